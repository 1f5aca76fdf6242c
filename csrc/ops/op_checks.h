// Argument checks of every tokensampler op: the one source that the CPU kernels, the CUDA
// kernels and the Meta (fake) kernels of csrc/ops/schemas.cpp all call. TORCH_CHECK_VALUE /
// TORCH_CHECK_TYPE surface in Python as ValueError / TypeError naming the argument.
//
// Sizes are read as SymInts: on real tensors they are plain numbers, and when torch.compile
// traces an op with dynamic shapes the Meta kernel sees symbolic sizes, each condition on them
// becoming a guard of the compiled graph (`holds`).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/SymBool.h>
#include <c10/core/SymInt.h>

#include "cuda/workspace.h"
#include "tokensampler/route.h"
#include "tokensampler/row_rules.h"
#include "tokensampler/slot_layout.h"

namespace tokensampler {

inline bool holds(const c10::SymBool& condition) {
  return condition.expect_true(__FILE__, __LINE__);
}

inline bool same_sizes(const at::Tensor& a, const at::Tensor& b) {
  if (a.dim() != b.dim()) return false;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (!holds(a.sym_size(d) == b.sym_size(d))) return false;
  return true;
}

inline void check_logits(const at::Tensor& logits, const char* name = "logits") {
  TORCH_CHECK_TYPE(logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kHalf ||
                       logits.scalar_type() == at::kBFloat16,
                   name, " must be float32, float16 or bfloat16, got ", logits.scalar_type());
  TORCH_CHECK_VALUE(logits.dim() == 2, name, " must be 2-D [rows, vocab], got shape ",
                    logits.sym_sizes());
  const c10::SymInt vocab = logits.sym_size(1);
  TORCH_CHECK_VALUE(holds(vocab >= 1) && holds(vocab <= (int64_t{1} << 20)), name,
                    " vocab size ", vocab, " is outside [1, 2^20]");
  TORCH_CHECK_VALUE(holds(logits.sym_stride(1) == 1), name, " rows must be contiguous");
}

inline void check_vector(const at::Tensor& t, at::ScalarType dtype, const char* dtype_name,
                         const char* name, const c10::SymInt& min_numel, const at::Device& device) {
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, name, " must be ", dtype_name, ", got ",
                   t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 1 && holds(t.sym_numel() >= min_numel), name,
                    " must be 1-D with at least ", min_numel, " entries, got shape ",
                    t.sym_sizes());
  TORCH_CHECK_VALUE(t.device() == device, name, " is on ", t.device(), ", expected ", device);
  TORCH_CHECK_VALUE(holds(t.sym_is_contiguous()), name, " must be contiguous");
}

inline void check_int32_vector(const at::Tensor& t, const char* name, const c10::SymInt& min_numel,
                               const at::Device& device) {
  check_vector(t, at::kInt, "int32", name, min_numel, device);
}

// The slot table's layout: H and B are given, the prompt mask (between the bias list and the
// history, which ends the row) takes the rest of the width (the kernels read a prompt bit only
// below 32 * P, so any P >= 0 is memory-safe). Call after check_slot_table.
inline SlotLayout slot_layout_of(const at::Tensor& table, int64_t history_capacity,
                                 int64_t bias_capacity) {
  const auto prompt_words = table.size(1) - kScalarWords - 2 * history_capacity - 2 * bias_capacity;
  return SlotLayout{static_cast<int32_t>(history_capacity), static_cast<int32_t>(bias_capacity),
                    static_cast<int32_t>(prompt_words)};
}

inline void check_slot_table(const at::Tensor& table, int64_t history_capacity,
                             int64_t bias_capacity, const at::Device& device) {
  TORCH_CHECK_TYPE(table.scalar_type() == at::kInt, "slot_table must be int32");
  TORCH_CHECK_VALUE(table.dim() == 2 && holds(table.sym_is_contiguous()),
                    "slot_table must be 2-D contiguous");
  TORCH_CHECK_VALUE(history_capacity >= 0 && bias_capacity >= 0 &&
                        holds(table.sym_size(1) >=
                              kScalarWords + 2 * history_capacity + 2 * bias_capacity),
                    "slot_table width ", table.sym_size(1), " does not match history_capacity=",
                    history_capacity, ", bias_capacity=", bias_capacity);
  TORCH_CHECK_VALUE(table.device() == device, "slot_table is on ", table.device(),
                    ", expected ", device);
}

