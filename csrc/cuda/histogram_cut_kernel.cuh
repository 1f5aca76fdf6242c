// Kernels 1, 2, 2b and 3 of the histogram-cut path of sample_rows, and the path's overview
// (shared code: histogram_cut_args.cuh; kernels 1a-b: _decide.cuh; kernel 4: _finish.cuh;
// launch code: histogram_cut_sample.cu).
// Rows: any mix of greedy, no-filter, top-p, min-p and top-k rows (mixed batches, and top-k
// beyond the split-row path's k <= 512), penalties and bias as in split_row_kernel.cuh.
//
// A top-p boundary depends on the whole row, so a row split over many blocks is read three
// times (small batches read it from L2; in larger ones the passes after kernel 1 take a chunk's
// rounds backward, split_row::Rounds, so they start on what the L2 still holds) and finished by
// one block:
//   1. stats: the argmax of the processed logits (z_max), the +inf count, raw log-sum-exp
//      partials; top-p rows also their winner, the best z + G over all tokens, and (in steps
//      of kRunnerUpMinRows rows or more with a cut, kernel 2b) the runner-up, the second best;
//   1a-b. in large top-p steps (decide), rows whose winner or runner-up passes min-p: float
//      sums of the masses of all tokens and of those ranked before the winner and before the
//      runner-up; a row where they prove the winner kept (surely_kept: about a fraction p of
//      rows), or the winner dropped and the runner-up kept (most of the others), is done, and
//      the others go on to kernel 2, spread over its whole grid;
//   2. histogram (top-p / top-k rows): counts and masses of the row's tokens in bins of 1/64
//      nat below z_max. Masses are the integers of row_rules.h's top_p_mass, summed per block in
//      32-bit halves (native shared atomics) and per row in 64 bits, so the sums are exact and
//      every run, batch and block size finds the same cut;
//   2b. cut (one block per row): the cut bin (the first whose cumulative mass reaches p times
//      the total, or whose cumulative count reaches k). A top-p row whose winner passes min-p
//      and lies below the cut bin is done: the winner is kept, so it is the kept set's best,
//      and kernels 3 and 4 skip its cut; so, where kernel 1 kept runner-ups, is a row whose
//      winner fails min-p or lies above the cut bin while its runner-up passes min-p and lies
//      below it (every token but the winner ranks below the runner-up). The other top-p rows
//      are listed for kernel 3;
//   3. select: tokens above the cut bin are surely kept: a block keeps the best z + G among
//      them (and the min-p threshold). Tokens in the cut bin (top-k rows: in it or above it) go
//      to a per-row list. Min-p and top-k rows take their own chunks; the listed top-p rows (a
//      fraction 1 - p of them) are spread over every block of the grid where the rows alone
//      do not fill the machine (spread), so they do not keep the kernel as long as whole chunks
//      would; where they do, they take their own chunks too;
//   4. finish: sorts the list into rank order and resolves the cut exactly (top-p: kept while
//      the mass before a token is below the limit; top-k: the first k, then top-p over their
//      masses; both as the CPU reference; then min-p), and takes the best z + G.
// Rows this cannot finish exactly (+inf logits, raw or after bias; z_max past fp32's range; a
// list over kCutCap; top-k over kCountCutMaxK)
// run the one-block-per-row kernel's code (sample_kernel.cuh) inside the finish kernel.
// Steps of fewer than kPdlMaxRows rows launch every kernel with programmatic dependent launch
// (split_row::launch); each kernel waits for the one ahead of it before its first global access.
// Kernels 1–3 read whole chunks, so each comes in four instantiations picked at launch (as the
// split-row chunk kernel): kMasked for a step with a grammar bitmask and kPenalties for a step
// with penalties, so a step without either carries none of its code. Kernels 1 and 2b are also
// instantiated with and without the runner-up (kRunnerUp: steps of kRunnerUpMinRows rows or more
// that run kernel 2b, those with decide among them), so min-p, no-filter and 1-3 row steps carry
// none of its code.
#pragma once

#include "histogram_cut_args.cuh"

