// Split-row sampling: the fast path of sample_rows for rows without penalties whose filters
// are none or top-k (<= kSplitMaxTopK) with optional top-p / min-p inside the top-k set.
//
// Kernel 1 (chunk): a row is cut into `splits` chunks, one block each, so a small batch still
// fills the GPU. Each block reads its chunk once (16-byte loads) and leaves a few numbers:
//   - the argmax of the logits (greedy rows), raw (max, sum-exp) partials (raw logprobs);
//   - no-filter rows: the best z + G of the chunk. Noise is keyed by token id, so it is needed
//     only where it can win: a cheap exact upper bound on G from the random word's leading
//     zeros (G = -ln(-ln u) <= -ln(1 - u)) skips the two logs for almost every token;
//   - top-k rows: the chunk's k best (z, id), kept in a shared-memory buffer whose admission
//     threshold rises as it fills (one pass, no re-read).
// Kernel 2 (finish): one block per row merges the chunks: argmax / best score, or the top-k of
// splits * k candidates (bitonic sort in shared memory), then top-p over them (sequential fp32
// sum in rank order, as the CPU reference), min-p, and Gumbel-max over the kept candidates.
// Every score is computed with the same helpers as the CPU kernels, so tokens are identical.
#pragma once

#include <cuda_runtime.h>

#include "tokensampler/rng.h"
#include "tokensampler/row_rules.h"
#include "tokensampler/slot_layout.h"

namespace tokensampler::cuda::split_row {

constexpr int kChunkThreads = 256;
constexpr int kFinishThreads = 512;
constexpr int kSplitMaxTopK = 512;
constexpr int kBufferCap = 2048;            // chunk buffer: > k + one round (4 * kChunkThreads)
constexpr int kMergeCap = 4096;             // finish kernel: splits * k candidates at most
constexpr int32_t kNoId = 0x7FFFFFFF;
constexpr float kLn2 = 0.693147180559945f;

struct Candidate {
  float z;
  int32_t id;
};

__device__ __forceinline__ bool before(const Candidate& a, const Candidate& b) {
  return ranks_before(a.z, a.id, b.z, b.id);
}

__device__ __forceinline__ Candidate best_of(Candidate a, Candidate b) { return before(b, a) ? b : a; }

__device__ __forceinline__ Candidate warp_best(Candidate c) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Candidate other{__shfl_xor_sync(0xffffffffu, c.z, o), __shfl_xor_sync(0xffffffffu, c.id, o)};
    c = best_of(c, other);
  }
  return c;
}

// Block-wide best; every thread gets it. `scratch` holds one Candidate per warp.
template <int kThreads>
__device__ __forceinline__ Candidate block_best(Candidate c, Candidate* scratch) {
  c = warp_best(c);
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) scratch[w] = c;
  __syncthreads();
  c = lane < kThreads / 32 ? scratch[lane] : Candidate{kNegInf, kNoId};
  return warp_best(c);
}

// Online (max, sum exp(x - max)) of finite values.
__device__ __forceinline__ void merge_lse(float& m, float& s, float m2, float s2) {
  if (m2 == kNegInf) return;
  if (m == kNegInf) { m = m2; s = s2; return; }
  if (m2 > m) { s = s * expf(m - m2) + s2; m = m2; }
  else s += s2 * expf(m2 - m);
}

// Upper bound of the Gumbel value a random word can give (exact math, see file comment):
// with q = 2^23 - 1 - (word >> 9), 1 - u >= 2^(31 - clz(q) - 23), so G <= (clz(q) - 8) ln 2.
// The margin covers the rounding of the computed G.
__device__ __forceinline__ float gumbel_upper_bound(uint32_t word) {
  const uint32_t q = 8388607u - (word >> 9);
  return static_cast<float>(__clz(q) - 8) * kLn2 + 1e-3f;
}

struct RowParams {
  float temperature;
  int32_t top_k;
  float top_p;
  float min_p;
  uint64_t seed;
  int64_t position;
  bool greedy;
  bool top_k_on;
  bool valid_slot;
};

__device__ __forceinline__ RowParams row_params(const int32_t* table, int64_t pool_rows,
                                                SlotLayout layout, const int32_t* req_pool_indices,
                                                const int32_t* valid_cache_lengths,
                                                int32_t tokens_per_req, int64_t r, int32_t vocab) {
  RowParams p{};
  const int32_t slot = req_pool_indices[r / tokens_per_req];
  p.valid_slot = slot >= 0 && slot < pool_rows;
  if (!p.valid_slot) return p;
  const SlotRow s{table + static_cast<int64_t>(slot) * layout.row_words(), layout};
  p.temperature = s.temperature();
  p.top_k = s.top_k();
  p.top_p = s.top_p();
  p.min_p = s.min_p();
  p.seed = s.seed();
  p.position = int64_t{valid_cache_lengths[slot]} + r % tokens_per_req;
  p.greedy = is_greedy_row(p.temperature, p.top_k);
  p.top_k_on = !top_k_disabled(p.top_k, vocab);
  return p;
}

// Per (row, chunk) results of kernel 1.
struct ChunkResult {
  Candidate argmax;      // of the processed logits (greedy rows), ties to the lowest id
  Candidate best;        // best z + G (no-filter rows) over finite tokens
  Candidate inf_best;    // best G over +inf tokens
  float raw_max, raw_sum;
  int32_t inf_count;
  int32_t kept;          // candidates written (top-k rows)
};

template <typename T>
__device__ __forceinline__ void load4(const T* row, int32_t i, int32_t end, float out[4]) {
  if constexpr (sizeof(T) == 4) {
    if (i + 3 < end && (reinterpret_cast<uintptr_t>(row + i) & 15) == 0) {
      const float4 v = *reinterpret_cast<const float4*>(row + i);
      out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
      return;
    }
  } else {
    if (i + 3 < end && (reinterpret_cast<uintptr_t>(row + i) & 7) == 0) {
      const uint2 v = *reinterpret_cast<const uint2*>(row + i);
      const T* h = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int q = 0; q < 4; ++q) out[q] = static_cast<float>(h[q]);
      return;
    }
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) out[q] = i + q < end ? static_cast<float>(row[i + q]) : kNegInf;
}

}  // namespace tokensampler::cuda::split_row
