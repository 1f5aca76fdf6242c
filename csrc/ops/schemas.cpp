// The tokensampler operator library: schemas, Meta (fake) kernels and the autograd
// kernel. CPU kernels are registered in csrc/ops/*_cpu.cpp and CUDA kernels in
// csrc/cuda/*.cu under the same names.
//
// Every op writes into caller-owned outputs (`Tensor(a!)`) and returns nothing, so a backend
// allocates its buffers once at construction and the ops are safe to capture in CUDA graphs.
// The Meta kernels have nothing to compute; they run the very argument checks of the real
// kernels (op_checks.h), so torch.compile and fake tensors refuse what the kernels would.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <vector>

#include "op_checks.h"

namespace tokensampler {

namespace {

void argmax_rows_meta(const at::Tensor& logits, at::Tensor& out_tokens,
                      const std::optional<at::Tensor>& token_bitmask,
                      const std::optional<at::Tensor>& out_invalid) {
  check_argmax_rows_args(logits, out_tokens, token_bitmask, out_invalid);
}

void sample_rows_meta(const at::Tensor& logits, const at::Tensor& req_pool_indices,
                      const at::Tensor& valid_cache_lengths, const at::Tensor& slot_table,
                      int64_t history_capacity, int64_t bias_capacity, int64_t tokens_per_req,
                      const std::optional<at::Tensor>& candidates, bool /*apply_penalties*/,
                      int64_t logprobs_mode, int64_t route, int64_t max_top_k,
                      at::Tensor& out_tokens, at::Tensor& out_invalid,
                      const std::optional<at::Tensor>& out_logprobs,
                      const std::optional<at::Tensor>& out_top_values,
                      const std::optional<at::Tensor>& out_top_ids,
                      const std::optional<at::Tensor>& workspace,
                      const std::optional<at::Tensor>& token_bitmask) {
  check_sample_rows_call(logits, req_pool_indices, valid_cache_lengths, slot_table,
                         history_capacity, bias_capacity, tokens_per_req, candidates,
                         logprobs_mode, route, max_top_k, out_tokens, out_invalid, out_logprobs,
                         out_top_values, out_top_ids, workspace, token_bitmask);
}

void verify_chain_meta(const at::Tensor& candidates, const at::Tensor& target_tokens,
                       at::Tensor& out_predict, at::Tensor& out_accept_length,
                       const std::optional<at::Tensor>& target_invalid) {
  check_verify_chain_args(candidates, target_tokens, out_predict, out_accept_length,
                          target_invalid);
}

void verify_rejection_meta(const at::Tensor& logits, const at::Tensor& req_pool_indices,
                           const at::Tensor& valid_cache_lengths, const at::Tensor& slot_table,
                           int64_t history_capacity, int64_t bias_capacity,
                           const at::Tensor& candidates, const at::Tensor& draft_probs,
                           bool /*apply_penalties*/, int64_t route, int64_t max_top_k,
                           at::Tensor& out_predict, at::Tensor& out_accept_length,
                           at::Tensor& out_invalid,
                           const std::optional<at::Tensor>& token_bitmask,
                           const std::optional<at::Tensor>& workspace) {
  check_verify_rejection_args(logits, req_pool_indices, valid_cache_lengths, slot_table,
                              history_capacity, bias_capacity, candidates, draft_probs, route,
                              max_top_k, out_predict, out_accept_length, out_invalid,
                              token_bitmask, workspace);
}

void penalize_logits_meta(const at::Tensor& logits, const at::Tensor& req_pool_indices,
                          const at::Tensor& slot_table, int64_t history_capacity,
                          int64_t bias_capacity, int64_t tokens_per_req,
                          const std::optional<at::Tensor>& candidates, int64_t /*vocab_offset*/,
                          at::Tensor& out) {
  check_penalize_args(logits, req_pool_indices, slot_table, history_capacity, bias_capacity,
                      tokens_per_req, candidates, out);
}

void raw_logprobs_meta(const at::Tensor& logits, const at::Tensor& tokens,
                       const std::optional<at::Tensor>& out_logprobs,
                       const std::optional<at::Tensor>& out_top_values,
                       const std::optional<at::Tensor>& out_top_ids,
                       const std::optional<at::Tensor>& token_bitmask,
                       const std::optional<at::Tensor>& req_pool_indices, int64_t tokens_per_req,
                       int64_t pool_rows) {
  check_raw_logprobs_args(logits, tokens, out_logprobs, out_top_values, out_top_ids, token_bitmask,
                          req_pool_indices, tokens_per_req, pool_rows);
}

void min_p_threshold_meta(const at::Tensor& z_max, const at::Tensor& min_p, at::Tensor& out) {
  check_min_p_threshold_args(z_max, min_p, out);
}

void gumbel_noise_meta(const at::Tensor& seeds, const at::Tensor& positions,
                       const at::Tensor& token_ids, int64_t /*stream*/, at::Tensor& out) {
  check_gumbel_noise_args(seeds, positions, token_ids, out);
}

void append_history_meta(at::Tensor& slot_table, int64_t history_capacity, int64_t bias_capacity,
                         const at::Tensor& req_pool_indices, const at::Tensor& tokens,
                         const at::Tensor& accept_length, int64_t tokens_per_req) {
  check_append_history_args(slot_table, history_capacity, bias_capacity, req_pool_indices, tokens,
                            accept_length, tokens_per_req);
}

// Autograd kernel of every op. They are not differentiable (tokens are discrete; the logprob
// outputs are reported, not trained through), so the op runs below autograd and records
// nothing, as torch.argmax does. What it writes gets its version counter bumped, as any in-place
// op's, so autograd still notices a tensor it saved being overwritten.
void below_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                    torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  const size_t first = stack->size() - arguments.size();
  std::vector<at::Tensor> written;
  for (size_t i = 0; i < arguments.size(); ++i) {
    const auto* alias = arguments[i].alias_info();
    const c10::IValue& value = (*stack)[first + i];
    if (alias != nullptr && alias->isWrite() && value.isTensor()) written.push_back(value.toTensor());
  }
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  for (const at::Tensor& t : written)
    if (!t.is_inference()) torch::autograd::impl::bump_version(t);
}

constexpr const char* kOps[] = {"argmax_rows",      "sample_rows",     "verify_chain",
                                "verify_rejection", "penalize_logits", "gumbel_noise",
                                "min_p_threshold",  "append_history",  "raw_logprobs"};

}  // namespace

}  // namespace tokensampler