namespace tokensampler::cuda::histogram_cut {

// Kernel 1: per chunk, the argmax of the processed logits, the +inf count, raw partials, and
// for top-p rows the winner: the best z + G, noise only where it can win (as the split-row
// no-filter loop; this kernel has issue slots to spare, the histogram kernel has not); with
// kRunnerUp (try_sample says which steps) also the runner-up, the second best z + G, for every
// top-p row of every chunk, which kernel 1b or 2b takes where it proves the winner dropped and
// the runner-up kept. Also clears the row's histogram and cut list for kernels 2 and 3.
template <typename T, bool kMasked, bool kRunnerUp, bool kPenalties>
__global__ void __launch_bounds__(kChunkThreads, kChunkBlocksPerSm)
    stats_kernel(const T* __restrict__ logits, Args a) {
  extern __shared__ __align__(16) uint32_t bitmap[];
  __shared__ Candidate scratch[kChunkThreads / 32];
  __shared__ float red_m[kChunkThreads / 32], red_s[kChunkThreads / 32];
  __shared__ int32_t red_n[kChunkThreads / 32];
  // second_seen (kRunnerUp): at most the block's second best
  __shared__ split_row::BlockBest best_seen, second_seen;
  const Chunk c = chunk_of(a);
  split_row::wait_for_prior_grids();
  if (blockIdx.x == 0 && threadIdx.x == 0) *a.spread_count = *a.hist_count = 0;
  const RowParams p = split_row::row_params(a, c.r);
  if (!p.valid_slot) return;
  const int32_t split = blockIdx.x % a.splits;
  if (uses_histogram(p)) {
    for (int b = split * kChunkThreads + threadIdx.x; b < kBins; b += a.splits * kChunkThreads) {
      a.bin_counts[c.r * kBins + b] = 0;
      a.bin_masses[c.r * kBins + b] = 0;
    }
  }
  if (split == 0 && threadIdx.x == 0) {
    a.cut_count[c.r] = 0;
    a.row_cuts[c.r].found = false;
  }
  if (threadIdx.x == 0) {
    best_seen.reset();
    if constexpr (kRunnerUp) second_seen.reset();
  }
  const PenaltySource pen = mark_chunk_penalties<kPenalties>(a, p, c, bitmap);  // syncs
  const bool top_p_row = !p.greedy && !p.top_k_on && p.top_p < 1.0f;
  const float inv_t = 1.0f / p.temperature;  // estimates only; exact z = x / T where it counts

  Candidate argmax{kNegInf, kNoId}, winner{kNegInf, kNoId}, runner_up{kNegInf, kNoId};
  float winner_z = kNegInf, runner_up_z = kNegInf;
  float raw_m = kNegInf, raw_s = 0.0f;
  int32_t inf_count = 0;
  split_row::for_each_round(a.row_of<kMasked>(logits, c.r), c.begin, c.end, a.wide_loads(),
                            split_row::Rounds::kForward, [&](float (&x)[4], int32_t i) {
    // Only greedy rows need the argmax's id (the finish kernel's token); the others need z_max,
    // the groups' maxima's maximum, without a (z, id) compare a token. Two calls, each with a
    // constant pointer, so the argmax stays in registers.
    float x_max4;
    if (p.greedy) {
      x_max4 = split_row::process_group<kPenalties>(x, i, c.begin, c.end, a, bitmap, pen,
                                                    inf_count, raw_m, raw_s, &argmax);
    } else {
      x_max4 = split_row::process_group<kPenalties>(x, i, c.begin, c.end, a, bitmap, pen,
                                                    inf_count, raw_m, raw_s, nullptr);
      argmax.z = fmaxf(argmax.z, x_max4);
    }
    // +inf rows never use the winner (kind_of: kFallback).
    if (!top_p_row || x_max4 == kNegInf || x_max4 == INFINITY) return;
    // Tokens below `bar` cannot change what the thread keeps: the block's best so far, or with
    // kRunnerUp a lower bound of the block's second best.
    const float bar = kRunnerUp ? fmaxf(runner_up.z, second_seen.get())
                                : fmaxf(winner.z, best_seen.get());
    const float z_max4 = x_max4 * inv_t;  // G <= 16.64; the margins cover the rounding
    const float margin = 1e-5f * fabsf(z_max4);
    if (z_max4 + 16.7f + margin < bar) return;
    const Philox4 w = random_words(p.seed, p.position, static_cast<uint32_t>(i) >> 2, kStreamGumbel);
    const uint32_t w_max = max(max(w.v[0], w.v[1]), max(w.v[2], w.v[3]));
    if (z_max4 + gumbel_upper_bound(w_max) + margin < bar) return;
    const int32_t held = winner.id;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (x[q] == kNegInf) continue;
      const float z_est = x[q] * inv_t;
      // Scored unless surely below (a NaN bound is scored).
      if (z_est + gumbel_upper_bound(w.v[q]) + 1e-5f * fabsf(z_est) <
          fmaxf(bar, kRunnerUp ? runner_up.z : winner.z))
        continue;
      const float z = scaled_logit(x[q], p.temperature);
      const Candidate scored{f_add(z, split_row::gumbel_of_word(w.v[q])), i + q};
      if (before(scored, winner)) {
        if constexpr (kRunnerUp) {
          runner_up = winner;
          runner_up_z = winner_z;
        }
        winner = scored;
        winner_z = z;
      } else if constexpr (kRunnerUp) {
        if (before(scored, runner_up)) {
          runner_up = scored;
          runner_up_z = z;
        }
      }
    }
    if constexpr (!kRunnerUp) {
      if (winner.z > bar) best_seen.raise(winner.z);  // above the block's best: share it
      return;
    }
    // A new winner and the token behind best_seen (published before it) are two tokens, so the
    // block's second best is at least the lower of their scores.
    float second = runner_up.z;
    if (winner.id != held) {
      const float seen = best_seen.get();
      if (winner.z > seen) best_seen.raise(winner.z);
      second = fmaxf(second, fminf(winner.z, seen));
    }
    if (second > bar) second_seen.raise(second);
  });
  argmax = block_best<kChunkThreads>(argmax, scratch);
  ChunkResult& out = a.results[blockIdx.x];
  if (top_p_row) {
    // Token ids are distinct, so exactly one thread holds the block's winner (or none is real).
    const Candidate block_winner = block_best<kChunkThreads>(winner, scratch);
    if (block_winner.id == kNoId ? threadIdx.x == 0 : winner.id == block_winner.id) {
      out.winner = block_winner;
      out.winner_z = block_winner.id == kNoId ? kNegInf : winner_z;
    }
    if constexpr (kRunnerUp) {
      // The best of the other threads' winners and the holder's runner-up.
      const bool holder = winner.id == block_winner.id;
      const Candidate mine = holder ? runner_up : winner;
      const Candidate second = block_best<kChunkThreads>(mine, scratch);
      if (second.id == kNoId ? threadIdx.x == 0 : mine.id == second.id) {
        ChunkDecide& d = a.chunk_decide[blockIdx.x];
        d.runner_up = second;
        d.runner_up_z = second.id == kNoId ? kNegInf : holder ? runner_up_z : winner_z;
      }
    }
  }
  warp_merge_lse(raw_m, raw_s);
  inf_count = __reduce_add_sync(0xffffffffu, inf_count);
  const int w = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0) {
    red_m[w] = raw_m;
    red_s[w] = raw_s;
    red_n[w] = inf_count;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = kNegInf, s = 0.0f;
    int32_t n = 0;
    for (int j = 0; j < kChunkThreads / 32; ++j) {
      merge_lse(m, s, red_m[j], red_s[j]);
      n += red_n[j];
    }
    out.argmax = argmax;
    out.raw_max = m;
    out.raw_sum = s;
    out.inf_count = n;
  }
}

