// Launch code and kernels of the split-row fast path of sample_rows (math in
// split_row_kernel.cuh). sample.cu calls try_split_row_sample() first.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include <algorithm>
#include <cmath>

#include "dispatch_logits.cuh"
#include "split_row_kernel.cuh"
#include "split_row_sample.h"

namespace tokensampler::cuda::split_row {

namespace {

struct Args {
  int64_t row_stride;
  int32_t vocab;
  int32_t splits;
  int32_t chunk_len;
  int32_t k_cap;
  const int32_t* req_pool_indices;
  const int32_t* valid_cache_lengths;
  const int32_t* table;
  int64_t pool_rows;
  SlotLayout layout;
  int32_t tokens_per_req;
  bool want_raw;
  ChunkResult* results;
  Candidate* candidates;
  int32_t* out_tokens;
  bool* out_invalid;
  float* out_logprobs;
};

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

template <typename T>
__global__ void __launch_bounds__(kChunkThreads) chunk_kernel(const T* __restrict__ logits, Args a) {
  __shared__ Candidate buf[kBufferCap];
  __shared__ Candidate scratch[kChunkThreads / 32];
  __shared__ float red_m[kChunkThreads / 32], red_s[kChunkThreads / 32];
  __shared__ int32_t red_n[kChunkThreads / 32];
  __shared__ int32_t buf_count;
  __shared__ float threshold;
  __shared__ float threshold_raw;

  const int64_t r = blockIdx.x / a.splits;
  const int32_t split = blockIdx.x % a.splits;
  const int32_t begin = split * a.chunk_len;
  const int32_t end = min(a.vocab, begin + a.chunk_len);
  const RowParams p = row_params(a.table, a.pool_rows, a.layout, a.req_pool_indices,
                                 a.valid_cache_lengths, a.tokens_per_req, r, a.vocab);
  ChunkResult* out = a.results + blockIdx.x;
  if (!p.valid_slot) return;  // the finish kernel flags the row without reading chunks
  const T* row = logits + r * a.row_stride;
  const bool top_k_rows = !p.greedy && p.top_k_on;
  const int32_t k = min(p.top_k, a.k_cap);

  Candidate argmax{kNegInf, kNoId}, best{kNegInf, kNoId}, inf_best{kNegInf, kNoId};
  float raw_m = kNegInf, raw_s = 0.0f;
  int32_t inf_count = 0;
  if (threadIdx.x == 0) {
    buf_count = 0;
    threshold = kNegInf;
    threshold_raw = kNegInf;
  }
  __syncthreads();

  for (int32_t base = begin; base < end; base += 4 * kChunkThreads) {
    const int32_t i = base + 4 * static_cast<int32_t>(threadIdx.x);
    float l[4];
    load4(row, i, end, l);
    const float admit = top_k_rows ? threshold : 0.0f;
    const float admit_raw = top_k_rows ? threshold_raw : 0.0f;
    float z[4];
    float z_max4 = kNegInf;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const bool in_range = i + q < end;
      l[q] = in_range ? sanitize_logit(l[q]) : kNegInf;
      // Greedy rows need the argmax; the others only whether any token is finite or +inf.
      if (p.greedy) {
        if (in_range) argmax = best_of(argmax, Candidate{l[q], i + q});
      } else {
        argmax.z = fmaxf(argmax.z, l[q]);
      }
      if (l[q] == INFINITY) ++inf_count;
      else if (a.want_raw) merge_lse(raw_m, raw_s, l[q], 1.0f);
      if (top_k_rows) {
        z[q] = l[q] > kNegInf && l[q] >= admit_raw ? scaled_logit(l[q], p.temperature) : kNegInf;
      } else {
        z[q] = p.greedy || l[q] == kNegInf ? kNegInf : scaled_logit(l[q], p.temperature);
      }
      z_max4 = fmaxf(z_max4, z[q]);
    }
    if (top_k_rows) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        if (z[q] > kNegInf && z[q] >= admit) buf[atomicAdd(&buf_count, 1)] = Candidate{z[q], i + q};
      }
      __syncthreads();
      if (buf_count > kBufferCap - 4 * kChunkThreads) {  // no room for another round: keep the k best
        const int n = next_pow2(buf_count);
        for (int e = buf_count + threadIdx.x; e < n; e += kChunkThreads) buf[e] = Candidate{kNegInf, kNoId};
        __syncthreads();
        bitonic_sort<kChunkThreads>(buf, n);
        if (threadIdx.x == 0) {
          buf_count = min(buf_count, k);
          threshold = buf[buf_count - 1].z;
          threshold_raw = admission_bound(threshold, p.temperature);
        }
      }
      __syncthreads();
    } else if (!p.greedy && z_max4 > kNegInf &&
               (z_max4 == INFINITY || double(z_max4) + 16.7 >= double(best.z))) {
      // No-filter row: noise only where it can beat this thread's best (exact bounds).
      const Philox4 w = random_words(p.seed, p.position, static_cast<uint32_t>(i) >> 2, kStreamGumbel);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        if (z[q] == kNegInf) continue;
        if (z[q] == INFINITY) {
          inf_best = best_of(inf_best, Candidate{gumbel_from_word(w.v[q]), i + q});
        } else if (double(z[q]) + gumbel_upper_bound(w.v[q]) + 1e-6 * fabs(double(z[q])) >=
                   double(best.z)) {
          best = best_of(best, Candidate{f_add(z[q], gumbel_from_word(w.v[q])), i + q});
        }
      }
    }
  }

  // Block reductions of the per-thread results.
  argmax = block_best<kChunkThreads>(argmax, scratch);
  best = block_best<kChunkThreads>(best, scratch);
  inf_best = block_best<kChunkThreads>(inf_best, scratch);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    merge_lse(raw_m, raw_s, __shfl_xor_sync(0xffffffffu, raw_m, o), __shfl_xor_sync(0xffffffffu, raw_s, o));
    inf_count += __shfl_xor_sync(0xffffffffu, inf_count, o);
  }
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    red_m[w] = raw_m;
    red_s[w] = raw_s;
    red_n[w] = inf_count;
  }
  if (top_k_rows) {  // final: exactly the chunk's k best, in rank order
    __syncthreads();
    const int n = next_pow2(max(buf_count, 1));
    for (int e = buf_count + threadIdx.x; e < n; e += kChunkThreads) buf[e] = Candidate{kNegInf, kNoId};
    __syncthreads();
    bitonic_sort<kChunkThreads>(buf, n);
    const int kept = min(buf_count, k);
    Candidate* dst = a.candidates + int64_t{blockIdx.x} * a.k_cap;
    for (int e = threadIdx.x; e < kept; e += kChunkThreads) dst[e] = buf[e];
    if (threadIdx.x == 0) out->kept = kept;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = kNegInf, s = 0.0f;
    int32_t n = 0;
    for (int j = 0; j < kChunkThreads / 32; ++j) {
      merge_lse(m, s, red_m[j], red_s[j]);
      n += red_n[j];
    }
    out->argmax = argmax;
    out->best = best;
    out->inf_best = inf_best;
    out->raw_max = m;
    out->raw_sum = s;
    out->inf_count = n;
    if (!top_k_rows) out->kept = 0;
  }
}

