// Block-wide exact top-k selection over candidates in shared memory, without sorting.
//
// The rank order is (z descending, id ascending). The k-th candidate is found by bisection:
// 32 steps on an order-preserving key of z, each one block-wide count of the keys at or above
// a trial value, then (only when several candidates tie on the boundary z) 31 steps on the id.
// Each step is a few shared-memory loads per thread and one barrier; a bitonic sort of the same
// buffer takes ~log2(n)^2 / 2 barrier stages with a full pass of compare-exchanges in each.
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

// Boundary of the top-k: a candidate is kept iff key > key, or key == key and id <= id.
struct Cut {
  uint32_t key;
  int32_t id;
};

__device__ __forceinline__ bool kept_by(const Cut& cut, const Candidate& c) {
  const uint32_t key = slot_key(c);
  return key > cut.key || (key == cut.key && c.id <= cut.id);
}

// The exact top-k cut of buf[0, n) (empty slots: id kNoId), 1 <= k <= real candidates.
// Loops stay rolled and the functions out of line: they run a few times per block, next to hot
// loops that need the instruction cache.
template <int kThreads>
__device__ __noinline__ Cut select_cut(const Candidate* buf, int n, int k, int32_t* red) {
  int parity = 0;
  auto count_if = [&](auto pred) {
    int32_t c = 0;
    for (int e = threadIdx.x; e < n; e += kThreads) c += pred(buf[e]) ? 1 : 0;
    return block_count<kThreads>(c, red, parity);
  };
  uint32_t key = 0;  // the largest key with at least k candidates at or above it: the k-th key
  for (int bit = 31; bit >= 0; --bit) {
    const uint32_t trial = key | (1u << bit);
    if (count_if([&](const Candidate& c) { return slot_key(c) >= trial; }) >= k) key = trial;
  }
  const int32_t above = count_if([&](const Candidate& c) { return slot_key(c) > key; });
  const int32_t tied = count_if([&](const Candidate& c) { return slot_key(c) == key; });
  const int32_t need = k - above;  // 1 <= need <= tied
  int32_t id = kNoId - 1;
  if (need < tied) {  // the need-th smallest id among the ties
    int32_t lo = 0;   // the largest value with fewer than `need` tied ids below it
    for (int bit = 30; bit >= 0; --bit) {
      const int32_t trial = lo | (1 << bit);
      if (count_if([&](const Candidate& c) { return slot_key(c) == key && c.id < trial; }) < need)
        lo = trial;
    }
    id = lo;
  }
  return Cut{key, id};
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
#pragma unroll 1
  for (int j = 0; j < kPerThread; ++j) {
    const int e = static_cast<int>(threadIdx.x) + j * kThreads;
    mine[j] = e < n ? buf[e] : Candidate{kNegInf, kNoId};
    take[j] = e < n && keep(mine[j]);
  }
  __syncthreads();  // every read of buf before the first write
#pragma unroll 1
  for (int j = 0; j < kPerThread; ++j) {
    warp_append(take[j], counter, [&](int32_t at) { buf[at] = mine[j]; });
  }
  __syncthreads();
  return *counter;
}

// Keeps the exact top-k of buf[0, n) and moves them to buf[0, k) (in no particular order).
// Returns the new count, min(k, real candidates) when `real` is that count. Syncs.
// kNarrowCut (same cut, so the same tokens; for a row's one finishing block, where the cut is
// serial work): when k <= kThreads and n is large, the candidates below the k-th largest of the
// threads' maxima (a lower bound of the k-th key) are dropped first; a set of at most
// kWarpSelectMax is then cut by warp 0 alone, without a block barrier per bisection step. The
// chunk kernels keep the block-wide cut: with many blocks per SM it measured faster at 128 rows
// (bench/RESULTS.md, 2026-12-04).
template <int kThreads, int kPerThread, bool kNarrowCut = false>
__device__ __noinline__ int keep_top_k(Candidate* buf, int n, int k, int real, int32_t* red, int32_t* counter) {
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
  Cut cut{0u, 0};
  if (kNarrowCut && n <= kWarpSelectMax) {
    if (threadIdx.x < 32) cut = select_cut<32>(buf, n, k, red);  // red unused by one warp
    __syncthreads();  // every earlier read of red and of `counter` done
    if (threadIdx.x == 0) {
      red[0] = static_cast<int32_t>(cut.key);
      red[1] = cut.id;
    }
    __syncthreads();
    cut = Cut{static_cast<uint32_t>(red[0]), red[1]};
  } else {
    cut = select_cut<kThreads>(buf, n, k, red);
  }
  compact_candidates<kThreads, kPerThread>(buf, n, [&](const Candidate& c) { return kept_by(cut, c); },
                                           counter);
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