// Kernel 2's work on tokens [c.begin, c.end) of row c.r: their histogram, added to the row's.
// `low` and `high` hold the block's bin sums in 32-bit words, so every add is a native shared
// atomic (a 64-bit one is a compare-and-swap loop): count rows count tokens in `low`; mass rows
// add each mass's low 16 bits to `low` and the rest to `high` (kMaxChunkTokens: neither wraps).
// Syncs.
template <typename T, bool kMasked, bool kPenalties>
__device__ void histogram_range(const T* __restrict__ logits, const Args& a, const Chunk& c,
                                const RowParams& p, bool by_mass, float z_max,
                                split_row::Rounds order, uint32_t* bitmap, uint32_t* low,
                                uint32_t* high) {
  __syncthreads();  // the bins' previous range is flushed
  for (int b = threadIdx.x; b < kBins; b += kChunkThreads) {
    low[b] = 0;
    high[b] = 0;
  }
  const PenaltySource pen = mark_chunk_penalties<kPenalties>(a, p, c, bitmap);  // syncs

  const split_row::Args quiet = without_raw(a);
  split_row::for_each_round(a.row_of<kMasked>(logits, c.r), c.begin, c.end, quiet.wide_loads(),
                            order, [&](float (&x)[4], int32_t i) {
    if (processed_group<kPenalties>(x, i, c, quiet, bitmap, pen) == kNegInf) return;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (x[q] == kNegInf) continue;
      const float z = scaled_logit(x[q], p.temperature);
      const int b = bin_of(z, z_max);
      if (!by_mass) {
        atomicAdd(&low[b], 1u);
        continue;
      }
      const uint64_t m = top_p_mass(z, z_max);
      if (m == 0) continue;
      atomicAdd(&low[b], static_cast<uint32_t>(m & 0xFFFFu));
      atomicAdd(&high[b], static_cast<uint32_t>(m >> 16));
    }
  });
  __syncthreads();
  for (int b = threadIdx.x; b < kBins; b += kChunkThreads) {
    if (!by_mass) {
      if (low[b] != 0) atomicAdd(&a.bin_counts[c.r * kBins + b], static_cast<int32_t>(low[b]));
      continue;
    }
    const unsigned long long m = (static_cast<unsigned long long>(high[b]) << 16) + low[b];
    if (m != 0) atomicAdd(&a.bin_masses[c.r * kBins + b], m);
  }
}

