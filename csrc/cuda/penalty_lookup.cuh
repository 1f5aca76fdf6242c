// Penalties and bias of one row on the device (DESIGN §3.2–3.4), shared by the generic and the
// split-row sampling kernels. Only tokens in the slot's prompt mask or output history, its bias
// list or this row's earlier drafts change; a bitmap in shared memory (bit = (token - base) mod 2^16) rejects every
// other token with one load, and a marked token is found by binary search in the slot's sorted
// history / bias lists.
#pragma once

#include <cuda_runtime.h>

#include "tokensampler/row_rules.h"
#include "tokensampler/slot_layout.h"

namespace tokensampler::cuda {

constexpr int kPenaltyBitmapWords = 2048;  // 65536 bits: exact for ranges up to 2^16 tokens

struct PenaltySource {
  SlotRow slot;
  const int32_t* drafts;  // earlier draft tokens of this verify row, or nullptr
  int32_t num_drafts;
};

__device__ __forceinline__ uint32_t penalty_bit(int32_t token, int32_t base) {
  return static_cast<uint32_t>(token - base) & (kPenaltyBitmapWords * 32 - 1);
}

// Whether the slot's repetition, frequency and presence penalties leave every logit as it is
// (1, 0, 0): penalized_logit then only adds the bias (a -0 logit may come out +0, which ranks,
// scores and masses alike), so only bias tokens need marking.
__device__ __forceinline__ bool penalties_neutral(const SlotRow& s) {
  return s.repetition() == 1.0f && s.frequency() == 0.0f && s.presence() == 0.0f;
}

// Marks the penalised tokens in [base, end) with all kThreads threads of the block. Syncs.
// A slot whose penalties are neutral (a gumbel_full request without any, the common case) marks
// its bias tokens only: no history, draft or prompt-mask reads, and no lookups in the hot loops.
template <int kThreads>
__device__ void mark_penalized_tokens(const PenaltySource& src, int32_t base, int32_t end,
                                      uint32_t* bitmap) {
  __syncthreads();
  for (int w = threadIdx.x; w < kPenaltyBitmapWords; w += kThreads) bitmap[w] = 0u;
  __syncthreads();
  auto mark = [&](int32_t t) {
    if (t >= base && t < end) {
      const uint32_t b = penalty_bit(t, base);
      atomicOr(&bitmap[b >> 5], 1u << (b & 31));
    }
  };
  const int32_t bl = src.slot.bias_size();
  for (int32_t k = threadIdx.x; k < bl; k += kThreads) mark(src.slot.bias_tokens()[k]);
  if (!penalties_neutral(src.slot)) {
    const int32_t hl = src.slot.history_size();
    for (int32_t k = threadIdx.x; k < hl; k += kThreads) mark(src.slot.history_tokens()[k]);
    for (int32_t k = threadIdx.x; k < src.num_drafts; k += kThreads) mark(src.drafts[k]);
    // Prompt tokens in [base, end): the mask's words there, one bit at a time (only slots with
    // a repetition penalty have bits set; the loads are V / 32 words at most).
    const int32_t w_end = static_cast<int32_t>((static_cast<int64_t>(end) + 31) >> 5);
    src.slot.for_each_prompt_token((base >> 5) + threadIdx.x, w_end, kThreads, mark);
  }
  __syncthreads();
}

// Bits of tokens i .. i + 3 (i - base a multiple of 4, so they share one word).
__device__ __forceinline__ uint32_t penalty_nibble(const uint32_t* bitmap, int32_t i, int32_t base) {
  const uint32_t b = penalty_bit(i, base);
  return (bitmap[b >> 5] >> (b & 31)) & 0xFu;
}

__device__ __forceinline__ bool maybe_penalized(const uint32_t* bitmap, int32_t i, int32_t base) {
  const uint32_t b = penalty_bit(i, base);
  return (bitmap[b >> 5] >> (b & 31)) & 1u;
}

// The processed logit of a marked token i (l already sanitised). Out of line: it is the rare path
// of the kernels' hot loops, which must stay small enough for the instruction cache.
inline __device__ __noinline__ float penalize_token(const PenaltySource& src, int32_t i, float l) {
  const SlotRow& s = src.slot;
  const int32_t bl = s.bias_size();
  const int32_t h = s.history_index(i);
  const int32_t drafted = recorded_draft_count(s, src.drafts, src.num_drafts, i);
  const bool in_history = h >= 0 || drafted > 0 || s.in_prompt(i);
  // a prompt-only token has no output count
  const int32_t count = (h >= 0 ? s.history_counts()[h] : 0) + drafted;
  const int32_t b = sorted_index(s.bias_tokens(), bl, i);
  if (!in_history && b < 0) return l;
  return penalized_logit(l, in_history, count, s.repetition(), s.frequency(), s.presence(),
                         b >= 0 ? s.bias_value(b) : 0.0f);
}

}  // namespace tokensampler::cuda
