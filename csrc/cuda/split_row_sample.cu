// Launch code of the split-row fast path of sample_rows (device code in split_row_kernel.cuh).
// sample.cu tries it first.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include "dispatch_logits.cuh"
#include "split_row_launch.cuh"

namespace tokensampler::cuda::split_row {

bool try_sample(const SampleRowsCall& c) {
  const int64_t max_top_k = c.max_top_k;
  const bool no_filter = c.route == Route::kNoFilter;
  const bool top_k_family = is_top_k_route(c.route);  // top_k, + top_p, + min_p
  if (c.want_top_n || (c.out_logprobs && c.logprobs_mode == 1)) return false;
  if (!no_filter && !(top_k_family && max_top_k >= 1 && max_top_k <= kSplitMaxTopK)) return false;

  const int64_t rows = c.logits.size(0);
  Args a = common_args(c);
  int k_cap = 0;
  if (top_k_family) {
    k_cap = 1;
    while (k_cap < max_top_k) k_cap <<= 1;
  }
  set_chunks(a, rows, top_k_family ? std::min(kMaxSplits, kMergeCap / k_cap) : kMaxSplits);
  a.k_cap = k_cap;

  static_assert(kMaxSplits * sizeof(ChunkResult) + kMergeCap * sizeof(Candidate) <=
                kWorkspaceBytesPerRow);  // splits * k_cap <= kMergeCap
  at::Tensor storage;
  const auto sections = workspace_sections<2>(
      c, {rows * a.splits * int64_t{sizeof(ChunkResult)}, rows * a.splits * k_cap * int64_t{sizeof(Candidate)}},
      storage);
  a.results = reinterpret_cast<ChunkResult*>(sections[0]);
  a.chunk_candidates = reinterpret_cast<Candidate*>(sections[1]);
  // Under 48 KiB in every case, so no opt-in attribute is needed.
  const size_t chunk_smem = (c.apply_penalties ? kPenaltyBitmapWords * sizeof(uint32_t) : 0) +
                            (top_k_family ? kBufferCap * sizeof(Candidate) : 0);
  const auto stream = at::cuda::getCurrentCUDAStream();
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    const T* x = c.logits.data_ptr<T>();
    chunk_kernel<T><<<rows * a.splits, kChunkThreads, chunk_smem, stream>>>(x, a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    finish_kernel<T><<<rows, kFinishThreads, 0, stream>>>(x, a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  dispatch_logits_dtype(c.logits.scalar_type(), launch);
  return true;
}

}  // namespace tokensampler::cuda::split_row
