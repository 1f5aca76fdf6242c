// Device code of the split-row fast path of sample_rows (launch code: split_row_sample.cu).
// Rows: no filter, or top-k (k <= kSplitRowMaxTopK) with optional top-p / min-p inside the top-k
// set; penalties and bias (with the drafts of verify rows) looked up per token.
//
// Kernel 1 (chunk): a row is cut into `splits` chunks, one block each, so a small batch still
// fills the GPU. A block streams its chunk once, kLoadsInFlight 16-byte loads per thread per
// round, and leaves a few numbers:
//   - the argmax of the processed logits (greedy rows), raw (max, sum-exp) partials (raw
//     logprobs), the +inf count;
//   - no-filter rows: the best z + G of the chunk. Noise is keyed by token id, so it is needed
//     only where it can win: a cheap exact upper bound on G from the random word's leading
//     zeros (G = -ln(-ln u) <= -ln(1 - u)) skips the two logs for almost every token;
//   - top-k rows: the chunk's k best (z, id). Candidates at or above a running threshold go to a
//     shared-memory buffer; when it holds more than kCompactAt, an exact select (block_select.cuh)
//     cuts it back to k and raises the threshold. The first round's threshold is the k-th
//     largest of the threads' maxima, so even the first round admits few.
// Finishing a row (finish_row): one block merges the row's chunks: argmax / best score, or the
// exact top-k of the chunks' candidates (block_select.cuh: candidates below the k-th largest of
// the threads' maxima dropped first, then one warp radix-selects among the few left), sorted
// (bitonic, <= 512 entries) only when top-p or +inf logits need the rank order; top-p over
// integer masses scanned in rank order (row_rules.h, as the CPU reference), min-p, and
// Gumbel-max over the kept candidates. Every score is computed with the helpers of the CPU
// kernels, so tokens are identical. In rejection-sampling verify (try_verify_rejection) the
// finisher also judges the row's draft over the kept set it holds (rejection_verdict.cuh) and
// writes the verdict for verify.cu's walker, which runs the rows it leaves undecided.
// Two launches of it (split_row_sample.cu picks by the step's rows; kMasked by whether the step
// has a grammar bitmask, so steps without one run no bitmask code):
//   - single launch, small steps: chunk_kernel<T, true, kMasked>. Each block, after writing its
//     chunk's results, takes a ticket of its row (an atomic counter in the workspace, after a
//     __threadfence); the block that draws the last one reads the others' results through L2,
//     finishes the row in its own shared memory and resets the ticket to zero, so the next
//     launch and every CUDA-graph replay find it zero (workspace.h states the invariant). No
//     block ever waits for another. Rows without top-k take up to kFusedMaxSplits chunks here.
//   - two launches, larger steps: chunk_kernel<T, false, kMasked>, then finish_kernel (one block
//     per row), launched with programmatic dependent launch.
#pragma once

#include <cuda_runtime.h>

#include <cfloat>
#include <climits>

#include "block_select.cuh"
#include "device_primitives.cuh"
#include "logits_row.cuh"
#include "mass_scan.cuh"
#include "penalty_lookup.cuh"
#include "rejection_verdict.cuh"
#include "row_outputs.cuh"
#include "tokensampler/rng.h"
#include "tokensampler/route.h"
#include "tokensampler/row_rules.h"
#include "tokensampler/slot_layout.h"

