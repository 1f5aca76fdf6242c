// One logits row as every CUDA kernel reads it: the engine's values and, when the step has one,
// the row of the grammar's token bitmask (DESIGN §3.0), applied in the same read, so a masked
// step moves V / 8 more bytes per row and no extra pass.
#pragma once

#include <cuda_runtime.h>

#include "tokensampler/row_rules.h"

namespace tokensampler::cuda {

// kMasked false: a row of a step without a bitmask, read with no bitmask code (the multi-block
// kernels come in both instantiations, picked at launch, so their hot loops pay nothing for it
// in unmasked steps); true (every other kernel): the bitmask row checked at run time, or null.
template <typename T, bool kMasked = true>
struct LogitsRow {
  const T* values;
  const int32_t* allowed;  // bitmask row, or null: every token allowed (always null unmasked)

  // §3.0–3.1 for token i.
  __device__ __forceinline__ float raw(int32_t i) const {
    return read_logit(static_cast<float>(values[i]), kMasked ? allowed : nullptr, i);
  }
};

// Row r of the logits and of the bitmask (kMasked false: of the logits only; the step has no
// bitmask).
template <bool kMasked = true, typename T>
__device__ __forceinline__ LogitsRow<T, kMasked> logits_row(const T* logits, int64_t row_stride,
                                                            BitmaskRows bitmask, int64_t r) {
  return LogitsRow<T, kMasked>{logits + r * row_stride, kMasked ? bitmask.row(r) : nullptr};
}

// Tokens of the widest load (load8: 16 bytes of fp16 / bf16). Chunks and slices of a row start
// at multiples of it, so their vector loads are aligned in every dtype.
constexpr int32_t kAlignTokens = 8;

// n rounded up to a multiple of kAlignTokens.
__host__ __device__ constexpr int32_t align_tokens(int32_t n) {
  return (n + kAlignTokens - 1) / kAlignTokens * kAlignTokens;
}

// Tokens i .. i+3 (-inf past `end`) in one 16-byte (fp32) or 8-byte (fp16 / bf16) streaming
// load where aligned; NaN left for the caller's sanitising, the bitmask for mask_bits / apply_mask.
template <typename T, bool kMasked>
__device__ __forceinline__ void load4(const LogitsRow<T, kMasked>& row, int32_t i, int32_t end,
                                      float out[4]) {
  const T* x = row.values;
  if constexpr (sizeof(T) == 4) {
    if (i + 3 < end && (reinterpret_cast<uintptr_t>(x + i) & 15) == 0) {
      const float4 v = __ldcs(reinterpret_cast<const float4*>(x + i));
      out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
      return;
    }
  } else {
    if (i + 3 < end && (reinterpret_cast<uintptr_t>(x + i) & 7) == 0) {
      const uint2 v = __ldcs(reinterpret_cast<const uint2*>(x + i));
      const T* h = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int q = 0; q < 4; ++q) out[q] = static_cast<float>(h[q]);
      return;
    }
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) out[q] = i + q < end ? static_cast<float>(x[i + q]) : kNegInf;
}

// Tokens i .. i+7 of a 2-byte (fp16 / bf16) row, i .. i+3 into lo and i+4 .. i+7 into hi, in one
// 16-byte streaming load where aligned (i a multiple of 8 and the row 16-byte aligned): the bytes
// a load moves, and so the bytes in flight per thread, match fp32's load4.
template <typename T, bool kMasked>
__device__ __forceinline__ void load8(const LogitsRow<T, kMasked>& row, int32_t i, int32_t end,
                                      float lo[4], float hi[4]) {
  static_assert(sizeof(T) == 2, "load8 serves the 2-byte types");
  const T* x = row.values;
  if (i + 7 < end && (reinterpret_cast<uintptr_t>(x + i) & 15) == 0) {
    const uint4 v = __ldcs(reinterpret_cast<const uint4*>(x + i));
    const T* h = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      lo[q] = static_cast<float>(h[q]);
      hi[q] = static_cast<float>(h[4 + q]);
    }
    return;
  }
  load4(row, i, end, lo);
  load4(row, i + 4, end, hi);
}

// f(i, v) for the tokens i of [begin, end) this thread owns, v as raw(i) gives it: four
// consecutive tokens per step of kThreads * 4, one 16- or 8-byte load each where aligned (begin
// a multiple of 4).
template <int kThreads, typename T, bool kMasked, typename F>
__device__ __forceinline__ void for_each_raw(const LogitsRow<T, kMasked>& row, int32_t begin,
                                             int32_t end, F&& f) {
#pragma unroll 4
  for (int32_t i = begin + 4 * static_cast<int32_t>(threadIdx.x); i < end; i += 4 * kThreads) {
    float v[4];
    load4(row, i, end, v);
#pragma unroll
    for (int q = 0; q < 4; ++q)
      if (i + q < end) f(i + q, read_logit(v[q], kMasked ? row.allowed : nullptr, i + q));
  }
}

// §3.0 for the four tokens at i, in two steps so that a round issues every load (logits and
// bitmask words) before its first use of one: mask_bits loads their allowed bits (all ones
// without a bitmask or past `end`), apply_mask sets disallowed ones to -inf. i is a multiple of 4
// (chunks start at multiples of 4), so the four bits share one bitmask word. Nothing unmasked.
// `allowed` may point into shared memory (a chunk kernel's staged words): a generic load.
template <typename T, bool kMasked>
__device__ __forceinline__ uint32_t mask_bits(const LogitsRow<T, kMasked>& row, int32_t i, int32_t end) {
  if constexpr (kMasked) {
    if (row.allowed != nullptr && i < end) return static_cast<uint32_t>(row.allowed[i >> 5]) >> (i & 31);
  }
  return 0xFu;
}

// Bitmask words that tokens [begin, begin + chunk_len) can touch, whatever begin's alignment.
__host__ __device__ constexpr int32_t staged_mask_words(int32_t chunk_len) { return chunk_len / 32 + 2; }

// Words of a chunk's bitmask [begin, end) staged in shared memory (kMasked): one coalesced read
// at the start, so the per-group lookups of the loops are shared-memory loads, not a global
// round trip each (ncu run 36: the masked chunk kernel's top stall). Returns the row reading
// them; needs a barrier before use. `stage` holds staged_mask_words(end - begin) words.
template <typename T, bool kMasked>
__device__ __forceinline__ LogitsRow<T, kMasked> stage_mask(LogitsRow<T, kMasked> row, int32_t begin,
                                                            int32_t end, int32_t* stage, int threads) {
  if constexpr (kMasked) {
    if (row.allowed == nullptr) return row;
    const int32_t first = begin >> 5, last = (end - 1) >> 5;
    for (int32_t w = first + static_cast<int32_t>(threadIdx.x); w <= last; w += threads)
      stage[w - first] = __ldg(row.allowed + w);
    row.allowed = stage - first;
  }
  return row;
}

template <bool kMasked>
__device__ __forceinline__ void apply_mask(uint32_t bits, float out[4]) {
  if constexpr (kMasked) {
#pragma unroll
    for (int q = 0; q < 4; ++q)
      if (!((bits >> q) & 1u)) out[q] = kNegInf;
  }
}

}  // namespace tokensampler::cuda
