// Device code of sample_rows and verify_rejection: DESIGN §3 for one logits row per block.
//
// One block of 1024 threads owns a row. Pass 1 reads the row once and yields the processed
// argmax (greedy), the +inf count, raw log-sum-exp stats and, for rows without filters, the
// Gumbel-max sample itself (noise fused into the pass, one Philox call per 4 tokens). Rows
// with filters express every filter as a prefix of the rank order (z desc, id asc): top-k and
// top-p boundaries are found by radix select over order-preserving keys of z (11/11/10-bit
// digits, shared-memory histograms of counts and of row_rules.h's integer top-p masses, so sums
// are exact in any order), ties at a boundary split by id
// with an ordered block scan; min-p is a threshold. A last pass samples over the kept set.
// Penalties: a 65536-bit filter in shared memory marks candidate tokens; a marked token is
// looked up in the slot's sorted history / bias lists and this row's drafts.
#pragma once

#include <cuda_runtime.h>

#include <cub/block/block_scan.cuh>

#include "device_primitives.cuh"
#include "logits_row.cuh"
#include "mass_scan.cuh"
#include "penalty_lookup.cuh"
#include "row_outputs.cuh"
#include "tokensampler/rng.h"
#include "tokensampler/row_rules.h"
#include "tokensampler/slot_layout.h"

namespace tokensampler::cuda {

constexpr int kSampleThreads = 1024;
constexpr int kBins = 2048;
constexpr uint32_t kAllKey = 0xFFFFFFFFu;

enum RowKind : int { kRowInvalid = 0, kRowGreedy = 1, kRowInf = 2, kRowFilter = 3 };

struct SampleSmem {
  uint32_t bitmap[kPenaltyBitmapWords];
  int32_t counts[kBins];
  unsigned long long masses[kBins];
  float red_f[32];
  float red_f2[32];
  int32_t red_i[32];
  double red_d[32];
  unsigned long long red_u[32];
  typename cub::BlockScan<int, kSampleThreads>::TempStorage scan_i;
  typename MassScan<kSampleThreads>::TempStorage scan_m;
  int32_t found_id;
  uint32_t sel_digit;
  int32_t sel_cgt;
  int32_t sel_ceq;
  unsigned long long sel_mgt;
};

// ---- block reductions (every thread gets the result) ----
// Block-wide best over the sample kernel's 32 warps, through its shared reduction arrays.
__device__ __forceinline__ Candidate block_best(Candidate c, SampleSmem& sm) {
  c = warp_best(c);
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) {
    sm.red_f[w] = c.z;
    sm.red_i[w] = c.id;
  }
  __syncthreads();
  return warp_best(Candidate{sm.red_f[lane], sm.red_i[lane]});
}

// Block-wide (max, sum-exp); every thread gets it. A butterfly over the warps' values, not
// block_merge_lse's pass in warp order: another merge order, so the sum may differ in its last bits.
__device__ __forceinline__ void block_ms(float& m, float& s, SampleSmem& sm) {
  warp_merge_lse(m, s);
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) {
    sm.red_f[w] = m;
    sm.red_f2[w] = s;
  }
  __syncthreads();
  m = sm.red_f[lane];
  s = sm.red_f2[lane];
  warp_merge_lse(m, s);
}

// ---- the row ----
struct RowInput {
  SlotRow slot;
  int64_t position;
  const int32_t* drafts;
  int32_t num_drafts;
  int32_t vocab;
  bool penalties;
  float temperature;
  int32_t top_k;
  bool top_k_on;
  float top_p;
  float min_p;
  bool greedy;
  bool no_filter;
  uint64_t seed;
};

