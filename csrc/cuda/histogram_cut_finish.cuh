// Kernel 4 of the histogram-cut path (histogram_cut_kernel.cuh's overview): one block per row
// resolves the cut exactly and takes the row's token.
#pragma once

#include "histogram_cut_args.cuh"
#include "sample_kernel.cuh"

namespace tokensampler::cuda::histogram_cut {

// Kernel 4: one block per row.
struct FinishSmem {
  union {
    SampleSmem generic;  // fallback rows
    Candidate list[kCutCap];  // cut rows; top-k rows scan top-p masses in the tail past k
  };
  typename MassScan<kFinishThreads>::TempStorage scan;
  Candidate scratch[kFinishThreads / 32];
  int32_t red[2 * kFinishThreads / 32];
  float red_m[kFinishThreads / 32], red_s[kFinishThreads / 32];
  int32_t keep_count;
};

template <typename T>
__device__ int32_t fallback_token(const LogitsRow<T>& x, const Args& a, const RowParams& p, int64_t r,
                                  SampleSmem& sm) {
  const int32_t slot = a.req_pool_indices[r / a.tokens_per_req];
  const PenaltySource pen = split_row::penalty_source(a, p, r);
  const RowInput row = make_row(a.slot_table + a.layout.row_offset(slot),
                                a.layout, p.position, pen.drafts, pen.num_drafts, a.vocab,
                                a.penalties);
  const RowPlan plan = plan_row(x, row, sm, false);
  return planned_token(x, row, plan, sm, false, nullptr);
}

template <typename T>
__global__ void __launch_bounds__(kFinishThreads) finish_kernel(const T* __restrict__ logits, Args a) {
  __shared__ FinishSmem sm;
  const int64_t r = blockIdx.x;
  split_row::wait_for_prior_grids();
  const RowParams p = split_row::row_params(a, r);
  if (!p.valid_slot) {
    write_unreadable_row(r, a.out_tokens, a.out_invalid, a.out_logprobs);
    return;
  }
  const LogitsRow<T> x = a.row_of(logits, r);
  const RowStats stats = merge_stats<kFinishThreads>(a, r, sm.scratch, sm.red);
  const Candidate argmax = stats.argmax;
  const int32_t inf_count = stats.inf_count;
  Candidate best{kNegInf, kNoId};
  float raw_m = kNegInf, raw_s = 0.0f;  // merged below when wanted (one chunk per thread)
  if (threadIdx.x < a.splits) {
    raw_m = a.results[r * a.splits + threadIdx.x].raw_max;
    raw_s = a.results[r * a.splits + threadIdx.x].raw_sum;
  }
  int kind = kind_of(p, argmax.z, inf_count);
  RowCut rc{CutBin{kBins, 0, 0}, kNoId, -1, false};
  if (kind == kMassCut || kind == kCountCut) {
    rc = a.row_cuts[r];
    if (!rc.found) kind = kFallback;  // a step whose route does not cover the row's filters
  }
  const CutBin& cut = rc.cut;
  const float z_max = scaled_logit(argmax.z, p.temperature);
  const bool winner_kept = kind == kMassCut && rc.winner_id != kNoId;  // kernel 3 skipped it
  if (kind == kNoCut || (kind == kMassCut && !winner_kept && !a.spread)) {  // own chunks
    if (threadIdx.x < a.splits) best = a.results[r * a.splits + threadIdx.x].best;
    best = block_best<kFinishThreads>(best, sm.scratch);
  } else if (kind == kMassCut && !winner_kept) {  // spread: kernel 3's blocks b = slot mod n
    const int32_t n = *a.spread_count, blocks = static_cast<int32_t>(gridDim.x) * a.splits;
    for (int32_t b = rc.spread_slot + n * static_cast<int32_t>(threadIdx.x); b < blocks;
         b += n * kFinishThreads)
      best = best_of(best, a.spread_best[b]);
    best = block_best<kFinishThreads>(best, sm.scratch);
  }
  const int32_t listed = (kind == kMassCut && !winner_kept) || kind == kCountCut ? a.cut_count[r] : 0;
  if (listed > kCutCap) kind = kFallback;

  int32_t token = 0;
  if (kind == kGreedy) {
    token = argmax.id;
  } else if (kind == kFallback) {
    token = fallback_token(x, a, p, r, sm.generic);
  } else if (kind == kNoCut) {
    token = best.id;
  } else if (winner_kept) {
    token = rc.winner_id;
  } else if (kind == kMassCut || kind == kCountCut) {
    const int n = split_row::next_pow2(max(listed, 1));
    const Candidate* src = a.chunk_candidates + r * kCutCap;
    for (int e = threadIdx.x; e < n; e += kFinishThreads)
      sm.list[e] = e < listed ? src[e] : Candidate{kNegInf, kNoId};
    __syncthreads();
    split_row::bitonic_sort<kFinishThreads>(sm.list, n);
    if (kind == kMassCut) {
      // Kept while the mass before a token (lower bins, then the list in rank order) is below
      // the limit, and min-p.
      const split_row::RankedMasses<kFinishThreads, kCutCap / kFinishThreads> masses(
          sm.list, listed, z_max, sm.scan);
      const int keep = masses.kept(listed, cut.before, cut.limit);
      // The listed tokens compete with `best`, the surely kept tokens' best score.
      const float tau = min_p_threshold(z_max, p.min_p);
      for (int e = threadIdx.x; e < keep; e += kFinishThreads) {
        const Candidate t = sm.list[e];
        if (t.z < tau) continue;
        best = best_of(best, Candidate{f_add(t.z, gumbel_noise(p.seed, p.position, t.id, kStreamGumbel)), t.id});
      }
      token = block_best<kFinishThreads>(best, sm.scratch).id;
    } else {
      const int m = min(listed, p.top_k);
      auto* scan = reinterpret_cast<unsigned long long*>(sm.list + kCountCutMaxK);
      const KeptSet kept = split_row::ranked_kept_set<kFinishThreads, kCountCutMaxK>(
          sm.list, m, p, z_max, false, scan, &sm.keep_count);  // +inf rows: kFallback
      token = split_row::sample_kept_set<kFinishThreads>(kept, p, sm.scratch);
    }
  }
  if (a.want_raw) block_merge_lse<kFinishThreads>(raw_m, raw_s, sm.red_m, sm.red_s);
  if (threadIdx.x == 0) {
    a.out_tokens[r] = token;
    a.out_invalid[r] = kind == kInvalid;
    if (a.out_logprobs != nullptr)
      a.out_logprobs[r] = raw_logprob(x.raw(token), inf_count, raw_m, raw_s);
  }
}

}  // namespace tokensampler::cuda::histogram_cut
