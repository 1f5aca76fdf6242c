// Argument checks shared by the CPU and CUDA kernels. TORCH_CHECK_VALUE / TORCH_CHECK_TYPE
// surface in Python as ValueError / TypeError naming the argument.
#pragma once

#include <ATen/ATen.h>

#include "tokensampler/slot_layout.h"

namespace tokensampler {

inline void check_logits(const at::Tensor& logits, const char* name = "logits") {
  TORCH_CHECK_TYPE(logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kHalf ||
                       logits.scalar_type() == at::kBFloat16,
                   name, " must be float32, float16 or bfloat16, got ", logits.scalar_type());
  TORCH_CHECK_VALUE(logits.dim() == 2, name, " must be 2-D [rows, vocab], got shape ",
                    logits.sizes());
  TORCH_CHECK_VALUE(logits.size(1) >= 1 && logits.size(1) <= (int64_t{1} << 20), name,
                    " vocab size ", logits.size(1), " is outside [1, 2^20]");
  TORCH_CHECK_VALUE(logits.stride(1) == 1, name, " rows must be contiguous");
}

inline void check_int32_vector(const at::Tensor& t, const char* name, int64_t min_numel,
                               const at::Device& device) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt, name, " must be int32, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 1 && t.numel() >= min_numel, name, " must be 1-D with at least ",
                    min_numel, " entries, got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.device() == device, name, " is on ", t.device(), ", expected ", device);
  TORCH_CHECK_VALUE(t.is_contiguous(), name, " must be contiguous");
}

// The slot table's layout: H and B are given, the prompt mask takes the rest of the width
// (the kernels read a prompt bit only below 32 * P, so any P >= 0 is memory-safe). Call after
// check_slot_table.
inline SlotLayout slot_layout_of(const at::Tensor& table, int64_t history_capacity,
                                 int64_t bias_capacity) {
  const auto prompt_words = table.size(1) - kScalarWords - 2 * history_capacity - 2 * bias_capacity;
  return SlotLayout{static_cast<int32_t>(history_capacity), static_cast<int32_t>(bias_capacity),
                    static_cast<int32_t>(prompt_words)};
}

inline void check_slot_table(const at::Tensor& table, int64_t history_capacity,
                                   int64_t bias_capacity, const at::Device& device) {
  TORCH_CHECK_TYPE(table.scalar_type() == at::kInt, "slot_table must be int32");
  TORCH_CHECK_VALUE(table.dim() == 2 && table.is_contiguous(), "slot_table must be 2-D contiguous");
  TORCH_CHECK_VALUE(history_capacity >= 0 && bias_capacity >= 0 &&
                        table.size(1) >= kScalarWords + 2 * history_capacity + 2 * bias_capacity,
                    "slot_table width ", table.size(1), " does not match history_capacity=",
                    history_capacity, ", bias_capacity=", bias_capacity);
  TORCH_CHECK_VALUE(table.device() == device, "slot_table is on ", table.device(),
                    ", expected ", device);
}

// The optional logprob outputs of sample_rows (CPU and CUDA).
inline void check_sample_rows_outputs(const at::Tensor& logits,
                                      const std::optional<at::Tensor>& out_logprobs,
                                      const std::optional<at::Tensor>& out_top_values,
                                      const std::optional<at::Tensor>& out_top_ids) {
  const int64_t rows = logits.size(0);
  if (out_logprobs) {
    TORCH_CHECK_TYPE(out_logprobs->scalar_type() == at::kFloat, "out_logprobs must be float32");
    TORCH_CHECK_VALUE(out_logprobs->is_contiguous() && out_logprobs->numel() >= rows &&
                          out_logprobs->device() == logits.device(),
                      "out_logprobs must be contiguous with ", rows, " rows on ", logits.device());
  }
  if (out_top_values) {
    TORCH_CHECK_VALUE(out_top_ids.has_value(), "out_top_ids is required with out_top_values");
    TORCH_CHECK_TYPE(out_top_values->scalar_type() == at::kFloat &&
                         out_top_ids->scalar_type() == at::kLong,
                     "out_top_values must be float32 and out_top_ids int64");
    TORCH_CHECK_VALUE(out_top_values->dim() == 2 && out_top_values->is_contiguous() &&
                          out_top_ids->is_contiguous() && out_top_values->size(0) >= rows &&
                          out_top_ids->numel() >= out_top_values->numel() &&
                          out_top_values->device() == logits.device() &&
                          out_top_ids->device() == logits.device(),
                      "out_top_values / out_top_ids must be contiguous [rows, N] on ",
                      logits.device());
  }
}

// Shared shape checks of sample_rows (CPU and CUDA).
inline void check_sample_rows_args(const at::Tensor& logits, const at::Tensor& req_pool_indices,
                                   const at::Tensor& valid_cache_lengths,
                                   const at::Tensor& slot_table, int64_t history_capacity,
                                   int64_t bias_capacity, int64_t tokens_per_req,
                                   const std::optional<at::Tensor>& candidates,
                                   const at::Tensor& out_tokens, const at::Tensor& out_invalid) {
  check_logits(logits);
  const auto device = logits.device();
  const int64_t rows = logits.size(0);
  TORCH_CHECK_VALUE(tokens_per_req >= 1 && rows % tokens_per_req == 0, "logits rows ", rows,
                    " is not a multiple of tokens_per_req=", tokens_per_req);
  const int64_t bs = rows / tokens_per_req;
  check_int32_vector(req_pool_indices, "req_pool_indices", bs, device);
  check_int32_vector(valid_cache_lengths, "valid_cache_lengths", slot_table.size(0), device);
  check_slot_table(slot_table, history_capacity, bias_capacity, device);
  check_int32_vector(out_tokens, "out_tokens", rows, device);
  TORCH_CHECK_TYPE(out_invalid.scalar_type() == at::kBool, "out_invalid must be bool");
  TORCH_CHECK_VALUE(out_invalid.numel() >= rows && out_invalid.device() == device &&
                        out_invalid.is_contiguous(),
                    "out_invalid must hold ", rows, " rows on ", device);
  if (candidates) {
    TORCH_CHECK_TYPE(candidates->scalar_type() == at::kInt, "candidates must be int32");
    TORCH_CHECK_VALUE(candidates->dim() == 2 && candidates->size(0) >= bs &&
                          candidates->size(1) == tokens_per_req && candidates->is_contiguous(),
                      "candidates must be contiguous [bs, ", tokens_per_req, "], got ",
                      candidates->sizes());
  }
}

}  // namespace tokensampler

