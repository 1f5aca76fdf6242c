// DESIGN §3.8 raw logprobs on CUDA: of given tokens (the raw_logprobs op) and each row's top N
// (the raw_logprobs op, and sample_rows' top logprobs after its sampling kernels). Kernels in
// raw_logprobs_kernel.cuh, launch code in raw_logprobs.cu.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "device_primitives.cuh"
#include "tokensampler/row_rules.h"

namespace tokensampler::cuda::raw_logprobs {

// A chunk's raw (max, sum-exp) of its finite values and its +inf count.
struct Partial {
  float m;
  float s;
  int32_t inf_count;
  int32_t unused;
};

struct Args {
  int64_t row_stride;
  BitmaskRows token_bitmask;  // DESIGN §3.0: disallowed tokens are -inf
  int32_t vocab;
  const int32_t* tokens;      // out_logprobs[r]: the raw logprob of tokens[r] (NaN outside [0, V))
  float* out_logprobs;        // null: no token logprobs
  float* out_top_values;      // [rows, top_n]
  int64_t* out_top_ids;
  int32_t top_n;
  // A row whose request's slot lies outside the pool (sample_rows; the op given
  // req_pool_indices) gets the outputs of a row with no finite logit without a read. Null:
  // every row readable.
  const int32_t* req_pool_indices;
  int32_t tokens_per_req;
  int64_t pool_rows;
  // Set by launch: rows cut into `splits` chunks of chunk_len tokens, and their scratch.
  int32_t splits;
  int32_t chunk_len;
  Partial* partials;     // [rows, splits]
  Candidate* chunk_top;  // [rows, splits, top_n]

  __device__ __forceinline__ bool readable(int64_t r) const {
    if (req_pool_indices == nullptr) return true;
    const int32_t slot = req_pool_indices[r / tokens_per_req];
    return slot >= 0 && slot < pool_rows;
  }
};

// Every field above `splits` from checked tensors: logprobs at `tokens` into out_logprobs where
// both are given, the top N into out_top_values / out_top_ids where given, and with
// req_pool_indices (a slot per tokens_per_req rows) rows of slots outside [0, pool_rows) unread.
Args args_of(const at::Tensor& logits, const std::optional<at::Tensor>& token_bitmask,
             const at::Tensor* tokens, const std::optional<at::Tensor>& out_logprobs,
             const std::optional<at::Tensor>& out_top_values,
             const std::optional<at::Tensor>& out_top_ids,
             const std::optional<at::Tensor>& req_pool_indices, int64_t tokens_per_req,
             int64_t pool_rows);

// Cuts the rows of `logits` into chunks (a few rows fill the GPU; N beyond kMaxSplitTopN keeps
// one chunk a row), takes the scratch from `workspace`'s sections when given (sample_rows' own,
// free again once its sampling kernels are done: the same stream) or from the caching
// allocator, and launches. Every field above `splits` must be set.
void launch(const at::Tensor& logits, Args a, const std::optional<at::Tensor>& workspace);

}  // namespace tokensampler::cuda::raw_logprobs
