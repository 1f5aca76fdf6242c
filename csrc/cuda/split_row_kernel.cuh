// Device code of the split-row fast path of sample_rows and verify_rejection (launch code:
// split_row_sample.cu; shared definitions: split_row_args.cuh).
// Rows: no filter, or top-k (k <= kSplitRowMaxTopK) with optional top-p / min-p inside the top-k
// set; penalties and bias (with the drafts of verify rows) looked up per token.
//
// Kernel 1 (chunk): a row is cut into `splits` chunks, one block each, so a small batch still
// fills the GPU. A block streams its chunk once, kLoadsInFlight 16-byte loads per thread per
// round (2-byte types: half as many, of 8 tokens each), and leaves a few numbers:
//   - the argmax of the processed logits (greedy rows), raw (max, sum-exp) partials (raw
//     logprobs), the +inf count;
//   - no-filter rows: the best z + G of the chunk. Noise is keyed by token id, so it is needed
//     only where it can win: a cheap exact upper bound on G from the random word's leading
//     zeros (G = -ln(-ln u) <= -ln(1 - u)) skips the two logs for almost every token;
//   - top-k rows: the chunk's k best (z, id), with the k-th's ties on z for 2-byte logits, or
//     every held candidate, where they fit its k_cap slots (the finisher's cut is exact).
//     Candidates at or above a running threshold go to a shared-memory buffer; when it holds
//     more than kCompactAt, a select (block_select.cuh) cuts it back to those and raises the
//     threshold. The first round's threshold is the k-th
//     largest of the threads' maxima, so even the first round admits few.
// Finishing a row (finish_row, split_row_finish.cuh): one block merges the row's chunks: argmax /
// best score, or the exact top-k of the chunks' candidates in rank order (block_select.cuh's
// rank_top_k: the candidates at or above the k-th largest of the threads' maxima, each placed by
// counting those before it; where more than a block's threads survive, or k > 256, keep_top_k's
// cut and a bitonic sort when top-p or +inf logits need the rank order);
// top-p over integer masses scanned in rank order (row_rules.h, as the CPU reference), min-p, and
// Gumbel-max over the kept candidates. Every score is computed with the helpers of the CPU
// kernels, so tokens are identical. In rejection-sampling verify (try_verify_rejection) the
// finisher also judges the row's draft over the kept set it holds (rejection_verdict.cuh) and
// writes the verdict for verify.cu's walker, which runs the rows it leaves undecided.
// Two launches of it (split_row_sample.cu picks by the step's rows; kMasked and kPenalties by
// whether the step has a grammar bitmask and penalties, so steps without run none of their code):
//   - single launch, small steps: chunk_kernel<T, true, ...>. Each block, after writing its
//     chunk's results, takes a ticket of its row (an atomic counter in the workspace, after a
//     __threadfence); the block that draws the last one reads the others' results through L2,
//     finishes the row in its own shared memory and resets the ticket to zero, so the next
//     launch and every CUDA-graph replay find it zero (workspace.h states the invariant). No
//     block ever waits for another. Rows without top-k take up to kFusedMaxSplits chunks here.
//   - two launches, larger steps: chunk_kernel<T, false, ...>, then finish_kernel (one block
//     per row), launched with programmatic dependent launch.
#pragma once

#include <cuda_runtime.h>

#include <cfloat>

#include "block_select.cuh"
#include "split_row_args.cuh"
#include "split_row_finish.cuh"
#include "tokensampler/rng.h"

