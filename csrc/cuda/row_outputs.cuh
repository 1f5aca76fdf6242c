// Outputs of a row whose slot index is outside the pool, shared by every sampling kernel: the
// row is flagged and reads nothing, and its outputs are those of a row with no finite logit
// (token 0, logprob -inf, top-N values -inf with ids 0..N-1), never the previous call's.
#pragma once

#include <cstdint>

#include "tokensampler/row_rules.h"

namespace tokensampler::cuda {

// Called by every thread of the row's block (thread 0 writes). The top-N of such a row are
// raw_logprobs_kernel.cuh's (write_unreadable_outputs).
__device__ __forceinline__ void write_unreadable_row(int64_t r, int32_t* out_tokens, bool* out_invalid,
                                                     float* out_logprobs) {
  if (threadIdx.x == 0) {
    out_tokens[r] = 0;
    out_invalid[r] = true;
    if (out_logprobs != nullptr) out_logprobs[r] = kNegInf;
  }
}

}  // namespace tokensampler::cuda
