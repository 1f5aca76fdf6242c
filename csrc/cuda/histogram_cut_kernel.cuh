// Device code of the histogram-cut path of sample_rows (launch code: histogram_cut_sample.cu).
// Rows: any mix of greedy, no-filter, top-p, min-p and top-k rows (mixed batches, and top-k
// beyond the split-row path's k <= 512), penalties and bias as in split_row_kernel.cuh.
//
// A top-p boundary depends on the whole row, so a row split over many blocks is read three
// times (small batches read it from L2) and finished by one block:
//   1. stats: the argmax of the processed logits (z_max), the +inf count, raw log-sum-exp
//      partials; top-p rows also their winner, the best z + G over all tokens;
//   1a-b. in large top-p steps (decide), rows whose winner passes min-p: float sums of the
//      masses of all tokens and of those ranked before the winner; a row where they prove
//      the winner kept (surely_kept: about a fraction p of rows) is done, and the others go
//      on to kernel 2, spread over its whole grid;
//   2. histogram (top-p / top-k rows): counts and masses of the row's tokens in bins of 1/64
//      nat below z_max. Masses are the integers of row_rules.h's top_p_mass, summed per block in
//      32-bit halves (native shared atomics) and per row in 64 bits, so the sums are exact and
//      every run, batch and block size finds the same cut;
//   2b. cut (one block per row): the cut bin (the first whose cumulative mass reaches p times
//      the total, or whose cumulative count reaches k). A top-p row whose winner passes min-p
//      and lies below the cut bin is done: the winner is kept, so it is the kept set's best,
//      and kernels 3 and 4 skip its cut. The other top-p rows are listed for kernel 3;
//   3. select: tokens above the cut bin are surely kept: a block keeps the best z + G among
//      them (and the min-p threshold). Tokens in the cut bin (top-k rows: in it or above it) go
//      to a per-row list. Min-p and top-k rows take their own chunks; the listed top-p rows (a
//      fraction 1 - p of them) are spread over every block of the grid, so they do not keep
//      the kernel as long as whole chunks would;
//   4. finish: sorts the list into rank order and resolves the cut exactly (top-p: kept while
//      the mass before a token is below the limit; top-k: the first k, then top-p over their
//      masses; both as the CPU reference; then min-p), and takes the best z + G.
// Rows this cannot finish exactly (+inf logits, raw or after bias; z_max past fp32's range; a
// list over kCutCap; top-k over kCountCutMaxK)
// run the one-block-per-row kernel's code (sample_kernel.cuh) inside the finish kernel.
// Steps of fewer than kPdlMaxRows rows launch every kernel with programmatic dependent launch
// (split_row::launch); each kernel waits for the one ahead of it before its first global access.
// Kernels 1–3 read whole chunks, so each comes in two instantiations picked at launch (as the
// split-row chunk kernel): kMasked for a step with a grammar bitmask, and one without any
// bitmask code for a step without.
#pragma once

#include "device_primitives.cuh"
#include "mass_scan.cuh"
#include "sample_kernel.cuh"
#include "split_row_kernel.cuh"

