// Launch code of the histogram-cut path of sample_rows (device code in histogram_cut_kernel.cuh).
// sample.cu tries it when the split-row path declines a step.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include "dispatch_logits.cuh"
#include "split_row_launch.cuh"
#include "histogram_cut_kernel.cuh"

namespace tokensampler::cuda::histogram_cut {

bool try_sample(const SampleRowsCall& c) {
  if ((c.out_logprobs && c.logprobs_mode == 1) || c.logits.size(1) > kMaxVocab)
    return false;
  // no_filter, min_p: no cut to find
  const bool histogram_rows = c.route != Route::kNoFilter && c.route != Route::kMinP;

  const int64_t rows = c.logits.size(0);
  Args a{};
  static_cast<split_row::Args&>(a) = split_row::common_args(c);
  split_row::set_chunks(a, rows, split_row::kMaxSplits, kMaxChunkTokens);

  // Chunk results, cut lists, histogram masses and counts, list lengths.
  static_assert(split_row::kMaxSplits * sizeof(ChunkResult) + kCutCap * sizeof(Candidate) +
                    kBins * (sizeof(unsigned long long) + sizeof(int32_t)) + sizeof(int32_t) <=
                kSectionBytesPerRow);
  at::Tensor storage;
  const auto sections = split_row::workspace_sections<5>(
      c, {rows * a.splits * int64_t{sizeof(ChunkResult)}, rows * kCutCap * int64_t{sizeof(Candidate)},
          rows * kBins * int64_t{sizeof(unsigned long long)}, rows * kBins * int64_t{sizeof(int32_t)},
          rows * int64_t{sizeof(int32_t)}},
      storage);
  a.results = reinterpret_cast<ChunkResult*>(sections[0]);
  a.chunk_candidates = reinterpret_cast<Candidate*>(sections[1]);
  a.bin_masses = reinterpret_cast<unsigned long long*>(sections[2]);
  a.bin_counts = reinterpret_cast<int32_t*>(sections[3]);
  a.cut_count = reinterpret_cast<int32_t*>(sections[4]);

  const size_t bitmap_smem = c.apply_penalties ? kPenaltyBitmapWords * sizeof(uint32_t) : 0;
  const auto stream = at::cuda::getCurrentCUDAStream();
  const unsigned chunks = static_cast<unsigned>(rows * a.splits);
  const bool masked = a.token_bitmask.words != nullptr;  // kMasked: unmasked steps skip its code
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    const T* x = c.logits.data_ptr<T>();
    const auto stats_fn = masked ? stats_kernel<T, true> : stats_kernel<T, false>;
    const auto histogram_fn = masked ? histogram_kernel<T, true> : histogram_kernel<T, false>;
    const auto select_fn = masked ? select_kernel<T, true> : select_kernel<T, false>;
    stats_fn<<<chunks, kChunkThreads, bitmap_smem, stream>>>(x, a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (histogram_rows) {
      histogram_fn<<<chunks, kChunkThreads, bitmap_smem, stream>>>(x, a);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    select_fn<<<chunks, kChunkThreads, bitmap_smem, stream>>>(x, a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    finish_kernel<T><<<static_cast<unsigned>(rows), kFinishThreads, 0, stream>>>(x, a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  dispatch_logits_dtype(c.logits.scalar_type(), launch);
  return true;
}

}  // namespace tokensampler::cuda::histogram_cut
