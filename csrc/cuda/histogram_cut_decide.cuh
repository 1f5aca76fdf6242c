// Kernels 1a and 1b of the histogram-cut path (histogram_cut_kernel.cuh's overview): large top-p
// steps prove most rows' winners kept from float mass sums, before any histogram.
#pragma once

#include "histogram_cut_args.cuh"

namespace tokensampler::cuda::histogram_cut {

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
  // Backward: kernel 1 streamed the chunk forward, so the L2 holds its end.
  split_row::for_each_round(a.row_of<kMasked>(logits, c.r), c.begin, c.end, quiet.wide_loads(),
                            split_row::Rounds::kBackward, [&](float (&x)[4], int32_t i) {
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

}  // namespace tokensampler::cuda::histogram_cut