template <typename T>
__global__ void __launch_bounds__(kFinishThreads) finish_kernel(const T* __restrict__ logits, Args a) {
  __shared__ Candidate buf[kMergeCap];
  __shared__ float mass[kSplitMaxTopK];
  __shared__ Candidate scratch[kFinishThreads / 32];
  __shared__ int32_t offsets[65];
  __shared__ int32_t keep_count;

  const int64_t r = blockIdx.x;
  const RowParams p = row_params(a.table, a.pool_rows, a.layout, a.req_pool_indices,
                                 a.valid_cache_lengths, a.tokens_per_req, r, a.vocab);
  if (!p.valid_slot) {
    if (threadIdx.x == 0) {
      a.out_tokens[r] = 0;
      a.out_invalid[r] = true;
    }
    return;
  }
  const ChunkResult* chunks = a.results + r * a.splits;
  Candidate argmax{kNegInf, kNoId}, best{kNegInf, kNoId}, inf_best{kNegInf, kNoId};
  float raw_m = kNegInf, raw_s = 0.0f;
  int32_t inf_count = 0;
  for (int s = 0; s < a.splits; ++s) {  // few entries: every thread merges them all
    argmax = best_of(argmax, chunks[s].argmax);
    best = best_of(best, chunks[s].best);
    inf_best = best_of(inf_best, chunks[s].inf_best);
    merge_lse(raw_m, raw_s, chunks[s].raw_max, chunks[s].raw_sum);
    inf_count += chunks[s].inf_count;
  }
  const bool invalid = argmax.z == kNegInf;
  int32_t token = 0;
  if (invalid) {
    token = 0;
  } else if (p.greedy) {
    token = argmax.id;
  } else if (!p.top_k_on) {
    token = inf_count > 0 ? inf_best.id : best.id;
  } else {
    if (threadIdx.x == 0) {
      offsets[0] = 0;
      for (int s = 0; s < a.splits; ++s) offsets[s + 1] = offsets[s] + chunks[s].kept;
    }
    __syncthreads();
    const int total = offsets[a.splits];
    const int n = next_pow2(max(total, 1));
    for (int s = 0; s < a.splits; ++s) {
      const Candidate* src = a.candidates + (r * a.splits + s) * a.k_cap;
      for (int e = threadIdx.x; e < chunks[s].kept; e += kFinishThreads) buf[offsets[s] + e] = src[e];
    }
    for (int e = total + threadIdx.x; e < n; e += kFinishThreads) buf[e] = Candidate{kNegInf, kNoId};
    __syncthreads();
    bitonic_sort<kFinishThreads>(buf, n);
    const int m = min(total, p.top_k);  // the row's top-k set, in rank order
    const float z_max = buf[0].z;
    if (z_max == INFINITY) {
      // Uniform among the +inf tokens of the top-k set; top-p keeps the first ceil(p * m).
      if (threadIdx.x == 0) {
        int m_inf = 0;
        while (m_inf < m && buf[m_inf].z == INFINITY) ++m_inf;
        int keep = 0;
        while (keep < m_inf && static_cast<float>(keep) / static_cast<float>(m_inf) < p.top_p) ++keep;
        keep_count = max(keep, 1);
      }
      __syncthreads();
      Candidate c{kNegInf, kNoId};
      for (int j = threadIdx.x; j < keep_count; j += kFinishThreads)
        c = best_of(c, Candidate{gumbel_noise(p.seed, p.position, buf[j].id, kStreamGumbel), buf[j].id});
      token = block_best<kFinishThreads>(c, scratch).id;
    } else {
      if (p.top_p < 1.0f) {
        for (int j = threadIdx.x; j < m; j += kFinishThreads) mass[j] = expf(f_sub(buf[j].z, z_max));
        __syncthreads();
        if (threadIdx.x == 0) {  // sequential fp32 sums in rank order, as the CPU reference
          float total_mass = 0.0f;
          for (int j = 0; j < m; ++j) total_mass = f_add(total_mass, mass[j]);
          const float limit = f_mul(p.top_p, total_mass);
          float before_mass = 0.0f;
          int keep = 0;
          while (keep < m && before_mass < limit) before_mass = f_add(before_mass, mass[keep++]);
          keep_count = max(keep, 1);
        }
      } else if (threadIdx.x == 0) {
        keep_count = m;
      }
      __syncthreads();
      const float cut = min_p_threshold(z_max, p.min_p);
      Candidate c{kNegInf, kNoId};
      for (int j = threadIdx.x; j < keep_count; j += kFinishThreads) {
        if (buf[j].z < cut) continue;
        const float score = f_add(buf[j].z, gumbel_noise(p.seed, p.position, buf[j].id, kStreamGumbel));
        c = best_of(c, Candidate{score, buf[j].id});
      }
      token = block_best<kFinishThreads>(c, scratch).id;
    }
  }
  if (threadIdx.x == 0) {
    a.out_tokens[r] = token;
    a.out_invalid[r] = invalid;
    if (a.out_logprobs != nullptr) {
      const float raw = sanitize_logit(static_cast<float>(logits[r * a.row_stride + token]));
      float lp;
      if (inf_count > 0) lp = raw == INFINITY ? -logf(static_cast<float>(inf_count)) : kNegInf;
      else if (raw_m == kNegInf) lp = kNegInf;
      else lp = static_cast<float>(double(raw) - double(raw_m) - log(double(raw_s)));
      a.out_logprobs[r] = lp;
    }
  }
}

}  // namespace

