// Launch code of sample_rows on CUDA (device code in sample_kernel.cuh).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../ops/op_checks.h"
#include "dispatch_logits.cuh"
#include "raw_logprobs_launch.h"
#include "sample_kernel.cuh"
#include "sample_rows_paths.h"

namespace tokensampler::cuda {

namespace {

struct SampleArgs : StepRows {
  const int32_t* candidates;
  bool apply_penalties;
  int32_t logprobs_mode;
  int32_t* out_tokens;
  bool* out_invalid;
  float* out_logprobs;
};

template <typename T>
__global__ void __launch_bounds__(kSampleThreads)
    sample_rows_kernel(const T* __restrict__ logits, SampleArgs a) {
  __shared__ SampleSmem sm;
  const int64_t r = blockIdx.x;
  const int64_t b = r / a.tokens_per_req, j = r % a.tokens_per_req;
  const int32_t slot = a.req_pool_indices[b];
  if (slot < 0 || slot >= a.pool_rows) {  // untrusted index: flag the row, read nothing
    write_unreadable_row(r, a.out_tokens, a.out_invalid, a.out_logprobs);
    return;
  }
  const LogitsRow<T> x = a.row_of(logits, r);
  const RowInput row = make_row(a.slot_table + a.layout.row_offset(slot),
                                a.layout, int64_t{a.valid_cache_lengths[slot]} + j,
                                a.candidates ? a.candidates + b * a.tokens_per_req + 1 : nullptr,
                                static_cast<int32_t>(j), a.vocab, a.apply_penalties);
  const bool want_raw = a.out_logprobs != nullptr && a.logprobs_mode != 1;
  const RowPlan p = plan_row(x, row, sm, want_raw);
  const bool want_processed = a.out_logprobs != nullptr && a.logprobs_mode == 1;

  double total = 1.0;
  const int32_t token = planned_token(x, row, p, sm, want_processed, &total);
  if (threadIdx.x == 0) {
    a.out_tokens[r] = token;
    a.out_invalid[r] = p.kind == kRowInvalid;
    if (a.out_logprobs != nullptr) {
      float lp;
      if (a.logprobs_mode == 1) {
        if (p.kind == kRowInvalid) {
          lp = kNegInf;
        } else if (p.kind == kRowGreedy) {
          lp = 0.0f;
        } else if (p.kind == kRowInf) {
          lp = static_cast<float>(-log(total));
        } else {
          const float z = scaled_logit(load_processed(x, row, sm, token), row.temperature);
          if (p.fused) {
            lp = static_cast<float>(static_cast<double>(z) - p.fused_zmax -
                                    log(static_cast<double>(p.fused_zsum)));
          } else {
            lp = static_cast<float>(static_cast<double>(z) - p.z_max - log(total));
          }
        }
      } else {
        lp = raw_logprob_of(p, x.raw(token));
      }
      a.out_logprobs[r] = lp;
    }
  }
}

// Every row of the call in one block: the rows the multi-block paths decline.
void launch_one_block_per_row(const SampleRowsCall& c) {
  SampleArgs a{};
  static_cast<StepRows&>(a) = step_rows_of(c);
  a.candidates = c.drafts ? c.drafts->data_ptr<int32_t>() : nullptr;
  a.apply_penalties = c.apply_penalties;
  a.logprobs_mode = static_cast<int32_t>(c.logprobs_mode);
  a.out_tokens = c.out_tokens.data_ptr<int32_t>();
  a.out_invalid = c.out_invalid.data_ptr<bool>();
  a.out_logprobs = c.out_logprobs ? c.out_logprobs->data_ptr<float>() : nullptr;
  const auto stream = at::cuda::getCurrentCUDAStream();
  dispatch_logits_dtype(c.logits.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    sample_rows_kernel<T><<<c.logits.size(0), kSampleThreads, 0, stream>>>(
        c.logits.data_ptr<T>(), a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void sample_rows(const at::Tensor& logits, const at::Tensor& req_pool_indices,
                 const at::Tensor& valid_cache_lengths, const at::Tensor& slot_table,
                 int64_t history_capacity, int64_t bias_capacity, int64_t tokens_per_req,
                 const std::optional<at::Tensor>& candidates, bool apply_penalties,
                 int64_t logprobs_mode, int64_t route, int64_t max_top_k,
                 at::Tensor& out_tokens, at::Tensor& out_invalid,
                 const std::optional<at::Tensor>& out_logprobs,
                 const std::optional<at::Tensor>& out_top_values,
                 const std::optional<at::Tensor>& out_top_ids,
                 const std::optional<at::Tensor>& workspace,
                 const std::optional<at::Tensor>& token_bitmask) {
  check_sample_rows_call(logits, req_pool_indices, valid_cache_lengths, slot_table,
                         history_capacity, bias_capacity, tokens_per_req, candidates,
                         logprobs_mode, route, max_top_k, out_tokens, out_invalid, out_logprobs,
                         out_top_values, out_top_ids, workspace, token_bitmask);
  const int64_t rows = logits.size(0);
  const int64_t top_n = out_top_values ? out_top_values->size(1) : 0;
  if (rows == 0) return;
  const c10::cuda::CUDAGuard guard(logits.device());
  const SlotLayout layout = slot_layout_of(slot_table, history_capacity, bias_capacity);
  // With top-N, the raw logprobs of the sampled tokens come from the top-N kernels, which read
  // the raw stats anyway: the sampling kernels then skip their log-sum-exp of every token.
  const bool raw_with_top = top_n > 0 && out_logprobs && logprobs_mode == 0;
  const std::optional<at::Tensor> no_logprobs;
  const SampleRowsCall call{logits, req_pool_indices, valid_cache_lengths, slot_table, layout,
                            tokens_per_req, candidates, apply_penalties, logprobs_mode,
                            static_cast<Route>(route), max_top_k,
                            out_tokens, out_invalid,
                            raw_with_top ? no_logprobs : out_logprobs, workspace, token_bitmask};
  if (!split_row::try_sample(call) && !histogram_cut::try_sample(call))
    launch_one_block_per_row(call);
  if (top_n > 0) {  // §3.8's top-N raw logprobs: rows in chunks, after the sampling kernels
    raw_logprobs::launch(
        logits,
        raw_logprobs::args_of(logits, token_bitmask, &out_tokens,
                              raw_with_top ? out_logprobs : no_logprobs, out_top_values,
                              out_top_ids, req_pool_indices, tokens_per_req, slot_table.size(0)),
        workspace);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(tokensampler, CUDA, m) { m.impl("sample_rows", &sample_rows); }

}  // namespace tokensampler::cuda
