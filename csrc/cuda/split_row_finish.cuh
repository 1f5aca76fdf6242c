// Finishing a split row (split_row_kernel.cuh describes the path): one block merges the
// row's chunk results into its token, or, in rejection-sampling verify, its verdict. Run by
// the finish kernel, or inside the single launch's chunk kernel by a row's last block.
#pragma once

#include <cuda_runtime.h>

#include <cfloat>

#include "block_select.cuh"
#include "mass_scan.cuh"
#include "rejection_verdict.cuh"
#include "row_outputs.cuh"
#include "split_row_args.cuh"
#include "tokensampler/rng.h"

namespace tokensampler::cuda::split_row {

// Top-p masses (row_rules.h) of the first m candidates of buf, in rank order, kPer consecutive
// ones per thread: each one's mass and the exact sum of those before it (from `base`), and the
// total. The block scan's storage is the caller's.
template <int kThreads, int kPer>
struct RankedMasses {
  using Scan = MassScan<kThreads>;
  unsigned long long before[kPer];
  unsigned long long total;

  __device__ __forceinline__ RankedMasses(const Candidate* buf, int m, float z_max,
                                          typename Scan::TempStorage& storage) {
    unsigned long long mass[kPer];
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      const int j = threadIdx.x * kPer + q;
      mass[q] = j < m ? top_p_mass(buf[j].z, z_max) : 0ull;
    }
    Scan(storage).ExclusiveSum(mass, before, total);
  }

  // How many of the m are kept: the mass before each, plus `base`, below `limit`. A prefix, as
  // masses are not negative.
  __device__ __forceinline__ int kept(int m, unsigned long long base, unsigned long long limit) const {
    int keep = 0;
#pragma unroll
    for (int q = 0; q < kPer; ++q)
      keep += __syncthreads_count(static_cast<int>(threadIdx.x) * kPer + q < m &&
                                  base + before[q] < limit);
    return keep;
  }
};

// The kept set of the first m (<= kMaxM) candidates of buf, in rank order (sorted when z_max is
// +inf or top-p is on): rows with a +inf processed logit (inf_row) keep their +inf tokens (top-p
// the first ceil(p * m_inf)); otherwise top-p over integer masses (as the CPU reference), then
// min-p (a z past fp32's range is +-FLT_MAX, candidate_z: finish_row breaks its ties with a z of
// exactly +-FLT_MAX). `scan_storage` holds kMaxM 8-byte words.
template <int kThreads, int kMaxM>
__device__ KeptSet ranked_kept_set(const Candidate* buf, int m, const RowParams& p, float z_max,
                                   bool inf_row, unsigned long long* scan_storage,
                                   int32_t* keep_count) {
  constexpr int kPer = (kMaxM + kThreads - 1) / kThreads;
  using Masses = RankedMasses<kThreads, kPer>;
  static_assert(sizeof(typename Masses::Scan::TempStorage) <= kMaxM * sizeof(unsigned long long));
  if (inf_row) {
    if (threadIdx.x == 0) {
      int m_inf = 0;
      while (m_inf < m && buf[m_inf].z == INFINITY) ++m_inf;
      *keep_count = inf_row_top_p_count(p.top_p, m_inf);
    }
    __syncthreads();
    return KeptSet{buf, *keep_count, kNegInf, 0.0f, true};
  }
  int keep = m;
  if (p.top_p < 1.0f) {
    const Masses masses(buf, m, z_max,
                        *reinterpret_cast<typename Masses::Scan::TempStorage*>(scan_storage));
    keep = max(masses.kept(m, 0ull, top_p_limit(p.top_p, masses.total)), 1);
  }
  return KeptSet{buf, keep, min_p_threshold(z_max, p.min_p), z_max, false};
}

// Gumbel-max over a kept set (a +inf row's tokens all score their noise alone).
template <int kThreads>
__device__ int32_t sample_kept_set(const KeptSet& kept, const RowParams& p, Candidate* scratch) {
  Candidate c{kNegInf, kNoId};
  for (int j = threadIdx.x; j < kept.count; j += kThreads) {
    if (!kept.has(j)) continue;
    const int32_t id = kept.buf[j].id;
    const float g = gumbel_noise(p.seed, p.position, id, kStreamGumbel);
    c = best_of(c, Candidate{kept.inf_row ? g : f_add(kept.buf[j].z, g), id});
  }
  return block_best<kThreads>(c, scratch).id;
}

