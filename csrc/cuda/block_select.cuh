// Block-wide exact top-k selection over candidates in shared memory, without sorting.
//
// The rank order is (z descending, id ascending). The k-th candidate is found by radix select:
// four passes over 8-bit digits of an order-preserving key of z (most significant first), each
// one shared-memory histogram of the candidates that share the digits chosen so far and one
// block scan of its 256 bins, then (only when several candidates tie on the boundary z) four
// passes over the digits of the id. A bisection needs a block-wide count and a barrier per key
// bit (32, and 31 more on ties: what the top-k chunk kernels' instruction counts pointed at,
// RESULTS.md runs 43-45); a bitonic sort of the same buffer takes ~log2(n)^2 / 2 barrier stages
// with a full pass of compare-exchanges in each. Where at most a block's threads survive a
// lower bound of the k-th key, rank_top_k places the top-k in rank order by counting instead.
#pragma once

#include <cuda_runtime.h>

#include "device_primitives.cuh"
#include "tokensampler/platform.h"
#include "tokensampler/row_rules.h"

namespace tokensampler::cuda::split_row {

__device__ __forceinline__ uint32_t slot_key(const Candidate& c) {
  return c.id == kNoId ? 0u : rank_key(c.z);
}

// Block-wide sum; one barrier per call. `red` holds 2 * kThreads / 32 ints and `parity` alternates
// between its halves, so a call never overwrites what a slower thread may still read.
// kThreads == 32: a warp-wide sum of warp 0 alone (no shared memory, no barrier).
template <int kThreads>
__device__ __forceinline__ int32_t block_count(int32_t c, int32_t* red, int& parity) {
  constexpr int kWarps = kThreads / 32;
  c = __reduce_add_sync(0xffffffffu, c);
  if constexpr (kThreads == 32) return c;  // one warp (warp 0) on its own: no barrier
  int32_t* half = red + parity * kWarps;
  if ((threadIdx.x & 31) == 0) half[threadIdx.x >> 5] = c;
  __syncthreads();
  int32_t total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += half[w];
  parity ^= 1;
  return total;
}

// Boundary of the top-k: a candidate is kept iff key > key, or key == key and id <= id; `kept`
// of them.
struct Cut {
  uint32_t key;
  int32_t id;
  int32_t kept;
};

__device__ __forceinline__ bool kept_by(const Cut& cut, const Candidate& c) {
  const uint32_t key = slot_key(c);
  return key > cut.key || (key == cut.key && c.id <= cut.id);
}

// Barrier of a block, or of warp 0 working alone (kThreads == 32).
template <int kThreads>
__device__ __forceinline__ void block_or_warp_sync() {
  if constexpr (kThreads == 32) __syncwarp();
  else __syncthreads();
}

// Inclusive prefix sum of one int per thread over the block (kThreads == 32: warp 0 alone, no
// shared memory). `warp_sums` holds kThreads / 32 ints; a barrier must separate this call from
// any earlier read of them.
template <int kThreads>
__device__ __forceinline__ int32_t block_inclusive_sum(int32_t v, int32_t* warp_sums) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int32_t t = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += t;
  }
  if constexpr (kThreads == 32) return v;
  if (lane == 31) warp_sums[w] = v;
  __syncthreads();
  for (int j = 0; j < w; ++j) v += warp_sums[j];
  return v;
}

constexpr int kRadixBins = 256;  // 8-bit digits

struct DigitPick {
  int32_t digit;
  int32_t before;  // candidates in digits ahead of it (in the pass's order)
  int32_t count;   // candidates with it
};

struct RadixSmem {
  int32_t hist[kRadixBins];
  DigitPick pick;
};

