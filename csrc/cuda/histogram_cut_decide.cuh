// Kernels 1a and 1b of the histogram-cut path (histogram_cut_kernel.cuh's overview): large top-p
// steps prove most rows' tokens from float mass sums, before any histogram: the winner where it
// is surely kept, else the runner-up where the winner is surely dropped and the runner-up kept
// (every token but the winner ranks below the runner-up in z + G).
#pragma once

#include "histogram_cut_args.cuh"

namespace tokensampler::cuda::histogram_cut {

// Kernel 1a (steps with decide; mass-cut rows whose winner or runner-up passes min-p): per chunk,
// in floats, S = the sum of e^(x / T - M) over its tokens and B = the same over those ranked
// before the winner (and B' before the runner-up), M the row's largest z (all estimated as
// x * (1 / T)). Kernel 1b bounds the row's integer masses by them (surely_kept,
// surely_dropped): most rows keep their winner, most others their runner-up, and need no
// histogram.
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

// Rows kernels 1a-b decide: a winner, min-p passed by it or by the runner-up (a winner that
// fails min-p is dropped), and estimates close enough to bound the masses by (|z_max| below
// about 2^11).
__device__ __forceinline__ bool decidable(const RowWinner& w, const RowWinner& u, float z_max,
                                          float m, const RowParams& p) {
  const float tau = min_p_threshold(z_max, p.min_p);
  return w.best.id != kNoId && (w.z >= tau || (u.best.id != kNoId && u.z >= tau)) &&
         isfinite(m) && estimate_slack(z_max) < 0x1p-10;
}

// Bounds of an integer mass sum (row_rules.h: masses m = floor(E(d) 2^32) for d > -23, E =
// portable_exp) from kernel 1a's float sum of the same tokens. Each term of a sum is
// e^a (1 +- kSumError) with |a - d| <= Delta where the mass is not 0; the tokens with d <= -23
// add at most V e^-22 to it. So for a float sum F of n <= V tokens' terms,
//   sum m <= (1 + kExpError) 2^32 e^Delta F / (1 - kSumError),
//   sum m >= (1 - kExpError) 2^32 e^-Delta (F / (1 + kSumError) - V e^-22) - V,
// each evaluated in double with a 2^-40 margin for its own rounding.
struct MassBounds {
  double slack, vocab;  // e^Delta, V
  __device__ __forceinline__ double upper(double f) const {
    return (1.0 + kExpError) * 0x1p32 * slack * f / (1.0 - kSumError) * (1.0 + 0x1p-40);
  }
  __device__ __forceinline__ double lower(double f) const {
    return ((1.0 - kExpError) * 0x1p32 / slack * (f / (1.0 + kSumError) - vocab * exp(-22.0)) -
            vocab) * (1.0 - 0x1p-40);
  }
};

__device__ __forceinline__ MassBounds mass_bounds(float z_max, int32_t vocab) {
  return MassBounds{exp(estimate_slack(z_max)), static_cast<double>(vocab)};
}

// Whether a token is kept, proven from kernel 1a's sums S (total) and B (ranked before it), or
// false: kept iff the mass before it is below top_p_limit(p, T), T the total (at least 2^32,
// the argmax's mass), monotone in T.
__device__ __forceinline__ bool surely_kept(double total, double before, float z_max, float top_p,
                                           int32_t vocab) {
  const MassBounds m = mass_bounds(z_max, vocab);
  const double total_lo = fmax(0x1p32, m.lower(total)), before_hi = m.upper(before);
  if (!(total_lo < 0x1p62) || !(before_hi < 0x1p62)) return false;
  return before_hi < static_cast<double>(top_p_limit(top_p, static_cast<uint64_t>(total_lo)));
}

// Whether a token is dropped, proven from the same sums, or false: the mass before it reaches
// top_p_limit of T's upper bound (rounded up), at least top_p_limit(p, T).
__device__ __forceinline__ bool surely_dropped(double total, double before, float z_max,
                                              float top_p, int32_t vocab) {
  const MassBounds m = mass_bounds(z_max, vocab);
  const double total_hi = m.upper(total), before_lo = m.lower(before);
  if (!(total_hi < 0x1p62) || !(before_lo > 0.0)) return false;
  return before_lo >= static_cast<double>(top_p_limit(top_p, static_cast<uint64_t>(ceil(total_hi))));
}

// What kernels 1a and 1b know of row r: whether it is a mass-cut row, and then its parameters,
// z_max, M (the estimate kernel 1a's sums are relative to), winner, runner-up, and whether the
// row is decidable, which must read the same in both kernels: 1b sums what 1a wrote for exactly
// those rows. Block-uniform. Syncs.
struct DecideRow {
  bool mass_cut;
  RowParams p;
  float z_max, m;
  RowWinner w, u;
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
  d.u = merge_runner_up<kChunkThreads>(a, r, d.w.best, scratch);
  d.decidable = decidable(d.w, d.u, d.z_max, d.m, d.p);
  return d;
}

template <typename T, bool kMasked, bool kPenalties>
__global__ void __launch_bounds__(kChunkThreads, kChunkBlocksPerSm)
    mass_sums_kernel(const T* __restrict__ logits, Args a) {
  extern __shared__ __align__(16) uint32_t bitmap[];
  __shared__ Candidate scratch[kChunkThreads / 32];
  __shared__ int32_t red[2 * kChunkThreads / 32];
  __shared__ float red_total[kChunkThreads / 32], red_before[kChunkThreads / 32],
      red_before_u[kChunkThreads / 32];
  const Chunk c = chunk_of(a);
  split_row::wait_for_prior_grids();
  const DecideRow d = decide_row(a, c.r, scratch, red);
  if (!d.mass_cut || !d.decidable) return;
  const RowParams& p = d.p;
  const float inv_t = 1.0f / p.temperature, m = d.m;
  const PenaltySource pen = mark_chunk_penalties<kPenalties>(a, p, c, bitmap);  // syncs
  // Ranked before a token: z > its z, or the same z and a lower id (raw-logit thresholds). A
  // missing runner-up (z = -inf, id kNoId) has every token but -inf ones before it: unused.
  auto z_of = [&](float x) { return x == kNegInf ? kNegInf : scaled_logit(x, p.temperature); };
  struct Rank {
    float x_above, x_tied;
    int32_t id;
  };
  auto rank_of = [&](const RowWinner& t) {
    const float hint = t.z * p.temperature;  // where the searches start
    return Rank{lowest_logit_where([&](float x) { return z_of(x) > t.z; }, hint),
                lowest_logit_where([&](float x) { return z_of(x) >= t.z; }, hint), t.best.id};
  };
  const Rank w = rank_of(d.w), u = rank_of(d.u);

  const split_row::Args quiet = without_raw(a);
  float total = 0.0f, before = 0.0f, before_u = 0.0f;
  // Backward: kernel 1 streamed the chunk forward, so the L2 holds its end.
  split_row::for_each_round(a.row_of<kMasked>(logits, c.r), c.begin, c.end, quiet.wide_loads(),
                            split_row::Rounds::kBackward, [&](float (&x)[4], int32_t i) {
    if (processed_group<kPenalties>(x, i, c, quiet, bitmap, pen) == kNegInf) return;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float e = __expf(fmaf(x[q], inv_t, -m));  // 0 for x = -inf
      total += e;
      if (x[q] >= w.x_above || (x[q] >= w.x_tied && i + q < w.id)) before += e;
      if (x[q] >= u.x_above || (x[q] >= u.x_tied && i + q < u.id)) before_u += e;
    }
  });
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    total += __shfl_xor_sync(0xffffffffu, total, o);
    before += __shfl_xor_sync(0xffffffffu, before, o);
    before_u += __shfl_xor_sync(0xffffffffu, before_u, o);
  }
  if ((threadIdx.x & 31) == 0) {
    red_total[threadIdx.x >> 5] = total;
    red_before[threadIdx.x >> 5] = before;
    red_before_u[threadIdx.x >> 5] = before_u;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0.0f, b = 0.0f, bu = 0.0f;
    for (int j = 0; j < kChunkThreads / 32; ++j) {
      t += red_total[j];
      b += red_before[j];
      bu += red_before_u[j];
    }
    ChunkDecide& out = a.chunk_decide[blockIdx.x];  // its runner-up fields are kernel 1's
    out.total = t;
    out.before_winner = b;
    out.before_runner_up = bu;
  }
}