// candidates [bs, n] of a verify step (int32, contiguous, on `device`).
inline void check_candidates(const at::Tensor& candidates, const c10::SymInt& min_bs, int64_t n,
                             const at::Device& device) {
  TORCH_CHECK_TYPE(candidates.scalar_type() == at::kInt, "candidates must be int32");
  TORCH_CHECK_VALUE(candidates.dim() == 2 && holds(candidates.sym_size(0) >= min_bs) &&
                        holds(candidates.sym_size(1) == n) && holds(candidates.sym_is_contiguous()),
                    "candidates must be contiguous [bs, ", n, "], got ", candidates.sym_sizes());
  TORCH_CHECK_VALUE(candidates.device() == device, "candidates is on ", candidates.device(),
                    ", expected ", device);
}

// route: a Route value (tokensampler/route.h); max_top_k: the step's largest top-k, 0 if unknown.
inline void check_route(int64_t route, int64_t max_top_k) {
  TORCH_CHECK_VALUE(is_valid_route(route), "route=", route, " is not a Route value (0 .. ",
                    kRouteCount - 1, ")");
  TORCH_CHECK_VALUE(max_top_k >= 0, "max_top_k=", max_top_k, " must be >= 0 (0: unknown)");
}

// token_bitmask: int32 [rows, ceil(V / 32)] (DESIGN §3.0), one row per logits row, rows contiguous.
inline void check_token_bitmask(const std::optional<at::Tensor>& token_bitmask,
                                const at::Tensor& logits) {
  if (!token_bitmask) return;
  const at::Tensor& m = *token_bitmask;
  TORCH_CHECK_TYPE(m.scalar_type() == at::kInt, "token_bitmask must be int32, got ", m.scalar_type());
  const c10::SymInt words = (logits.sym_size(1) + 31) / 32;
  TORCH_CHECK_VALUE(m.dim() == 2 && holds(m.sym_size(0) == logits.sym_size(0)) &&
                        holds(m.sym_size(1) == words) && holds(m.sym_stride(1) == 1),
                    "token_bitmask must be [rows, ceil(vocab/32)] = [", logits.sym_size(0), ", ",
                    words, "] with contiguous rows, got ", m.sym_sizes());
  TORCH_CHECK_VALUE(m.device() == logits.device(), "token_bitmask is on ", m.device(),
                    ", expected ", logits.device());
}

// A checked token_bitmask as the kernels read it.
inline BitmaskRows bitmask_rows(const std::optional<at::Tensor>& token_bitmask) {
  if (!token_bitmask) return BitmaskRows{nullptr, 0};
  return BitmaskRows{token_bitmask->data_ptr<int32_t>(), token_bitmask->stride(0)};
}

inline void check_argmax_rows_args(const at::Tensor& logits, const at::Tensor& out_tokens,
                                   const std::optional<at::Tensor>& token_bitmask,
                                   const std::optional<at::Tensor>& out_invalid) {
  check_logits(logits);
  check_int32_vector(out_tokens, "out_tokens", logits.sym_size(0), logits.device());
  check_token_bitmask(token_bitmask, logits);
  if (out_invalid)
    check_vector(*out_invalid, at::kBool, "bool", "out_invalid", logits.sym_size(0), logits.device());
}

// The optional logprob outputs of sample_rows.
inline void check_sample_rows_outputs(const at::Tensor& logits,
                                      const std::optional<at::Tensor>& out_logprobs,
                                      const std::optional<at::Tensor>& out_top_values,
                                      const std::optional<at::Tensor>& out_top_ids) {
  const c10::SymInt rows = logits.sym_size(0);
  if (out_logprobs) {
    TORCH_CHECK_TYPE(out_logprobs->scalar_type() == at::kFloat, "out_logprobs must be float32");
    TORCH_CHECK_VALUE(holds(out_logprobs->sym_is_contiguous()) &&
                          holds(out_logprobs->sym_numel() >= rows) &&
                          out_logprobs->device() == logits.device(),
                      "out_logprobs must be contiguous with ", rows, " rows on ", logits.device());
  }
  if (out_top_values) {
    TORCH_CHECK_VALUE(out_top_ids.has_value(), "out_top_ids is required with out_top_values");
    TORCH_CHECK_TYPE(out_top_values->scalar_type() == at::kFloat &&
                         out_top_ids->scalar_type() == at::kLong,
                     "out_top_values must be float32 and out_top_ids int64");
    TORCH_CHECK_VALUE(out_top_values->dim() == 2 && holds(out_top_values->sym_is_contiguous()) &&
                          holds(out_top_ids->sym_is_contiguous()) &&
                          holds(out_top_values->sym_size(0) >= rows) &&
                          holds(out_top_ids->sym_numel() >= out_top_values->sym_numel()) &&
                          out_top_values->device() == logits.device() &&
                          out_top_ids->device() == logits.device(),
                      "out_top_values / out_top_ids must be contiguous [rows, N] on ",
                      logits.device());
    TORCH_CHECK_VALUE(holds(out_top_values->sym_size(1) <= logits.sym_size(1)),
                      "out_top_values has N = ", out_top_values->sym_size(1),
                      " columns, more than the ", logits.sym_size(1), " tokens of a row");
  }
}