// One radix pass: the digit holding the rank-th (1-based) candidate, in descending digit order
// (kDescending) or ascending, among the candidates for which digit_of gives a digit (>= 0;
// -1: not in the set). Syncs.
template <int kThreads, bool kDescending, typename DigitOf>
__device__ __forceinline__ DigitPick radix_pick(const Candidate* buf, int n, int32_t rank,
                                                DigitOf digit_of, RadixSmem& sm,
                                                int32_t* warp_sums) {
  constexpr int kPer = (kRadixBins + kThreads - 1) / kThreads;  // bins per thread
  for (int b = threadIdx.x; b < kRadixBins; b += kThreads) sm.hist[b] = 0;
  block_or_warp_sync<kThreads>();
  for (int e = threadIdx.x; e < n; e += kThreads) {
    const int d = digit_of(buf[e]);
    if (d >= 0) atomicAdd(&sm.hist[d], 1);
  }
  block_or_warp_sync<kThreads>();
  int32_t h[kPer], mine = 0;
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    const int j = static_cast<int>(threadIdx.x) * kPer + q;  // position in the pass's order
    h[q] = j < kRadixBins ? sm.hist[kDescending ? kRadixBins - 1 - j : j] : 0;
    mine += h[q];
  }
  int32_t cum = block_inclusive_sum<kThreads>(mine, warp_sums) - mine;
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    const int j = static_cast<int>(threadIdx.x) * kPer + q;
    if (cum < rank && rank <= cum + h[q])
      sm.pick = DigitPick{kDescending ? kRadixBins - 1 - j : j, cum, h[q]};
    cum += h[q];
  }
  block_or_warp_sync<kThreads>();
  return sm.pick;
}

// The rank-th (1-based) of value_of(c), in descending (kDescending) or ascending order, over the
// candidates in_set admits: four passes, 8 bits each. On return, rank is the rank among the
// candidates of that value and tied their count. Syncs.
template <int kThreads, bool kDescending, typename ValueOf, typename InSet>
__device__ __forceinline__ uint32_t radix_select(const Candidate* buf, int n, int32_t& rank,
                                                 int32_t& tied, ValueOf value_of, InSet in_set,
                                                 RadixSmem& sm, int32_t* warp_sums) {
  uint32_t value = 0;  // 8 bits per pass
#pragma unroll 1
  for (int shift = 24; shift >= 0; shift -= 8) {
    const uint32_t high = shift == 24 ? 0u : ~0u << (shift + 8);  // the digits chosen so far
    const DigitPick d = radix_pick<kThreads, kDescending>(buf, n, rank, [&](const Candidate& c) {
      const uint32_t v = value_of(c);
      return in_set(c) && (v & high) == value ? static_cast<int>((v >> shift) & 0xFFu) : -1;
    }, sm, warp_sums);
    value |= static_cast<uint32_t>(d.digit) << shift;
    rank -= d.before;
    tied = d.count;
  }
  return value;
}

// The top-k cut of buf[0, n) (empty slots: id kNoId), 1 <= k <= real candidates. `red` holds
// kThreads / 32 ints at least (unused by one warp). Exact where cap <= k. With cap > k (a buffer
// without empty slots: `kept` counts the boundary key's candidates), the candidates tied on z
// with the k-th are all kept where that keeps at most cap: a superset of the top-k, for a later
// exact cut, without the id passes (2-byte logits tie on the boundary in most chunks: ~60 % of
// bf16 randn chunks at k = 50).
// Loops stay rolled and the functions out of line: they run a few times per block, next to hot
// loops that need the instruction cache.
template <int kThreads>
__device__ __noinline__ Cut select_cut(const Candidate* buf, int n, int k, int cap, int32_t* red) {
  __shared__ RadixSmem sm;
  int32_t need = k, tied = 0;
  const uint32_t key = radix_select<kThreads, true>(
      buf, n, need, tied, [](const Candidate& c) { return slot_key(c); },
      [](const Candidate&) { return true; }, sm, red);
  const int32_t with_ties = k - need + tied;  // k - need candidates lie above the boundary z
  if (need == tied || with_ties <= cap) return Cut{key, kNoId - 1, with_ties};  // every tie kept
  // the need-th smallest id among the ties
  const int32_t id = static_cast<int32_t>(radix_select<kThreads, false>(
      buf, n, need, tied, [](const Candidate& c) { return static_cast<uint32_t>(c.id); },
      [&](const Candidate& c) { return slot_key(c) == key; }, sm, red));
  return Cut{key, id, k};
}

