// Row argmax (greedy sampling): NaN and tokens the grammar bitmask disallows count as -inf, ties
// go to the lowest token id. A row whose argmax is -inf is invalid (DESIGN §3.1).
#pragma once

#include <cuda_runtime.h>

#include "device_primitives.cuh"
#include "logits_row.cuh"

namespace tokensampler::cuda {

// One block per row. Each thread scans its tokens four at a time (for_each_raw: one vector load
// each), then warps and the block reduce.
template <typename T, int kThreads>
__global__ void argmax_rows_kernel(const T* __restrict__ logits, int64_t row_stride,
                                   BitmaskRows token_bitmask, int32_t vocab,
                                   int32_t* __restrict__ out_tokens,
                                   bool* __restrict__ out_invalid) {
  const LogitsRow<T> row = logits_row(logits, row_stride, token_bitmask, blockIdx.x);
  Candidate best{kNegInf, vocab};
  for_each_raw<kThreads>(row, 0, vocab,
                         [&](int32_t i, float v) { best = best_of(best, Candidate{v, i}); });
  best = warp_best(best);
  __shared__ Candidate per_warp[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) per_warp[warp] = best;
  __syncthreads();
  if (warp == 0) {
    best = lane < kThreads / 32 ? per_warp[lane] : Candidate{kNegInf, vocab};
    best = warp_best(best);
    // An all -inf row ties the sentinel at id 0 or beats it: token 0 either way.
    if (lane == 0) {
      out_tokens[blockIdx.x] = best.id < vocab ? best.id : 0;
      if (out_invalid != nullptr) out_invalid[blockIdx.x] = !(best.z > kNegInf);
    }
  }
}

}  // namespace tokensampler::cuda
