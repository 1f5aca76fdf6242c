// DESIGN §3.8 raw logprobs of given tokens (the raw_logprobs op; CPU kernel in
// ops/raw_logprobs_cpu.cpp), for code that samples without the sampling kernels: rejection
// verify, the FlashInfer adapters. The arithmetic is the sampling kernels' (raw_logprob in
// device_primitives.cuh) and the top-N the one-block sampling kernel's (row_top_n.cuh).
#pragma once

#include <cuda_runtime.h>

#include "device_primitives.cuh"
#include "logits_row.cuh"
#include "row_top_n.cuh"

namespace tokensampler::cuda {

// One block per row: one read for the raw (max, sum-exp) of the finite values and the +inf
// count, then one per top-N rank (for_each_top_raw).
// A token outside [0, vocab) (a row that emitted none) gets NaN.
template <typename T, int kThreads>
__global__ void __launch_bounds__(kThreads)
    raw_logprobs_kernel(const T* __restrict__ logits, int64_t row_stride, BitmaskRows token_bitmask,
                        int32_t vocab, const int32_t* __restrict__ tokens,
                        float* __restrict__ out_logprobs, float* __restrict__ out_top_values,
                        int64_t* __restrict__ out_top_ids, int32_t top_n) {
  __shared__ float red_m[kThreads / 32], red_s[kThreads / 32];
  __shared__ Candidate scratch[kThreads / 32];
  __shared__ int32_t inf_total;
  const int64_t r = blockIdx.x;
  const LogitsRow<T> x = logits_row(logits, row_stride, token_bitmask, r);
  if (threadIdx.x == 0) inf_total = 0;
  float m = kNegInf, s = 0.0f;
  int32_t inf_count = 0;
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = x.raw(i);
    if (v == INFINITY) ++inf_count;
    else add_to_lse(m, s, v);
  }
  __syncthreads();  // inf_total is zero
  inf_count = __reduce_add_sync(0xffffffffu, inf_count);
  if ((threadIdx.x & 31) == 0 && inf_count > 0) atomicAdd(&inf_total, inf_count);
  block_merge_lse<kThreads>(m, s, red_m, red_s);  // its barrier also publishes inf_total
  inf_count = inf_total;

  if (out_logprobs != nullptr && threadIdx.x == 0) {
    const int32_t token = tokens[r];
    out_logprobs[r] = token >= 0 && token < vocab ? raw_logprob(x.raw(token), inf_count, m, s)
                                                  : __int_as_float(0x7fc00000);  // NaN
  }
  for_each_top_raw(
      x, vocab, top_n, kThreads, [&](Candidate c) { return block_best<kThreads>(c, scratch); },
      [&](int32_t n, Candidate best) {
        if (threadIdx.x != 0) return;
        out_top_ids[r * top_n + n] = best.id;
        out_top_values[r * top_n + n] = raw_logprob(best.z, inf_count, m, s);
      });
}

}  // namespace tokensampler::cuda
