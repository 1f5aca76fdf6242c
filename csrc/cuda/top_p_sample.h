// The histogram-cut path of sample_rows (top_p_sample.cu).
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "tokensampler/slot_layout.h"

namespace tokensampler::cuda::top_p {

// Samples every row and returns true when the step has no top-N or processed logprobs (any
// route: top-p, min-p, mixed batches, top-k beyond the split-row path). Rows it cannot finish
// exactly run the one-block-per-row kernel's code inside its finish kernel. Otherwise returns
// false and launches nothing. Arguments as split_row::try_split_row_sample.
bool try_top_p_sample(const at::Tensor& logits, const at::Tensor& req_pool_indices,
                      const at::Tensor& valid_cache_lengths, const at::Tensor& slot_table,
                      SlotLayout layout, int64_t tokens_per_req,
                      const std::optional<at::Tensor>& drafts, bool apply_penalties,
                      int64_t logprobs_mode, int64_t route_hint, at::Tensor& out_tokens,
                      at::Tensor& out_invalid, const std::optional<at::Tensor>& out_logprobs,
                      bool want_top_n);

}  // namespace tokensampler::cuda::top_p