namespace tokensampler {

// Shared checks of penalize_logits (CPU and CUDA).
inline void check_penalize_args(const at::Tensor& logits, const at::Tensor& req_pool_indices,
                                const at::Tensor& slot_table, int64_t history_capacity,
                                int64_t bias_capacity, int64_t tokens_per_req,
                                const std::optional<at::Tensor>& candidates,
                                const at::Tensor& out) {
  check_logits(logits);
  const auto device = logits.device();
  const int64_t rows = logits.size(0);
  TORCH_CHECK_VALUE(tokens_per_req >= 1 && rows % tokens_per_req == 0, "logits rows ", rows,
                    " is not a multiple of tokens_per_req=", tokens_per_req);
  check_int32_vector(req_pool_indices, "req_pool_indices", rows / tokens_per_req, device);
  check_slot_table(slot_table, history_capacity, bias_capacity, device);
  TORCH_CHECK_TYPE(out.scalar_type() == at::kFloat, "out must be float32");
  TORCH_CHECK_VALUE(out.sizes() == logits.sizes() && out.is_contiguous() && out.device() == device,
                    "out must be a contiguous float32 tensor shaped like logits");
  if (candidates) {
    TORCH_CHECK_TYPE(candidates->scalar_type() == at::kInt, "candidates must be int32");
    TORCH_CHECK_VALUE(candidates->dim() == 2 && candidates->size(1) == tokens_per_req &&
                          candidates->size(0) >= rows / tokens_per_req && candidates->is_contiguous(),
                      "candidates must be contiguous [bs, ", tokens_per_req, "]");
  }
}

}  // namespace tokensampler

namespace tokensampler {

// Shared checks of gumbel_noise (CPU and CUDA).
inline void check_gumbel_noise_args(const at::Tensor& seeds, const at::Tensor& positions,
                                    const at::Tensor& token_ids, const at::Tensor& out) {
  const auto device = token_ids.device();
  TORCH_CHECK_TYPE(seeds.scalar_type() == at::kLong && positions.scalar_type() == at::kLong,
                   "seeds and positions must be int64");
  TORCH_CHECK_TYPE(token_ids.scalar_type() == at::kInt, "token_ids must be int32");
  TORCH_CHECK_TYPE(out.scalar_type() == at::kFloat, "out must be float32");
  TORCH_CHECK_VALUE(token_ids.dim() == 2 && token_ids.is_contiguous(), "token_ids must be contiguous [rows, C]");
  const int64_t rows = token_ids.size(0);
  TORCH_CHECK_VALUE(seeds.dim() == 1 && seeds.numel() == rows && seeds.is_contiguous() &&
                        positions.dim() == 1 && positions.numel() == rows && positions.is_contiguous(),
                    "seeds and positions must be contiguous [", rows, "]");
  TORCH_CHECK_VALUE(out.sizes() == token_ids.sizes() && out.is_contiguous(),
                    "out must be contiguous and shaped like token_ids");
  TORCH_CHECK_VALUE(seeds.device() == device && positions.device() == device && out.device() == device,
                    "seeds, positions, token_ids and out must be on one device");
}

}  // namespace tokensampler

namespace tokensampler {

// Shared checks of verify_rejection (CPU and CUDA).
inline void check_verify_rejection_args(const at::Tensor& logits, const at::Tensor& req_pool_indices,
                                        const at::Tensor& valid_cache_lengths,
                                        const at::Tensor& slot_table, int64_t history_capacity,
                                        int64_t bias_capacity, const at::Tensor& candidates,
                                        const at::Tensor& draft_probs, const at::Tensor& out_predict,
                                        const at::Tensor& out_accept_length,
                                        const at::Tensor& out_invalid) {
  TORCH_CHECK_VALUE(candidates.dim() == 2, "candidates must be [bs, n], got ", candidates.sizes());
  const int64_t bs = candidates.size(0), n = candidates.size(1);
  check_sample_rows_args(logits, req_pool_indices, valid_cache_lengths, slot_table,
                         history_capacity, bias_capacity, n, candidates, out_predict, out_invalid);
  const int64_t V = logits.size(1);
  TORCH_CHECK_VALUE(draft_probs.dim() == 3 && draft_probs.size(0) == bs &&
                        draft_probs.size(1) == n - 1 && draft_probs.size(2) == V,
                    "draft_probs must be [bs, n-1, V] = [", bs, ", ", n - 1, ", ", V, "], got ",
                    draft_probs.sizes());
  TORCH_CHECK_VALUE(draft_probs.device() == logits.device(), "draft_probs is on ",
                    draft_probs.device(), ", expected ", logits.device());
  check_int32_vector(out_accept_length, "out_accept_length", bs, logits.device());
}

}  // namespace tokensampler