namespace tokensampler::cuda::histogram_cut {

using split_row::ChunkResult;
using split_row::kChunkBlocksPerSm;
using split_row::kChunkThreads;
using split_row::kLoadsInFlight;
using split_row::kRoundTokens;
using split_row::RowParams;

constexpr int kBins = 2048;
constexpr float kBinsPerNat = 64.0f;
constexpr int kCutCap = 4096;        // tokens in a row's cut list that the finish kernel sorts
constexpr int kCountCutMaxK = kCutCap / 2;  // top-k rows: the list's tail holds the top-p scan
constexpr int kFinishThreads = 1024; // the one-block-per-row kernel's block size (fallback)
// Tokens per chunk at most: a bin's per-block sums of 16-bit mass halves then fit in 32 bits.
constexpr int32_t kMaxChunkTokens = 65532;
static_assert(uint64_t{kMaxChunkTokens} * 65536 < (uint64_t{1} << 32));
constexpr int32_t kMaxVocab = split_row::kMaxSplits * kMaxChunkTokens;  // 4.2 M; larger: one block per row
constexpr int64_t kDecideMinRows = 64;  // top-p steps of this many rows or more decide (kernels 1a-b)
constexpr int64_t kPdlMaxRows = 256;    // steps of fewer rows launch with PDL

struct CutBin {
  int bin;                    // tokens in lower bins are kept, in higher ones dropped
  unsigned long long before;  // mass (or count) of the lower bins
  unsigned long long limit;   // top-p: top_p_limit of the total mass; top-k: k
};

// A mass-cut or count-cut row's cut (kernel 2b), or its kept winner (kernel 1b or 2b), read by
// kernels 2b, 3 and 4.
struct RowCut {
  CutBin cut;
  int32_t winner_id;    // mass-cut rows whose winner is kept (the row's token); else kNoId
  int32_t spread_slot;  // mass-cut rows it did not finish: their index in spread_rows; else -1
  bool found;           // written this step (kernel 1 clears it); a row without runs the fallback
};

struct Args : split_row::Args {
  int32_t* bin_counts;              // [rows, kBins]
  unsigned long long* bin_masses;   // [rows, kBins]
  int32_t* cut_count;               // [rows] tokens appended to the cut list
  RowCut* row_cuts;                 // [rows]
  int32_t* spread_rows;             // [rows] mass-cut rows that kernel 3 spreads over its grid
  int32_t* spread_count;            // how many (kernel 1 clears it)
  Candidate* spread_best;           // [chunks] kernel 3: the best z + G of a block's share
  // Steps that decide top-p rows before the histogram (decide: large batches).
  bool decide;
  float2* mass_sums;                // [chunks] kernel 1a: a chunk's float mass sums (total, before)
  int32_t* hist_rows;               // [rows] top-p rows kernel 2 spreads over its grid
  int32_t* hist_count;              // how many (kernel 1 clears it)
};

enum Kind : int { kInvalid, kGreedy, kFallback, kNoCut, kMassCut, kCountCut };

__device__ __forceinline__ bool uses_histogram(const RowParams& p) {
  return !p.greedy && (p.top_k_on || p.top_p < 1.0f);
}

// max_logit: the row's largest processed logit; inf_count: its raw +inf entries. Rows with a
// +inf raw or processed logit (a +inf bias), or whose z_max is past fp32's range, run the
// one-block-per-row kernel's code: the bins and masses assume a finite z_max.
__device__ __forceinline__ int kind_of(const RowParams& p, float max_logit, int32_t inf_count) {
  if (max_logit == kNegInf) return kInvalid;
  if (p.greedy) return kGreedy;
  if (inf_count > 0 || !isfinite(scaled_logit(max_logit, p.temperature))) return kFallback;
  if (p.top_k_on) return p.top_k <= kCountCutMaxK ? kCountCut : kFallback;
  return p.top_p < 1.0f ? kMassCut : kNoCut;
}

// Bin of a token d = z_max - z nats below the row's best (monotone in z, so bins follow rank
// order); the last bin holds everything 32 nats down or more.
__device__ __forceinline__ int bin_of(float z, float z_max) {
  return static_cast<int>(fminf(f_sub(z_max, z) * kBinsPerNat, static_cast<float>(kBins - 1)));
}

// The smallest processed logit x (in float order) for which up(x) holds, where up is an up-set
// of the finite and -inf logits (true at x implies true above it); NaN (every x >= NaN is
// false) when none. z = x / T and bin_of are monotone, so each of the select kernel's per-token
// tests is such a set or the difference of two: a search per block replaces a division and a
// bin per token with comparisons of x, and decides exactly as they would. Each step probes 32
// keys at once, one per lane: the first at the two ends and at offsets of 4^j keys either side
// of `hint` (an estimate of the answer: a good one leaves a bracket of a few keys), then 32-ary
// steps inside the bracket. Every lane of a warp calls it and gets the result.
template <typename Up>
__device__ __forceinline__ float lowest_logit_where(Up up, float hint) {
  const int64_t lowest = rank_key(kNegInf), highest = rank_key(3.40282347e38f);
  const int64_t center = rank_key(isfinite(hint) ? hint : 0.0f);
  const int d = static_cast<int>(threadIdx.x & 31) - 16;  // lane 0: -inf, 31: the largest float
  const int64_t offset = d < 0 ? -(int64_t{1} << (-2 * d)) : d > 0 ? int64_t{1} << (2 * d) : 0;
  const uint32_t first_probe =
      static_cast<uint32_t>(d == 15 ? highest : min(max(center + offset, lowest), highest));
  const uint32_t holds = __ballot_sync(0xffffffffu, up(key_to_z(first_probe)));  // a suffix
  if (holds == 0) return NAN;
  const int first = __ffs(holds) - 1;
  if (first == 0) return kNegInf;
  uint32_t hi = __shfl_sync(0xffffffffu, first_probe, first);  // up true at hi, false at lo
  uint32_t lo = __shfl_sync(0xffffffffu, first_probe, first - 1);
  const uint32_t lane = threadIdx.x & 31;
  while (hi - lo > 1) {
    const uint32_t step = max((hi - lo) / 32, 1u);
    const uint32_t probe = min(lo + step * (lane + 1), hi);
    const uint32_t in = __ballot_sync(0xffffffffu, up(key_to_z(probe)));  // a suffix of lanes
    const uint32_t at = __ffs(in) - 1;  // in != 0: lane 31's probe is hi or below it
    if (in == 0) {
      lo = lo + step * 32;
    } else {
      hi = min(lo + step * (at + 1), hi);
      if (at > 0) lo = lo + step * at;
    }
  }
  return key_to_z(hi);
}

// The row-wide argmax and +inf count from kernel 1's per-chunk results.
struct RowStats {
  Candidate argmax;
  int32_t inf_count;
};

template <int kThreads>
__device__ RowStats merge_stats(const Args& a, int64_t r, Candidate* scratch, int32_t* red) {
  Candidate argmax{kNegInf, kNoId};
  int32_t inf_count = 0;
  for (int j = threadIdx.x; j < a.splits; j += kThreads) {
    const ChunkResult& c = a.results[r * a.splits + j];
    argmax = best_of(argmax, c.argmax);
    inf_count += c.inf_count;
  }
  int parity = 0;
  RowStats s;
  s.argmax = block_best<kThreads>(argmax, scratch);
  s.inf_count = split_row::block_count<kThreads>(inf_count, red, parity);
  return s;
}

template <int kThreads>
struct CutSmem {
  typename MassScan<kThreads>::TempStorage scan;
  int bin;
  unsigned long long before;
};

// The first bin whose cumulative mass (or count) reaches the limit; the last bin when none does
// (fewer finite tokens than k).
template <int kThreads>
__device__ CutBin find_cut(const Args& a, int64_t r, bool by_mass, int32_t k, float top_p,
                           CutSmem<kThreads>& sm) {
  constexpr int kPer = kBins / kThreads;
  unsigned long long v[kPer], sum = 0;
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    const int b = threadIdx.x * kPer + q;
    v[q] = by_mass ? a.bin_masses[r * kBins + b]
                   : static_cast<unsigned long long>(a.bin_counts[r * kBins + b]);
    sum += v[q];
  }
  if (threadIdx.x == 0) sm.bin = kBins - 1;
  unsigned long long excl, total;
  MassScan<kThreads>(sm.scan).ExclusiveSum(sum, excl, total);
  __syncthreads();
  const unsigned long long limit = by_mass ? top_p_limit(top_p, total) : k;
  unsigned long long cum = excl;
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    if (cum + v[q] >= limit) {
      atomicMin(&sm.bin, static_cast<int>(threadIdx.x) * kPer + q);
      break;
    }
    cum += v[q];
  }
  __syncthreads();
  const int bin = sm.bin;
  if (bin / kPer == static_cast<int>(threadIdx.x)) {
    cum = excl;
    for (int q = 0; q < bin % kPer; ++q) cum += v[q];
    sm.before = cum;
  }
  __syncthreads();
  return CutBin{bin, sm.before, limit};
}

