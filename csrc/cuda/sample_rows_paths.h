// The multi-block paths of sample_rows. sample.cu tries them in order, then falls back to the
// one-block-per-row kernel: split_row::try_sample (split_row_sample.cu), then
// histogram_cut::try_sample (histogram_cut_sample.cu). verify.cu tries
// split_row::try_verify_rejection. None of them writes top-N logprobs:
// sample.cu launches raw_logprobs' kernels for those after whichever sampled.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "../ops/op_checks.h"
#include "step_rows.cuh"
#include "tokensampler/route.h"
#include "tokensampler/slot_layout.h"

namespace tokensampler::cuda {

// One sample_rows call, as the multi-block paths read it.
struct SampleRowsCall {
  const at::Tensor& logits;
  const at::Tensor& req_pool_indices;
  const at::Tensor& valid_cache_lengths;
  const at::Tensor& slot_table;
  SlotLayout layout;
  int64_t tokens_per_req;
  const std::optional<at::Tensor>& drafts;  // verify candidates: penalties count earlier drafts,
                                            // rejection verify judges them
  bool apply_penalties;
  int64_t logprobs_mode;
  Route route;         // the step's route: which filters its rows use
  int64_t max_top_k;   // the step's largest top-k; 0: unknown
  at::Tensor& out_tokens;
  at::Tensor& out_invalid;
  const std::optional<at::Tensor>& out_logprobs;
  const std::optional<at::Tensor>& workspace;  // uint8, sample_rows_workspace_bytes(rows) or more
  const std::optional<at::Tensor>& token_bitmask;  // int32 [rows, ceil(V / 32)] (DESIGN §3.0)
};

// The call's rows and slots as the kernels read them.
inline StepRows step_rows_of(const SampleRowsCall& c) {
  StepRows s{};
  s.row_stride = c.logits.stride(0);
  s.token_bitmask = bitmask_rows(c.token_bitmask);
  s.vocab = static_cast<int32_t>(c.logits.size(1));
  s.req_pool_indices = c.req_pool_indices.data_ptr<int32_t>();
  s.valid_cache_lengths = c.valid_cache_lengths.data_ptr<int32_t>();
  s.slot_table = c.slot_table.data_ptr<int32_t>();
  s.pool_rows = c.slot_table.size(0);
  s.layout = c.layout;
  s.tokens_per_req = static_cast<int32_t>(c.tokens_per_req);
  return s;
}

namespace split_row {
// Samples every row and returns true when the step has no processed logprobs and its
// route is no_filter, or top_k / top_k_top_p / top_k_top_p_min_p with k <= 512 (one read of each
// row). Otherwise returns false and launches nothing.
bool try_sample(const SampleRowsCall& call);
// Rejection-sampling verify (DESIGN §4) of top-k steps with k <= 512: every row of the call
// (call.drafts the candidates [bs, tokens_per_req], draft_probs float32 [bs, tokens_per_req - 1,
// V] contiguous) judged at once, its verdict (rejection_verdict.cuh) in call.out_tokens for
// verify.cu's walker. Returns false, launching nothing, for other steps.
bool try_verify_rejection(const SampleRowsCall& call, const at::Tensor& draft_probs);
}  // namespace split_row

namespace histogram_cut {
// Samples every row and returns true when the step has no processed logprobs (any
// route: top-p, min-p, mixed batches, top-k beyond the split-row path). Rows it cannot finish
// exactly run the one-block-per-row kernel's code inside its finish kernel. Otherwise returns
// false and launches nothing.
bool try_sample(const SampleRowsCall& call);
}  // namespace histogram_cut

}  // namespace tokensampler::cuda