// Kernel 2: count-cut rows (and mass-cut rows of a step without decide) take their own chunk,
// backward after kernel 1's forward pass; then, in a step with decide, every block takes its
// share of a top-p row kernels 1a-b did not keep (spread_share over hist_rows).
template <typename T, bool kMasked, bool kPenalties>
__global__ void __launch_bounds__(kChunkThreads, kChunkBlocksPerSm)
    histogram_kernel(const T* __restrict__ logits, Args a) {
  extern __shared__ __align__(16) uint32_t bitmap[];
  __shared__ uint32_t low[kBins], high[kBins];
  __shared__ Candidate scratch[kChunkThreads / 32];
  __shared__ int32_t red[2 * kChunkThreads / 32];
  const Chunk c = chunk_of(a);
  split_row::wait_for_prior_grids();
  const RowParams p = split_row::row_params(a, c.r);
  if (p.valid_slot && uses_histogram(p)) {
    const RowStats s = merge_stats<kChunkThreads>(a, c.r, scratch, red);
    const int kind = kind_of(p, s.argmax.z, s.inf_count);
    if (kind == kCountCut || (kind == kMassCut && !a.decide))
      histogram_range<T, kMasked, kPenalties>(logits, a, c, p, kind == kMassCut,
                                              scaled_logit(s.argmax.z, p.temperature),
                                              split_row::Rounds::kBackward, bitmap, low, high);
  }
  if (!a.decide) return;
  const int32_t n = *a.hist_count;
  if (n == 0) return;
  const Chunk share = spread_share(a, a.hist_rows, n);
  if (share.begin >= share.end) return;
  const RowParams q = split_row::row_params(a, share.r);
  const RowStats s = merge_stats<kChunkThreads>(a, share.r, scratch, red);
  histogram_range<T, kMasked, kPenalties>(logits, a, share, q, true,
                                          scaled_logit(s.argmax.z, q.temperature),
                                          split_row::Rounds::kForward, bitmap, low, high);
}

// Kernel 2b (one block per row with a cut): the cut bin, and for top-p rows whether the winner
// is kept, or else (kRunnerUp: kernel 1 kept the runner-ups) dropped with the runner-up kept;
// in a step with spread, the rows it does not finish are listed for kernel 3 to spread.
template <bool kRunnerUp>
__global__ void __launch_bounds__(kChunkThreads) cut_kernel(Args a) {
  __shared__ CutSmem<kChunkThreads> cut_sm;
  __shared__ Candidate scratch[kChunkThreads / 32];
  __shared__ int32_t red[2 * kChunkThreads / 32];
  const int64_t r = blockIdx.x;
  split_row::wait_for_prior_grids();
  const RowParams p = split_row::row_params(a, r);
  if (!p.valid_slot || !uses_histogram(p)) return;
  const RowStats s = merge_stats<kChunkThreads>(a, r, scratch, red);
  const int kind = kind_of(p, s.argmax.z, s.inf_count);
  if (kind != kMassCut && kind != kCountCut) return;
  if (kind == kMassCut && a.decide && a.row_cuts[r].found) return;  // kernel 1b kept its winner
  const CutBin cut = find_cut<kChunkThreads>(a, r, kind == kMassCut, p.top_k, p.top_p, cut_sm);
  int32_t winner_id = kNoId;
  if (kind == kMassCut) {
    const float z_max = scaled_logit(s.argmax.z, p.temperature);
    const float tau = min_p_threshold(z_max, p.min_p);
    const RowWinner w = merge_winner<kChunkThreads>(a, r, scratch);
    if (winner_is_kept(w, cut, z_max, tau)) {
      winner_id = w.best.id;
    } else if constexpr (kRunnerUp) {
      if (winner_is_dropped(w, cut, z_max, tau)) {
        // Every other token ranks below the runner-up.
        const RowWinner u = merge_runner_up<kChunkThreads>(a, r, w.best, scratch);
        if (winner_is_kept(u, cut, z_max, tau)) winner_id = u.best.id;
      }
    }
  }
  if (threadIdx.x == 0) {
    int32_t slot = -1;
    if (kind == kMassCut && winner_id == kNoId && a.spread) {
      slot = atomicAdd(a.spread_count, 1);
      a.spread_rows[slot] = static_cast<int32_t>(r);
    }
    a.row_cuts[r] = RowCut{cut, winner_id, slot, true};
  }
}

