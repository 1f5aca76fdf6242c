// The per-row rules of DESIGN §3 that every kernel, CPU or CUDA, applies the same way.
#pragma once

#include <cmath>

#include "tokensampler/rng.h"

namespace tokensampler {

constexpr float kNegInf = -INFINITY;

// §3.1: NaN counts as -inf.
TS_HD float sanitize_logit(float x) { return x != x ? kNegInf : x; }

// §3.0: bit i % 32 of word i / 32 of a row of a grammar's token bitmask (xgrammar / llguidance
// layout) allows token i; a row without a bitmask (null) allows every token.
TS_HD bool token_allowed(const int32_t* allowed_bits, int32_t i) {
  return allowed_bits == nullptr || ((static_cast<uint32_t>(allowed_bits[i >> 5]) >> (i & 31)) & 1u);
}

// §3.0: a grammar's token bitmask as every kernel, CPU or CUDA, is given it: int32
// [rows, ceil(V / 32)] with contiguous rows, or none (words null).
struct BitmaskRows {
  const int32_t* words;
  int64_t stride;  // words from one row to the next

  // Row r's bits, or null (every token allowed) without a bitmask.
  TS_HD const int32_t* row(int64_t r) const { return words ? words + r * stride : nullptr; }
};

// §3.0 then §3.1: the logit every later rule, raw logprobs included, starts from.
TS_HD float read_logit(float x, const int32_t* allowed_bits, int32_t i) {
  return token_allowed(allowed_bits, i) ? sanitize_logit(x) : kNegInf;
}

// True when a row's k disables top-k: -1 (or any k <= 0) and k >= V.
TS_HD bool top_k_disabled(int32_t k, int32_t vocab) { return k <= 0 || k >= vocab; }

// §3.5: temperature 0 or top_k 1 is greedy.
TS_HD bool is_greedy_row(float temperature, int32_t top_k) {
  return temperature <= 0.0f || top_k == 1;
}

// §3.2–3.4 for one token: repetition penalty if the token is in the slot's history,
// frequency and presence over its output count, then the bias. ±inf stays ±inf; a bias of the
// opposite infinity (NaN) bans the token, as §3.1 treats NaN.
TS_HD float penalized_logit(float l, bool in_history, int32_t output_count, float repetition,
                            float frequency, float presence, float bias) {
  if (in_history && repetition != 1.0f) l = l > 0.0f ? f_div(l, repetition) : f_mul(l, repetition);
  if (output_count > 0) {
    l = f_sub(l, f_add(f_mul(frequency, static_cast<float>(output_count)), presence));
  }
  return sanitize_logit(f_add(l, bias));
}

// Order used by top-k, top-p and every tie rule: a precedes b when its value is larger, or
// equal with a lower token id.
TS_HD bool ranks_before(float za, int32_t ia, float zb, int32_t ib) {
  return za > zb || (za == zb && ia < ib);
}

// §4: a draft probability as verify reads it: NaN as 0, clamped to [0, 1], so no input can
// accept a draft the target gives probability 0.
TS_HD float draft_probability(float q) { return q > 0.0f ? (q < 1.0f ? q : 1.0f) : 0.0f; }

// §3.6: z = l / T.
TS_HD float scaled_logit(float l, float temperature) { return f_div(l, temperature); }

// §3.6 top-p masses: a token's mass is the integer floor(2^32 e^(z - z_max)) (portable_exp,
// 0 more than 23 nats down), so sums are exact in any order and every kernel, CPU or CUDA,
// finds the same cut. A token is kept while the mass before it (rank order) is below
// top_p_limit, p times the set's total rounded up to an integer, exactly.
TS_HD uint64_t top_p_mass(float z, float z_max) {
  const float d = f_sub(z, z_max);
  if (!(d > -23.0f)) return 0;
  return static_cast<uint64_t>(f_mul(portable_exp(d), 4294967296.0f));
}

// p in (0, 1) is a float m 2^-k (an integer m < 2^24, k >= 24), so ceil(p * total) is a 128-bit
// product shifted with rounding up: exact where a double product (53 bits) rounds once the
// total passes ~2^40 (V above 256 tokens of equal mass).
TS_HD uint64_t top_p_limit(float top_p, uint64_t total) {
  if (!(top_p > 0.0f)) return 0;
  if (top_p >= 1.0f) return total;
  const uint32_t bits = float_bits(top_p), biased = bits >> 23;
  const uint64_t m = biased == 0 ? bits : (bits & 0x7FFFFFu) | 0x800000u;
  const int k = biased == 0 ? 149 : 150 - static_cast<int>(biased);
  const unsigned __int128 product = static_cast<unsigned __int128>(m) * total;
  if (k >= 100) return product != 0;  // product < 2^88: a positive quotient below 1
  return static_cast<uint64_t>((product + ((static_cast<unsigned __int128>(1) << k) - 1)) >> k);
}

// §3.1 with top-p: the m +inf entries of a +inf row share its mass evenly, so top-p keeps the
// first ceil(p * m) of them, at least one: the rule above with a mass of 1 each (the same count
// as for m tied finite tokens, whose masses are 2^32 each).
TS_HD int32_t inf_row_top_p_count(float top_p, int32_t m) {
  const uint64_t limit = top_p_limit(top_p, static_cast<uint64_t>(m));
  return limit < 1 ? 1 : limit > static_cast<uint64_t>(m) ? m : static_cast<int32_t>(limit);
}

// §4 target-sampled chain matching of one request: cand and y its n candidates and target
// tokens, invalid its rows' invalid flags (or null). Draft j >= 1 is accepted while every earlier
// one was, row j - 1 is valid (an invalid row's token 0 ends the chain, as in rejection
// sampling) and cand[j] == y[j - 1]. Returns the accept length (bonus included).
TS_HD int32_t chain_accept_length(const int32_t* cand, const int32_t* y, const bool* invalid,
                                  int64_t n) {
  int64_t accepted = 0;
  while (accepted + 1 < n && !(invalid && invalid[accepted]) && cand[accepted + 1] == y[accepted])
    ++accepted;
  return static_cast<int32_t>(accepted + 1);
}

// §4 rejection sampling: a kept token's target probability is its top-p mass over the kept set's
// total (one double division), and a positive residual p - q weighs its Gumbel draw by
// portable_log, so CPU and CUDA accept and resample identically. (p >= 2^-55 and q is a float, so
// a positive residual is at least 2^-107: a normal float.)
TS_HD double kept_probability(uint64_t mass, uint64_t kept_total) {
  return static_cast<double>(mass) / static_cast<double>(kept_total);
}

TS_HD float residual_log_weight(double residual) { return portable_log(static_cast<float>(residual)); }

// §4's accept test, the one every verify kernel runs: the draft stays when coin * q(draft) <
// p(draft), coin the position's uniform and q as draft_probability reads it.
TS_HD bool draft_accepted(uint64_t seed, int64_t position, float q_draft, double p_draft) {
  const double coin = uniform_coin(seed, position, kStreamAcceptCoin);
  return coin * static_cast<double>(draft_probability(q_draft)) < p_draft;
}

// §4's residual draw: a kept token of target probability p and draft probability q scores
// log(p - q) plus its residual noise where p - q > 0 (true, into `score`); elsewhere it takes no
// part (false).
TS_HD bool residual_score(double p, float q, uint64_t seed, int64_t position, int32_t token,
                          float& score) {
  const double residual = p - static_cast<double>(draft_probability(q));
  if (!(residual > 0.0)) return false;
  score = f_add(residual_log_weight(residual), gumbel_noise(seed, position, token, kStreamResidual));
  return true;
}

// §3.6 min-p threshold on z: keep z >= z_max + ln(min_p). min_p <= 0 keeps everything.
TS_HD float min_p_threshold(float z_max, float min_p) {
  return min_p > 0.0f ? f_add(z_max, portable_log(min_p)) : kNegInf;
}

}  // namespace tokensampler
