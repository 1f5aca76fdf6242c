// The CPU row pipeline: DESIGN §3 for one logits row, written for clarity. It is the
// executable specification the CUDA kernels are tested against.
#pragma once

#include <cstdint>
#include <vector>

#include "tokensampler/slot_layout.h"

namespace tokensampler::cpu {

// Everything the kernels need to know about one row.
struct RowContext {
  SlotRow slot;
  int64_t position;            // t (+ j for verify row j)
  int32_t vocab;
  const int32_t* drafts;       // candidates[b, 1..j]: tokens before this verify row, or null
  int32_t num_drafts;
  bool apply_penalties;
  int32_t vocab_offset = 0;    // first token id of the row's columns (vocab-parallel shards)
  const int32_t* allowed = nullptr;  // the row's grammar bitmask (§3.0), or null: all allowed
};

// The filtered distribution of one row.
struct RowDistribution {
  std::vector<float> raw;          // §3.0–3.1 output (masked, NaN -> -inf), for raw logprobs
  std::vector<float> processed;    // l after §3.2–3.4
  std::vector<int32_t> kept;       // kept token ids: rank order with top-k, else id order
                                   // (greedy: the argmax; +inf rows: the +inf ids)
  std::vector<float> kept_z;       // z of each kept token (+inf rows: 0, i.e. uniform)
  bool greedy = false;
  bool invalid = false;            // no finite and no +inf entry
};

// §3.0–3.1 for a row: the grammar bitmask (`allowed`, or null) and NaN -> -inf.
std::vector<float> read_raw_row(const float* logits, const int32_t* allowed, int32_t vocab);

// Steps 1–4 in place: NaN -> -inf, then repetition / frequency / presence penalties and bias
// for the tokens of the slot's history, this row's drafts and the bias list.
void penalize_row(float* l, const RowContext& ctx);

// Builds the row's kept set (steps 1–6).
RowDistribution filter_row(const float* logits, const RowContext& ctx);

// Step 7: the Gumbel-max sample over the kept set; token 0 for invalid rows.
int32_t sample_kept(const RowDistribution& dist, const RowContext& ctx);

// Probabilities of the kept tokens (softmax of kept_z; one-hot for greedy rows).
std::vector<double> kept_probabilities(const RowDistribution& dist);

// §4: the target probabilities rejection sampling compares with the draft's, from integer
// top-p masses (row_rules.h), as the CUDA kernel computes them.
std::vector<double> rejection_probabilities(const RowDistribution& dist);

// §3.8: the raw row's log-softmax as its max m and the log of sum exp(x - m) (a logprob is
// (x - m) - log_sum, never x - (m + log_sum), which loses log_sum next to a huge m: logits of
// 1e17), and its +inf count (a row with +inf entries spreads its mass over them). Computed once
// a row for every raw logprob of it.
struct RawNormalizer {
  float max;
  double log_sum;     // unused when max is ±inf
  int64_t inf_count;  // read when max is +inf
};
RawNormalizer raw_log_normalizer(const RowDistribution& dist);

// §3.8: log-softmax of the raw logits at `token`.
float raw_logprob(const RowDistribution& dist, const RawNormalizer& norm, int32_t token);

// §3.8 processed mode: log-probability of `token` under the kept distribution; 0 for greedy.
float processed_logprob(const RowDistribution& dist, int32_t token);

// The n largest raw log-softmax values and their ids, in rank order.
void top_raw_logprobs(const RowDistribution& dist, const RawNormalizer& norm, int32_t n,
                      float* values, int64_t* ids);

}  // namespace tokensampler::cpu