// Kernel 3's work on tokens [c.begin, c.end) of row c.r (a cut row, or a min-p row: no cut): the
// best z + G of the surely kept tokens, returned to every thread; the cut bin's tokens appended
// to the row's list. Syncs.
template <typename T, bool kMasked, bool kPenalties>
__device__ Candidate select_range(const T* __restrict__ logits, const Args& a, const Chunk& c,
                                  const RowParams& p, int kind, const CutBin& cut, float z_max,
                                  split_row::Rounds order, uint32_t* bitmap, Candidate* scratch,
                                  split_row::BlockBest& best_seen) {
  const float tau = min_p_threshold(z_max, p.min_p);
  // Mass cut: bins below the cut are surely kept, the cut bin is listed. Count cut: the cut bin
  // and everything above it is listed (the finish kernel needs the whole top-k set in order).
  const int sure_below = kind == kMassCut ? cut.bin : kind == kNoCut ? kBins : 0;
  const int list_from = kind == kMassCut ? cut.bin : 0;
  const int list_to = kind == kNoCut ? -1 : cut.bin;
  if (threadIdx.x == 0) best_seen.reset();
  const PenaltySource pen = mark_chunk_penalties<kPenalties>(a, p, c, bitmap);  // syncs

  // A token is surely kept when x >= x_sure and listed when x_list <= x < x_above_list (the
  // tests on z = x / T below, as raw-logit thresholds: lowest_logit_where).
  auto z_of = [&](float x) { return x == kNegInf ? kNegInf : scaled_logit(x, p.temperature); };
  // Where the searches start: the z boundaries the bin tests approximate, times T.
  auto x_near = [&](int bins_down) { return (z_max - bins_down / kBinsPerNat) * p.temperature; };
  const float x_sure = lowest_logit_where([&](float x) {
    const float z = z_of(x);
    return z != kNegInf && bin_of(z, z_max) < sure_below && z >= tau;
  }, sure_below >= kBins ? tau * p.temperature : fmaxf(tau * p.temperature, x_near(sure_below)));
  const float x_list = lowest_logit_where([&](float x) {
    const float z = z_of(x);
    return z != kNegInf && bin_of(z, z_max) <= list_to;
  }, x_near(list_to + 1));
  const float x_above_list = lowest_logit_where([&](float x) {
    const float z = z_of(x);
    return z != kNegInf && bin_of(z, z_max) < list_from;
  }, x_near(list_from));
  const float inv_t = 1.0f / p.temperature;  // estimates only; exact z = x / T where it counts

  const split_row::Args quiet = without_raw(a);
  Candidate best{kNegInf, kNoId};
  Candidate* list = a.chunk_candidates + c.r * kCutCap;
  split_row::for_each_round(a.row_of<kMasked>(logits, c.r), c.begin, c.end, quiet.wide_loads(),
                            order, [&](float (&x)[4], int32_t i) {
    processed_group<kPenalties>(x, i, c, quiet, bitmap, pen);
    float sure_max = kNegInf;
    bool sure[4], listed[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      sure[q] = x[q] >= x_sure;
      listed[q] = x[q] >= x_list && !(x[q] >= x_above_list);
      if (sure[q]) sure_max = fmaxf(sure_max, x[q]);
    }
    // Noise only where it can win (as the split-row no-filter loop): G <= 16.64 for any word,
    // and the word's leading zeros bound G before the two logs, against the block's best score
    // so far; z estimated as x * (1 / T) with margins that cover the rounding, exact where it
    // counts.
    const float bar = fmaxf(best.z, best_seen.get());
    const float z_max4 = sure_max * inv_t;
    const float margin = 1e-5f * fabsf(z_max4);
    // Bounds in the `!(bound < bar)` form: a NaN bound (z_max4 = -inf from the estimate of a
    // finite z near -FLT_MAX) is scored, as in the no-filter loop.
    if (sure_max != kNegInf && !(z_max4 + 16.7f + margin < bar)) {
      const Philox4 w = random_words(p.seed, p.position, static_cast<uint32_t>(i) >> 2, kStreamGumbel);
      // One bound for the group first (gumbel_upper_bound grows with the word), then per token.
      const uint32_t w_max = max(max(w.v[0], w.v[1]), max(w.v[2], w.v[3]));
      if (!(z_max4 + gumbel_upper_bound(w_max) + margin < bar)) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float z_est = x[q] * inv_t;
          if (!sure[q] || z_est + gumbel_upper_bound(w.v[q]) + 1e-5f * fabsf(z_est) <
                              fmaxf(bar, best.z))
            continue;
          best = best_of(best,
                         Candidate{f_add(z_of(x[q]), split_row::gumbel_of_word(w.v[q])), i + q});
        }
        if (best.z > bar) best_seen.raise(best.z);  // above the block's best: share it
      }
    }
    // Listed tokens are few (one bin, or the top-k set): one vote skips the four appends.
    if (__any_sync(0xffffffffu, listed[0] || listed[1] || listed[2] || listed[3])) {
#pragma unroll
      for (int q = 0; q < 4; ++q)  // past kCutCap: counted, not stored (the row's fallback)
        split_row::append_candidate<kCutCap>(
            listed[q], Candidate{listed[q] ? z_of(x[q]) : kNegInf, i + q}, list, &a.cut_count[c.r]);
    }
  });
  return block_best<kChunkThreads>(best, scratch);
}

