// Row argmax (greedy sampling): NaN and tokens the grammar bitmask disallows count as -inf, ties
// go to the lowest token id.
#pragma once

#include <cuda_runtime.h>

#include "logits_row.cuh"

namespace tokensampler::cuda {

struct ArgmaxCandidate {
  float value;
  int32_t index;
};

__device__ __forceinline__ ArgmaxCandidate better_of(ArgmaxCandidate a, ArgmaxCandidate b) {
  return ranks_before(b.value, b.index, a.value, a.index) ? b : a;
}

__device__ __forceinline__ ArgmaxCandidate warp_argmax(ArgmaxCandidate c) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    ArgmaxCandidate other{__shfl_xor_sync(0xffffffffu, c.value, offset),
                          __shfl_xor_sync(0xffffffffu, c.index, offset)};
    c = better_of(c, other);
  }
  return c;
}

// One block per row. Each thread scans a strided slice, then warps and the block reduce.
template <typename T, int kThreads>
__global__ void argmax_rows_kernel(const T* __restrict__ logits, int64_t row_stride,
                                   BitmaskRows token_bitmask, int32_t vocab,
                                   int32_t* __restrict__ out_tokens) {
  const LogitsRow<T> row = logits_row(logits, row_stride, token_bitmask, blockIdx.x);
  ArgmaxCandidate best{kNegInf, vocab};
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
    best = better_of(best, ArgmaxCandidate{row.raw(i), i});
  }
  best = warp_argmax(best);
  __shared__ ArgmaxCandidate per_warp[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) per_warp[warp] = best;
  __syncthreads();
  if (warp == 0) {
    best = lane < kThreads / 32 ? per_warp[lane] : ArgmaxCandidate{kNegInf, vocab};
    best = warp_argmax(best);
    // An all -inf row has no strictly better candidate than the sentinel: token 0.
    if (lane == 0) out_tokens[blockIdx.x] = best.index < vocab ? best.index : 0;
  }
}

}  // namespace tokensampler::cuda