// Kernel 1's winner of a top-p row (the best of its chunks' winners) and that token's z.
struct RowWinner {
  Candidate best;
  float z;
};

template <int kThreads>
__device__ RowWinner merge_winner(const Args& a, int64_t r, Candidate* scratch) {
  Candidate w{kNegInf, kNoId};
  for (int j = threadIdx.x; j < a.splits; j += kThreads) w = best_of(w, a.results[r * a.splits + j].winner);
  w = block_best<kThreads>(w, scratch);
  const float z = w.id == kNoId ? kNegInf : a.results[r * a.splits + w.id / a.chunk_len].winner_z;
  return RowWinner{w, z};
}

// Every token in a bin below the cut that passes min-p is kept: when the row's best z + G is
// such a token, it is the kept set's best, exactly as the cut would find it (same scores, same
// order).
__device__ __forceinline__ bool winner_is_kept(const RowWinner& w, const CutBin& cut, float z_max,
                                               float tau) {
  return w.best.id != kNoId && w.z >= tau && bin_of(w.z, z_max) < cut.bin;
}

struct Chunk {
  int64_t r;
  int32_t begin, end;
};

__device__ __forceinline__ Chunk chunk_of(const Args& a) {
  const int32_t split = blockIdx.x % a.splits;
  const int32_t begin = split * a.chunk_len;
  return Chunk{blockIdx.x / a.splits, begin, min(a.vocab, begin + a.chunk_len)};
}