__device__ __forceinline__ RowInput make_row(const int32_t* slot_words, SlotLayout layout,
                                             int64_t position, const int32_t* drafts,
                                             int32_t num_drafts, int32_t vocab, bool penalties) {
  RowInput r;
  r.slot = SlotRow{slot_words, layout};
  r.position = position;
  r.drafts = drafts;
  r.num_drafts = drafts ? num_drafts : 0;
  r.vocab = vocab;
  r.penalties = penalties;
  r.temperature = r.slot.temperature();
  r.top_k = r.slot.top_k();
  r.top_k_on = !top_k_disabled(r.top_k, vocab);
  r.top_p = r.slot.top_p();
  r.min_p = r.slot.min_p();
  r.greedy = is_greedy_row(r.temperature, r.top_k);
  r.no_filter = !r.top_k_on && !(r.top_p < 1.0f) && !(r.min_p > 0.0f);
  r.seed = r.slot.seed();
  return r;
}

__device__ __forceinline__ PenaltySource penalty_source(const RowInput& row) {
  return PenaltySource{row.slot, row.drafts, row.num_drafts};
}

__device__ __forceinline__ void build_penalty_filter(const RowInput& row, SampleSmem& sm) {
  if (row.penalties) mark_penalized_tokens<kSampleThreads>(penalty_source(row), 0, INT32_MAX, sm.bitmap);
  else __syncthreads();  // the callers' shared-memory hand-over
}

// §3.2–3.4 for token i (l already sanitised).
__device__ __forceinline__ float processed_logit(const RowInput& row, const SampleSmem& sm,
                                                 int32_t i, float l) {
  if (!row.penalties || !maybe_penalized(sm.bitmap, i, 0)) return l;
  return penalize_token(penalty_source(row), i, l);
}

template <typename T>
__device__ __forceinline__ float load_processed(const LogitsRow<T>& x, const RowInput& row,
                                                const SampleSmem& sm, int32_t i) {
  return processed_logit(row, sm, i, x.raw(i));
}

struct RowPlan {
  int kind;
  int32_t best;        // argmax of the processed logits
  float z_max;         // filter rows; 0 for greedy / +inf rows
  uint32_t k_key;      // top-k boundary: kept iff key < k_key or (== and id <= k_id)
  int32_t k_id;
  uint32_t p_key;      // top-p boundary
  int32_t p_id;
  float tau;           // min-p threshold on z
  int32_t inf_cut;     // +inf rows: keep +inf ids <= inf_cut
  // raw stats (when requested)
  float raw_max, raw_sum;
  int32_t raw_inf;
  // rows without filters: the sample, fused into pass 1
  bool fused;
  int32_t fused_token;
  float fused_zmax, fused_zsum;
};

// Kept set membership and z of token i with processed logit l.
__device__ __forceinline__ bool kept_z(const RowPlan& p, const RowInput& row, int32_t i, float l,
                                       float& z) {
  if (p.kind == kRowGreedy) {
    z = 0.0f;
    return i == p.best;
  }
  if (p.kind == kRowInf) {
    z = 0.0f;
    return l == INFINITY && i <= p.inf_cut;
  }
  if (p.kind != kRowFilter || l == kNegInf) return false;
  z = scaled_logit(l, row.temperature);
  const uint32_t key = desc_key(z);
  return (key < p.k_key || (key == p.k_key && i <= p.k_id)) &&
         (key < p.p_key || (key == p.p_key && i <= p.p_id)) && z >= p.tau;
}

// The id of the `target`-th (0-based) token, in id order, for which pred(i) holds.
template <typename Pred>
__device__ int32_t ordered_select(int32_t V, int32_t target, Pred pred, SampleSmem& sm) {
  constexpr int kItems = 4;
  __syncthreads();
  if (threadIdx.x == 0) sm.found_id = -1;
  __syncthreads();
  int32_t running = 0;
  for (int32_t base = 0; base < V; base += kSampleThreads * kItems) {
    const int32_t start = base + threadIdx.x * kItems;
    int cnt = 0;
#pragma unroll
    for (int q = 0; q < kItems; ++q)
      if (start + q < V && pred(start + q)) ++cnt;
    int excl, total;
    cub::BlockScan<int, kSampleThreads>(sm.scan_i).ExclusiveSum(cnt, excl, total);
    if (cnt > 0 && running + excl <= target && target < running + excl + cnt) {
      int32_t seen = running + excl;
      for (int q = 0; q < kItems; ++q) {
        if (start + q < V && pred(start + q)) {
          if (seen == target) {
            sm.found_id = start + q;
            break;
          }
          ++seen;
        }
      }
    }
    __syncthreads();
    const int32_t found = sm.found_id;
    if (found >= 0) return found;
    running += total;
  }
  return kNoId;
}