namespace tokensampler::cuda::split_row {

// The k-th largest of the threads' values (a lower bound of the k-th largest z of the round:
// at least k values reach it), to 16 key bits; -inf when fewer than k threads have a value.
// That case is counted first (one barrier, not the bisection's 16): sparse rows, e.g. a
// grammar's bitmask allowing 1 % of the vocabulary, keep it for many rounds.
template <int kThreads>
__device__ __forceinline__ float kth_thread_max(float v, int k) {
  if (__syncthreads_count(v != kNegInf) < k) return kNegInf;
  const uint32_t cut = kth_key_lower_bound<kThreads>(v == kNegInf ? 0u : rank_key(v), k);
  return cut == 0 ? kNegInf : key_to_z(cut);
}

// Raw (max, sum-exp) partials of four logits (sanitised; +inf counted elsewhere). Out of line
// like the other per-group helpers below: the hot loop stays small enough for the instruction
// cache, and these run only for the rows and groups that need them.
inline __device__ __noinline__ void fold_raw_group(float4 x4, float& m, float& s) {
  const float x[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll 1
  for (int q = 0; q < 4; ++q)
    if (x[q] != INFINITY) merge_lse(m, s, x[q], 1.0f);
}

// Top-k rows: z = x / T of a processed logit (-inf stays -inf). A finite logit whose z is past
// fp32's range gets +-FLT_MAX: it ranks below a +inf logit's +inf, and a -FLT_MAX candidate is a
// real token, unlike the -inf of a hole.
__device__ __forceinline__ float candidate_z(float x, float temperature) {
  if (x == kNegInf) return kNegInf;
  const float s = scaled_logit(x, temperature);
  return x == INFINITY ? s : fminf(fmaxf(s, -FLT_MAX), FLT_MAX);
}

// The candidates a round appended with their processed logits, buf[from, to), get their z in
// place: one division per admitted token, spread over the block (a warp dividing for the lanes
// of each group that reached the bound ran most of its groups' divisions for a few lanes).
// A finite logit whose z is past +FLT_MAX, or exactly -FLT_MAX, also lowers the chunk's
// edge_ids (rare): there an overflowed z ties with a z of exactly +-FLT_MAX, where the CPU ranks
// the overflowed z (+inf) above it and the overflowed z (-inf) below it; the finisher breaks
// the tie by the lowest id of each kind (DESIGN §5).
template <int kThreads>
__device__ __forceinline__ void scale_candidates(Candidate* buf, int from, int to,
                                                 float temperature, int32_t* edge_ids) {
  for (int e = from + static_cast<int>(threadIdx.x); e < to; e += kThreads) {
    const Candidate c = buf[e];  // c.z > -inf: appended tokens reached the bound
    float z = scaled_logit(c.z, temperature);
    if (c.z != INFINITY) {
      if (z == INFINITY) atomicMin(&edge_ids[0], c.id);
      if (z == -FLT_MAX) atomicMin(&edge_ids[1], c.id);
      z = fminf(fmaxf(z, -FLT_MAX), FLT_MAX);
    }
    buf[e].z = z;
  }
}

// No-filter rows: the rare exact evaluations of their hot loop (two logs and a division each),
// out of line so that loop stays small.
inline __device__ __noinline__ float gumbel_of_word(uint32_t word) { return gumbel_from_word(word); }

inline __device__ __noinline__ float gumbel_score(float x, float temperature, uint32_t word) {
  return f_add(scaled_logit(x, temperature), gumbel_from_word(word));
}

// The per-group work every row kind shares: sanitises four logits (the loads already put -inf
// past `end`), counts the raw +inf entries (raw logprobs; a bias can make more), folds the raw
// (max, sum-exp) partials when wanted, and applies penalties / bias to the marked tokens.
// Returns the group's largest processed logit; greedy rows (argmax != nullptr) also track the
// argmax. The common group (finite logits, no penalties) costs a few min/max: fmaxf(x, -inf) is
// sanitize_logit (fmaxf returns its other operand for a NaN, x for anything else), one
// instruction a token where a NaN test and selects took three. kPenalties false (a chunk kernel
// of a step without penalties): no penalty code at all; true: a.penalties decides at run time.
template <bool kPenalties = true>
__device__ __forceinline__ float process_group(float (&x)[4], int32_t i, int32_t begin,
                                               int32_t end, const Args& a,
                                               const uint32_t* bitmap, const PenaltySource& pen,
                                               int32_t& inf_count, float& raw_m, float& raw_s,
                                               Candidate* argmax) {
#pragma unroll
  for (int q = 0; q < 4; ++q) x[q] = fmaxf(x[q], kNegInf);
  float x_max4 = fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3]));
  if (x_max4 == INFINITY) {
#pragma unroll
    for (int q = 0; q < 4; ++q) inf_count += x[q] == INFINITY;
  }
  if (a.want_raw) fold_raw_group(make_float4(x[0], x[1], x[2], x[3]), raw_m, raw_s);
  const uint32_t marked =
      kPenalties && a.penalties && i < end ? penalty_nibble(bitmap, i, begin) : 0u;
  if (marked != 0u || argmax != nullptr) {
    x_max4 = kNegInf;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if ((marked >> q) & 1u) x[q] = penalize_token(pen, i + q, x[q]);
      if (argmax != nullptr && i + q < end) *argmax = best_of(*argmax, Candidate{x[q], i + q});
      x_max4 = fmaxf(x_max4, x[q]);
    }
  }
  return x_max4;
}