// The chunk's penalty source, its penalised tokens marked in the shared bitmap (syncs).
__device__ __forceinline__ PenaltySource mark_chunk_penalties(const Args& a, const RowParams& p,
                                                              const Chunk& c, uint32_t* bitmap) {
  if (!a.penalties) {
    __syncthreads();
    return PenaltySource{};
  }
  const PenaltySource pen = split_row::penalty_source(a, p, c.r);
  mark_penalized_tokens<kChunkThreads>(pen, c.begin, c.end, bitmap);
  return pen;
}

// Kernel 1: per chunk, the argmax of the processed logits, the +inf count, raw partials, and
// for top-p rows the winner: the best z + G, noise only where it can win (as the split-row
// no-filter loop; this kernel has issue slots to spare, the histogram kernel has not). Also
// clears the row's histogram and cut list for kernels 2 and 3.
template <typename T, bool kMasked>
__global__ void __launch_bounds__(kChunkThreads, kChunkBlocksPerSm)
    stats_kernel(const T* __restrict__ logits, Args a) {
  extern __shared__ __align__(16) uint32_t bitmap[];
  __shared__ Candidate scratch[kChunkThreads / 32];
  __shared__ float red_m[kChunkThreads / 32], red_s[kChunkThreads / 32];
  __shared__ int32_t red_n[kChunkThreads / 32];
  __shared__ split_row::BlockBest best_seen;
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
  if (threadIdx.x == 0) best_seen.reset();
  const PenaltySource pen = mark_chunk_penalties(a, p, c, bitmap);  // syncs
  const bool top_p_row = !p.greedy && !p.top_k_on && p.top_p < 1.0f;
  const float inv_t = 1.0f / p.temperature;  // estimates only; exact z = x / T where it counts

  Candidate argmax{kNegInf, kNoId}, winner{kNegInf, kNoId};
  float winner_z = kNegInf;
  float raw_m = kNegInf, raw_s = 0.0f;
  int32_t inf_count = 0;
  split_row::for_each_round(a.row_of<kMasked>(logits, c.r), c.begin, c.end, [&](float (&x)[4], int32_t i) {
    const float x_max4 = split_row::process_group(x, i, c.begin, c.end, a, bitmap, pen, inf_count,
                                                  raw_m, raw_s, &argmax);
    // +inf rows never use the winner (kind_of: kFallback).
    if (!top_p_row || x_max4 == kNegInf || x_max4 == INFINITY) return;
    const float bar = fmaxf(winner.z, best_seen.get());
    const float z_max4 = x_max4 * inv_t;  // G <= 16.64; the margins cover the rounding
    const float margin = 1e-5f * fabsf(z_max4);
    if (z_max4 + 16.7f + margin < bar) return;
    const Philox4 w = random_words(p.seed, p.position, static_cast<uint32_t>(i) >> 2, kStreamGumbel);
    const uint32_t w_max = max(max(w.v[0], w.v[1]), max(w.v[2], w.v[3]));
    if (z_max4 + gumbel_upper_bound(w_max) + margin < bar) return;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (x[q] == kNegInf) continue;
      const float z_est = x[q] * inv_t;
      // Scored unless surely below (a NaN bound is scored).
      if (z_est + gumbel_upper_bound(w.v[q]) + 1e-5f * fabsf(z_est) < fmaxf(bar, winner.z))
        continue;
      const float z = scaled_logit(x[q], p.temperature);
      const Candidate scored{f_add(z, split_row::gumbel_of_word(w.v[q])), i + q};
      if (before(scored, winner)) {
        winner = scored;
        winner_z = z;
      }
    }
    if (winner.z > bar) best_seen.raise(winner.z);  // above the block's best: share it
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

// Kernels 2 and 3 re-read the row for the processed logits only: kernel 1 has the +inf count
// and the raw partials.
__device__ __forceinline__ split_row::Args without_raw(const Args& a) {
  split_row::Args quiet = a;
  quiet.want_raw = false;
  return quiet;
}

// Sanitises and penalises four logits in place (-inf past the chunk); returns their maximum.
__device__ __forceinline__ float processed_group(float (&x)[4], int32_t i, const Chunk& c,
                                                 const split_row::Args& quiet,
                                                 const uint32_t* bitmap, const PenaltySource& pen) {
  int32_t inf_count = 0;
  float raw_m = kNegInf, raw_s = 0.0f;
  return split_row::process_group(x, i, c.begin, c.end, quiet, bitmap, pen, inf_count, raw_m,
                                  raw_s, nullptr);
}

// Kernel 1a (steps with decide; mass-cut rows whose winner passes min-p): per chunk, in floats,
// S = the sum of e^(x / T - M) over its tokens and B = the same over those ranked before the
// winner, M the row's largest z (both estimated as x * (1 / T)). Kernel 1b bounds the row's
// integer masses by them (surely_kept): most rows keep their winner and need no histogram.
// Written per chunk and added in chunk order: no float atomics, the same sums every run.
// Relative error bounds. kernel 1a's sums: __expf is within 2 + 1.173 |a| ulp (CUDA guide), 48
// ulp where a term counts (|a| <= 40); its argument is rounded once (40 * 2^-24); a thread adds
// at most 256 terms (kMaxChunkTokens / kChunkThreads), the block 13 partials more, each add
// 2^-24: 2.5e-5 in all, a tenth of the bound. portable_exp: < 2e-7 (DESIGN §3, step 6).
constexpr double kSumError = 0x1p-12;
constexpr double kExpError = 0x1p-20;
static_assert((kMaxChunkTokens + kChunkThreads - 1) / kChunkThreads <= 256, "kSumError counts 256 terms a thread");

// Delta: how far x * (1 / T) - M can be from the rule's d = z - z_max for a token with a mass
// (|z| <= |z_max| + 24): each z estimate within 2^-23 of it, M within 2^-22 of z_max, d rounded.
__device__ __forceinline__ double estimate_slack(float z_max) {
  return (2.0 * fabs(static_cast<double>(z_max)) + 40.0) * 0x1p-22 + 40.0 * 0x1p-24;
}

// Rows kernels 1a-b decide: a winner that passes min-p, and estimates close enough to bound the
// masses by (|z_max| below about 2^11).
__device__ __forceinline__ bool decidable(const RowWinner& w, float z_max, float m,
                                          const RowParams& p) {
  return w.best.id != kNoId && w.z >= min_p_threshold(z_max, p.min_p) && isfinite(m) &&
         estimate_slack(z_max) < 0x1p-10;
}

// Whether the winner is kept, proven from kernel 1a's sums S (total) and B (before), or false.
// The rule (row_rules.h): masses m = floor(E(d) 2^32) for d > -23, E = portable_exp; kept iff
// the mass before the winner is below top_p_limit(p, T), T the total, monotone in T. Each term of
// the sums is e^a (1 +- kSumError) with |a - d| <= Delta where the mass is not 0; the tokens with
// d <= -23 add at most V e^-22 to S. So T >= 2^32 (the argmax's mass) and
//   T >= (1 - kExpError) 2^32 e^-Delta (S / (1 + kSumError) - V e^-22) - V,
//   before <= (1 + kExpError) 2^32 e^Delta B / (1 - kSumError),
// each evaluated in double with a 2^-40 margin for its own rounding.
__device__ __forceinline__ bool surely_kept(double total, double before, float z_max, float top_p,
                                           int32_t vocab) {
  const double slack = exp(estimate_slack(z_max)), unit = 0x1p32, v = vocab;
  const double total_lo = fmax(unit, ((1.0 - kExpError) * unit / slack *
                                          (total / (1.0 + kSumError) - v * exp(-22.0)) - v) *
                                         (1.0 - 0x1p-40));
  const double before_hi = (1.0 + kExpError) * unit * slack * before / (1.0 - kSumError) *
                           (1.0 + 0x1p-40);
  if (!(total_lo < 0x1p62) || !(before_hi < 0x1p62)) return false;
  return before_hi < static_cast<double>(top_p_limit(top_p, static_cast<uint64_t>(total_lo)));
}

// What kernels 1a and 1b know of row r: whether it is a mass-cut row, and then its parameters,
// z_max, M (the estimate kernel 1a's sums are relative to), winner, and whether the winner is
// decidable, which must read the same in both kernels: 1b sums what 1a wrote for exactly those
// rows. Block-uniform. Syncs.
struct DecideRow {
  bool mass_cut;
  RowParams p;
  float z_max, m;
  RowWinner w;
  bool decidable;
};

__device__ __forceinline__ DecideRow decide_row(const Args& a, int64_t r, Candidate* scratch, int32_t* red) {
  DecideRow d{};
  d.p = split_row::row_params(a, r);
  if (!d.p.valid_slot || !uses_histogram(d.p)) return d;
  const RowStats s = merge_stats<kChunkThreads>(a, r, scratch, red);
  if (kind_of(d.p, s.argmax.z, s.inf_count) != kMassCut) return d;
  d.mass_cut = true;
  d.z_max = scaled_logit(s.argmax.z, d.p.temperature);
  d.m = s.argmax.z * (1.0f / d.p.temperature);
  d.w = merge_winner<kChunkThreads>(a, r, scratch);
  d.decidable = decidable(d.w, d.z_max, d.m, d.p);
  return d;
}

template <typename T, bool kMasked>
__global__ void __launch_bounds__(kChunkThreads, kChunkBlocksPerSm)
    mass_sums_kernel(const T* __restrict__ logits, Args a) {
  extern __shared__ __align__(16) uint32_t bitmap[];
  __shared__ Candidate scratch[kChunkThreads / 32];
  __shared__ int32_t red[2 * kChunkThreads / 32];
  __shared__ float red_total[kChunkThreads / 32], red_before[kChunkThreads / 32];
  const Chunk c = chunk_of(a);
  split_row::wait_for_prior_grids();
  const DecideRow d = decide_row(a, c.r, scratch, red);
  if (!d.mass_cut || !d.decidable) return;
  const RowParams& p = d.p;
  const RowWinner& w = d.w;
  const float inv_t = 1.0f / p.temperature, m = d.m;
  const PenaltySource pen = mark_chunk_penalties(a, p, c, bitmap);  // syncs
  // Ranked before the winner: z > z_w, or z == z_w and a lower id (raw-logit thresholds).
  auto z_of = [&](float x) { return x == kNegInf ? kNegInf : scaled_logit(x, p.temperature); };
  const float x_w = w.z * p.temperature;  // where the searches start
  const float x_above = lowest_logit_where([&](float x) { return z_of(x) > w.z; }, x_w);
  const float x_tied = lowest_logit_where([&](float x) { return z_of(x) >= w.z; }, x_w);

  const split_row::Args quiet = without_raw(a);
  float total = 0.0f, before = 0.0f;
  split_row::for_each_round(a.row_of<kMasked>(logits, c.r), c.begin, c.end, [&](float (&x)[4], int32_t i) {
    if (processed_group(x, i, c, quiet, bitmap, pen) == kNegInf) return;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float e = __expf(fmaf(x[q], inv_t, -m));  // 0 for x = -inf
      total += e;
      if (x[q] >= x_above || (x[q] >= x_tied && i + q < w.best.id)) before += e;
    }
  });
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    total += __shfl_xor_sync(0xffffffffu, total, o);
    before += __shfl_xor_sync(0xffffffffu, before, o);
  }
  if ((threadIdx.x & 31) == 0) {
    red_total[threadIdx.x >> 5] = total;
    red_before[threadIdx.x >> 5] = before;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0.0f, b = 0.0f;
    for (int j = 0; j < kChunkThreads / 32; ++j) {
      t += red_total[j];
      b += red_before[j];
    }
    a.mass_sums[blockIdx.x] = make_float2(t, b);
  }
}

