// The split-row fast path of sample_rows (split_row_sample.cu).
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "tokensampler/slot_layout.h"

namespace tokensampler::cuda::split_row {

// Samples every row and returns true when the step fits the fast path: no top-N or processed
// logprobs, and route_hint (low 8 bits: route; higher bits: the step's largest top-k) names
// no_filter, or top_k / top_k_top_p / top_k_top_p_min_p with k <= 512. Penalties and bias are
// applied when apply_penalties is set (`drafts`: the verify candidates, whose earlier drafts
// count as history). Otherwise returns false and launches nothing.
bool try_split_row_sample(const at::Tensor& logits, const at::Tensor& req_pool_indices,
                          const at::Tensor& valid_cache_lengths, const at::Tensor& slot_table,
                          SlotLayout layout, int64_t tokens_per_req,
                          const std::optional<at::Tensor>& drafts, bool apply_penalties,
                          int64_t logprobs_mode, int64_t route_hint, at::Tensor& out_tokens,
                          at::Tensor& out_invalid, const std::optional<at::Tensor>& out_logprobs,
                          bool want_top_n);

}  // namespace tokensampler::cuda::split_row
