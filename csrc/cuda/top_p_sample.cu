// Launch code of the histogram-cut path of sample_rows (device code in top_p_kernel.cuh).
// sample.cu calls try_top_p_sample() when the split-row path declines a step.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include <algorithm>

#include "dispatch_logits.cuh"
#include "top_p_kernel.cuh"
#include "top_p_sample.h"

namespace tokensampler::cuda::top_p {

namespace {

int64_t aligned(int64_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

bool try_top_p_sample(const at::Tensor& logits, const at::Tensor& req_pool_indices,
                      const at::Tensor& valid_cache_lengths, const at::Tensor& slot_table,
                      SlotLayout layout, int64_t tokens_per_req,
                      const std::optional<at::Tensor>& drafts, bool apply_penalties,
                      int64_t logprobs_mode, int64_t route_hint, at::Tensor& out_tokens,
                      at::Tensor& out_invalid, const std::optional<at::Tensor>& out_logprobs,
                      bool want_top_n) {
  const int64_t vocab = logits.size(1);
  if (want_top_n || (out_logprobs && logprobs_mode == 1) || vocab > kMaxVocab) return false;
  const int64_t route = route_hint & 0xFF;
  const bool histogram_rows = route != 1 && route != 5;  // no_filter, min_p: no cut to find

  const int64_t rows = logits.size(0);
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  int64_t splits = std::max<int64_t>(1, (8 * sms + rows - 1) / rows);  // about one full wave
  splits = std::min<int64_t>({splits, split_row::kMaxSplits, std::max<int64_t>(1, vocab / 1024)});
  int32_t chunk_len = static_cast<int32_t>((vocab + splits - 1) / splits);
  chunk_len = (chunk_len + 3) / 4 * 4;  // chunks start 16-byte aligned
  splits = (vocab + chunk_len - 1) / chunk_len;

  // One scratch allocation: chunk results, cut lists, histograms, list lengths.
  const int64_t results_bytes = aligned(rows * splits * int64_t{sizeof(ChunkResult)});
  const int64_t lists_bytes = aligned(rows * kCutCap * int64_t{sizeof(Candidate)});
  const int64_t masses_bytes = aligned(rows * kBins * int64_t{sizeof(unsigned long long)});
  const int64_t counts_bytes = aligned(rows * kBins * int64_t{sizeof(int32_t)});
  const int64_t lengths_bytes = aligned(rows * int64_t{sizeof(int32_t)});
  auto scratch = at::empty({results_bytes + lists_bytes + masses_bytes + counts_bytes + lengths_bytes},
                           logits.options().dtype(at::kByte));
  auto* base = static_cast<unsigned char*>(scratch.data_ptr());

  Args a{};
  a.row_stride = logits.stride(0);
  a.vocab = static_cast<int32_t>(vocab);
  a.splits = static_cast<int32_t>(splits);
  a.chunk_len = chunk_len;
  a.k_cap = 0;
  a.req_pool_indices = req_pool_indices.data_ptr<int32_t>();
  a.valid_cache_lengths = valid_cache_lengths.data_ptr<int32_t>();
  a.table = slot_table.data_ptr<int32_t>();
  a.pool_rows = slot_table.size(0);
  a.layout = layout;
  a.tokens_per_req = static_cast<int32_t>(tokens_per_req);
  a.candidates = apply_penalties && drafts ? drafts->data_ptr<int32_t>() : nullptr;
  a.penalties = apply_penalties;
  a.want_raw = out_logprobs.has_value();
  a.results = reinterpret_cast<ChunkResult*>(base);
  a.chunk_candidates = reinterpret_cast<Candidate*>(base + results_bytes);
  a.bin_masses = reinterpret_cast<unsigned long long*>(base + results_bytes + lists_bytes);
  a.bin_counts = reinterpret_cast<int32_t*>(base + results_bytes + lists_bytes + masses_bytes);
  a.cut_count = reinterpret_cast<int32_t*>(base + results_bytes + lists_bytes + masses_bytes + counts_bytes);
  a.out_tokens = out_tokens.data_ptr<int32_t>();
  a.out_invalid = out_invalid.data_ptr<bool>();
  a.out_logprobs = out_logprobs ? out_logprobs->data_ptr<float>() : nullptr;

  const size_t bitmap_smem = apply_penalties ? kPenaltyBitmapWords * sizeof(uint32_t) : 0;
  const auto stream = at::cuda::getCurrentCUDAStream();
  const unsigned chunks = static_cast<unsigned>(rows * splits);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    const T* x = logits.data_ptr<T>();
    stats_kernel<T><<<chunks, kChunkThreads, bitmap_smem, stream>>>(x, a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (histogram_rows) {
      histogram_kernel<T><<<chunks, kChunkThreads, bitmap_smem, stream>>>(x, a);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    select_kernel<T><<<chunks, kChunkThreads, bitmap_smem, stream>>>(x, a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    finish_kernel<T><<<static_cast<unsigned>(rows), kFinishThreads, 0, stream>>>(x, a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  dispatch_logits_dtype(logits.scalar_type(), launch);
  return true;
}

}  // namespace tokensampler::cuda::top_p
