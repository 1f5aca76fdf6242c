// The rows of a sampling step and the slots they read, as every sampling kernel takes them: the
// head of each path's kernel arguments (split_row::Args, sample.cu's and verify.cu's), filled on
// the host by step_rows_of (sample_rows_paths.h).
#pragma once

#include <cstdint>

#include "logits_row.cuh"
#include "tokensampler/row_rules.h"
#include "tokensampler/slot_layout.h"

namespace tokensampler::cuda {

struct StepRows {
  int64_t row_stride;
  BitmaskRows token_bitmask;  // DESIGN §3.0
  int32_t vocab;
  const int32_t* req_pool_indices;     // one slot per request (tokens_per_req rows)
  const int32_t* valid_cache_lengths;  // per slot
  const int32_t* slot_table;
  int64_t pool_rows;
  SlotLayout layout;
  int32_t tokens_per_req;

  template <bool kMasked = true, typename T>
  __device__ __forceinline__ LogitsRow<T, kMasked> row_of(const T* logits, int64_t r) const {
    return logits_row<kMasked>(logits, row_stride, token_bitmask, r);
  }
};

}  // namespace tokensampler::cuda