// Kernel 1b (steps with decide; one block per mass-cut row): a row whose winner surely_kept by
// kernel 1a's sums is done; the others are listed for kernel 2's histogram.
__global__ void __launch_bounds__(kChunkThreads) decide_kernel(Args a) {
  __shared__ Candidate scratch[kChunkThreads / 32];
  __shared__ int32_t red[2 * kChunkThreads / 32];
  const int64_t r = blockIdx.x;
  split_row::wait_for_prior_grids();
  const DecideRow d = decide_row(a, r, scratch, red);
  if (!d.mass_cut || threadIdx.x != 0) return;
  bool kept = false;
  if (d.decidable) {
    double total = 0.0, before = 0.0;  // in chunk order
    for (int32_t j = 0; j < a.splits; ++j) {
      total += a.mass_sums[r * a.splits + j].x;
      before += a.mass_sums[r * a.splits + j].y;
    }
    kept = surely_kept(total, before, d.z_max, d.p.top_p, a.vocab);
  }
  if (kept) {
    a.row_cuts[r] = RowCut{CutBin{kBins, 0, 0}, d.w.best.id, -1, true};
  } else {
    const int32_t slot = atomicAdd(a.hist_count, 1);
    a.hist_rows[slot] = static_cast<int32_t>(r);
  }
}

