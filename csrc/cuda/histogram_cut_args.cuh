// What the histogram-cut kernels share (kernels: histogram_cut_kernel.cuh, _decide.cuh,
// _finish.cuh): constants, the step's arguments, row kinds and bins, the merges of kernel 1's
// per-chunk results, the cut search, chunks and spread shares, the processed-logit group.
#pragma once

#include "device_primitives.cuh"
#include "mass_scan.cuh"
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
constexpr int32_t kMaxChunkTokens = 65528;  // a multiple of kAlignTokens
static_assert(uint64_t{kMaxChunkTokens} * 65536 < (uint64_t{1} << 32) &&
              kMaxChunkTokens % kAlignTokens == 0);
constexpr int32_t kMaxVocab = split_row::kMaxSplits * kMaxChunkTokens;  // 4.2 M; larger: one block per row
constexpr int64_t kDecideMinRows = 64;  // top-p steps of this many rows or more decide (kernels 1a-b)
constexpr int64_t kRunnerUpMinRows = 4;  // steps with a cut of this many rows or more keep runner-ups
static_assert(kRunnerUpMinRows <= kDecideMinRows, "kernels 1a-b read the runner-ups");
constexpr int64_t kPdlMaxRows = 256;    // steps of fewer rows launch with PDL

struct CutBin {
  int bin;                    // tokens in lower bins are kept, in higher ones dropped
  unsigned long long before;  // mass (or count) of the lower bins
  unsigned long long limit;   // top-p: top_p_limit of the total mass; top-k: k
};

// A mass-cut or count-cut row's cut (kernel 2b), or its token where kernel 1b or 2b found it
// without the cut (the winner, or kernel 1b's runner-up), read by kernels 2b, 3 and 4.
struct RowCut {
  CutBin cut;
  int32_t winner_id;    // mass-cut rows whose kept best is known (the row's token); else kNoId
  int32_t spread_slot;  // mass-cut rows it listed (spread): their index in spread_rows; else -1
  bool found;           // written this step (kernel 1 clears it); a row without runs the fallback
};

// What a top-p row's chunk leaves kernels 1b and 2b beside its ChunkResult: kernel 1's
// runner-up (the chunk's second best z + G) and its z; in steps with decide, kernel 1a's float
// sums of the masses of all its tokens and of those ranked before the row's winner and before
// its runner-up.
struct ChunkDecide {
  Candidate runner_up;
  float runner_up_z;
  float total, before_winner, before_runner_up;
};

struct Args : split_row::Args {
  int32_t* bin_counts;              // [rows, kBins]
  unsigned long long* bin_masses;   // [rows, kBins]
  int32_t* cut_count;               // [rows] tokens appended to the cut list
  RowCut* row_cuts;                 // [rows]
  int32_t* spread_rows;             // [rows] mass-cut rows that kernel 3 spreads over its grid
  int32_t* spread_count;            // how many (kernel 1 clears it)
  Candidate* spread_best;           // [chunks] kernel 3: the best z + G of a block's share
  bool spread;                      // kernel 3 spreads the listed mass-cut rows (few rows)
  // Steps that decide top-p rows before the histogram (decide: large batches).
  bool decide;
  ChunkDecide* chunk_decide;        // [chunks] kernel 1: top-p runner-ups; 1a: float mass sums
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

// A top-p row's runner-up: the best of the chunks' winners other than the row's winner `w` and
// the runner-up of the chunk holding it, and that token's z.
template <int kThreads>
__device__ RowWinner merge_runner_up(const Args& a, int64_t r, const Candidate& w,
                                     Candidate* scratch) {
  Candidate u{kNegInf, kNoId};
  for (int j = threadIdx.x; j < a.splits; j += kThreads) {
    const Candidate c = a.results[r * a.splits + j].winner;
    u = best_of(u, c.id == w.id ? a.chunk_decide[r * a.splits + j].runner_up : c);
  }
  u = block_best<kThreads>(u, scratch);
  if (u.id == kNoId) return RowWinner{u, kNegInf};
  const int64_t j = r * a.splits + u.id / a.chunk_len;
  return RowWinner{u, a.results[j].winner.id == u.id ? a.results[j].winner_z
                                                     : a.chunk_decide[j].runner_up_z};
}

// Every token in a bin below the cut that passes min-p is kept: when the row's best z + G is
// such a token, it is the kept set's best, exactly as the cut would find it (same scores, same
// order).
__device__ __forceinline__ bool winner_is_kept(const RowWinner& w, const CutBin& cut, float z_max,
                                               float tau) {
  return w.best.id != kNoId && w.z >= tau && bin_of(w.z, z_max) < cut.bin;
}

// The mirror of winner_is_kept: the row's winner fails min-p or lies in a bin above the cut, so
// every kept token ranks below it (a winner in the cut bin is neither).
__device__ __forceinline__ bool winner_is_dropped(const RowWinner& w, const CutBin& cut,
                                                  float z_max, float tau) {
  return w.best.id != kNoId && (w.z < tau || bin_of(w.z, z_max) > cut.bin);
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
// kPenalties false (a step without penalties): nothing to mark.
template <bool kPenalties>
__device__ __forceinline__ PenaltySource mark_chunk_penalties(const Args& a, const RowParams& p,
                                                              const Chunk& c, uint32_t* bitmap) {
  if (!kPenalties || !a.penalties) {
    __syncthreads();
    return PenaltySource{};
  }
  const PenaltySource pen = split_row::penalty_source(a, p, c.r);
  mark_penalized_tokens<kChunkThreads>(pen, c.begin, c.end, bitmap);
  return pen;
}

// Kernels 1a, 2 and 3 re-read the row for the processed logits only: kernel 1 has the +inf count
// and the raw partials (so they may read 2-byte rows 8 tokens a load: wide_loads()).
__device__ __forceinline__ split_row::Args without_raw(const Args& a) {
  split_row::Args quiet = a;
  quiet.want_raw = false;
  return quiet;
}

// Sanitises and penalises four logits in place (-inf past the chunk); returns their maximum.
template <bool kPenalties>
__device__ __forceinline__ float processed_group(float (&x)[4], int32_t i, const Chunk& c,
                                                 const split_row::Args& quiet,
                                                 const uint32_t* bitmap, const PenaltySource& pen) {
  int32_t inf_count = 0;
  float raw_m = kNegInf, raw_s = 0.0f;
  return split_row::process_group<kPenalties>(x, i, c.begin, c.end, quiet, bitmap, pen,
                                              inf_count, raw_m, raw_s, nullptr);
}

// A spread row's share of a grid (kernels 2 and 3): the blocks b with b % n == slot (n rows in
// `rows`) take equal consecutive ranges of its tokens, 1024 at least (a block's start costs about
// as much as reading that many), so the last of them may have none.
__device__ __forceinline__ Chunk spread_share(const Args& a, const int32_t* rows, int32_t n) {
  const int32_t slot = static_cast<int32_t>(blockIdx.x) % n;
  const int32_t share = static_cast<int32_t>(blockIdx.x) / n;
  const int32_t shares = (static_cast<int32_t>(gridDim.x) - 1 - slot) / n + 1;
  const int32_t len = max(align_tokens((a.vocab + shares - 1) / shares), 1024);
  const int32_t begin = static_cast<int32_t>(min(int64_t{share} * len, int64_t{a.vocab}));
  return Chunk{rows[slot], begin, min(a.vocab, begin + len)};
}

}  // namespace tokensampler::cuda::histogram_cut