namespace tokensampler::cuda::split_row {

constexpr int kChunkThreads = 256;
// Resident chunk-kernel blocks per SM (every chunk kernel's launch bound, so none needs more than
// 64 registers a thread): set_chunks sizes a step's blocks to one wave of them.
constexpr int kChunkBlocksPerSm = 4;
constexpr int kFinishThreads = 512;
constexpr int kLoadsInFlight = 4;  // 16-byte loads per thread per round (bytes in flight per SM)
constexpr int kRoundTokens = kChunkThreads * 4 * kLoadsInFlight;
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
// hot loop divides only the logits it admits.
__device__ __forceinline__ float admission_bound(float thr, float temperature) {
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
  Candidate argmax;      // of the processed logits (greedy rows), ties to the lowest id
  Candidate best;        // best z + G (no-filter rows) over finite tokens
  Candidate inf_best;    // best G over +inf tokens
  float raw_max, raw_sum;
  int32_t inf_count;
  int32_t kept;          // real candidates (top-k rows); the chunk's k_cap slots past them are holes
  // Histogram-cut top-p rows (histogram_cut_kernel.cuh, kernel 1): the chunk's best z + G and
  // that token's z.
  Candidate winner;
  float winner_z;
  // Top-k rows (scaled_group holds a z past fp32's range at +-FLT_MAX): the chunk's lowest id
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

struct Args {
  int64_t row_stride;
  BitmaskRows token_bitmask;  // DESIGN §3.0
  int32_t vocab;
  int32_t splits;
  int32_t chunk_len;
  int32_t k_cap;
  bool stage_bitmask;  // chunk kernel of a masked step: bitmask words staged in shared memory
  const int32_t* req_pool_indices;
  const int32_t* valid_cache_lengths;
  const int32_t* table;
  int64_t pool_rows;
  SlotLayout layout;
  int32_t tokens_per_req;
  const int32_t* candidates;  // verify: [bs, tokens_per_req] drafts (penalties count them)
  bool penalties;
  bool want_raw;
  ChunkResult* results;
  Candidate* chunk_candidates;
  // Single launch only: one ticket per row, zero before the launch and zero again after it (the
  // row's finishing block resets its own), so CUDA-graph replays find them zero. See workspace.h.
  uint32_t* tickets;
  // Rejection-sampling verify (try_verify_rejection), else null: the draft probabilities
  // [bs, tokens_per_req - 1, V] (float32) and the drafts [bs, tokens_per_req]. out_tokens then
  // takes each row's verdict (rejection_verdict.cuh) for verify.cu's walker.
  const float* draft_probs;
  const int32_t* drafts;
  int32_t* out_tokens;
  bool* out_invalid;
  float* out_logprobs;

  template <bool kMasked = true, typename T>
  __device__ __forceinline__ LogitsRow<T, kMasked> row_of(const T* logits, int64_t r) const {
    return logits_row<kMasked>(logits, row_stride, token_bitmask, r);
  }
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
  p.slot = SlotRow{a.table + a.layout.row_offset(slot), a.layout};
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

__device__ __forceinline__ PenaltySource penalty_source(const Args& a, const RowParams& p, int64_t r) {
  const int32_t* drafts = a.candidates ? a.candidates + (r - p.row_in_req) + 1 : nullptr;
  return PenaltySource{p.slot, drafts, drafts ? p.row_in_req : 0};
}

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

// Top-k rows: z = x / T of four processed logits (tokens i..i+3) at or above the admission
// bound, -inf below. A finite logit whose z is past fp32's range gets +-FLT_MAX: it ranks below
// a +inf logit's +inf, and a -FLT_MAX candidate is a real token, unlike the -inf of a hole. But
// there it ties with a z of exactly +-FLT_MAX, where the CPU ranks the overflowed z (+inf) above
// it and the overflowed z (-inf) below it. So the lowest id past +FLT_MAX goes to edge_ids[0]
// and the lowest at exactly -FLT_MAX to edge_ids[1] (shared memory) for the finisher (DESIGN §5).
inline __device__ __noinline__ float4 scaled_group(float4 x4, int32_t i, float bound,
                                                    float temperature, int32_t* edge_ids) {
  auto z = [&](float x, int32_t id) {
    if (!(x > kNegInf && x >= bound)) return kNegInf;
    const float s = scaled_logit(x, temperature);
    if (x == INFINITY) return s;
    if (s == INFINITY) atomicMin(edge_ids, id);
    if (s == -FLT_MAX) atomicMin(edge_ids + 1, id);
    return fminf(fmaxf(s, -FLT_MAX), FLT_MAX);
  };
  return make_float4(z(x4.x, i), z(x4.y, i + 1), z(x4.z, i + 2), z(x4.w, i + 3));
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
// argmax. The common group (finite logits, no penalties) costs a few min/max: fmaxf drops NaN,
// and NaN / +inf are found with one sum (NaN when any is NaN, or +inf beside -inf).
__device__ __forceinline__ float process_group(float (&x)[4], int32_t i, int32_t begin,
                                               int32_t end, const Args& a,
                                               const uint32_t* bitmap, const PenaltySource& pen,
                                               int32_t& inf_count, float& raw_m, float& raw_s,
                                               Candidate* argmax) {
  float x_max4 = fmaxf(fmaxf(kNegInf, fmaxf(x[0], x[1])), fmaxf(x[2], x[3]));
  const float sum = (x[0] + x[1]) + (x[2] + x[3]);
  if (sum != sum) {
#pragma unroll
    for (int q = 0; q < 4; ++q) x[q] = sanitize_logit(x[q]);
  }
  if (x_max4 == INFINITY) {
#pragma unroll
    for (int q = 0; q < 4; ++q) inf_count += x[q] == INFINITY;
  }
  if (a.want_raw) fold_raw_group(make_float4(x[0], x[1], x[2], x[3]), raw_m, raw_s);
  const uint32_t marked = a.penalties && i < end ? penalty_nibble(bitmap, i, begin) : 0u;
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

// This thread's kLoadsInFlight groups of a round (group u at round + 4 (u kChunkThreads +
// thread), -inf past `end`), every load (bitmask words first) issued before any is used.
template <typename T, bool kMasked>
__device__ __forceinline__ void load_round(const LogitsRow<T, kMasked>& row, int32_t round,
                                           int32_t end, float (&l)[kLoadsInFlight][4]) {
  const int32_t first = round + 4 * static_cast<int32_t>(threadIdx.x);
  uint32_t bits[kLoadsInFlight];
#pragma unroll
  for (int u = 0; u < kLoadsInFlight; ++u) bits[u] = mask_bits(row, first + 4 * u * kChunkThreads, end);
#pragma unroll
  for (int u = 0; u < kLoadsInFlight; ++u) load4(row, first + 4 * u * kChunkThreads, end, l[u]);
#pragma unroll
  for (int u = 0; u < kLoadsInFlight; ++u) apply_mask<kMasked>(bits[u], l[u]);
}

// A chunk [begin, end) round by round (load_round), each group handed to f(x, i) with i its
// first token.
template <typename T, bool kMasked, typename F>
__device__ __forceinline__ void for_each_round(const LogitsRow<T, kMasked>& row, int32_t begin,
                                               int32_t end, F&& f) {
  for (int32_t round = begin; round < end; round += kRoundTokens) {
    float l[kLoadsInFlight][4];
    load_round(row, round, end, l);
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u)
      f(l[u], round + 4 * (u * kChunkThreads + static_cast<int32_t>(threadIdx.x)));
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
// counted but not stored.
template <int32_t kCap = INT32_MAX>
__device__ __forceinline__ void append_candidate(bool take, Candidate c, Candidate* buf,
                                                 int32_t* count) {
  warp_append(take, count, [&](int32_t at) {
    if (kCap == INT32_MAX || at < kCap) buf[at] = c;
  });
}

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
// min-p (a z past fp32's range is +-FLT_MAX, scaled_group: finish_row breaks its ties with a z of
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
  unsigned long long* scan_storage;  // kSplitRowMaxTopK words (top-k steps with top-p only)
  Candidate* scratch;   // kThreads / 32
  Partial* partials;    // kThreads / 32
  float* red_m;         // kThreads / 32
  float* red_s;         // kThreads / 32
  int32_t* red_count;   // 2 * kThreads / 32
  int32_t* keep_count;
  int32_t* counter;
};

// Finishes row r (valid slot) from its chunks' results, with all kThreads threads of the block:
// argmax / best score, or the exact top-k of the chunks' candidates, sorted (bitonic, <= 512
// entries) only when top-p or +inf logits need the rank order; then its kept set and Gumbel-max
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
    const int m = keep_top_k<kThreads, kMergeCap / kThreads, true>(sm.buf, slots, p.top_k, total,
                                                            sm.red_count, sm.counter);
    Candidate top{kNegInf, kNoId};
    for (int e = threadIdx.x; e < m; e += kThreads) top = best_of(top, sm.buf[e]);
    const float z_max = block_best<kThreads>(top, sm.scratch).z;
    const bool ordered = z_max == INFINITY || p.top_p < 1.0f;
    if (ordered) {  // rank order of the (<= 512) kept candidates
      const int n = next_pow2(max(m, 1));
      for (int e = m + threadIdx.x; e < n; e += kThreads) sm.buf[e] = Candidate{kNegInf, kNoId};
      __syncthreads();
      bitonic_sort<kThreads>(sm.buf, n);
    }
    const KeptSet kept_set = ranked_kept_set<kThreads, kSplitRowMaxTopK>(
        sm.buf, m, p, z_max, argmax.z == INFINITY, sm.scan_storage, sm.keep_count);
    token = sample_kept_set<kThreads>(kept_set, p, sm.scratch);
    if (fabsf(z_max) == FLT_MAX) {
      // Ties at +-FLT_MAX (scaled_group): as on the CPU, a z past +FLT_MAX (+inf there) wins
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

// kFused (the single launch): the last block of each row to finish its chunk (a per-row ticket)
// finishes the row itself, so a step is one kernel. kMasked: the step has a grammar bitmask;
// without one the loops carry no bitmask code (they run at the 64-register cap).
template <typename T, bool kFused, bool kMasked>
__global__ void __launch_bounds__(kChunkThreads, kChunkBlocksPerSm)
    chunk_kernel(const T* __restrict__ logits, Args a) {
  // Dynamic shared memory: [penalty bitmap, if penalties][candidate buffer, if top-k rows]
  // [the chunk's bitmask words, if kMasked].
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ Candidate scratch[kChunkThreads / 32];
  __shared__ Partial partials[kChunkThreads / 32];
  __shared__ float red_m[kChunkThreads / 32], red_s[kChunkThreads / 32];
  __shared__ int32_t red_count[2 * kChunkThreads / 32];
  __shared__ int32_t buf_count, compact_counter, keep_count;
  __shared__ float threshold;
  __shared__ BlockBest best_seen;  // no-filter rows
  __shared__ int32_t edge_ids[2];  // top-k rows: scaled_group
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
      write_unreadable_row(r, a.out_tokens, a.out_invalid, a.out_logprobs, nullptr, nullptr, 0);
    return;  // the whole block; this row's ticket is never taken
  }
  const bool top_k_rows = !p.greedy && p.top_k_on && a.k_cap > 0;
  const int32_t k = min(p.top_k, a.k_cap);
  uint32_t* bitmap = reinterpret_cast<uint32_t*>(dyn_smem);
  Candidate* buf = reinterpret_cast<Candidate*>(dyn_smem + (a.penalties ? kPenaltyBitmapWords * 4 : 0));
  int32_t* mask_stage = reinterpret_cast<int32_t*>(buf + (a.k_cap > 0 ? kBufferCap : 0));
  LogitsRow<T, kMasked> row = a.row_of<kMasked>(logits, r);
  // Staged words are read only after the barrier below.
  if (a.stage_bitmask) row = stage_mask(row, begin, end, mask_stage, kChunkThreads);
  const PenaltySource pen = a.penalties ? penalty_source(a, p, r) : PenaltySource{};
  const float inv_t = 1.0f / p.temperature;  // estimates only; exact z = x / T where it counts
  if (a.penalties) mark_penalized_tokens<kChunkThreads>(pen, begin, end, bitmap);

  Candidate argmax{kNegInf, kNoId}, best{kNegInf, kNoId}, inf_best{kNegInf, kNoId};
  float raw_m = kNegInf, raw_s = 0.0f;
  int32_t inf_count = 0;
  if (threadIdx.x == 0) {
    buf_count = 0;
    threshold = kNegInf;
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
    for_each_round(row, begin, end, [&](float (&x)[4], int32_t i) {
      const float x_max4 =
          process_group(x, i, begin, end, a, bitmap, pen, inf_count, raw_m, raw_s, nullptr);
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
  // Greedy and top-k rows, kLoadsInFlight loads per thread per round.
  const int32_t rounds_end = top_k_rows || p.greedy ? end : begin;
  for (int32_t round = begin; round < rounds_end; round += kRoundTokens) {
    float l[kLoadsInFlight][4];
    load_round(row, round, end, l);
    const float thr = top_k_rows ? threshold : 0.0f;
    const float thr_raw = top_k_rows ? admission_bound(thr, p.temperature) : 0.0f;
    float thread_max = kNegInf;  // top-k rows: the thread's largest z of the round
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int32_t i = round + 4 * (u * kChunkThreads + static_cast<int32_t>(threadIdx.x));
      // Greedy rows need the argmax; the others only whether any token is finite or +inf.
      const float x_max4 = process_group(l[u], i, begin, end, a, bitmap, pen, inf_count, raw_m,
                                         raw_s, p.greedy ? &argmax : nullptr);
      argmax.z = p.greedy ? argmax.z : fmaxf(argmax.z, x_max4);
      if (top_k_rows) {
        const float4 z4 = x_max4 > kNegInf && x_max4 >= thr_raw
                              ? scaled_group(make_float4(l[u][0], l[u][1], l[u][2], l[u][3]), i,
                                             thr_raw, p.temperature, edge_ids)
                              : make_float4(kNegInf, kNegInf, kNegInf, kNegInf);
        // l[u] now holds z of the tokens at or above the threshold, -inf below it
        l[u][0] = z4.x; l[u][1] = z4.y; l[u][2] = z4.z; l[u][3] = z4.w;
        thread_max = fmaxf(thread_max, fmaxf(fmaxf(z4.x, z4.y), fmaxf(z4.z, z4.w)));
      }
    }
    if (top_k_rows) {
      float admit = thr;
      if (admit == kNegInf && k <= kChunkThreads) admit = kth_thread_max<kChunkThreads>(thread_max, k);
#pragma unroll
      for (int u = 0; u < kLoadsInFlight; ++u) {
        const int32_t i = round + 4 * (u * kChunkThreads + static_cast<int32_t>(threadIdx.x));
#pragma unroll
        for (int q = 0; q < 4; ++q)
          append_candidate(l[u][q] > kNegInf && l[u][q] >= admit, Candidate{l[u][q], i + q}, buf,
                           &buf_count);
      }
      __syncthreads();
      const int held = buf_count;
      if (held > kCompactAt) {
        keep_top_k<kChunkThreads, kBufferCap / kChunkThreads>(buf, held, k, held, red_count,
                                                             &compact_counter);
        // The smallest kept z: nothing below it can enter the chunk's top-k.
        Candidate lowest{kNegInf, kNoId};  // holds -z
        for (int e = threadIdx.x; e < k; e += kChunkThreads)
          lowest = best_of(lowest, Candidate{-buf[e].z, buf[e].id});
        lowest = block_best<kChunkThreads>(lowest, scratch);
        if (threadIdx.x == 0) {
          buf_count = k;
          threshold = -lowest.z;
        }
      } else if (admit > thr && threadIdx.x == 0) {
        threshold = admit;
      }
      __syncthreads();
    }
  }

  // Block reductions of the per-thread results.
  const Partial chunk = block_partial<kChunkThreads>(Partial{argmax, best, inf_best, inf_count, 0}, partials);
  warp_merge_lse(raw_m, raw_s);
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    red_m[w] = raw_m;
    red_s[w] = raw_s;
  }
  if (top_k_rows) {  // exactly the chunk's k best, in no particular order
    const int held = buf_count;
    const int kept = keep_top_k<kChunkThreads, kBufferCap / kChunkThreads>(
        buf, held, k, held, red_count, &compact_counter);
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
    // Release this chunk's writes (every thread's), then take the row's ticket; the block that
    // draws the last one acquires the others' writes and finishes the row. It resets the ticket:
    // no other block of this launch touches it again, and the next launch (or replay) starts
    // after this one ends.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      const uint32_t ticket = atomicAdd(a.tickets + r, 1u);
      finishes_row = ticket == static_cast<uint32_t>(a.splits - 1);
      if (finishes_row) {
        a.tickets[r] = 0u;
        __threadfence();
      }
    }
    __syncthreads();
    if (!finishes_row) return;
    __threadfence();
    // The chunk buffer (top-k steps) becomes the merge buffer; the top-p scan works behind it.
    const FinishSmem sm{buf, reinterpret_cast<unsigned long long*>(buf + kMergeCap), scratch, partials,
                        red_m, red_s, red_count, &keep_count, &compact_counter};
    finish_row<kChunkThreads>(logits, a, r, row_params(a, r), sm);  // reloaded: fewer live registers
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
    write_unreadable_row(r, a.out_tokens, a.out_invalid, a.out_logprobs, nullptr, nullptr, 0);
    return;
  }
  const FinishSmem sm{buf, scan_storage, scratch, partials, red_m, red_s, red_count, &keep_count,
                      &counter};
  finish_row<kFinishThreads>(logits, a, r, p, sm);
}

}  // namespace tokensampler::cuda::split_row