// Kernel 1b (steps with decide; one block per mass-cut row): a row whose winner kernel 1a's
// sums prove kept, or prove dropped (or min-p drops it) and its runner-up kept, is done with
// that token; the others are listed for kernel 2's histogram.
__global__ void __launch_bounds__(kChunkThreads) decide_kernel(Args a) {
  __shared__ Candidate scratch[kChunkThreads / 32];
  __shared__ int32_t red[2 * kChunkThreads / 32];
  const int64_t r = blockIdx.x;
  split_row::wait_for_prior_grids();
  const DecideRow d = decide_row(a, r, scratch, red);
  if (!d.mass_cut || threadIdx.x != 0) return;
  int32_t token = kNoId;
  if (d.decidable) {
    double total = 0.0, before_w = 0.0, before_u = 0.0;  // in chunk order
    for (int32_t j = 0; j < a.splits; ++j) {
      const ChunkDecide& s = a.chunk_decide[r * a.splits + j];
      total += s.total;
      before_w += s.before_winner;
      before_u += s.before_runner_up;
    }
    const float tau = min_p_threshold(d.z_max, d.p.min_p), top_p = d.p.top_p;
    const bool w_passes = d.w.z >= tau;
    if (w_passes && surely_kept(total, before_w, d.z_max, top_p, a.vocab)) {
      token = d.w.best.id;
    } else if (d.u.best.id != kNoId && d.u.z >= tau &&
               (!w_passes || surely_dropped(total, before_w, d.z_max, top_p, a.vocab)) &&
               surely_kept(total, before_u, d.z_max, top_p, a.vocab)) {
      token = d.u.best.id;
    }
  }
  if (token != kNoId) {
    a.row_cuts[r] = RowCut{CutBin{kBins, 0, 0}, token, -1, true};
  } else {
    const int32_t slot = atomicAdd(a.hist_count, 1);
    a.hist_rows[slot] = static_cast<int32_t>(r);
  }
}

}  // namespace tokensampler::cuda::histogram_cut