struct Boundary {
  uint32_t key;
  int32_t id;
  unsigned long long total;  // top-p mass of the kept prefix
};

// Radix select over the finite tokens' keys. Count mode: the prefix of `count` tokens. Mass
// mode: the top-p prefix below `limit` (0: top_p_limit of all finite tokens' mass).
template <typename T>
__device__ Boundary radix_select(const LogitsRow<T>& x, const RowInput& row, float z_max, SampleSmem& sm,
                                 bool mass_mode, int32_t count, float p, unsigned long long limit,
                                 bool need_mass) {
  const int32_t V = row.vocab;
  uint32_t prefix = 0, pmask = 0;
  int32_t c_gt = 0;
  unsigned long long m_gt = 0, total_all = 0;
  need_mass = need_mass || mass_mode;
  for (int level = 0; level < 3; ++level) {
    const int shift = level == 0 ? 21 : level == 1 ? 10 : 0;
    const int nbins = level == 2 ? 1024 : 2048;
    __syncthreads();
    for (int b = threadIdx.x; b < nbins; b += kSampleThreads) {
      sm.counts[b] = 0;
      sm.masses[b] = 0;
    }
    if (threadIdx.x == 0) sm.sel_digit = 0xFFFFFFFFu;
    __syncthreads();
    for (int32_t i = threadIdx.x; i < V; i += kSampleThreads) {
      const float l = load_processed(x, row, sm, i);
      if (l == kNegInf) continue;
      const float z = scaled_logit(l, row.temperature);
      const uint32_t key = desc_key(z);
      if ((key & pmask) != prefix) continue;
      const int d = (key >> shift) & (nbins - 1);
      atomicAdd(&sm.counts[d], 1);
      if (need_mass) atomicAdd(&sm.masses[d], static_cast<unsigned long long>(top_p_mass(z, z_max)));
    }
    __syncthreads();
    const int per = (nbins + kSampleThreads - 1) / kSampleThreads;
    const int lo = min(static_cast<int>(threadIdx.x) * per, nbins);
    const int hi = min(lo + per, nbins);
    int lc = 0;
    unsigned long long lm = 0;
    for (int d = lo; d < hi; ++d) {
      lc += sm.counts[d];
      lm += sm.masses[d];
    }
    int excl_c, total_c;
    unsigned long long excl_m, total_m;
    cub::BlockScan<int, kSampleThreads>(sm.scan_i).ExclusiveSum(lc, excl_c, total_c);
    MassScan<kSampleThreads>(sm.scan_m).ExclusiveSum(lm, excl_m, total_m);
    if (level == 0) {
      total_all = total_m;
      if (mass_mode && limit == 0) limit = top_p_limit(p, total_all);
    }
    {
      int32_t cb = c_gt + excl_c;
      unsigned long long mb = m_gt + excl_m;
      for (int d = lo; d < hi; ++d) {
        const int c = sm.counts[d];
        const unsigned long long m = sm.masses[d];
        const bool hit = c > 0 && (mass_mode ? (mb + m >= limit) : (cb + c >= count));
        if (hit) {
          atomicMin(&sm.sel_digit, static_cast<uint32_t>(d));
          break;
        }
        cb += c;
        mb += m;
      }
    }
    __syncthreads();
    const uint32_t digit = sm.sel_digit;
    if (digit == 0xFFFFFFFFu) return Boundary{kAllKey, kNoId, total_all};  // keeps every token
    if (static_cast<int>(digit) >= lo && static_cast<int>(digit) < hi) {
      int32_t cb = c_gt + excl_c;
      unsigned long long mb = m_gt + excl_m;
      for (int d = lo; d < static_cast<int>(digit); ++d) {
        cb += sm.counts[d];
        mb += sm.masses[d];
      }
      sm.sel_cgt = cb;
      sm.sel_mgt = mb;
      sm.sel_ceq = sm.counts[digit];
    }
    __syncthreads();
    prefix |= digit << shift;
    pmask |= static_cast<uint32_t>(nbins - 1) << shift;
    c_gt = sm.sel_cgt;
    m_gt = sm.sel_mgt;
  }
  // The boundary key's c_eq tokens share one z, so one mass: keep the first t (id order) of them,
  // t = the number whose mass before them (m_gt + j * mass) is below the limit (> m_gt here).
  const int32_t c_eq = sm.sel_ceq;
  const unsigned long long mass = top_p_mass(desc_key_to_z(prefix), z_max);
  int32_t t;
  if (!mass_mode) t = count - c_gt;
  else if (mass == 0) t = c_eq;
  else t = static_cast<int32_t>(min((limit - m_gt + mass - 1) / mass, static_cast<unsigned long long>(c_eq)));
  t = min(max(t, 1), c_eq);
  const unsigned long long total = m_gt + static_cast<unsigned long long>(t) * mass;
  int32_t id = kNoId;
  if (t < c_eq) {
    const uint32_t bkey = prefix;
    id = ordered_select(
        V, t - 1,
        [&](int32_t i) {
          const float l = load_processed(x, row, sm, i);
          return l != kNegInf && desc_key(scaled_logit(l, row.temperature)) == bkey;
        },
        sm);
  }
  return Boundary{prefix, id, total};
}