bool try_split_row_sample(const at::Tensor& logits, const at::Tensor& req_pool_indices,
                          const at::Tensor& valid_cache_lengths, const at::Tensor& slot_table,
                          SlotLayout layout, int64_t tokens_per_req, bool apply_penalties,
                          int64_t logprobs_mode, int64_t route_hint, at::Tensor& out_tokens,
                          at::Tensor& out_invalid, const std::optional<at::Tensor>& out_logprobs,
                          bool want_top_n) {
  const int64_t route = route_hint & 0xFF;
  const int64_t max_top_k = route_hint >> 8;
  const bool no_filter = route == 1;
  const bool top_k_family = route == 2 || route == 4;  // top_k, top_k_top_p
  if (apply_penalties || want_top_n || (out_logprobs && logprobs_mode == 1)) return false;
  if (!no_filter && !(top_k_family && max_top_k >= 1 && max_top_k <= kSplitMaxTopK)) return false;

  const int64_t rows = logits.size(0);
  const int32_t vocab = static_cast<int32_t>(logits.size(1));
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  int k_cap = 0;
  int64_t splits = std::max<int64_t>(1, (8 * sms + rows - 1) / rows);  // about one full wave
  splits = std::min<int64_t>({splits, 64, std::max<int64_t>(1, vocab / 1024)});
  if (top_k_family) {
    k_cap = 1;
    while (k_cap < max_top_k) k_cap <<= 1;
    splits = std::min<int64_t>(splits, std::max(1, kMergeCap / k_cap));
  }
  int32_t chunk_len = static_cast<int32_t>((vocab + splits - 1) / splits);
  chunk_len = (chunk_len + 3) / 4 * 4;  // chunks start 16-byte aligned
  splits = (vocab + chunk_len - 1) / chunk_len;

  const auto options = logits.options().dtype(at::kByte);
  auto results = at::empty({rows * splits * static_cast<int64_t>(sizeof(ChunkResult))}, options);
  auto candidates = at::empty(
      {std::max<int64_t>(1, rows * splits * k_cap * static_cast<int64_t>(sizeof(Candidate)))}, options);
  Args a;
  a.row_stride = logits.stride(0);
  a.vocab = vocab;
  a.splits = static_cast<int32_t>(splits);
  a.chunk_len = chunk_len;
  a.k_cap = k_cap;
  a.req_pool_indices = req_pool_indices.data_ptr<int32_t>();
  a.valid_cache_lengths = valid_cache_lengths.data_ptr<int32_t>();
  a.table = slot_table.data_ptr<int32_t>();
  a.pool_rows = slot_table.size(0);
  a.layout = layout;
  a.tokens_per_req = static_cast<int32_t>(tokens_per_req);
  a.want_raw = out_logprobs.has_value();
  a.results = reinterpret_cast<ChunkResult*>(results.data_ptr());
  a.candidates = reinterpret_cast<Candidate*>(candidates.data_ptr());
  a.out_tokens = out_tokens.data_ptr<int32_t>();
  a.out_invalid = out_invalid.data_ptr<bool>();
  a.out_logprobs = out_logprobs ? out_logprobs->data_ptr<float>() : nullptr;
  const auto stream = at::cuda::getCurrentCUDAStream();
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    chunk_kernel<T><<<rows * splits, kChunkThreads, 0, stream>>>(logits.data_ptr<T>(), a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    finish_kernel<T><<<rows, kFinishThreads, 0, stream>>>(logits.data_ptr<T>(), a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  dispatch_logits_dtype(logits.scalar_type(), launch);
  return true;
}

}  // namespace tokensampler::cuda::split_row
