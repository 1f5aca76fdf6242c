// What the split-row kernels (split_row_kernel.cuh, split_row_finish.cuh) and the paths that
// reuse them (histogram_cut_kernel.cuh) share: their constants, a chunk's results and the
// per-row partials merged from them, the kernel arguments and a row's parameters.
#pragma once

#include <cuda_runtime.h>

#include <cfloat>
#include <climits>

#include "device_primitives.cuh"
#include "logits_row.cuh"
#include "penalty_lookup.cuh"
#include "step_rows.cuh"
#include "tokensampler/route.h"
#include "tokensampler/row_rules.h"
#include "tokensampler/slot_layout.h"

namespace tokensampler::cuda::split_row {

constexpr int kChunkThreads = 256;
// Resident chunk-kernel blocks per SM (every chunk kernel's launch bound, so none needs more than
// 64 registers a thread): set_chunks sizes a step's blocks to one wave of them.
constexpr int kChunkBlocksPerSm = 4;
// The finish kernel's block: the single launch's finishing block size (kChunkThreads), so no
// other instantiation of the block primitives. Its steps are barrier-bound over a few hundred
// candidates: 256 beat 512 by 4-11 % on top-k + top-p at 32-512 rows (RESULTS.md, run 68).
constexpr int kFinishThreads = 256;
constexpr int kLoadsInFlight = 4;  // 16-byte loads per thread per round (bytes in flight per SM)
constexpr int kRoundTokens = kChunkThreads * 4 * kLoadsInFlight;
// Bitmask words a round's tokens touch (rounds start at multiples of 4, not of 32): masked top-k
// rows stage them a round ahead (round_word).
constexpr int kRoundWords = kRoundTokens / 32 + 1;
constexpr int kCompactAt = 512;                        // buffer entries that trigger a cut to k
constexpr int kBufferCap = kCompactAt + kRoundTokens;  // room for one more round
constexpr int kMergeCap = 4096;                        // finish kernel: splits * k_cap at most
constexpr int kMaxSplits = 64;        // two-kernel launch, and top-k rows of the single launch
constexpr int kFusedMaxSplits = 256;  // single launch, rows without top-k: fill the GPU at bs 1
static_assert(kBufferCap - kMergeCap >= kSplitRowMaxTopK,
              "the single launch's finishing block scans top-p masses behind its merge buffer");

// Programmatic dependent launch: a kernel launched with the programmatic-serialization attribute
// may start before the kernel ahead of it in the stream has finished; it waits here, before its
// first global-memory access, for that grid to complete and flush. A no-op otherwise.
__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The exact per-block / per-row partials every split-row kernel merges: three (value, id) maxima
// (a total order, so any merge order gives the same result) and two integer counts.
struct Partial {
  Candidate argmax;    // of the processed logits (greedy rows)
  Candidate best;      // best z + G over finite tokens (no-filter rows)
  Candidate inf_best;  // best G over +inf tokens
  int32_t inf_count;
  int32_t kept;        // top-k candidates
};

__device__ __forceinline__ Partial warp_partial(Partial v) {
  v.argmax = warp_best(v.argmax);
  v.best = warp_best(v.best);
  v.inf_best = warp_best(v.inf_best);
  v.inf_count = __reduce_add_sync(0xffffffffu, v.inf_count);
  v.kept = __reduce_add_sync(0xffffffffu, v.kept);
  return v;
}

// Block-wide merge of the partials in one exchange (two barriers, instead of two per maximum and
// one per count); every thread gets it. `scratch` holds one Partial per warp.
template <int kThreads>
__device__ __forceinline__ Partial block_partial(Partial v, Partial* scratch) {
  static_assert(kThreads / 32 <= 32);
  v = warp_partial(v);
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();  // earlier readers of scratch are done
  if (lane == 0) scratch[w] = v;
  __syncthreads();
  const Candidate hole{kNegInf, kNoId};
  v = lane < kThreads / 32 ? scratch[lane] : Partial{hole, hole, hole, 0, 0};
  return warp_partial(v);
}

// A raw-logit admission bound for the z-threshold `thr`: l < bound implies l / T < thr (IEEE
// division is monotone; four ulps below thr * T cover the rounding of both operations), so the
// hot loop divides only the logits it admits. A thr of -FLT_MAX (or below) admits every finite
// logit: candidates hold a z past fp32's range at -FLT_MAX (candidate_z), so a logit below
// thr * T may still have z == thr.
__device__ __forceinline__ float admission_bound(float thr, float temperature) {
  if (thr <= -FLT_MAX) return kNegInf;
  float bound = f_mul(thr, temperature);
#pragma unroll
  for (int s = 0; s < 4; ++s) bound = nextafterf(bound, kNegInf);
  return bound;
}

__device__ __forceinline__ int next_pow2(int n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

// Per (row, chunk) results of kernel 1.
struct ChunkResult {
  Candidate argmax;      // of the processed logits: z for every row, id (ties to the lowest)
                         // for greedy rows
  Candidate best;        // best z + G (no-filter rows) over finite tokens
  Candidate inf_best;    // best G over +inf tokens
  float raw_max, raw_sum;
  int32_t inf_count;
  int32_t kept;          // real candidates (top-k rows); the chunk's k_cap slots past them are holes
  // Histogram-cut top-p rows (histogram_cut_kernel.cuh, kernel 1): the chunk's best z + G and
  // that token's z.
  Candidate winner;
  float winner_z;
  // Top-k rows (candidate_z holds a z past fp32's range at +-FLT_MAX): the chunk's lowest id
  // whose finite logit has z past +FLT_MAX, and its lowest id whose z is exactly -FLT_MAX
  // (kNoId if none). The finisher breaks a tie at +-FLT_MAX by them.
  int32_t past_max_id;
  int32_t at_lowest_id;
  int32_t unused;  // load_result copies 8-byte words
};

// A chunk's result as another block of the same kernel wrote it: read from L2 (ld.cg), never
// from this SM's L1, which does not see other SMs' writes. 8-byte aligned (sections are).
__device__ __forceinline__ ChunkResult load_result(const ChunkResult* at) {
  static_assert(sizeof(ChunkResult) % 8 == 0);
  ChunkResult c;
  const int2* src = reinterpret_cast<const int2*>(at);
  int2* dst = reinterpret_cast<int2*>(&c);
#pragma unroll
  for (int q = 0; q < static_cast<int>(sizeof(ChunkResult) / 8); ++q) dst[q] = __ldcg(src + q);
  return c;
}

__device__ __forceinline__ Candidate load_candidate(const Candidate* at) {
  const int2 v = __ldcg(reinterpret_cast<const int2*>(at));
  return Candidate{__int_as_float(v.x), v.y};
}

struct Args : StepRows {
  int32_t splits;
  int32_t chunk_len;
  int32_t k_cap;
  bool stage_bitmask;  // chunk kernel of a masked step: bitmask words staged in shared memory
  const int32_t* candidates;  // verify with penalties: [bs, tokens_per_req] drafts they count
  bool penalties;
  bool want_raw;
  ChunkResult* results;
  Candidate* chunk_candidates;
  // Single launch only: one ticket per row, zero before the launch and zero again after it (the
  // row's finishing block resets its own), so CUDA-graph replays find them zero. See workspace.h.
  uint32_t* tickets;
  // Rejection-sampling verify (try_verify_rejection), else null: the draft probabilities
  // [bs, tokens_per_req - 1, V] (float32) and the drafts [bs, tokens_per_req] to judge (the
  // tensor `candidates` points at when penalties apply). out_tokens then
  // takes each row's verdict (rejection_verdict.cuh) for verify.cu's walker.
  const float* draft_probs;
  const int32_t* drafts;
  int32_t* out_tokens;
  bool* out_invalid;
  float* out_logprobs;

  // 2-byte rows read 8 tokens a 16-byte load (group_token), except in steps with logprobs: their
  // raw partials are float sums in each thread's token order, which must be fp32's, so a 2-byte
  // row and its fp32 copy give the same logprobs.
  __host__ __device__ bool wide_loads() const { return !want_raw; }
};

struct RowParams {
  SlotRow slot;
  float temperature;
  int32_t top_k;
  float top_p;
  float min_p;
  uint64_t seed;
  int64_t position;
  int32_t row_in_req;  // j of a verify row: drafts 1..j precede it
  bool greedy;
  bool top_k_on;
  bool valid_slot;
};

__device__ __forceinline__ RowParams row_params(const Args& a, int64_t r) {
  RowParams p{};
  const int32_t slot = a.req_pool_indices[r / a.tokens_per_req];
  p.valid_slot = slot >= 0 && slot < a.pool_rows;
  if (!p.valid_slot) return p;
  p.slot = SlotRow{a.slot_table + a.layout.row_offset(slot), a.layout};
  p.temperature = p.slot.temperature();
  p.top_k = p.slot.top_k();
  p.top_p = p.slot.top_p();
  p.min_p = p.slot.min_p();
  p.seed = p.slot.seed();
  p.row_in_req = static_cast<int32_t>(r % a.tokens_per_req);
  p.position = int64_t{a.valid_cache_lengths[slot]} + p.row_in_req;
  p.greedy = is_greedy_row(p.temperature, p.top_k);
  p.top_k_on = !top_k_disabled(p.top_k, a.vocab);
  return p;
}

constexpr int32_t kNoDraft = -1;
constexpr int32_t kVerdictNone = INT32_MIN;  // finish_row: not set, the row's token stands

// Row r's draft to judge (the request's next candidate), or kNoDraft: a sampling step, the
// request's last (bonus) row, or a draft that is not a token (rejected: the row's target stands).
__device__ __forceinline__ int32_t draft_of(const Args& a, int64_t r, const RowParams& p) {
  if (a.draft_probs == nullptr || p.row_in_req + 1 >= a.tokens_per_req) return kNoDraft;
  const int32_t d = a.drafts[r + 1];
  return d >= 0 && d < a.vocab ? d : kNoDraft;
}

// The draft model's probabilities for row r (a row with a draft).
__device__ __forceinline__ const float* draft_row(const Args& a, int64_t r, const RowParams& p) {
  const int64_t b = r / a.tokens_per_req;
  return a.draft_probs + (b * (a.tokens_per_req - 1) + p.row_in_req) * int64_t{a.vocab};
}

// The single launch's hand-over (Args::tickets): releases this block's writes (every
// thread's) and takes row r's ticket; returns, in every thread, whether this block drew the last
// one, which then has acquired the row's other blocks' writes and has reset the ticket (no other
// block of this launch touches it again, and the next launch or replay starts after this one
// ends). `last` is a shared flag.
__device__ __forceinline__ bool last_block_of_row(uint32_t* tickets, int64_t r, int32_t splits,
                                                  bool& last) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t ticket = atomicAdd(tickets + r, 1u);
    last = ticket == static_cast<uint32_t>(splits - 1);
    if (last) {
      tickets[r] = 0u;
      __threadfence();
    }
  }
  __syncthreads();
  if (!last) return false;
  __threadfence();
  return true;
}

__device__ __forceinline__ PenaltySource penalty_source(const Args& a, const RowParams& p, int64_t r) {
  const int32_t* drafts = a.candidates ? a.candidates + (r - p.row_in_req) + 1 : nullptr;
  return PenaltySource{p.slot, drafts, drafts ? p.row_in_req : 0};
}

}  // namespace tokensampler::cuda::split_row
