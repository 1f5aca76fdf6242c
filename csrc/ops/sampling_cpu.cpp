// CPU kernels of argmax_rows and sample_rows: row-at-a-time, clarity over speed.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "op_checks.h"
#include "row_reference.h"
#include "tokensampler/row_rules.h"

namespace tokensampler::cpu {

namespace {

void argmax_rows(const at::Tensor& logits, at::Tensor& out_tokens,
                 const std::optional<at::Tensor>& token_bitmask,
                 const std::optional<at::Tensor>& out_invalid) {
  check_argmax_rows_args(logits, out_tokens, token_bitmask, out_invalid);
  const auto rows = logits.to(at::kFloat).contiguous();
  const int32_t V = static_cast<int32_t>(rows.size(1));
  const float* x = rows.data_ptr<float>();
  int32_t* out = out_tokens.data_ptr<int32_t>();
  bool* invalid = out_invalid ? out_invalid->data_ptr<bool>() : nullptr;
  const BitmaskRows masks = bitmask_rows(token_bitmask);
  at::parallel_for(0, rows.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = x + r * V;
      const int32_t* allowed = masks.row(r);
      int32_t best = 0;
      float best_value = read_logit(row[0], allowed, 0);
      for (int32_t i = 1; i < V; ++i) {
        const float v = read_logit(row[i], allowed, i);
        if (v > best_value) {
          best = i;
          best_value = v;
        }
      }
      out[r] = best;
      if (invalid) invalid[r] = !(best_value > kNegInf);
    }
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
                 const std::optional<at::Tensor>& workspace /*the CUDA paths' scratch*/,
                 const std::optional<at::Tensor>& token_bitmask) {
  // route and max_top_k select CUDA kernels; the CPU kernel serves every route alike.
  check_sample_rows_call(logits, req_pool_indices, valid_cache_lengths, slot_table,
                         history_capacity, bias_capacity, tokens_per_req, candidates,
                         logprobs_mode, route, max_top_k, out_tokens, out_invalid, out_logprobs,
                         out_top_values, out_top_ids, workspace, token_bitmask);
  const auto x = logits.to(at::kFloat).contiguous();
  const int64_t rows = x.size(0);
  const int32_t V = static_cast<int32_t>(x.size(1));
  const int64_t pool_rows = slot_table.size(0);
  const SlotLayout layout = slot_layout_of(slot_table, history_capacity, bias_capacity);
  const int32_t* slots = req_pool_indices.data_ptr<int32_t>();
  const int32_t* lengths = valid_cache_lengths.data_ptr<int32_t>();
  const int32_t* table = slot_table.data_ptr<int32_t>();
  const int32_t* cand = candidates ? candidates->data_ptr<int32_t>() : nullptr;
  const int64_t top_n = out_top_values ? out_top_values->size(1) : 0;
  const BitmaskRows masks = bitmask_rows(token_bitmask);

  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / tokens_per_req, j = r % tokens_per_req;
      const int32_t slot = slots[b];
      if (slot < 0 || slot >= pool_rows) {  // untrusted index: flag the row, read nothing
        out_tokens.data_ptr<int32_t>()[r] = 0;
        out_invalid.data_ptr<bool>()[r] = true;
        // Outputs as for a row with no finite logit, never the previous call's.
        if (out_logprobs) out_logprobs->data_ptr<float>()[r] = kNegInf;
        for (int64_t n = 0; n < top_n; ++n) {
          out_top_values->data_ptr<float>()[r * top_n + n] = kNegInf;
          out_top_ids->data_ptr<int64_t>()[r * top_n + n] = n;
        }
        continue;
      }
      RowContext ctx{SlotRow{table + layout.row_offset(slot), layout},
                     int64_t{lengths[slot]} + j, V,
                     cand ? cand + b * tokens_per_req + 1 : nullptr,
                     cand ? static_cast<int32_t>(j) : 0, apply_penalties};
      ctx.allowed = masks.row(r);
      const RowDistribution dist = filter_row(x.data_ptr<float>() + r * V, ctx);
      const int32_t token = sample_kept(dist, ctx);
      out_tokens.data_ptr<int32_t>()[r] = token;
      out_invalid.data_ptr<bool>()[r] = dist.invalid;
      const bool raw = (out_logprobs && logprobs_mode != 1) || top_n > 0;
      const RawNormalizer norm = raw ? raw_log_normalizer(dist) : RawNormalizer{};
      if (out_logprobs) {
        out_logprobs->data_ptr<float>()[r] = logprobs_mode == 1 ? processed_logprob(dist, token)
                                                                : raw_logprob(dist, norm, token);
      }
      if (top_n > 0) {
        top_raw_logprobs(dist, norm, static_cast<int32_t>(top_n),
                         out_top_values->data_ptr<float>() + r * top_n,
                         out_top_ids->data_ptr<int64_t>() + r * top_n);
      }
    }
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(tokensampler, CPU, m) {
  m.impl("argmax_rows", &argmax_rows);
  m.impl("sample_rows", &sample_rows);
}

}  // namespace tokensampler::cpu
