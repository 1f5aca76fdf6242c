// Launch code of the histogram-cut path of sample_rows (device code in top_p_kernel.cuh).
// sample.cu tries it when the split-row path declines a step.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include "dispatch_logits.cuh"
#include "split_row_launch.cuh"
#include "top_p_kernel.cuh"

namespace tokensampler::cuda::top_p {

namespace {

int64_t aligned(int64_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

bool try_sample(const SampleRowsCall& c) {
  if (c.want_top_n || (c.out_logprobs && c.logprobs_mode == 1) || c.logits.size(1) > kMaxVocab)
    return false;
  const int64_t route = c.route_hint & 0xFF;
  const bool histogram_rows = route != 1 && route != 5;  // no_filter, min_p: no cut to find

  const int64_t rows = c.logits.size(0);
  Args a{};
  static_cast<split_row::Args&>(a) = split_row::common_args(c);
  split_row::set_chunks(a, rows, split_row::kMaxSplits);

  // One scratch allocation: chunk results, cut lists, histograms, list lengths.
  const int64_t results_bytes = aligned(rows * a.splits * int64_t{sizeof(ChunkResult)});
  const int64_t lists_bytes = aligned(rows * kCutCap * int64_t{sizeof(Candidate)});
  const int64_t masses_bytes = aligned(rows * kBins * int64_t{sizeof(unsigned long long)});
  const int64_t counts_bytes = aligned(rows * kBins * int64_t{sizeof(int32_t)});
  const int64_t lengths_bytes = aligned(rows * int64_t{sizeof(int32_t)});
  auto scratch = at::empty({results_bytes + lists_bytes + masses_bytes + counts_bytes + lengths_bytes},
                           c.logits.options().dtype(at::kByte));
  auto* base = static_cast<unsigned char*>(scratch.data_ptr());
  a.results = reinterpret_cast<ChunkResult*>(base);
  a.chunk_candidates = reinterpret_cast<Candidate*>(base + results_bytes);
  a.bin_masses = reinterpret_cast<unsigned long long*>(base + results_bytes + lists_bytes);
  a.bin_counts = reinterpret_cast<int32_t*>(base + results_bytes + lists_bytes + masses_bytes);
  a.cut_count = reinterpret_cast<int32_t*>(base + results_bytes + lists_bytes + masses_bytes + counts_bytes);

  const size_t bitmap_smem = c.apply_penalties ? kPenaltyBitmapWords * sizeof(uint32_t) : 0;
  const auto stream = at::cuda::getCurrentCUDAStream();
  const unsigned chunks = static_cast<unsigned>(rows * a.splits);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    const T* x = c.logits.data_ptr<T>();
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
  dispatch_logits_dtype(c.logits.scalar_type(), launch);
  return true;
}

}  // namespace tokensampler::cuda::top_p
