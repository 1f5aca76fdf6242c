// The tokensampler operator library: schemas and Meta kernels. CPU kernels are registered in
// csrc/ops/*_cpu.cpp and CUDA kernels in csrc/cuda/*.cu under the same names.
//
// Every op writes into caller-owned outputs (`Tensor(a!)`) and returns nothing, so a backend
// allocates its buffers once at construction and the ops are safe to capture in CUDA graphs.
// Meta kernels have nothing to compute for such ops; they exist so torch.compile and fake
// tensors can trace a backend's step.
#include <torch/library.h>

namespace {

void argmax_rows_meta(const at::Tensor&, at::Tensor&) {}

void sample_rows_meta(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      int64_t, int64_t, int64_t, const std::optional<at::Tensor>&, bool, int64_t,
                      int64_t, at::Tensor&, at::Tensor&, const std::optional<at::Tensor>&,
                      const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                      const std::optional<at::Tensor>&) {}

void verify_chain_meta(const at::Tensor&, const at::Tensor&, at::Tensor&, at::Tensor&) {}

void verify_rejection_meta(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const at::Tensor&, int64_t, int64_t, const at::Tensor&,
                           const at::Tensor&, bool, int64_t, at::Tensor&, at::Tensor&,
                           at::Tensor&) {}

void penalize_logits_meta(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                          int64_t, int64_t, const std::optional<at::Tensor>&, int64_t,
                          at::Tensor&) {}

void gumbel_noise_meta(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                       at::Tensor&) {}

void append_history_meta(at::Tensor&, int64_t, int64_t, const at::Tensor&, const at::Tensor&,
                         const at::Tensor&, int64_t) {}

}  // namespace

TORCH_LIBRARY(tokensampler, m) {
  // Greedy: out_tokens[r] = argmax of row r (NaN as -inf, ties to the lowest id).
  m.def("argmax_rows(Tensor logits, Tensor(a!) out_tokens) -> ()");
  // DESIGN §3 for each logits row r: request b = r // tokens_per_req, j = r % tokens_per_req,
  // slot req_pool_indices[b], position valid_cache_lengths[slot] + j. With candidates, row j
  // sees drafts candidates[b, 1..j] in its penalty history. route is a hint that selects a
  // kernel: low 8 bits the step's route (Route in slot_params.h, which must cover the filters
  // the rows use), higher bits the step's largest top-k (0: unknown). It never changes tokens.
  // workspace: scratch of the CUDA multi-block paths (uint8, _C.sample_rows_workspace_bytes of
  // the step's rows or more), allocated once by the caller and ZEROED once (torch.zeros): it
  // holds the single-launch kernel's per-row tickets, which every launch leaves at zero again.
  // Without it they allocate (and zero the tickets) per step. One stream at a time.
  m.def(
      "sample_rows(Tensor logits, Tensor req_pool_indices, Tensor valid_cache_lengths, "
      "Tensor slot_table, int history_capacity, int bias_capacity, int tokens_per_req, "
      "Tensor? candidates, bool apply_penalties, int logprobs_mode, int route, "
      "Tensor(a!) out_tokens, Tensor(b!) out_invalid, Tensor(c!)? out_logprobs, "
      "Tensor(d!)? out_top_values, Tensor(e!)? out_top_ids, Tensor(f!)? workspace=None) -> ()");
  // DESIGN §4 target-sampled chain matching over candidates [bs, n] and target tokens [bs*n].
  m.def(
      "verify_chain(Tensor candidates, Tensor target_tokens, Tensor(a!) out_predict, "
      "Tensor(b!) out_accept_length) -> ()");
  // DESIGN §4 lossless rejection sampling with draft probabilities [bs, n-1, V].
  m.def(
      "verify_rejection(Tensor logits, Tensor req_pool_indices, Tensor valid_cache_lengths, "
      "Tensor slot_table, int history_capacity, int bias_capacity, Tensor candidates, "
      "Tensor draft_probs, bool apply_penalties, int route, Tensor(a!) out_predict, "
      "Tensor(b!) out_accept_length, Tensor(c!) out_invalid) -> ()");
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
  // Adds the first accept_length[b] tokens of tokens[b*n : b*n+n] to slot b's output history.
  m.def(
      "append_history(Tensor(a!) slot_table, int history_capacity, int bias_capacity, "
      "Tensor req_pool_indices, Tensor tokens, Tensor accept_length, int tokens_per_req) -> ()");
}

TORCH_LIBRARY_IMPL(tokensampler, Meta, m) {
  m.impl("argmax_rows", &argmax_rows_meta);
  m.impl("sample_rows", &sample_rows_meta);
  m.impl("verify_chain", &verify_chain_meta);
  m.impl("verify_rejection", &verify_rejection_meta);
  m.impl("penalize_logits", &penalize_logits_meta);
  m.impl("gumbel_noise", &gumbel_noise_meta);
  m.impl("append_history", &append_history_meta);
}