// A spread row's share of a grid (kernels 2 and 3): the blocks b with b % n == slot (n rows in
// `rows`) take equal consecutive ranges of its tokens, 1024 at least (a block's start costs about
// as much as reading that many), so the last of them may have none.
__device__ __forceinline__ Chunk spread_share(const Args& a, const int32_t* rows, int32_t n) {
  const int32_t slot = static_cast<int32_t>(blockIdx.x) % n;
  const int32_t share = static_cast<int32_t>(blockIdx.x) / n;
  const int32_t shares = (static_cast<int32_t>(gridDim.x) - 1 - slot) / n + 1;
  const int32_t len = max(((a.vocab + shares - 1) / shares + 3) / 4 * 4, 1024);
  const int32_t begin = static_cast<int32_t>(min(int64_t{share} * len, int64_t{a.vocab}));
  return Chunk{rows[slot], begin, min(a.vocab, begin + len)};
}

// Kernel 2's work on tokens [c.begin, c.end) of row c.r: their histogram, added to the row's.
// `low` and `high` hold the block's bin sums in 32-bit words, so every add is a native shared
// atomic (a 64-bit one is a compare-and-swap loop): count rows count tokens in `low`; mass rows
// add each mass's low 16 bits to `low` and the rest to `high` (kMaxChunkTokens: neither wraps).
// Syncs.
template <typename T, bool kMasked>
__device__ void histogram_range(const T* __restrict__ logits, const Args& a, const Chunk& c,
                                const RowParams& p, bool by_mass, float z_max, uint32_t* bitmap,
                                uint32_t* low, uint32_t* high) {
  __syncthreads();  // the bins' previous range is flushed
  for (int b = threadIdx.x; b < kBins; b += kChunkThreads) {
    low[b] = 0;
    high[b] = 0;
  }
  const PenaltySource pen = mark_chunk_penalties(a, p, c, bitmap);  // syncs

  const split_row::Args quiet = without_raw(a);
  split_row::for_each_round(a.row_of<kMasked>(logits, c.r), c.begin, c.end, [&](float (&x)[4], int32_t i) {
    if (processed_group(x, i, c, quiet, bitmap, pen) == kNegInf) return;
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

// Kernel 2: count-cut rows (and mass-cut rows of a step without decide) take their own chunk;
// then, in a step with decide, every block takes its share of a top-p row kernels 1a-b did not
// keep (spread_share over hist_rows).
template <typename T, bool kMasked>
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
      histogram_range<T, kMasked>(logits, a, c, p, kind == kMassCut,
                                  scaled_logit(s.argmax.z, p.temperature), bitmap, low, high);
  }
  if (!a.decide) return;
  const int32_t n = *a.hist_count;
  if (n == 0) return;
  const Chunk share = spread_share(a, a.hist_rows, n);
  if (share.begin >= share.end) return;
  const RowParams q = split_row::row_params(a, share.r);
  const RowStats s = merge_stats<kChunkThreads>(a, share.r, scratch, red);
  histogram_range<T, kMasked>(logits, a, share, q, true, scaled_logit(s.argmax.z, q.temperature),
                              bitmap, low, high);
}

// Kernel 2b (one block per row with a cut): the cut bin, and for top-p rows whether the winner
// is kept; the rows it does not finish are listed for kernel 3 to spread.
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
    const RowWinner w = merge_winner<kChunkThreads>(a, r, scratch);
    if (winner_is_kept(w, cut, z_max, min_p_threshold(z_max, p.min_p))) winner_id = w.best.id;
  }
  if (threadIdx.x == 0) {
    int32_t slot = -1;
    if (kind == kMassCut && winner_id == kNoId) {
      slot = atomicAdd(a.spread_count, 1);
      a.spread_rows[slot] = static_cast<int32_t>(r);
    }
    a.row_cuts[r] = RowCut{cut, winner_id, slot, true};
  }
}