// Rows come tokens_per_req to a request: returns the requests, rows / tokens_per_req.
inline c10::SymInt requests_of(const c10::SymInt& rows, int64_t tokens_per_req) {
  TORCH_CHECK_VALUE(tokens_per_req >= 1 && holds(rows % tokens_per_req == 0), "logits rows ",
                    rows, " is not a multiple of tokens_per_req=", tokens_per_req);
  return rows / tokens_per_req;
}

// raw_logprobs: tokens int32 [rows] and the logprob outputs sample_rows takes (with neither, the
// op writes nothing); req_pool_indices int32 [rows / tokens_per_req] at least.
inline void check_raw_logprobs_args(const at::Tensor& logits, const at::Tensor& tokens,
                                    const std::optional<at::Tensor>& out_logprobs,
                                    const std::optional<at::Tensor>& out_top_values,
                                    const std::optional<at::Tensor>& out_top_ids,
                                    const std::optional<at::Tensor>& token_bitmask,
                                    const std::optional<at::Tensor>& req_pool_indices,
                                    int64_t tokens_per_req, int64_t pool_rows) {
  check_logits(logits);
  check_int32_vector(tokens, "tokens", logits.sym_size(0), logits.device());
  check_sample_rows_outputs(logits, out_logprobs, out_top_values, out_top_ids);
  check_token_bitmask(token_bitmask, logits);
  if (!req_pool_indices) return;
  const c10::SymInt bs = requests_of(logits.sym_size(0), tokens_per_req);
  TORCH_CHECK_VALUE(pool_rows >= 0, "pool_rows must be >= 0, got ", pool_rows);
  check_int32_vector(*req_pool_indices, "req_pool_indices", bs, logits.device());
}

// The shared shape checks of sample_rows and verify_rejection.
inline void check_sample_rows_args(const at::Tensor& logits, const at::Tensor& req_pool_indices,
                                   const at::Tensor& valid_cache_lengths,
                                   const at::Tensor& slot_table, int64_t history_capacity,
                                   int64_t bias_capacity, int64_t tokens_per_req,
                                   const std::optional<at::Tensor>& candidates,
                                   const at::Tensor& out_tokens, const at::Tensor& out_invalid) {
  check_logits(logits);
  const auto device = logits.device();
  const c10::SymInt rows = logits.sym_size(0);
  const c10::SymInt bs = requests_of(rows, tokens_per_req);
  check_int32_vector(req_pool_indices, "req_pool_indices", bs, device);
  check_slot_table(slot_table, history_capacity, bias_capacity, device);
  check_int32_vector(valid_cache_lengths, "valid_cache_lengths", slot_table.sym_size(0), device);
  check_int32_vector(out_tokens, "out_tokens", rows, device);
  TORCH_CHECK_TYPE(out_invalid.scalar_type() == at::kBool, "out_invalid must be bool");
  TORCH_CHECK_VALUE(holds(out_invalid.sym_numel() >= rows) && out_invalid.device() == device &&
                        holds(out_invalid.sym_is_contiguous()),
                    "out_invalid must hold ", rows, " rows on ", device);
  if (candidates) check_candidates(*candidates, bs, tokens_per_req, device);
}

// The scratch of the CUDA multi-block paths (sample_rows, verify_rejection), read by them only;
// every kernel refuses a bad one.
inline void check_workspace(const std::optional<at::Tensor>& workspace, const at::Tensor& logits) {
  if (!workspace) return;
  const at::Tensor& w = *workspace;
  TORCH_CHECK_VALUE(w.scalar_type() == at::kByte && w.dim() == 1 &&
                        holds(w.sym_is_contiguous()) && w.device() == logits.device(),
                    "workspace must be a contiguous 1-D uint8 tensor on ", logits.device(),
                    ", got ", w.scalar_type(), " ", w.sym_sizes(), " on ", w.device());
  const c10::SymInt rows = logits.sym_size(0);
  const c10::SymInt needed = cuda::sample_rows_workspace_bytes(rows);
  TORCH_CHECK_VALUE(holds(w.sym_numel() >= needed), "workspace holds ", w.sym_numel(),
                    " bytes; a step of ", rows, " rows needs ", needed,
                    " (_C.sample_rows_workspace_bytes(rows))");
}