// Shared memory the finishing block works in (the finish kernel's own, or the chunk kernel's in
// the single launch).
struct FinishSmem {
  Candidate* buf;       // kMergeCap entries (top-k steps only)
  unsigned long long* scan_storage;  // kSplitRowMaxTopK words: top-p's mass scan, then
                                     // rejection_verdict's per-warp sums (top-k steps)
  Candidate* scratch;   // kThreads / 32
  Partial* partials;    // kThreads / 32
  float* red_m;         // kThreads / 32
  float* red_s;         // kThreads / 32
  int32_t* red_count;   // 2 * kThreads / 32
  int32_t* keep_count;
  int32_t* counter;
};

// Finishes row r (valid slot) from its chunks' results, with all kThreads threads of the block:
// argmax / best score, or the exact top-k of the chunks' candidates (in rank order from
// rank_top_k; from keep_top_k's fallback sorted, bitonic, only when top-p or +inf logits need the
// rank order); then its kept set and Gumbel-max
// over it. Writes the row's token (a verify row's verdict), invalid flag and raw logprob. Chunk
// results are read through L2 (another block of the same grid may have written them).
template <int kThreads, typename T>
__device__ __forceinline__ void finish_row(const T* __restrict__ logits, const Args& a, int64_t r,
                                           const RowParams& p, const FinishSmem& sm) {
  Candidate argmax{kNegInf, kNoId}, best{kNegInf, kNoId}, inf_best{kNegInf, kNoId};
  float raw_m = kNegInf, raw_s = 0.0f;
  int32_t inf_count = 0, kept = 0, past_max_id = kNoId, at_lowest_id = kNoId;
  for (int s = threadIdx.x; s < a.splits; s += kThreads) {
    const ChunkResult c = load_result(a.results + r * a.splits + s);
    argmax = best_of(argmax, c.argmax);
    best = best_of(best, c.best);
    inf_best = best_of(inf_best, c.inf_best);
    merge_lse(raw_m, raw_s, c.raw_max, c.raw_sum);
    inf_count += c.inf_count;
    kept += c.kept;
    past_max_id = min(past_max_id, c.past_max_id);
    at_lowest_id = min(at_lowest_id, c.at_lowest_id);
  }
  const Partial row = block_partial<kThreads>(Partial{argmax, best, inf_best, inf_count, kept}, sm.partials);
  argmax = row.argmax;
  best = row.best;
  inf_best = row.inf_best;
  inf_count = row.inf_count;
  const int total = row.kept;
  if (a.want_raw) block_merge_lse<kThreads>(raw_m, raw_s, sm.red_m, sm.red_s);

  const bool invalid = argmax.z == kNegInf;
  // Verify rows of rejection sampling with a draft to judge: out_tokens takes their verdict.
  const int32_t draft = invalid ? kNoDraft : draft_of(a, r, p);
  int32_t token = 0, verdict = kVerdictNone;
  if (invalid) {
    token = 0;
  } else if (p.greedy) {
    token = argmax.id;
    if (draft != kNoDraft) verdict = greedy_verdict(token, draft, draft_row(a, r, p), p.seed, p.position);
  } else if (!p.top_k_on || a.k_cap == 0) {  // k_cap 0: a step whose route has no top-k (the
    // chunks scored every row without it); a processed +inf (inf_best) wins over any score
    token = inf_best.id != kNoId ? inf_best.id : best.id;
    if (draft != kNoDraft) verdict = kVerdictUndecided;  // its kept set is not in the buffer
  } else {
    // The chunks' k_cap slots each (holes past a chunk's real candidates), then the row's exact
    // top-k set (m candidates) at buf[0, m).
    const int slots = a.splits * a.k_cap;
    const Candidate* src = a.chunk_candidates + r * slots;
    for (int e = threadIdx.x; e < slots; e += kThreads) sm.buf[e] = load_candidate(src + e);
    __syncthreads();
    // buf[0, m): the top-k in rank order (rank_top_k), or in no order (keep_top_k).
    int m = rank_top_k<kThreads, kMergeCap / kThreads>(
        sm.buf, slots, p.top_k, total, reinterpret_cast<Candidate*>(sm.scan_storage), sm.red_count);
    const bool ranked = m >= 0;
    float z_max;
    if (ranked) {
      z_max = sm.buf[0].z;  // m >= 1 there
    } else {
      m = keep_top_k<kThreads, kMergeCap / kThreads, true>(sm.buf, slots, p.top_k, total,
                                                           sm.red_count, sm.counter);
      Candidate top{kNegInf, kNoId};
      for (int e = threadIdx.x; e < m; e += kThreads) top = best_of(top, sm.buf[e]);
      z_max = block_best<kThreads>(top, sm.scratch).z;
    }
    const bool ordered = z_max == INFINITY || p.top_p < 1.0f;
    if (ordered && !ranked) {  // rank order of the (<= 512) kept candidates
      const int n = next_pow2(max(m, 1));
      for (int e = m + threadIdx.x; e < n; e += kThreads) sm.buf[e] = Candidate{kNegInf, kNoId};
      __syncthreads();
      bitonic_sort<kThreads>(sm.buf, n);
    }
    const KeptSet kept_set = ranked_kept_set<kThreads, kSplitRowMaxTopK>(
        sm.buf, m, p, z_max, argmax.z == INFINITY, sm.scan_storage, sm.keep_count);
    token = sample_kept_set<kThreads>(kept_set, p, sm.scratch);
    if (fabsf(z_max) == FLT_MAX) {
      // Ties at +-FLT_MAX (scale_candidates): as on the CPU, a z past +FLT_MAX (+inf there) wins
      // over every other token, and at -FLT_MAX a z of exactly -FLT_MAX over one past it (-inf
      // there); each kind's lowest id wins (DESIGN §5). Verify rows leave these to the walker.
      const int32_t edge = z_max > 0.0f ? past_max_id : at_lowest_id;
      const int32_t lowest = block_best<kThreads>(Candidate{0.0f, edge}, sm.scratch).id;
      if (lowest != kNoId) token = lowest;
      if (draft != kNoDraft) verdict = kVerdictUndecided;
    } else if (draft != kNoDraft) {
      verdict = rejection_verdict<kThreads>(kept_set, draft, draft_row(a, r, p), p.seed,
                                            p.position, token, sm.scan_storage, sm.scratch);
    }
  }
  if (verdict == kVerdictNone) verdict = token;
  if (threadIdx.x == 0) {
    a.out_tokens[r] = verdict;
    a.out_invalid[r] = invalid;
    if (a.out_logprobs != nullptr) {
      a.out_logprobs[r] = raw_logprob(a.row_of(logits, r).raw(token), inf_count, raw_m, raw_s);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kFinishThreads) finish_kernel(const T* __restrict__ logits, Args a) {
  __shared__ Candidate buf[kMergeCap];
  __shared__ unsigned long long scan_storage[kSplitRowMaxTopK];
  __shared__ Candidate scratch[kFinishThreads / 32];
  __shared__ Partial partials[kFinishThreads / 32];
  __shared__ float red_m[kFinishThreads / 32], red_s[kFinishThreads / 32];
  __shared__ int32_t red_count[2 * kFinishThreads / 32];
  __shared__ int32_t keep_count, counter;

  wait_for_prior_grids();
  const int64_t r = blockIdx.x;
  const RowParams p = row_params(a, r);
  if (!p.valid_slot) {
    write_unreadable_row(r, a.out_tokens, a.out_invalid, a.out_logprobs);
    return;
  }
  const FinishSmem sm{buf, scan_storage, scratch, partials, red_m, red_s, red_count, &keep_count,
                      &counter};
  finish_row<kFinishThreads>(logits, a, r, p, sm);
}

}  // namespace tokensampler::cuda::split_row
