// Launch code of the split-row fast path of sample_rows (device code in split_row_kernel.cuh).
// sample.cu calls try_split_row_sample() first.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include <algorithm>
#include <cmath>

#include "dispatch_logits.cuh"
#include "split_row_kernel.cuh"
#include "split_row_sample.h"

namespace tokensampler::cuda::split_row {

bool try_split_row_sample(const at::Tensor& logits, const at::Tensor& req_pool_indices,
                          const at::Tensor& valid_cache_lengths, const at::Tensor& slot_table,
                          SlotLayout layout, int64_t tokens_per_req,
                          const std::optional<at::Tensor>& drafts, bool apply_penalties,
                          int64_t logprobs_mode, int64_t route_hint, at::Tensor& out_tokens,
                          at::Tensor& out_invalid, const std::optional<at::Tensor>& out_logprobs,
                          bool want_top_n) {
  const int64_t route = route_hint & 0xFF;
  const int64_t max_top_k = route_hint >> 8;
  const bool no_filter = route == 1;
  const bool top_k_family = route == 2 || route == 4 || route == 6;  // top_k, + top_p, + min_p
  if (want_top_n || (out_logprobs && logprobs_mode == 1)) return false;
  if (!no_filter && !(top_k_family && max_top_k >= 1 && max_top_k <= kSplitMaxTopK)) return false;

  const int64_t rows = logits.size(0);
  const int32_t vocab = static_cast<int32_t>(logits.size(1));
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  int k_cap = 0;
  int64_t splits = std::max<int64_t>(1, (8 * sms + rows - 1) / rows);  // about one full wave
  splits = std::min<int64_t>({splits, kMaxSplits, std::max<int64_t>(1, vocab / 1024)});
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
  a.candidates = apply_penalties && drafts ? drafts->data_ptr<int32_t>() : nullptr;
  a.penalties = apply_penalties;
  a.want_raw = out_logprobs.has_value();
  a.results = reinterpret_cast<ChunkResult*>(results.data_ptr());
  a.chunk_candidates = reinterpret_cast<Candidate*>(candidates.data_ptr());
  a.out_tokens = out_tokens.data_ptr<int32_t>();
  a.out_invalid = out_invalid.data_ptr<bool>();
  a.out_logprobs = out_logprobs ? out_logprobs->data_ptr<float>() : nullptr;
  // Under 48 KiB in every case, so no opt-in attribute is needed.
  const size_t chunk_smem = (apply_penalties ? kPenaltyBitmapWords * sizeof(uint32_t) : 0) +
                            (top_k_family ? kBufferCap * sizeof(Candidate) : 0);
  const auto stream = at::cuda::getCurrentCUDAStream();
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    chunk_kernel<T><<<rows * splits, kChunkThreads, chunk_smem, stream>>>(logits.data_ptr<T>(), a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    finish_kernel<T><<<rows, kFinishThreads, 0, stream>>>(logits.data_ptr<T>(), a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  dispatch_logits_dtype(logits.scalar_type(), launch);
  return true;
}

}  // namespace tokensampler::cuda::split_row