// A lower bound of the k-th largest of the threads' keys, to 16 key bits (16 barrier counts):
// at least k threads hold a key at or above it. 0 when fewer than k threads hold a key >= 2^16.
template <int kThreads>
__device__ __forceinline__ uint32_t kth_key_lower_bound(uint32_t key, int k) {
  uint32_t cut = 0;
  for (int bit = 31; bit >= 16; --bit) {
    const uint32_t trial = cut | (1u << bit);
    if (__syncthreads_count(key >= trial) >= k) cut = trial;
  }
  return cut;
}

constexpr int kWarpSelectMax = 256;  // candidates that one warp selects from (8 per lane)

// Moves the candidates of buf[0, n) that `keep` admits to buf[0, count) (order not kept), one
// warp-aggregated atomic per warp and slot round; returns count. Syncs. `counter` is reset here,
// so a barrier must separate this call from any earlier read of it (keep_top_k has one).
template <int kThreads, int kPerThread, typename Keep>
__device__ __forceinline__ int compact_candidates(Candidate* buf, int n, Keep keep, int32_t* counter) {
  if (threadIdx.x == 0) *counter = 0;
  Candidate mine[kPerThread];
  bool take[kPerThread];
  const int rounds = min(kPerThread, (n + kThreads - 1) / kThreads);  // block-uniform
#pragma unroll 1
  for (int j = 0; j < rounds; ++j) {
    const int e = static_cast<int>(threadIdx.x) + j * kThreads;
    mine[j] = e < n ? buf[e] : Candidate{kNegInf, kNoId};
    take[j] = e < n && keep(mine[j]);
  }
  __syncthreads();  // every read of buf before the first write
#pragma unroll 1
  for (int j = 0; j < rounds; ++j) {
    warp_append(take[j], counter, [&](int32_t at) { buf[at] = mine[j]; });
  }
  __syncthreads();
  return *counter;
}

// Keeps the top-k of buf[0, n) (exact; with cap > k, plus the k-th's ties on z up to cap:
// select_cut) and moves them to buf[0, count) (in no particular order). Returns count: min(k,
// real candidates) when `real` is that count, or up to cap with the ties. Syncs.
// kNarrowCut (same cut, so the same tokens; for a row's one finishing block, where the cut is
// serial work): when k <= kThreads and n is large, the candidates below the k-th largest of the
// threads' maxima (a lower bound of the k-th key) are dropped first; a set of at most
// kWarpSelectMax is then cut by warp 0 alone, without block barriers in its radix passes. The
// chunk kernels keep the block-wide cut: with many blocks per SM it measured faster at 128 rows
// (bench/RESULTS.md, 2026-12-04, with the bisection select_cut had then).
template <int kThreads, int kPerThread, bool kNarrowCut = false>
__device__ __noinline__ int keep_top_k(Candidate* buf, int n, int k, int real, int32_t* red,
                                      int32_t* counter, int cap = 0) {
  if (real == 0) return 0;
  if (real <= k && real == n) return n;
  k = min(k, real);
  if (kNarrowCut && k <= kThreads && n > kWarpSelectMax) {
    uint32_t thread_max = 0;
    for (int e = threadIdx.x; e < n; e += kThreads) thread_max = max(thread_max, slot_key(buf[e]));
    const uint32_t low = kth_key_lower_bound<kThreads>(thread_max, k);
    if (low > 0) {  // holes (key 0) go too; at least k real candidates stay
      n = compact_candidates<kThreads, kPerThread>(
          buf, n, [&](const Candidate& c) { return slot_key(c) >= low; }, counter);
      if (n == k) return k;
    }
  }
  Cut cut{0u, 0, 0};
  if (kNarrowCut && n <= kWarpSelectMax) {
    if (threadIdx.x < 32) cut = select_cut<32>(buf, n, k, cap, red);  // red unused by one warp
    __syncthreads();  // every earlier read of red and of `counter` done
    if (threadIdx.x == 0) {
      red[0] = static_cast<int32_t>(cut.key);
      red[1] = cut.id;
      red[2] = cut.kept;
    }
    __syncthreads();
    cut = Cut{static_cast<uint32_t>(red[0]), red[1], red[2]};
  } else {
    cut = select_cut<kThreads>(buf, n, k, cap, red);
  }
  compact_candidates<kThreads, kPerThread>(buf, n, [&](const Candidate& c) { return kept_by(cut, c); },
                                           counter);
  return cut.kept;
}