inline void check_sample_rows_call(
    const at::Tensor& logits, const at::Tensor& req_pool_indices,
    const at::Tensor& valid_cache_lengths, const at::Tensor& slot_table, int64_t history_capacity,
    int64_t bias_capacity, int64_t tokens_per_req, const std::optional<at::Tensor>& candidates,
    int64_t logprobs_mode, int64_t route, int64_t max_top_k, const at::Tensor& out_tokens,
    const at::Tensor& out_invalid, const std::optional<at::Tensor>& out_logprobs,
    const std::optional<at::Tensor>& out_top_values, const std::optional<at::Tensor>& out_top_ids,
    const std::optional<at::Tensor>& workspace, const std::optional<at::Tensor>& token_bitmask) {
  check_sample_rows_args(logits, req_pool_indices, valid_cache_lengths, slot_table,
                         history_capacity, bias_capacity, tokens_per_req, candidates, out_tokens,
                         out_invalid);
  check_sample_rows_outputs(logits, out_logprobs, out_top_values, out_top_ids);
  TORCH_CHECK_VALUE(logprobs_mode == 0 || logprobs_mode == 1, "logprobs_mode=", logprobs_mode,
                    " must be 0 (raw) or 1 (processed)");
  check_route(route, max_top_k);
  check_token_bitmask(token_bitmask, logits);
  check_workspace(workspace, logits);
}

inline void check_penalize_args(const at::Tensor& logits, const at::Tensor& req_pool_indices,
                                const at::Tensor& slot_table, int64_t history_capacity,
                                int64_t bias_capacity, int64_t tokens_per_req,
                                const std::optional<at::Tensor>& candidates,
                                const at::Tensor& out) {
  check_logits(logits);
  const auto device = logits.device();
  const c10::SymInt bs = requests_of(logits.sym_size(0), tokens_per_req);
  check_int32_vector(req_pool_indices, "req_pool_indices", bs, device);
  check_slot_table(slot_table, history_capacity, bias_capacity, device);
  TORCH_CHECK_TYPE(out.scalar_type() == at::kFloat, "out must be float32");
  TORCH_CHECK_VALUE(same_sizes(out, logits) && holds(out.sym_is_contiguous()) &&
                        out.device() == device,
                    "out must be a contiguous float32 tensor shaped like logits");
  if (candidates) check_candidates(*candidates, bs, tokens_per_req, device);
}

inline void check_min_p_threshold_args(const at::Tensor& z_max, const at::Tensor& min_p,
                                        const at::Tensor& out) {
  TORCH_CHECK_TYPE(z_max.scalar_type() == at::kFloat && min_p.scalar_type() == at::kFloat &&
                       out.scalar_type() == at::kFloat,
                   "z_max, min_p and out must be float32");
  TORCH_CHECK_VALUE(z_max.dim() == 1 && holds(z_max.sym_is_contiguous()) && same_sizes(min_p, z_max) &&
                        holds(min_p.sym_is_contiguous()) && same_sizes(out, z_max) &&
                        holds(out.sym_is_contiguous()),
                    "z_max, min_p and out must be contiguous [rows], got ", z_max.sym_sizes(), ", ",
                    min_p.sym_sizes(), ", ", out.sym_sizes());
  TORCH_CHECK_VALUE(min_p.device() == z_max.device() && out.device() == z_max.device(),
                    "z_max, min_p and out must be on one device");
}

inline void check_gumbel_noise_args(const at::Tensor& seeds, const at::Tensor& positions,
                                    const at::Tensor& token_ids, const at::Tensor& out) {
  const auto device = token_ids.device();
  TORCH_CHECK_TYPE(seeds.scalar_type() == at::kLong && positions.scalar_type() == at::kLong,
                   "seeds and positions must be int64");
  TORCH_CHECK_TYPE(token_ids.scalar_type() == at::kInt, "token_ids must be int32");
  TORCH_CHECK_TYPE(out.scalar_type() == at::kFloat, "out must be float32");
  TORCH_CHECK_VALUE(token_ids.dim() == 2 && holds(token_ids.sym_is_contiguous()),
                    "token_ids must be contiguous [rows, C]");
  const c10::SymInt rows = token_ids.sym_size(0);
  TORCH_CHECK_VALUE(seeds.dim() == 1 && holds(seeds.sym_numel() == rows) &&
                        holds(seeds.sym_is_contiguous()) && positions.dim() == 1 &&
                        holds(positions.sym_numel() == rows) && holds(positions.sym_is_contiguous()),
                    "seeds and positions must be contiguous [", rows, "]");
  TORCH_CHECK_VALUE(same_sizes(out, token_ids) && holds(out.sym_is_contiguous()),
                    "out must be contiguous and shaped like token_ids");
  TORCH_CHECK_VALUE(seeds.device() == device && positions.device() == device &&
                        out.device() == device,
                    "seeds, positions, token_ids and out must be on one device");
}

