// Row argmax (greedy sampling): NaN and tokens the grammar bitmask disallows count as -inf, ties
// go to the lowest token id. A row whose argmax is -inf is invalid (DESIGN §3.1).
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "device_primitives.cuh"
#include "logits_row.cuh"

namespace tokensampler::cuda {

// kCtas blocks per row, each scanning a slice of it: its threads four tokens at a time
// (for_each_raw: one vector load each), then warps and the block reduce. Small steps (argmax.cu)
// read each row with a thread-block cluster of up to 8 blocks (sm_90; one SM cannot stream a
// 608 KB row fast), whose first block merges the blocks' bests through distributed shared
// memory: no workspace, nothing left behind for graph replays.
template <typename T, int kThreads, int kCtas>
__global__ void __launch_bounds__(kThreads)
    argmax_rows_kernel(const T* __restrict__ logits, int64_t row_stride, BitmaskRows token_bitmask,
                       int32_t vocab, int32_t* __restrict__ out_tokens,
                       bool* __restrict__ out_invalid) {
  const int64_t r = blockIdx.x / kCtas;
  const int32_t part = static_cast<int32_t>(blockIdx.x % kCtas);
  // Slices of a multiple of 4 tokens, so each starts 16-byte aligned.
  const int32_t slice = (vocab + 4 * kCtas - 1) / (4 * kCtas) * 4;
  const int32_t begin = min(vocab, part * slice), end = min(vocab, begin + slice);
  const LogitsRow<T> row = logits_row(logits, row_stride, token_bitmask, r);
  Candidate best{kNegInf, vocab};
  for_each_raw<kThreads>(row, begin, end,
                         [&](int32_t i, float v) { best = best_of(best, Candidate{v, i}); });
  __shared__ Candidate per_warp[kThreads / 32];
  best = block_best<kThreads>(best, per_warp);
  if constexpr (kCtas > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    __shared__ Candidate block_result;
    if (threadIdx.x == 0) block_result = best;
    const cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every block's result is written
    if (part == 0 && threadIdx.x < 32) {
      Candidate c{kNegInf, vocab};
      if (threadIdx.x < kCtas)
        c = *cluster.map_shared_rank(&block_result, static_cast<unsigned>(threadIdx.x));
      best = warp_best(c);
    }
    cluster.sync();  // no block leaves while the first reads its shared memory
#else
    __trap();  // launched only where the kernel has sm_90 code (argmax.cu)
#endif
  }
  // An all -inf row ties the sentinel at id 0 or beats it: token 0 either way.
  if (part == 0 && threadIdx.x == 0) {
    out_tokens[r] = best.id < vocab ? best.id : 0;
    if (out_invalid != nullptr) out_invalid[r] = !(best.z > kNegInf);
  }
}

}  // namespace tokensampler::cuda