TORCH_LIBRARY(tokensampler, m) {
  // Greedy: out_tokens[r] = argmax of row r (NaN as -inf, ties to the lowest id); with
  // out_invalid, out_invalid[r] = row r has no allowed finite or +inf entry (DESIGN §3.1: its
  // argmax, token 0, is -inf).
  // token_bitmask (every op that reads logits): int32 [rows, ceil(V/32)], the grammar mask of
  // DESIGN §3.0 in xgrammar's layout; a token whose bit is 0 counts as -inf before anything
  // else reads it, raw logprobs included.
  m.def("argmax_rows(Tensor logits, Tensor(a!) out_tokens, Tensor? token_bitmask=None, "
        "Tensor(b!)? out_invalid=None) -> ()");
  // DESIGN §3 for each logits row r: request b = r // tokens_per_req, j = r % tokens_per_req,
  // slot req_pool_indices[b], position valid_cache_lengths[slot] + j. With candidates, row j
  // sees drafts candidates[b, 1..j] in its penalty history. logprobs_mode: 0 raw, 1 processed.
  // route (a Route value, tokensampler/route.h, which must cover the filters the rows use) and
  // max_top_k (the step's largest top-k; 0: unknown) select a CUDA kernel; they never change
  // tokens. workspace: scratch of the CUDA multi-block paths (uint8,
  // _C.sample_rows_workspace_bytes of the step's rows or more), allocated once by the caller
  // and ZEROED once (torch.zeros): it holds the single-launch kernel's per-row tickets, which
  // every launch leaves at zero again. Without it they allocate (and zero the tickets) per
  // step. One stream at a time.
  m.def(
      "sample_rows(Tensor logits, Tensor req_pool_indices, Tensor valid_cache_lengths, "
      "Tensor slot_table, int history_capacity, int bias_capacity, int tokens_per_req, "
      "Tensor? candidates, bool apply_penalties, int logprobs_mode, int route, int max_top_k, "
      "Tensor(a!) out_tokens, Tensor(b!) out_invalid, Tensor(c!)? out_logprobs, "
      "Tensor(d!)? out_top_values, Tensor(e!)? out_top_ids, Tensor(f!)? workspace=None, "
      "Tensor? token_bitmask=None) -> ()");
  // DESIGN §4 target-sampled chain matching over candidates [bs, n] and target tokens [bs*n];
  // target_invalid (bool [bs*n], the sampler's invalid_rows) ends a chain at an invalid row.
  m.def(
      "verify_chain(Tensor candidates, Tensor target_tokens, Tensor(a!) out_predict, "
      "Tensor(b!) out_accept_length, Tensor? target_invalid=None) -> ()");
  // DESIGN §4 lossless rejection sampling with draft probabilities [bs, n-1, V]; route,
  // max_top_k and workspace (for bs * n rows) as in sample_rows.
  m.def(
      "verify_rejection(Tensor logits, Tensor req_pool_indices, Tensor valid_cache_lengths, "
      "Tensor slot_table, int history_capacity, int bias_capacity, Tensor candidates, "
      "Tensor draft_probs, bool apply_penalties, int route, int max_top_k, "
      "Tensor(a!) out_predict, Tensor(b!) out_accept_length, Tensor(c!) out_invalid, "
      "Tensor? token_bitmask=None, Tensor(d!)? workspace=None) -> ()");
  // DESIGN §3.1–3.4 alone: out = the processed logits (fp32) of every row, i.e. what the
  // filters of sample_rows see before temperature. Used by backends that sample elsewhere
  // (flashinfer_full) so their processed logits are identical to gumbel_full's. The columns
  // may be a vocabulary shard starting at token vocab_offset (vocab-parallel sampling).
  m.def(
      "penalize_logits(Tensor logits, Tensor req_pool_indices, Tensor slot_table, "
      "int history_capacity, int bias_capacity, int tokens_per_req, Tensor? candidates, "
      "int vocab_offset, Tensor(a!) out) -> ()");
  // Gumbel noise G(seed[r], position[r], token_ids[r, c]) of DESIGN §3.7 for given tokens:
  // lets code outside the kernels (vocab-parallel sampling) reproduce the kernels' scores.
  m.def(
      "gumbel_noise(Tensor seeds, Tensor positions, Tensor token_ids, int stream, "
      "Tensor(a!) out) -> ()");
  // The min-p threshold of DESIGN §3.6 per row, out[r] = z_max[r] + ln(min_p[r]) (-inf where
  // min_p[r] <= 0) in the kernels' own arithmetic (portable_log, one fp32 add), for code
  // outside them (vocab-parallel sampling) that must keep exactly the tokens they keep.
  m.def("min_p_threshold(Tensor z_max, Tensor min_p, Tensor(a!) out) -> ()");
  // DESIGN §3.8 raw logprobs of given tokens, for code that samples without the sampling
  // kernels (rejection verify, the FlashInfer adapters): out_logprobs[r] = the raw log-softmax
  // of row r at tokens[r] (NaN where tokens[r] is outside [0, V): the row emitted no token) and
  // the row's top-N (values, ids) in rank order, by the sampling kernels' rule (+inf rows, no
  // finite logit, ties to the lower id). One read of each row. With req_pool_indices (one slot
  // per tokens_per_req rows), a row whose slot lies outside [0, pool_rows) is not read: it gets
  // a row's outputs with no finite logit (-inf at its token, top-N -inf at ids 0..N-1), as the
  // sampling kernels write them (DESIGN §5).
  m.def(
      "raw_logprobs(Tensor logits, Tensor tokens, Tensor(a!)? out_logprobs, "
      "Tensor(b!)? out_top_values, Tensor(c!)? out_top_ids, Tensor? token_bitmask=None, "
      "Tensor? req_pool_indices=None, int tokens_per_req=1, int pool_rows=0) -> ()");
  // Adds the first accept_length[b] tokens of tokens[b*n : b*n+n] to slot b's output history.
  m.def(
      "append_history(Tensor(a!) slot_table, int history_capacity, int bias_capacity, "
      "Tensor req_pool_indices, Tensor tokens, Tensor accept_length, int tokens_per_req) -> ()");
}

TORCH_LIBRARY_IMPL(tokensampler, Meta, m) {
  using namespace tokensampler;
  m.impl("argmax_rows", &argmax_rows_meta);
  m.impl("sample_rows", &sample_rows_meta);
  m.impl("verify_chain", &verify_chain_meta);
  m.impl("verify_rejection", &verify_rejection_meta);
  m.impl("penalize_logits", &penalize_logits_meta);
  m.impl("gumbel_noise", &gumbel_noise_meta);
  m.impl("min_p_threshold", &min_p_threshold_meta);
  m.impl("append_history", &append_history_meta);
  m.impl("raw_logprobs", &raw_logprobs_meta);
}

TORCH_LIBRARY_IMPL(tokensampler, Autograd, m) {
  for (const char* op : tokensampler::kOps)
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&tokensampler::below_autograd>());
}
