// DESIGN §3.8 raw logprobs of given tokens and each row's top N, under the grammar bitmask (CPU
// kernels: ops/raw_logprobs_cpu.cpp). The arithmetic is raw_logprob's (device_primitives.cuh);
// the rank order is ranks_before (value descending, ties to the lower id; NaN and disallowed
// tokens are -inf, so a row with fewer than N larger values goes on through its -inf ids in
// order).
//
// Rows are cut into chunks, so a step of a few rows fills the GPU (one block a row read a
// 152k-token row N + 1 times through one SM). The chunk kernel gives each chunk's raw
// (max, sum-exp, +inf count) and the chunk's own top N: each of the row's top N is among its
// chunk's top N, so the finish kernel's top N of the chunks' is the row's. A step of one chunk a
// row runs the chunk kernel alone, and it writes the outputs. For N <= kThreadTopN the chunk is
// read once: each thread keeps its own best kThreadTopN in registers during the stats read, and
// the block merges those lists; a larger N takes one pass over the chunk per rank.
#pragma once

#include <cuda_runtime.h>

#include "device_primitives.cuh"
#include "logits_row.cuh"
#include "raw_logprobs_launch.h"

namespace tokensampler::cuda::raw_logprobs {

constexpr int kThreads = 256;
constexpr int32_t kMaxSplitTopN = 32;  // larger N: one chunk a row (no candidate scratch)
constexpr int32_t kMergeCap = 4096;    // splits * N: the finish kernel's candidates (32 KiB)
constexpr int kThreadTopN = 8;         // N up to this: the chunk kernel's one-read top N

struct Smem {
  float red_m[kThreads / 32];
  float red_s[kThreads / 32];
  Candidate scratch[kThreads / 32];
  int32_t inf_total;
};

// Block-wide raw (max, sum-exp) and +inf count from each thread's; every thread gets them.
// Once per kernel (inf_total is zeroed on entry).
__device__ __forceinline__ void block_raw_stats(float& m, float& s, int32_t& inf_count, Smem& sm) {
  if (threadIdx.x == 0) sm.inf_total = 0;
  __syncthreads();
  inf_count = __reduce_add_sync(0xffffffffu, inf_count);
  if ((threadIdx.x & 31) == 0 && inf_count > 0) atomicAdd(&sm.inf_total, inf_count);
  block_merge_lse<kThreads>(m, s, sm.red_m, sm.red_s);  // its barrier publishes inf_total
  inf_count = sm.inf_total;
}

// The first n of `count` candidates get(j) in rank order: one block best per rank over those
// ranked after the rank before. emit(rank, best) runs on every thread.
template <typename Get, typename Emit>
__device__ void for_each_top(int32_t count, int32_t n, Smem& sm, Get&& get, Emit&& emit) {
  Candidate prev{0.0f, -1};
  for (int32_t rank = 0; rank < n; ++rank) {
    Candidate best{kNegInf, kNoId};
#pragma unroll 4
    for (int32_t j = threadIdx.x; j < count; j += kThreads) {
      const Candidate c = get(j);
      if (prev.id < 0 || before(prev, c)) best = best_of(best, c);
    }
    best = block_best<kThreads>(best, sm.scratch);
    emit(rank, best);
    prev = best;
  }
}

// A thread's best kThreadTopN candidates in rank order (ranks_before), in registers: every
// index is a constant once the loops unroll. Empty slots hold {-inf, kNoId}, after every token.
struct ThreadTop {
  Candidate c[kThreadTopN];

