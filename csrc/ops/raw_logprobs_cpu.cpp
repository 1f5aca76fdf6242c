// CPU kernel of raw_logprobs: DESIGN §3.8's raw logprobs of given tokens, by the row pipeline's
// own functions (row_reference.h), so they equal what sample_rows publishes for the same rows.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <limits>

#include "op_checks.h"
#include "row_reference.h"

namespace tokensampler::cpu {

namespace {

void raw_logprobs(const at::Tensor& logits, const at::Tensor& tokens,
                  const std::optional<at::Tensor>& out_logprobs,
                  const std::optional<at::Tensor>& out_top_values,
                  const std::optional<at::Tensor>& out_top_ids,
                  const std::optional<at::Tensor>& token_bitmask,
                  const std::optional<at::Tensor>& req_pool_indices, int64_t tokens_per_req,
                  int64_t pool_rows) {
  check_raw_logprobs_args(logits, tokens, out_logprobs, out_top_values, out_top_ids, token_bitmask,
                          req_pool_indices, tokens_per_req, pool_rows);
  const auto x = logits.to(at::kFloat).contiguous();
  const int64_t rows = x.size(0);
  const int32_t V = static_cast<int32_t>(x.size(1));
  const int32_t top_n = out_top_values ? static_cast<int32_t>(out_top_values->size(1)) : 0;
  const BitmaskRows masks = bitmask_rows(token_bitmask);
  const int32_t* slots = req_pool_indices ? req_pool_indices->data_ptr<int32_t>() : nullptr;
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      RowDistribution d;
      // A row whose slot lies outside the pool is read as one with no finite logit (DESIGN §5).
      const int32_t slot = slots ? slots[r / tokens_per_req] : 0;
      if (slots && (slot < 0 || slot >= pool_rows))
        d.raw.assign(V, -std::numeric_limits<float>::infinity());
      else
        d.raw = read_raw_row(x.data_ptr<float>() + r * V, masks.row(r), V);
      const RawNormalizer norm = raw_log_normalizer(d);
      if (out_logprobs) {
        const int32_t token = tokens.data_ptr<int32_t>()[r];
        out_logprobs->data_ptr<float>()[r] = token >= 0 && token < V
                                                 ? raw_logprob(d, norm, token)
                                                 : std::numeric_limits<float>::quiet_NaN();
      }
      if (top_n > 0)
        top_raw_logprobs(d, norm, top_n, out_top_values->data_ptr<float>() + r * top_n,
                         out_top_ids->data_ptr<int64_t>() + r * top_n);
    }
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(tokensampler, CPU, m) { m.impl("raw_logprobs", &raw_logprobs); }

}  // namespace tokensampler::cpu