inline void check_verify_chain_args(const at::Tensor& candidates, const at::Tensor& target_tokens,
                                    const at::Tensor& out_predict,
                                    const at::Tensor& out_accept_length,
                                    const std::optional<at::Tensor>& target_invalid) {
  TORCH_CHECK_VALUE(candidates.dim() == 2, "candidates must be [bs, n], got ",
                    candidates.sym_sizes());
  const c10::SymInt bs = candidates.sym_size(0), n = candidates.sym_size(1);
  const auto device = candidates.device();
  TORCH_CHECK_TYPE(candidates.scalar_type() == at::kInt, "candidates must be int32, got ",
                   candidates.scalar_type());
  TORCH_CHECK_VALUE(holds(candidates.sym_is_contiguous()), "candidates must be contiguous");
  check_int32_vector(target_tokens, "target_tokens", bs * n, device);
  check_int32_vector(out_predict, "out_predict", bs * n, device);
  check_int32_vector(out_accept_length, "out_accept_length", bs, device);
  if (target_invalid)
    check_vector(*target_invalid, at::kBool, "bool", "target_invalid", bs * n, device);
}

inline void check_verify_rejection_args(
    const at::Tensor& logits, const at::Tensor& req_pool_indices,
    const at::Tensor& valid_cache_lengths, const at::Tensor& slot_table, int64_t history_capacity,
    int64_t bias_capacity, const at::Tensor& candidates, const at::Tensor& draft_probs,
    int64_t route, int64_t max_top_k, const at::Tensor& out_predict,
    const at::Tensor& out_accept_length, const at::Tensor& out_invalid,
    const std::optional<at::Tensor>& token_bitmask, const std::optional<at::Tensor>& workspace) {
  TORCH_CHECK_VALUE(candidates.dim() == 2, "candidates must be [bs, n], got ",
                    candidates.sym_sizes());
  // n sets the row grouping of every other argument: a compiled graph specialises on it.
  const int64_t n = candidates.sym_size(1).guard_int(__FILE__, __LINE__);
  const c10::SymInt bs = candidates.sym_size(0);
  check_sample_rows_args(logits, req_pool_indices, valid_cache_lengths, slot_table,
                         history_capacity, bias_capacity, n, candidates, out_predict, out_invalid);
  TORCH_CHECK_VALUE(holds(logits.sym_size(0) == bs * n), "logits must have bs * n = ", bs * n,
                    " rows, got ", logits.sym_size(0));
  TORCH_CHECK_TYPE(draft_probs.is_floating_point(), "draft_probs must be floating point, got ",
                   draft_probs.scalar_type());
  TORCH_CHECK_VALUE(draft_probs.dim() == 3 && holds(draft_probs.sym_size(0) == bs) &&
                        holds(draft_probs.sym_size(1) == n - 1) &&
                        holds(draft_probs.sym_size(2) == logits.sym_size(1)),
                    "draft_probs must be [bs, n-1, V] = [", bs, ", ", n - 1, ", ",
                    logits.sym_size(1), "], got ", draft_probs.sym_sizes());
  TORCH_CHECK_VALUE(draft_probs.device() == logits.device(), "draft_probs is on ",
                    draft_probs.device(), ", expected ", logits.device());
  check_int32_vector(out_accept_length, "out_accept_length", bs, logits.device());
  check_route(route, max_top_k);
  check_token_bitmask(token_bitmask, logits);
  check_workspace(workspace, logits);
}

inline void check_append_history_args(const at::Tensor& slot_table, int64_t history_capacity,
                                      int64_t bias_capacity, const at::Tensor& req_pool_indices,
                                      const at::Tensor& tokens, const at::Tensor& accept_length,
                                      int64_t tokens_per_req) {
  const auto device = slot_table.device();
  check_slot_table(slot_table, history_capacity, bias_capacity, device);
  TORCH_CHECK_VALUE(tokens_per_req >= 1, "tokens_per_req=", tokens_per_req, " must be >= 1");
  const c10::SymInt bs = accept_length.sym_numel();
  check_int32_vector(req_pool_indices, "req_pool_indices", bs, device);
  check_int32_vector(tokens, "tokens", bs * tokens_per_req, device);
  check_int32_vector(accept_length, "accept_length", bs, device);
}

}  // namespace tokensampler