// Steps 1–6 for one row; pass 1 also samples rows without filters (fused Gumbel-max).
template <typename T>
__device__ RowPlan plan_row(const LogitsRow<T>& x, const RowInput& row, SampleSmem& sm, bool want_raw) {
  const int32_t V = row.vocab;
  build_penalty_filter(row, sm);
  RowPlan p;
  p.k_key = p.p_key = kAllKey;
  p.k_id = p.p_id = kNoId;
  p.tau = kNegInf;
  p.inf_cut = kNoId;
  p.z_max = 0.0f;
  p.fused = false;
  p.fused_token = 0;
  p.fused_zmax = kNegInf;
  p.fused_zsum = 0.0f;
  p.raw_max = kNegInf;
  p.raw_sum = 0.0f;
  p.raw_inf = 0;

  const bool fuse = !row.greedy && row.no_filter;
  Candidate best{kNegInf, kNoId}, score_best{kNegInf, kNoId};
  int32_t n_inf = 0, raw_inf = 0;
  float rm = kNegInf, rs = 0.0f, zm = kNegInf, zs = 0.0f;
  const int32_t groups = (V + 3) >> 2;
  for (int32_t g = threadIdx.x; g < groups; g += kSampleThreads) {
    Philox4 w;
    bool have_words = false;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int32_t i = (g << 2) + q;
      if (i >= V) break;
      const float r = x.raw(i);
      if (want_raw) {
        if (r == INFINITY) ++raw_inf;
        else add_to_lse(rm, rs, r);
      }
      const float l = processed_logit(row, sm, i, r);
      best = best_of(best, Candidate{l, i});
      if (l == INFINITY) ++n_inf;
      if (fuse && l != kNegInf && l != INFINITY) {
        if (!have_words) {
          w = random_words(row.seed, row.position, static_cast<uint32_t>(g), kStreamGumbel);
          have_words = true;
        }
        const float z = scaled_logit(l, row.temperature);
        score_best = best_of(score_best, Candidate{f_add(z, gumbel_from_word(w.v[q])), i});
        add_to_lse(zm, zs, z);
      }
    }
  }
  best = block_best(best, sm);
  n_inf = block_sum<kSampleThreads>(n_inf, sm.red_i);
  if (want_raw) {
    raw_inf = block_sum<kSampleThreads>(raw_inf, sm.red_i);
    block_ms(rm, rs, sm);
    p.raw_max = rm;
    p.raw_sum = rs;
    p.raw_inf = raw_inf;
  }
  p.best = best.id < V ? best.id : 0;
  if (best.z == kNegInf) {
    p.kind = kRowInvalid;
    return p;
  }
  if (row.greedy) {
    p.kind = kRowGreedy;
    return p;
  }
  if (best.z == INFINITY) {
    p.kind = kRowInf;
    const int32_t m = (row.top_k_on && n_inf > row.top_k) ? row.top_k : n_inf;
    const int32_t keep = inf_row_top_p_count(row.top_p, m);
    if (keep < n_inf) {
      p.inf_cut = ordered_select(
          V, keep - 1, [&](int32_t i) { return load_processed(x, row, sm, i) == INFINITY; }, sm);
    }
    return p;
  }
  p.kind = kRowFilter;
  p.z_max = scaled_logit(best.z, row.temperature);
  if (fuse) {
    score_best = block_best(score_best, sm);
    block_ms(zm, zs, sm);
    p.fused = true;
    p.fused_token = score_best.id < V ? score_best.id : 0;
    p.fused_zmax = zm;
    p.fused_zsum = zs;
    return p;
  }
  const bool top_p_on = row.top_p < 1.0f;
  unsigned long long total_k = 0;
  if (row.top_k_on) {
    const Boundary b = radix_select(x, row, p.z_max, sm, false, row.top_k, 0.0f, 0, top_p_on);
    p.k_key = b.key;
    p.k_id = b.id;
    total_k = b.total;
  }
  if (top_p_on) {
    const unsigned long long limit = row.top_k_on ? top_p_limit(row.top_p, total_k) : 0;
    const Boundary b = radix_select(x, row, p.z_max, sm, true, 0, row.top_p, limit, true);
    p.p_key = b.key;
    p.p_id = b.id;
  }
  p.tau = min_p_threshold(p.z_max, row.min_p);
  return p;
}

