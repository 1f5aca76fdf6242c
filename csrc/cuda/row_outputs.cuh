// Outputs of a row whose slot index is outside the pool, shared by every sampling kernel: the
// row is flagged and reads nothing, and its outputs are those of a row with no finite logit
// (token 0, logprob -inf, top-N values -inf with ids 0..N-1), never the previous call's.
#pragma once

#include <cstdint>

#include "tokensampler/row_rules.h"

namespace tokensampler::cuda {

// Called by every thread of the row's block (threads stride over the top-N entries).
__device__ __forceinline__ void write_unreadable_row(int64_t r, int32_t* out_tokens, bool* out_invalid,
                                                     float* out_logprobs, float* out_top_values,
                                                     int64_t* out_top_ids, int32_t top_n) {
  if (threadIdx.x == 0) {
    out_tokens[r] = 0;
    out_invalid[r] = true;
    if (out_logprobs != nullptr) out_logprobs[r] = kNegInf;
  }
  for (int32_t n = threadIdx.x; n < top_n; n += blockDim.x) {
    out_top_values[r * top_n + n] = kNegInf;
    out_top_ids[r * top_n + n] = n;
  }
}

}  // namespace tokensampler::cuda