// Kernel 3: min-p rows (no cut), count-cut rows and, in a step without spread, the mass-cut
// rows kernel 2b did not finish take their own chunk, backward (min-p rows follow kernel 1's
// forward pass; a direction chosen per row would inline the loop twice): its surely kept best
// into results[].best. Then every block takes its share of a spread row (spread_share): its
// best into spread_best[block].
template <typename T, bool kMasked, bool kPenalties>
__global__ void __launch_bounds__(kChunkThreads, kChunkBlocksPerSm)
    select_kernel(const T* __restrict__ logits, Args a) {
  extern __shared__ __align__(16) uint32_t bitmap[];
  __shared__ Candidate scratch[kChunkThreads / 32];
  __shared__ int32_t red[2 * kChunkThreads / 32];
  __shared__ split_row::BlockBest best_seen;
  const Chunk c = chunk_of(a);
  split_row::wait_for_prior_grids();
  const RowParams p = split_row::row_params(a, c.r);
  if (p.valid_slot && !p.greedy) {
    const RowStats s = merge_stats<kChunkThreads>(a, c.r, scratch, red);
    const int kind = kind_of(p, s.argmax.z, s.inf_count);
    // Spread mass-cut rows are taken below; a row whose winner is kept (count-cut rows have
    // none) needs no select.
    const bool own_cut = kind == kCountCut || (kind == kMassCut && !a.spread);
    if (kind == kNoCut ||
        (own_cut && a.row_cuts[c.r].found && a.row_cuts[c.r].winner_id == kNoId)) {
      const CutBin cut = kind == kNoCut ? CutBin{kBins, 0, 0} : a.row_cuts[c.r].cut;
      const Candidate best = select_range<T, kMasked, kPenalties>(
          logits, a, c, p, kind, cut, scaled_logit(s.argmax.z, p.temperature),
          split_row::Rounds::kBackward, bitmap, scratch, best_seen);
      if (threadIdx.x == 0) a.results[blockIdx.x].best = best;
    }
  }
  const int32_t n = *a.spread_count;  // 0 without spread (kernel 1 clears it)
  if (n == 0) return;
  const Chunk share = spread_share(a, a.spread_rows, n);
  Candidate best{kNegInf, kNoId};
  if (share.begin < share.end) {  // a mass-cut row (cut_kernel)
    const RowParams q = split_row::row_params(a, share.r);
    const RowStats s = merge_stats<kChunkThreads>(a, share.r, scratch, red);
    best = select_range<T, kMasked, kPenalties>(logits, a, share, q, kMassCut,
                                                a.row_cuts[share.r].cut,
                                                scaled_logit(s.argmax.z, q.temperature),
                                                split_row::Rounds::kForward, bitmap, scratch,
                                                best_seen);
  }
  if (threadIdx.x == 0) a.spread_best[blockIdx.x] = best;
}

}  // namespace tokensampler::cuda::histogram_cut