  __device__ __forceinline__ ThreadTop() {
#pragma unroll
    for (int k = 0; k < kThreadTopN; ++k) c[k] = Candidate{kNegInf, kNoId};
  }
  // Inserts x where it ranks; the last entry drops out.
  __device__ __forceinline__ void offer(Candidate x) {
    if (!before(x, c[kThreadTopN - 1])) return;
#pragma unroll
    for (int k = kThreadTopN - 1; k > 0; --k)
      c[k] = before(x, c[k - 1]) ? c[k - 1] : before(x, c[k]) ? x : c[k];
    if (before(x, c[0])) c[0] = x;
  }
  // Drops the first entry.
  __device__ __forceinline__ void pop() {
#pragma unroll
    for (int k = 0; k < kThreadTopN - 1; ++k) c[k] = c[k + 1];
    c[kThreadTopN - 1] = Candidate{kNegInf, kNoId};
  }
};

// The block's first n (<= kThreadTopN) candidates in rank order from every thread's ThreadTop:
// each rank is the block best of the threads' first entries, and the thread that held it (ids
// are distinct) moves on. emit(rank, best) runs on every thread.
template <typename Emit>
__device__ void merge_thread_tops(ThreadTop& top, int32_t n, Smem& sm, Emit&& emit) {
  for (int32_t rank = 0; rank < n; ++rank) {
    const Candidate best = block_best<kThreads>(top.c[0], sm.scratch);
    emit(rank, best);
    if (top.c[0].id == best.id) top.pop();
  }
}

// out_logprobs[r], where asked for: of(token) for the row's token, NaN where tokens[r] lies
// outside [0, V) (the row emitted none).
template <typename Of>
__device__ __forceinline__ void write_token_logprob(const Args& a, int64_t r, Of&& of) {
  if (a.out_logprobs == nullptr || threadIdx.x != 0) return;
  const int32_t token = a.tokens[r];
  a.out_logprobs[r] = token >= 0 && token < a.vocab ? of(token) : __int_as_float(0x7fc00000);  // NaN
}

// Row r's outputs from its raw stats and its top N, which each_top(emit) gives (emit(rank, best)
// in rank order, on every thread).
template <typename T, bool kMasked, typename EachTop>
__device__ __forceinline__ void write_row(const Args& a, int64_t r, const LogitsRow<T, kMasked>& x,
                                          float m, float s, int32_t inf_count, EachTop&& each_top) {
  write_token_logprob(a, r, [&](int32_t token) { return raw_logprob(x.raw(token), inf_count, m, s); });
  each_top([&](int32_t n, Candidate best) {
    if (threadIdx.x != 0) return;
    a.out_top_ids[r * a.top_n + n] = best.id < a.vocab ? best.id : 0;
    a.out_top_values[r * a.top_n + n] = raw_logprob(best.z, inf_count, m, s);
  });
}

// A row read nowhere (its slot outside the pool): the outputs of a row with no finite logit, a
// -inf logprob and the top N -inf at ids 0..N-1.
__device__ __forceinline__ void write_unreadable_outputs(const Args& a, int64_t r) {
  write_token_logprob(a, r, [](int32_t) { return kNegInf; });
  for (int32_t n = threadIdx.x; n < a.top_n; n += kThreads) {
    a.out_top_values[r * a.top_n + n] = kNegInf;
    a.out_top_ids[r * a.top_n + n] = n;
  }
}

// Block (r, split): chunk [split * chunk_len, + chunk_len) of row r.
template <typename T>
__global__ void __launch_bounds__(kThreads) chunk_kernel(const T* __restrict__ logits, Args a) {
  __shared__ Smem sm;
  const int64_t r = blockIdx.x / a.splits;
  const int32_t split = static_cast<int32_t>(blockIdx.x % a.splits);
  if (!a.readable(r)) {
    if (a.splits == 1) write_unreadable_outputs(a, r);
    return;
  }
  const int32_t begin = split * a.chunk_len, end = min(a.vocab, begin + a.chunk_len);
  const LogitsRow<T> x = logits_row(logits, a.row_stride, a.token_bitmask, r);
  const bool one_read = a.top_n > 0 && a.top_n <= kThreadTopN;  // the same for every block
  float m = kNegInf, s = 0.0f;
  int32_t inf_count = 0;
  ThreadTop thread_top;
  for_each_raw<kThreads>(x, begin, end, [&](int32_t i, float v) {
    if (v == INFINITY) ++inf_count;
    else add_to_lse(m, s, v);
    if (one_read) thread_top.offer(Candidate{v, i});
  });
  block_raw_stats(m, s, inf_count, sm);
  const auto each_top = [&](auto&& emit) {
    if (one_read) {
      merge_thread_tops(thread_top, a.top_n, sm, emit);
    } else {
      const auto get = [&](int32_t j) { return Candidate{x.raw(begin + j), begin + j}; };
      for_each_top(end - begin, a.top_n, sm, get, emit);
    }
  };
  if (a.splits == 1) {
    write_row(a, r, x, m, s, inf_count, each_top);
    return;
  }
  if (threadIdx.x == 0) a.partials[blockIdx.x] = Partial{m, s, inf_count, 0};
  Candidate* top = a.chunk_top + int64_t{blockIdx.x} * a.top_n;
  each_top([&](int32_t n, Candidate best) {
    if (threadIdx.x == 0) top[n] = best;
  });
}

// Block r: merges row r's chunks. Dynamic shared memory: splits * top_n candidates.
template <typename T>
__global__ void __launch_bounds__(kThreads) finish_kernel(const T* __restrict__ logits, Args a) {
  __shared__ Smem sm;
  extern __shared__ Candidate held[];
  const int64_t r = blockIdx.x;
  if (!a.readable(r)) {
    write_unreadable_outputs(a, r);
    return;
  }
  float m = kNegInf, s = 0.0f;
  int32_t inf_count = 0;
  const Partial* part = a.partials + r * a.splits;
  for (int32_t j = threadIdx.x; j < a.splits; j += kThreads) {
    const Partial p = part[j];
    merge_lse(m, s, p.m, p.s);
    inf_count += p.inf_count;
  }
  const int32_t count = a.splits * a.top_n;
  const Candidate* src = a.chunk_top + r * count;
  for (int32_t j = threadIdx.x; j < count; j += kThreads) held[j] = src[j];
  block_raw_stats(m, s, inf_count, sm);  // its barriers also publish `held`
  const LogitsRow<T> x = logits_row(logits, a.row_stride, a.token_bitmask, r);
  write_row(a, r, x, m, s, inf_count, [&](auto&& emit) {
    for_each_top(count, a.top_n, sm, [&](int32_t j) { return held[j]; }, emit);
  });
}

}  // namespace tokensampler::cuda::raw_logprobs