// The first token of this thread's group u of a round. Narrow (fp32, and any step folding raw
// logprob partials): group u at round + 4 (u kChunkThreads + thread). Wide (fp16 / bf16 otherwise):
// groups in pairs of 8 consecutive tokens, one 16-byte load a pair (load8), pair v at
// round + 8 (v kChunkThreads + thread), so a round moves fp32's bytes per load in half the loads.
// Raw partials are float sums in each thread's token order: steps that want them keep fp32's
// layout, so a 2-byte row and its fp32 copy give the same logprobs. Either way a round covers
// [round, round + kRoundTokens) once.
template <typename T>
__device__ __forceinline__ int32_t group_token(int32_t round, int u, bool wide) {
  const int32_t t = static_cast<int32_t>(threadIdx.x);
  if (sizeof(T) == 2 && wide) return round + 8 * ((u >> 1) * kChunkThreads + t) + 4 * (u & 1);
  return round + 4 * (u * kChunkThreads + t);
}
static_assert(kLoadsInFlight % 2 == 0, "wide rounds load their groups in pairs");

// This thread's kLoadsInFlight groups of a round (group u at group_token(round, u, wide), -inf
// past `end`), every load issued before any is used, the bitmask applied with the allowed bits
// bits_of(i) gives for the group at token i (its word loaded first, or staged: kRoundWords).
template <typename T, bool kMasked, typename BitsOf>
__device__ __forceinline__ void load_round(const LogitsRow<T, kMasked>& row, int32_t round,
                                           int32_t end, bool wide, float (&l)[kLoadsInFlight][4],
                                           BitsOf&& bits_of) {
  uint32_t bits[kLoadsInFlight];
#pragma unroll
  for (int u = 0; u < kLoadsInFlight; ++u) bits[u] = bits_of(group_token<T>(round, u, wide));
  bool loaded = false;
  if constexpr (sizeof(T) == 2) {
    if (wide) {
#pragma unroll
      for (int u = 0; u < kLoadsInFlight; u += 2)
        load8(row, group_token<T>(round, u, true), end, l[u], l[u + 1]);
      loaded = true;
    }
  }
  if (!loaded) {
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) load4(row, group_token<T>(round, u, false), end, l[u]);
  }
#pragma unroll
  for (int u = 0; u < kLoadsInFlight; ++u) apply_mask<kMasked>(bits[u], l[u]);
}

// load_round with the bits of the row's bitmask (mask_bits).
template <typename T, bool kMasked>
__device__ __forceinline__ void load_round(const LogitsRow<T, kMasked>& row, int32_t round,
                                           int32_t end, bool wide, float (&l)[kLoadsInFlight][4]) {
  load_round(row, round, end, wide, l, [&](int32_t i) { return mask_bits(row, i, end); });
}

// The bitmask words of the top-k loop's rounds, staged one round ahead in shared memory (masked
// steps): while a round works, threads 0 .. kRoundWords - 1 hold the next round's words, loaded
// with the round's logits and stored behind its barrier, so the loop takes each group's bits
// from shared memory at a fixed offset, whatever the chunk's length (a whole chunk's words fit
// the block's shared memory only up to ~10^5 tokens, not at bs 512: run 109's 1.133), with no
// null test (a row without a bitmask stages all-ones words). The ring is 2 x kRoundWords words
// of the chunk kernel's dynamic shared memory.
// Word t of the round at `round` of a row's bitmask `allowed` (all ones without one, or past
// `end`: tokens there are -inf already).
__device__ __forceinline__ uint32_t round_word(const int32_t* allowed, int32_t round, int32_t end,
                                               int t) {
  const int32_t w = (round >> 5) + t;
  if (allowed == nullptr || round >= end || w >= ((end + 31) >> 5)) return ~0u;
  return static_cast<uint32_t>(__ldg(allowed + w));
}

// The ring slot of the round at `round` of a chunk from `begin`: rounds alternate.
__device__ __forceinline__ int round_parity(int32_t round, int32_t begin) {
  return ((round - begin) / kRoundTokens) & 1;
}

// The allowed bits of the group at token i of the round at `round`, from that round's staged
// words (i a multiple of 4: the four bits share one word).
__device__ __forceinline__ uint32_t staged_bits(const uint32_t* words, int32_t round, int32_t i) {
  return words[(i >> 5) - (round >> 5)] >> (i & 31);
}

