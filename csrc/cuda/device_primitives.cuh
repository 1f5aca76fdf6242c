// The one set of device primitives every CUDA path uses (split_row, histogram_cut, sample,
// verify, argmax, raw_logprobs): the (value, id) candidate and its rank order, the warp / block
// best of it, block sums, order-preserving keys of z, warp-aggregated appends, the online log-sum-exp merge
// and the raw logprob it gives.
#pragma once

#include <cuda_runtime.h>

#include "tokensampler/row_rules.h"

namespace tokensampler::cuda {

// The id of no token: it ranks after every real id, so an empty candidate loses every tie.
constexpr int32_t kNoId = 0x7FFFFFFF;

// A value and its token id; the rank order is ranks_before (z descending, ties to the lower id).
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

// Block-wide sum of an integer or double (exact for integers in any order); every thread gets
// it. `scratch` holds one value per warp.
template <int kThreads, typename V>
__device__ __forceinline__ V block_sum(V v, V* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) scratch[w] = v;
  __syncthreads();
  V r = lane < kThreads / 32 ? scratch[lane] : V{0};
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
  return r;
}

// Order-preserving key of z: a larger key ranks earlier; -0 and +0 share a key; 0 is below every
// real z (the key of -inf is 0x007FFFFF) and marks an empty slot.
__device__ __forceinline__ uint32_t rank_key(float z) {
  const uint32_t u = float_bits(z == 0.0f ? 0.0f : z);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_to_z(uint32_t key) {
  return bits_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}

// The same order the other way round (a smaller key ranks earlier), for radix selects that
// count from the top.
__device__ __forceinline__ uint32_t desc_key(float z) { return ~rank_key(z); }

__device__ __forceinline__ float desc_key_to_z(uint32_t key) { return key_to_z(~key); }

// Warp-aggregated append: the lanes of a warp where `take` holds get consecutive slots from
// *counter, in lane order, with one atomic per warp, and store(slot) runs on each of them.
// Every lane calls it.
template <typename Store>
__device__ __forceinline__ void warp_append(bool take, int32_t* counter, Store&& store) {
  const uint32_t mask = __ballot_sync(0xffffffffu, take);
  if (mask == 0) return;
  const int lane = threadIdx.x & 31, leader = __ffs(mask) - 1;
  int32_t base = 0;
  if (lane == leader) base = atomicAdd(counter, __popc(mask));
  base = __shfl_sync(0xffffffffu, base, leader);
  if (take) store(base + __popc(mask & ((1u << lane) - 1u)));
}

// warp_append for n in [0, 7] entries a lane: three ballots of n's bits give every lane its
// first slot, so a warp appending a group's four tokens takes one atomic, not four.
template <typename Store>
__device__ __forceinline__ void warp_append_n(int n, int32_t* counter, Store&& store) {
  const uint32_t b0 = __ballot_sync(0xffffffffu, n & 1), b1 = __ballot_sync(0xffffffffu, n & 2),
                 b2 = __ballot_sync(0xffffffffu, n & 4);
  if ((b0 | b1 | b2) == 0) return;
  const int lane = threadIdx.x & 31, leader = __ffs(b0 | b1 | b2) - 1;
  int32_t base = 0;
  if (lane == leader) base = atomicAdd(counter, __popc(b0) + 2 * __popc(b1) + 4 * __popc(b2));
  base = __shfl_sync(0xffffffffu, base, leader);
  const uint32_t below = (1u << lane) - 1u;
  if (n > 0) store(base + __popc(b0 & below) + 2 * __popc(b1 & below) + 4 * __popc(b2 & below));
}

// Online (max, sum exp(x - max)) of finite values: merges (m2, s2) into (m, s).
__device__ __forceinline__ void merge_lse(float& m, float& s, float m2, float s2) {
  if (m2 == kNegInf) return;
  if (m == kNegInf) { m = m2; s = s2; return; }
  if (m2 > m) { s = s * expf(m - m2) + s2; m = m2; }
  else s += s2 * expf(m2 - m);
}

// Adds one value x to (m, s). Kept apart from merge_lse(m, s, x, 1.0f), which branches in another
// order (and treats a NaN x otherwise): the sample kernel's code stays as it was.
__device__ __forceinline__ void add_to_lse(float& m, float& s, float x) {
  if (x == kNegInf) return;
  if (x > m) {
    s = (m == kNegInf ? 0.0f : s * expf(m - x)) + 1.0f;
    m = x;
  } else {
    s += expf(x - m);
  }
}

__device__ __forceinline__ void warp_merge_lse(float& m, float& s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    merge_lse(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
}

// Block-wide (max, sum-exp); every thread gets it. red_m / red_s hold one value per warp, merged
// in warp order by every thread.
template <int kThreads>
__device__ __forceinline__ void block_merge_lse(float& m, float& s, float* red_m, float* red_s) {
  warp_merge_lse(m, s);
  if ((threadIdx.x & 31) == 0) {
    red_m[threadIdx.x >> 5] = m;
    red_s[threadIdx.x >> 5] = s;
  }
  __syncthreads();
  m = kNegInf;
  s = 0.0f;
  for (int j = 0; j < kThreads / 32; ++j) merge_lse(m, s, red_m[j], red_s[j]);
}

// §3.8 raw log-softmax of a sanitised logit, from its row's +inf count and raw (max, sum-exp) of
// the finite values: -log(count) at a +inf entry of a row with some (-inf elsewhere), -inf in a
// row with no finite or +inf value, else (x - max) - log(sum), not x - (max + log(sum)), which
// loses log(sum) next to a huge max.
__device__ __forceinline__ float raw_logprob(float raw, int32_t inf_count, float raw_m, float raw_s) {
  if (inf_count > 0) return raw == INFINITY ? -logf(static_cast<float>(inf_count)) : kNegInf;
  if (raw_m == kNegInf) return kNegInf;
  return static_cast<float>(double(raw) - double(raw_m) - log(double(raw_s)));
}

}  // namespace tokensampler::cuda