// Gumbel-max over the kept set (step 7); optionally the kept mass sum exp(z - z_max) in double.
template <typename T>
__device__ Candidate kept_sample(const LogitsRow<T>& x, const RowInput& row, const RowPlan& p, SampleSmem& sm,
                            bool want_total, double* total_out) {
  const int32_t V = row.vocab;
  Candidate best{kNegInf, kNoId};
  double total = 0.0;
  const int32_t groups = (V + 3) >> 2;
  for (int32_t g = threadIdx.x; g < groups; g += kSampleThreads) {
    Philox4 w;
    bool have_words = false;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int32_t i = (g << 2) + q;
      if (i >= V) break;
      float z;
      const float l = (p.kind == kRowGreedy) ? 0.0f : load_processed(x, row, sm, i);
      if (!kept_z(p, row, i, l, z)) continue;
      if (!have_words) {
        w = random_words(row.seed, row.position, static_cast<uint32_t>(g), kStreamGumbel);
        have_words = true;
      }
      best = best_of(best, Candidate{f_add(z, gumbel_from_word(w.v[q])), i});
      if (want_total) total += exp(static_cast<double>(z) - static_cast<double>(p.z_max));
    }
  }
  best = block_best(best, sm);
  if (want_total) *total_out = block_sum<kSampleThreads>(total, sm.red_d);
  if (best.id >= V) best.id = 0;
  return best;
}

// The token of a planned row: its argmax (greedy), the sample fused into pass 1 (no filters),
// or Gumbel-max over the kept set (kept_sample's total as there).
template <typename T>
__device__ int32_t planned_token(const LogitsRow<T>& x, const RowInput& row, const RowPlan& p, SampleSmem& sm,
                                 bool want_total, double* total) {
  if (p.kind == kRowGreedy) return p.best;
  if (p.kind == kRowFilter && p.fused) return p.fused_token;
  if (p.kind == kRowInvalid) return 0;
  return kept_sample(x, row, p, sm, want_total, total).id;
}

// §3.8 raw log-softmax at a token, given the row's raw stats.
__device__ __forceinline__ float raw_logprob_of(const RowPlan& p, float raw_value) {
  return raw_logprob(raw_value, p.raw_inf, p.raw_max, p.raw_sum);
}

}  // namespace tokensampler::cuda
