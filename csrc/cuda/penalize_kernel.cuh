// Sparse penalty and bias update of processed logits (DESIGN §3.2–3.4), one block per row.
// Each distinct token the row names (slot history, this row's drafts, bias list) is written by
// exactly one thread, so the update needs no atomics and costs O(history), not O(V).
#pragma once

#include "penalty_lookup.cuh"
#include "tokensampler/row_rules.h"
#include "tokensampler/slot_layout.h"

namespace tokensampler::cuda {

__global__ void penalize_rows_kernel(float* __restrict__ out, int32_t vocab,
                                     const int32_t* __restrict__ req_pool_indices,
                                     const int32_t* __restrict__ table, int64_t pool_rows,
                                     SlotLayout layout, int32_t tokens_per_req,
                                     const int32_t* __restrict__ candidates,
                                     int32_t vocab_offset) {
  const int64_t r = blockIdx.x;
  const int32_t b = static_cast<int32_t>(r / tokens_per_req), j = static_cast<int32_t>(r % tokens_per_req);
  const int32_t slot = req_pool_indices[b];
  if (slot < 0 || slot >= pool_rows) return;
  const SlotRow s{table + layout.row_offset(slot), layout};
  float* row = out + r * vocab;
  const int32_t* drafts = candidates ? candidates + b * tokens_per_req + 1 : nullptr;
  const int32_t num_drafts = candidates ? j : 0;
  const int32_t hist_n = s.history_size(), bias_n = s.bias_size();

  // Earlier drafts of `token` that count (DESIGN §4: as plain decoding recorded them).
  auto drafted = [&](int32_t token) { return recorded_draft_count(s, drafts, num_drafts, token); };
  auto bias_of = [&](int32_t token) {
    const int32_t at = sorted_index(s.bias_tokens(), bias_n, token);
    return at >= 0 ? s.bias_value(at) : 0.0f;
  };
  auto apply = [&](int32_t token, bool in_history, int32_t count, float bias) {
    const int32_t i = token - vocab_offset;  // columns may be a vocabulary shard
    if (i < 0 || i >= vocab) return;
    row[i] = penalized_logit(row[i], in_history, count, s.repetition(), s.frequency(),
                             s.presence(), bias);
  };

  // Output-history tokens (plus any drafts of the same id).
  for (int32_t i = threadIdx.x; i < hist_n; i += blockDim.x) {
    const int32_t token = s.history_tokens()[i];
    apply(token, true, s.history_counts()[i] + drafted(token), bias_of(token));
  }
  // Recorded drafts not in the history: first occurrence only.
  for (int32_t d = threadIdx.x; d < num_drafts; d += blockDim.x) {
    const int32_t token = drafts[d];
    bool first = true;
    for (int32_t e = 0; e < d; ++e) first &= drafts[e] != token;
    const int32_t count = first && s.history_index(token) < 0 ? drafted(token) : 0;
    if (count > 0) apply(token, true, count, bias_of(token));
  }
  // Prompt tokens named by neither (the mask's words of this row's columns).
  const int32_t w_begin = max(vocab_offset, 0) >> 5;
  const int32_t w_end = (vocab_offset + vocab + 31) >> 5;
  s.for_each_prompt_token(w_begin + threadIdx.x, w_end, blockDim.x, [&](int32_t token) {
    if (s.history_index(token) < 0 && drafted(token) == 0) apply(token, true, 0, bias_of(token));
  });
  // Bias entries named by none of them.
  for (int32_t i = threadIdx.x; i < bias_n; i += blockDim.x) {
    const int32_t token = s.bias_tokens()[i];
    if (s.history_index(token) < 0 && drafted(token) == 0 && !s.in_prompt(token))
      apply(token, false, 0, s.bias_value(i));
  }
}

}  // namespace tokensampler::cuda
