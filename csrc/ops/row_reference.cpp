#include "row_reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>

#include "tokensampler/rng.h"
#include "tokensampler/row_rules.h"

namespace tokensampler::cpu {

namespace {

struct TokenAdjustment {
  bool in_history = false;
  int32_t output_count = 0;
  float bias = 0.0f;
};

// §3.2–3.4: every token the slot's history, this row's drafts or the bias list names.
std::map<int32_t, TokenAdjustment> collect_adjustments(const RowContext& ctx) {
  std::map<int32_t, TokenAdjustment> adjust;
  const SlotRow& s = ctx.slot;
  for (int32_t i = 0; i < s.history_size(); ++i) {
    auto& a = adjust[s.history_tokens()[i]];
    a.in_history = true;
    a.output_count = s.history_counts()[i];
  }
  if (s.repetition() != 1.0f) {  // prompt tokens: in the history, output count 0
    s.for_each_prompt_token(0, s.layout.prompt_mask_words, 1,
                            [&](int32_t token) { adjust[token].in_history = true; });
  }
  for (int32_t i = 0; i < ctx.num_drafts; ++i) {  // each distinct draft once
    const int32_t token = ctx.drafts[i];
    if (std::find(ctx.drafts, ctx.drafts + i, token) != ctx.drafts + i) continue;
    const int32_t recorded = recorded_draft_count(s, ctx.drafts, ctx.num_drafts, token);
    if (recorded == 0) continue;  // dropped from a full history, as plain decoding would
    auto& a = adjust[token];
    a.in_history = true;
    a.output_count += recorded;
  }
  for (int32_t i = 0; i < s.bias_size(); ++i) adjust[s.bias_tokens()[i]].bias = s.bias_value(i);
  return adjust;
}

// The first `limit` of `ids` in rank order (value descending, id ascending), sorted.
std::vector<int32_t> ranked_prefix(const std::vector<float>& values, std::vector<int32_t> ids,
                                   size_t limit) {
  auto before = [&](int32_t a, int32_t b) { return ranks_before(values[a], a, values[b], b); };
  limit = std::min(limit, ids.size());
  if (limit == ids.size()) std::sort(ids.begin(), ids.end(), before);  // not partial_sort's heap sort
  else std::partial_sort(ids.begin(), ids.begin() + limit, ids.end(), before);
  ids.resize(limit);
  return ids;
}

// Top-p without top-k (§3.6): the tokens of `ids` whose top-p mass ranked strictly before them
// (rank order over `ids`) is below `limit`, at least the first, in id order. Partitioning
// around pivots finds them in expected linear time; sorting the whole row took most of a step.
std::vector<int32_t> top_p_kept(const std::vector<float>& z, std::vector<int32_t> ids,
                                const std::vector<uint64_t>& mass, uint64_t limit) {
  auto before = [&](int32_t a, int32_t b) { return ranks_before(z[a], a, z[b], b); };
  // ids[0, lo) are kept and hold kept_mass; ids[lo, hi) are undecided; ids[hi, end) are cut.
  size_t lo = 0, hi = ids.size();
  uint64_t kept_mass = 0;
  while (hi - lo > 32 && kept_mass < limit) {
    const int32_t a = ids[lo], b = ids[lo + (hi - lo) / 2], c = ids[hi - 1];
    const int32_t pivot = before(a, b) ? (before(b, c) ? b : before(a, c) ? c : a)
                                       : (before(a, c) ? a : before(b, c) ? c : b);
    const auto first = ids.begin() + lo, last = ids.begin() + hi;
    const auto mid = std::partition(first, last, [&](int32_t i) { return before(i, pivot); });
    std::iter_swap(mid, std::find(mid, last, pivot));  // the pivot first of the rest
    uint64_t ahead = 0;  // the mass ranked before the pivot among the undecided
    for (auto it = first; it != mid; ++it) ahead += mass[*it];
    if (kept_mass + ahead >= limit) {
      hi = mid - ids.begin();  // the pivot and everything after it have >= limit before them
    } else {
      kept_mass += ahead + mass[pivot];  // everything up to the pivot has < limit before it
      lo = mid - ids.begin() + 1;
    }
  }
  std::sort(ids.begin() + lo, ids.begin() + hi, before);
  for (; lo < hi && kept_mass < limit; ++lo) kept_mass += mass[ids[lo]];
  if (lo == 0) {  // limit 0: the first token alone
    std::iter_swap(ids.begin(), std::min_element(ids.begin(), ids.end(), before));
    lo = 1;
  }
  ids.resize(lo);
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace

std::vector<float> read_raw_row(const float* logits, const int32_t* allowed, int32_t vocab) {
  std::vector<float> raw(vocab);
  for (int32_t i = 0; i < vocab; ++i) raw[i] = read_logit(logits[i], allowed, i);
  return raw;
}

void penalize_row(float* l, const RowContext& ctx) {
  const SlotRow& s = ctx.slot;
  for (int32_t i = 0; i < ctx.vocab; ++i) l[i] = sanitize_logit(l[i]);
  for (const auto& [token, a] : collect_adjustments(ctx)) {
    const int32_t i = token - ctx.vocab_offset;
    if (i < 0 || i >= ctx.vocab) continue;
    l[i] = penalized_logit(l[i], a.in_history, a.output_count, s.repetition(), s.frequency(),
                           s.presence(), a.bias);
  }
}

RowDistribution filter_row(const float* logits, const RowContext& ctx) {
  RowDistribution d;
  const int32_t V = ctx.vocab;
  d.raw = read_raw_row(logits, ctx.allowed, V);
  d.processed = d.raw;
  if (ctx.apply_penalties) penalize_row(d.processed.data(), ctx);
  const std::vector<float>& l = d.processed;

  int32_t best = 0;
  for (int32_t i = 1; i < V; ++i)
    if (l[i] > l[best]) best = i;
  if (l[best] == kNegInf) {
    d.invalid = true;
    return d;
  }
  const float T = ctx.slot.temperature();
  const int32_t k = ctx.slot.top_k();
  if (is_greedy_row(T, k)) {
    d.greedy = true;
    d.kept = {best};
    d.kept_z = {0.0f};
    return d;
  }
  const bool top_k_on = !top_k_disabled(k, V);
  const float top_p = ctx.slot.top_p();

  if (l[best] == INFINITY) {
    // A row with +inf entries samples uniformly among them; top-k keeps the k lowest ids and
    // top-p the first ceil(p * m) of the m left (mass before the j-th is j / m).
    for (int32_t i = 0; i < V; ++i)
      if (l[i] == INFINITY) d.kept.push_back(i);
    if (top_k_on && static_cast<int32_t>(d.kept.size()) > k) d.kept.resize(k);
    d.kept.resize(inf_row_top_p_count(top_p, static_cast<int32_t>(d.kept.size())));
    d.kept_z.assign(d.kept.size(), 0.0f);
    return d;
  }

  std::vector<float> z(V, kNegInf);
  std::vector<int32_t> finite;
  for (int32_t i = 0; i < V; ++i) {
    if (l[i] == kNegInf) continue;
    z[i] = scaled_logit(l[i], T);
    finite.push_back(i);
  }
  // Rank order is needed only as far as top-k looks: the top-k set in rank order, or else
  // every finite token in id order (top-p selects from them without sorting).
  std::vector<int32_t> order = ranked_prefix(z, finite, top_k_on ? static_cast<size_t>(k) : 1);
  const float z_max = z[order.front()];
  if (!top_k_on) order = std::move(finite);
  if (top_p < 1.0f && top_k_on) {
    // Mass strictly before each token, in rank order, over the top-k set renormalised.
    std::vector<uint64_t> mass(order.size());
    uint64_t total = 0;
    for (size_t j = 0; j < order.size(); ++j) total += mass[j] = top_p_mass(z[order[j]], z_max);
    const uint64_t limit = top_p_limit(top_p, total);
    uint64_t before = 0;
    size_t keep = 0;
    while (keep < order.size() && before < limit) before += mass[keep++];
    order.resize(std::max<size_t>(keep, 1));
  } else if (top_p < 1.0f) {
    std::vector<uint64_t> mass(V, 0);  // by token id
    uint64_t total = 0;
    for (int32_t i : order) total += mass[i] = top_p_mass(z[i], z_max);
    order = top_p_kept(z, std::move(order), mass, top_p_limit(top_p, total));
  }
  const float threshold = min_p_threshold(z_max, ctx.slot.min_p());
  for (int32_t i : order)
    if (z[i] >= threshold) {
      d.kept.push_back(i);
      d.kept_z.push_back(z[i]);
    }
  return d;
}

int32_t sample_kept(const RowDistribution& d, const RowContext& ctx) {
  if (d.invalid) return 0;
  if (d.greedy) return d.kept.front();
  const uint64_t seed = ctx.slot.seed();
  int32_t best = -1;
  float best_score = 0.0f;
  // gumbel_noise(seed, position, i) with one Philox call per group of 4 ids (kept ids of
  // rows without top-k / top-p come in id order); a token whose z plus its word's noise bound
  // is below the best score cannot win (f_add is monotone), so its two logs are skipped
  Philox4 words{};
  uint32_t group = UINT32_MAX;
  for (size_t j = 0; j < d.kept.size(); ++j) {
    const int32_t i = d.kept[j];
    if (static_cast<uint32_t>(i) >> 2 != group) {
      group = static_cast<uint32_t>(i) >> 2;
      words = random_words(seed, ctx.position, group, kStreamGumbel);
    }
    const uint32_t word = words.v[i & 3];
    if (best >= 0 && f_add(d.kept_z[j], gumbel_upper_bound(word)) < best_score) continue;
    const float score = f_add(d.kept_z[j], gumbel_from_word(word));
    if (best < 0 || ranks_before(score, i, best_score, best)) {
      best = i;
      best_score = score;
    }
  }
  return best;
}

std::vector<double> kept_probabilities(const RowDistribution& d) {
  std::vector<double> p(d.kept.size(), 0.0);
  if (d.kept.empty()) return p;
  const double z_max = *std::max_element(d.kept_z.begin(), d.kept_z.end());
  double total = 0.0;
  for (size_t j = 0; j < p.size(); ++j) total += p[j] = std::exp(double(d.kept_z[j]) - z_max);
  for (double& v : p) v /= total;
  return p;
}

std::vector<double> rejection_probabilities(const RowDistribution& d) {
  std::vector<double> p(d.kept.size(), 0.0);
  if (d.kept.empty()) return p;
  const float z_max = *std::max_element(d.kept_z.begin(), d.kept_z.end());
  std::vector<uint64_t> mass(p.size());
  uint64_t total = 0;
  for (size_t j = 0; j < p.size(); ++j) total += mass[j] = top_p_mass(d.kept_z[j], z_max);
  for (size_t j = 0; j < p.size(); ++j) p[j] = kept_probability(mass[j], total);
  return p;
}

RawNormalizer raw_log_normalizer(const RowDistribution& d) {
  const float m = *std::max_element(d.raw.begin(), d.raw.end());
  if (m == INFINITY) return {m, 0.0, std::count(d.raw.begin(), d.raw.end(), INFINITY)};
  if (m == kNegInf) return {m, 0.0, 0};
  double sum = 0.0;
  for (float x : d.raw) sum += std::exp(double(x) - m);
  return {m, std::log(sum), 0};
}

float raw_logprob(const RowDistribution& d, const RawNormalizer& norm, int32_t token) {
  if (norm.max == kNegInf) return kNegInf;
  if (norm.max == INFINITY)
    return d.raw[token] == INFINITY ? -static_cast<float>(std::log(double(norm.inf_count))) : kNegInf;
  return static_cast<float>((double(d.raw[token]) - norm.max) - norm.log_sum);
}

float processed_logprob(const RowDistribution& d, int32_t token) {
  if (d.invalid) return kNegInf;
  if (d.greedy) return 0.0f;
  const std::vector<double> p = kept_probabilities(d);
  for (size_t j = 0; j < d.kept.size(); ++j)
    if (d.kept[j] == token) return static_cast<float>(std::log(p[j]));
  return kNegInf;
}

void top_raw_logprobs(const RowDistribution& d, const RawNormalizer& norm, int32_t n,
                      float* values, int64_t* ids) {
  std::vector<int32_t> all(d.raw.size());
  std::iota(all.begin(), all.end(), 0);
  const std::vector<int32_t> top = ranked_prefix(d.raw, std::move(all), n);
  for (int32_t j = 0; j < n; ++j) {
    ids[j] = top[j];
    values[j] = raw_logprob(d, norm, top[j]);
  }
}

}  // namespace tokensampler::cpu