// The order of a chunk's rounds. A pass that re-reads the chunks a forward pass streamed just
// before it (the histogram-cut path's kernels 1a, 2 and 3 after kernel 1) goes backward, so it
// starts on the part of each chunk that pass read last: what the L2 still holds of a step
// larger than the L2.
enum class Rounds { kForward, kBackward };

// A chunk [begin, end) round by round (load_round), each group handed to f(x, i) with i its
// first token.
template <typename T, bool kMasked, typename F>
__device__ __forceinline__ void for_each_round(const LogitsRow<T, kMasked>& row, int32_t begin,
                                               int32_t end, bool wide, Rounds order, F&& f) {
  auto one_round = [&](int32_t round) {
    float l[kLoadsInFlight][4];
    load_round(row, round, end, wide, l);
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) f(l[u], group_token<T>(round, u, wide));
  };
  // Two loops, so neither keeps a direction or a step in a register.
  if (order == Rounds::kForward) {
    for (int32_t round = begin; round < end; round += kRoundTokens) one_round(round);
  } else if (end > begin) {
    for (int32_t round = begin + (end - begin - 1) / kRoundTokens * kRoundTokens; round >= begin;
         round -= kRoundTokens)
      one_round(round);
  }
}

// The best score z + G any thread of a block has reached so far, in shared memory: the bar of
// noise pruning (a token whose score bound is below it cannot win). Exact: it only ever holds
// scores of real tokens, so it never exceeds the block's best.
struct BlockBest {
  uint32_t key;  // rank_key of the score; raised with atomicMax

  __device__ __forceinline__ void reset() { key = rank_key(kNegInf); }  // one thread, then a barrier
  __device__ __forceinline__ float get() const {
    return key_to_z(*static_cast<const volatile uint32_t*>(&key));
  }
  __device__ __forceinline__ void raise(float z) { atomicMax(&key, rank_key(z)); }
};

// Appends `c` to buf where `take` holds: one atomic per warp. Entries at or past kCap are
// counted but not stored (the histogram-cut path's cut list; the top-k loop appends a group at
// a time, warp_append_n).
template <int32_t kCap>
__device__ __forceinline__ void append_candidate(bool take, Candidate c, Candidate* buf,
                                                 int32_t* count) {
  warp_append(take, count, [&](int32_t at) {
    if (at < kCap) buf[at] = c;
  });
}

