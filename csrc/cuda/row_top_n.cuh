// The top-N raw values of one logits row (DESIGN §3.8's top logprobs), shared by the one-block
// sampling kernel (sample.cu) and raw_logprobs: rank order is value descending, ties to the
// lower id, NaN and disallowed tokens -inf, so a row with fewer than N larger values goes on
// through its -inf ids in order (the CPU kernels' top_raw_logprobs).
#pragma once

#include <cuda_runtime.h>

#include "device_primitives.cuh"
#include "logits_row.cuh"

namespace tokensampler::cuda {

// One block argmax per rank over the values ranked after the rank before (every thread of the
// block calls it): reduce(c) is the block's best of c, emit(rank, best) runs on every thread.
template <typename T, bool kMasked, typename Reduce, typename Emit>
__device__ void for_each_top_raw(const LogitsRow<T, kMasked>& x, int32_t vocab, int32_t n,
                                 int threads, Reduce&& reduce, Emit&& emit) {
  Candidate prev{0.0f, -1};
  for (int32_t rank = 0; rank < n; ++rank) {
    Candidate best{kNegInf, kNoId};
    for (int32_t i = threadIdx.x; i < vocab; i += threads) {
      const float v = x.raw(i);
      if (prev.id >= 0 && !ranks_before(prev.z, prev.id, v, i)) continue;
      best = best_of(best, Candidate{v, i});
    }
    best = reduce(best);
    if (best.id >= vocab) best.id = 0;
    emit(rank, best);
    prev = best;
  }
}

}  // namespace tokensampler::cuda