// The row's top-k of buf[0, n) (holes: kNoId; `real` real candidates), in rank order at
// buf[0, min(k, real)), where the candidates at or above the k-th largest of the threads' maxima
// (a lower bound of the k-th key) number at most kThreads: those are gathered to `survivors`
// (kThreads entries outside buf[0, n)) and each is placed by counting the survivors that rank
// before it (ids differ, so the order is total). Returns the count, or -1 with nothing moved
// where more survive or k > kThreads (keep_top_k then cuts). Against keep_top_k's narrow cut
// (a compaction, a warp's radix select, another compaction) and a bitonic sort for top-p: one
// block scan and one pass over the survivors (run 121: keep_top_k was 16.5 k of the bs-1 top-k
// finisher's 25.6 k cycles, the sort 5.7 k more with top-p). `warp_sums`: kThreads / 32 ints.
template <int kThreads, int kPerThread>
__device__ __noinline__ int rank_top_k(Candidate* buf, int n, int k, int real, Candidate* survivors,
                                      int32_t* warp_sums) {
  if (real == 0 || k > kThreads) return -1;
  k = min(k, real);
  uint32_t keys[kPerThread];
  uint32_t thread_max = 0;
#pragma unroll
  for (int q = 0; q < kPerThread; ++q) {
    const int e = static_cast<int>(threadIdx.x) + q * kThreads;
    keys[q] = e < n ? slot_key(buf[e]) : 0u;
    thread_max = max(thread_max, keys[q]);
  }
  // At least k threads hold a key at or above `low`; holes (key 0) never survive.
  const uint32_t low = max(kth_key_lower_bound<kThreads>(thread_max, k), 1u);
  int32_t mine = 0;
#pragma unroll
  for (int q = 0; q < kPerThread; ++q) mine += keys[q] >= low;
  int32_t at = block_inclusive_sum<kThreads>(mine, warp_sums) - mine;
  int32_t count = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) count += warp_sums[w];
  if (count > kThreads) return -1;  // block-uniform; buf untouched
#pragma unroll
  for (int q = 0; q < kPerThread; ++q) {
    if (keys[q] >= low) survivors[at++] = buf[static_cast<int>(threadIdx.x) + q * kThreads];
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < count) {
    const Candidate c = survivors[threadIdx.x];
    int rank = 0;
#pragma unroll 4
    for (int j = 0; j < count; ++j) rank += before(survivors[j], c);  // one address a warp
    if (rank < k) buf[rank] = c;
  }
  __syncthreads();
  return k;
}

// Sorts buf[0, n) (n a power of two) into rank order with a block-wide bitonic network.
template <int kThreads>
__device__ void bitonic_sort(Candidate* buf, int n) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int idx = threadIdx.x; idx < (n >> 1); idx += kThreads) {
        const int pos = 2 * idx - (idx & (stride - 1));
        const int partner = pos + stride;
        const Candidate a = buf[pos], b = buf[partner];
        const bool rank_order = (pos & size) == 0;
        if (rank_order ? before(b, a) : before(a, b)) {
          buf[pos] = b;
          buf[partner] = a;
        }
      }
      __syncthreads();
    }
  }
}

}  // namespace tokensampler::cuda::split_row