// kFused (the single launch): the last block of each row to finish its chunk (a per-row ticket)
// finishes the row itself, so a step is one kernel. kMasked: the step has a grammar bitmask;
// without one the loops carry no bitmask code (they run at the 64-register cap). kPenalties:
// the step applies penalties (a.penalties); without them the loops carry no penalty code
// (run 100: changing only that code cost unpenalised top-k steps 2-7 %). kWide: 2-byte rows in
// steps without logprobs read 8 tokens a load (group_token); a template parameter, so each
// kernel carries one loop layout.
template <typename T, bool kFused, bool kMasked, bool kPenalties, bool kWide = false>
__global__ void __launch_bounds__(kChunkThreads, kChunkBlocksPerSm)
    chunk_kernel(const T* __restrict__ logits, Args a) {
  // Dynamic shared memory: [penalty bitmap, if penalties][candidate buffer, if top-k rows]
  // [two rounds of bitmask words, if kMasked and top-k rows][the chunk's bitmask words, if
  // kMasked and staged].
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ Candidate scratch[kChunkThreads / 32];
  __shared__ Partial partials[kChunkThreads / 32];
  __shared__ float red_m[kChunkThreads / 32], red_s[kChunkThreads / 32];
  __shared__ int32_t red_count[2 * kChunkThreads / 32];
  __shared__ int32_t buf_count, compact_counter, keep_count;
  // Top-k rows: the running threshold on z and its admission bound on the raw logits
  // (admission_bound: a product and four ulp steps, which thread 0 works out once per raise
  // instead of every thread every round).
  __shared__ float threshold, threshold_raw;
  __shared__ BlockBest best_seen;  // no-filter rows
  __shared__ int32_t edge_ids[2];  // top-k rows: scale_candidates
  __shared__ bool finishes_row;

  const int64_t r = blockIdx.x / a.splits;
  const int32_t split = blockIdx.x % a.splits;
  const int32_t begin = split * a.chunk_len;
  const int32_t end = min(a.vocab, begin + a.chunk_len);
  wait_for_prior_grids();
  const RowParams p = row_params(a, r);
  ChunkResult* out = a.results + blockIdx.x;
  if (!p.valid_slot) {  // the finishing code flags the row without reading chunks
    if (kFused && split == 0)
      write_unreadable_row(r, a.out_tokens, a.out_invalid, a.out_logprobs);
    return;  // the whole block; this row's ticket is never taken
  }
  const bool top_k_rows = !p.greedy && p.top_k_on && a.k_cap > 0;
  const int32_t k = min(p.top_k, a.k_cap);
  // Cuts keep the k-th's ties on z where they fit k_cap, skipping select_cut's id passes: 2-byte
  // logits tie there in ~60 % of chunks (bf16 randn, k = 50); 4-byte ones almost never.
  const int tie_cap = sizeof(T) == 2 ? a.k_cap : 0;
  uint32_t* bitmap = reinterpret_cast<uint32_t*>(dyn_smem);
  Candidate* buf = reinterpret_cast<Candidate*>(dyn_smem + (kPenalties ? kPenaltyBitmapWords * 4 : 0));
  // Masked top-k steps: two rounds of bitmask words (round_word), then the whole-chunk stage.
  uint32_t* ring = reinterpret_cast<uint32_t*>(buf + (a.k_cap > 0 ? kBufferCap : 0));
  int32_t* mask_stage =
      reinterpret_cast<int32_t*>(ring + (kMasked && a.k_cap > 0 ? 2 * kRoundWords : 0));
  LogitsRow<T, kMasked> row = a.row_of<kMasked>(logits, r);
  // Staged words are read only after the barrier below. Top-k rows stage theirs a round at a
  // time (kRoundWords), starting with the first round's here.
  if (a.stage_bitmask && !(kMasked && top_k_rows))
    row = stage_mask(row, begin, end, mask_stage, kChunkThreads);
  if constexpr (kMasked) {
    if (top_k_rows && threadIdx.x < kRoundWords)
      ring[threadIdx.x] = round_word(row.allowed, begin, end, threadIdx.x);
  }
  const PenaltySource pen = kPenalties ? penalty_source(a, p, r) : PenaltySource{};
  const float inv_t = 1.0f / p.temperature;  // estimates only; exact z = x / T where it counts
  static_assert(!kWide || sizeof(T) == 2, "wide loads serve the 2-byte types");
  constexpr bool wide = kWide;  // group_token
  if constexpr (kPenalties) mark_penalized_tokens<kChunkThreads>(pen, begin, end, bitmap);

  Candidate argmax{kNegInf, kNoId}, best{kNegInf, kNoId}, inf_best{kNegInf, kNoId};
  float raw_m = kNegInf, raw_s = 0.0f;
  int32_t inf_count = 0;
  if (threadIdx.x == 0) {
    buf_count = 0;
    threshold = threshold_raw = kNegInf;  // admission_bound(-inf, T) for every T > 0
    best_seen.reset();
    edge_ids[0] = edge_ids[1] = kNoId;
  }
  __syncthreads();

  if (!top_k_rows && !p.greedy) {
    // No-filter rows: argmax of z + G, noise keyed by token id, so it is needed only where it
    // can win: z + an exact upper bound of G from the random word must reach the best score
    // already seen in the block, any thread's (z estimated as x * (1 / T) with a relative
    // margin that covers both roundings; the exact z = x / T where it counts). A token below it
    // cannot win, so the two logs of its exact score are skipped, and a group below it skips
    // Philox too. Philox for every 4 tokens bounds this loop, not memory. The single launch
    // keeps to each thread's own best: its chunks hold about one group per thread, so every
    // thread would raise the shared bar at once and none would read it later (run 31: bs 1
    // 10.2 -> 13.1 us with it).
    constexpr bool kShareBest = !kFused;
    for_each_round(row, begin, end, wide, Rounds::kForward, [&](float (&x)[4], int32_t i) {
      const float x_max4 =
          process_group<kPenalties>(x, i, begin, end, a, bitmap, pen, inf_count, raw_m, raw_s,
                                    nullptr);
      argmax.z = fmaxf(argmax.z, x_max4);
      if (x_max4 == kNegInf) return;
      const float bar = kShareBest ? fmaxf(best.z, best_seen.get()) : best.z;
      const float z_max4 = x_max4 * inv_t;  // G <= 16.64; the margins cover the rounding
      const float margin = 1e-5f * fabsf(z_max4);
      if (x_max4 != INFINITY && z_max4 + 16.7f + margin < bar) return;
      const Philox4 w = random_words(p.seed, p.position, static_cast<uint32_t>(i) >> 2, kStreamGumbel);
      // One bound for the group first: gumbel_upper_bound grows with the word, and no token's
      // z exceeds the group's largest.
      const uint32_t w_max = max(max(w.v[0], w.v[1]), max(w.v[2], w.v[3]));
      if (x_max4 != INFINITY && z_max4 + gumbel_upper_bound(w_max) + margin < bar) return;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        if (x[q] == kNegInf) continue;
        if (x[q] == INFINITY) {
          inf_best = best_of(inf_best, Candidate{gumbel_of_word(w.v[q]), i + q});
          continue;
        }
        const float z_est = x[q] * inv_t;  // against the best so far, this group's included
        // Scored unless surely below (a NaN bound, z = -inf past fp32's range, is scored).
        if (!(z_est + gumbel_upper_bound(w.v[q]) + 1e-5f * fabsf(z_est) < fmaxf(bar, best.z)))
          best = best_of(best, Candidate{gumbel_score(x[q], p.temperature, w.v[q]), i + q});
      }
      if (kShareBest && best.z > bar) best_seen.raise(best.z);  // above the block's best: share it
    });
  }
  if (p.greedy) {  // the argmax of the processed logits, tracked in registers
    for_each_round(row, begin, end, wide, Rounds::kForward, [&](float (&x)[4], int32_t i) {
      process_group<kPenalties>(x, i, begin, end, a, bitmap, pen, inf_count, raw_m, raw_s,
                                &argmax);
    });
  }
  // Top-k rows, kLoadsInFlight loads per thread per round. A round appends the tokens whose
  // processed logit reaches the admission bound, as (logit, id), then gives them their z behind
  // the round's barrier (scale_candidates); `base` is where the round's appends begin.
  // At rounds 1, 2, 4, 8, ... (and every round while the threshold is -inf) the k-th largest of
  // the threads' largest logits so far raises the threshold first: k distinct tokens reach it,
  // so the chunk's k-th largest z does too. A round's own maxima (16 tokens a thread) would
  // admit ~1.4 % of the tokens at k = 50; the maxima of R rounds admit about 1.4 % / R, so fewer
  // warps take the admission path and fewer candidates reach the buffer and its cuts.
  const int32_t rounds_end = top_k_rows ? end : begin;
  int32_t rounds_done = 0, base = 0;
  for (int32_t round = begin; round < rounds_end; round += kRoundTokens) {
    float l[kLoadsInFlight][4];
    uint32_t next_word = ~0u;  // masked: the next round's word of this thread, stored below
    if constexpr (kMasked) {
      if (threadIdx.x < kRoundWords)
        next_word = round_word(row.allowed, round + kRoundTokens, end, threadIdx.x);
      const uint32_t* words = ring + round_parity(round, begin) * kRoundWords;
      load_round(row, round, end, wide, l,
                 [&](int32_t i) { return staged_bits(words, round, i); });
    } else {
      load_round(row, round, end, wide, l);
    }
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {  // argmax.z: the thread's largest logit so far
      argmax.z = fmaxf(argmax.z, process_group<kPenalties>(l[u], group_token<T>(round, u, wide),
                                                           begin, end, a, bitmap, pen, inf_count,
                                                           raw_m, raw_s, nullptr));
    }
    // The round before read this slot before its barriers; the next reads it after ours.
    if constexpr (kMasked) {
      if (threadIdx.x < kRoundWords)
        ring[(round_parity(round, begin) ^ 1) * kRoundWords + threadIdx.x] = next_word;
    }
    ++rounds_done;
    const float thr = threshold;
    float admit = thr, bound = threshold_raw;
    if (k <= kChunkThreads && (thr == kNegInf || (rounds_done & (rounds_done - 1)) == 0)) {
      const float kth = candidate_z(kth_thread_max<kChunkThreads>(argmax.z, k), p.temperature);
      if (kth > admit) {
        admit = kth;
        bound = admission_bound(kth, p.temperature);
      }
    }
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      // One vote a group skips its four appends in the warps (most, once the threshold has
      // risen) where no lane holds a candidate. A logit below the bound has z below admit.
      const float x_max4 = fmaxf(fmaxf(l[u][0], l[u][1]), fmaxf(l[u][2], l[u][3]));
      if (!__any_sync(0xffffffffu, x_max4 > kNegInf && x_max4 >= bound)) continue;
      const int32_t i = group_token<T>(round, u, wide);
      bool take[4];
      int n = 0;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        take[q] = l[u][q] > kNegInf && l[u][q] >= bound;
        n += take[q];
      }
      warp_append_n(n, &buf_count, [&](int32_t at) {
#pragma unroll
        for (int q = 0; q < 4; ++q)
          if (take[q]) buf[at++] = Candidate{l[u][q], i + q};
      });
    }
    __syncthreads();
    const int held = buf_count;
    scale_candidates<kChunkThreads>(buf, base, held, p.temperature, edge_ids);
    base = held;
    float next = admit;  // the next round's threshold
    if (held > kCompactAt) {
      __syncthreads();  // the round's z
      const int kept = keep_top_k<kChunkThreads, kBufferCap / kChunkThreads>(
          buf, held, k, held, red_count, &compact_counter, tie_cap);
      // The smallest kept z (at or above admit): nothing below it can enter the chunk's top-k.
      Candidate lowest{kNegInf, kNoId};  // holds -z
      for (int e = threadIdx.x; e < kept; e += kChunkThreads)
        lowest = best_of(lowest, Candidate{-buf[e].z, buf[e].id});
      lowest = block_best<kChunkThreads>(lowest, scratch);
      next = -lowest.z;
      base = kept;
      if (threadIdx.x == 0) buf_count = kept;
    }
    if (next > thr && threadIdx.x == 0) {
      threshold = next;
      threshold_raw = admission_bound(next, p.temperature);
    }
    __syncthreads();
  }
  // Block reductions of the per-thread results.
  const Partial chunk = block_partial<kChunkThreads>(Partial{argmax, best, inf_best, inf_count, 0}, partials);
  warp_merge_lse(raw_m, raw_s);
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    red_m[w] = raw_m;
    red_s[w] = raw_s;
  }
  if (top_k_rows) {  // the chunk's k best, or more where they fit, in no particular order
    // Held candidates that fit the k_cap slots all go (every token at or above the admission
    // bar is held, and the bar is at most the chunk's k-th z, so they hold its top k): the row's
    // finishing block cuts exactly anyway. A chunk of one or two rounds (steps of up to ~16 rows)
    // holds ~1.1 k, so it skips the four radix passes of the cut.
    const int held = buf_count;
    const int kept = held <= a.k_cap ? held
                                     : keep_top_k<kChunkThreads, kBufferCap / kChunkThreads>(
                                           buf, held, k, held, red_count, &compact_counter,
                                           tie_cap);
    Candidate* dst = a.chunk_candidates + int64_t{blockIdx.x} * a.k_cap;
    for (int e = threadIdx.x; e < a.k_cap; e += kChunkThreads)
      dst[e] = e < kept ? buf[e] : Candidate{kNegInf, kNoId};  // holes: the finisher copies slots
    if (threadIdx.x == 0) out->kept = kept;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = kNegInf, s = 0.0f;
    for (int j = 0; j < kChunkThreads / 32; ++j) merge_lse(m, s, red_m[j], red_s[j]);
    out->argmax = chunk.argmax;
    out->best = chunk.best;
    out->inf_best = chunk.inf_best;
    out->raw_max = m;
    out->raw_sum = s;
    out->inf_count = chunk.inf_count;
    out->past_max_id = edge_ids[0];
    out->at_lowest_id = edge_ids[1];
    if (!top_k_rows) out->kept = 0;
  }
  if constexpr (kFused) {
    // The block that draws the row's last ticket finishes the row.
    if (!last_block_of_row(a.tickets, r, a.splits, finishes_row)) return;
    // The chunk buffer (top-k steps) becomes the merge buffer; the top-p scan works behind it.
    const FinishSmem sm{buf, reinterpret_cast<unsigned long long*>(buf + kMergeCap), scratch, partials,
                        red_m, red_s, red_count, &keep_count, &compact_counter};
    finish_row<kChunkThreads>(logits, a, r, row_params(a, r), sm);  // reloaded: fewer live registers
  }
}

}  // namespace tokensampler::cuda::split_row