// Kernel 3's work on tokens [c.begin, c.end) of row c.r (a cut row, or a min-p row: no cut): the
// best z + G of the surely kept tokens, returned to every thread; the cut bin's tokens appended
// to the row's list. Syncs.
template <typename T, bool kMasked>
__device__ Candidate select_range(const T* __restrict__ logits, const Args& a, const Chunk& c,
                                  const RowParams& p, int kind, const CutBin& cut, float z_max,
                                  uint32_t* bitmap, Candidate* scratch,
                                  split_row::BlockBest& best_seen) {
  const float tau = min_p_threshold(z_max, p.min_p);
  // Mass cut: bins below the cut are surely kept, the cut bin is listed. Count cut: the cut bin
  // and everything above it is listed (the finish kernel needs the whole top-k set in order).
  const int sure_below = kind == kMassCut ? cut.bin : kind == kNoCut ? kBins : 0;
  const int list_from = kind == kMassCut ? cut.bin : 0;
  const int list_to = kind == kNoCut ? -1 : cut.bin;
  if (threadIdx.x == 0) best_seen.reset();
  const PenaltySource pen = mark_chunk_penalties(a, p, c, bitmap);  // syncs

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
  split_row::for_each_round(a.row_of<kMasked>(logits, c.r), c.begin, c.end, [&](float (&x)[4], int32_t i) {
    processed_group(x, i, c, quiet, bitmap, pen);
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

// Kernel 3: min-p rows (no cut) and count-cut rows take their own chunk: its surely kept best
// into results[].best. Then every block takes its share of a spread row (spread_share): its
// best into spread_best[block].
template <typename T, bool kMasked>
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
    if (kind == kNoCut || (kind == kCountCut && a.row_cuts[c.r].found)) {
      const CutBin cut = kind == kNoCut ? CutBin{kBins, 0, 0} : a.row_cuts[c.r].cut;
      const Candidate best = select_range<T, kMasked>(logits, a, c, p, kind, cut,
                                                      scaled_logit(s.argmax.z, p.temperature),
                                                      bitmap, scratch, best_seen);
      if (threadIdx.x == 0) a.results[blockIdx.x].best = best;
    }
  }
  const int32_t n = *a.spread_count;
  if (n == 0) return;
  const Chunk share = spread_share(a, a.spread_rows, n);
  Candidate best{kNegInf, kNoId};
  if (share.begin < share.end) {  // a mass-cut row (cut_kernel)
    const RowParams q = split_row::row_params(a, share.r);
    const RowStats s = merge_stats<kChunkThreads>(a, share.r, scratch, red);
    best = select_range<T, kMasked>(logits, a, share, q, kMassCut, a.row_cuts[share.r].cut,
                                    scaled_logit(s.argmax.z, q.temperature), bitmap, scratch,
                                    best_seen);
  }
  if (threadIdx.x == 0) a.spread_best[blockIdx.x] = best;
}

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
  if (kind == kNoCut) {
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
