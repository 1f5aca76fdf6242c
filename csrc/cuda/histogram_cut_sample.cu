// Launch code of the histogram-cut path of sample_rows (device code in histogram_cut_*.cuh).
// sample.cu tries it when the split-row path declines a step.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include "dispatch_logits.cuh"
#include "split_row_launch.cuh"
#include "histogram_cut_decide.cuh"
#include "histogram_cut_finish.cuh"
#include "histogram_cut_kernel.cuh"

namespace tokensampler::cuda::histogram_cut {

// The instantiations of the kernels that read whole chunks (1, 1a, 2 and 3) for a step: kMasked
// where it has a grammar bitmask, kPenalties where it applies penalties, and for kernel 1
// kRunnerUp where a later kernel reads the top-p rows' runner-ups (try_sample says which steps).
template <typename T>
struct ChunkKernels {
  using Kernel = void (*)(const T*, Args);
  Kernel stats, mass_sums, histogram, select;
};

template <typename T, bool kMasked, bool kPenalties>
ChunkKernels<T> chunk_kernels(bool runner_up) {
  return {runner_up ? stats_kernel<T, kMasked, true, kPenalties>
                    : stats_kernel<T, kMasked, false, kPenalties>,
          mass_sums_kernel<T, kMasked, kPenalties>, histogram_kernel<T, kMasked, kPenalties>,
          select_kernel<T, kMasked, kPenalties>};
}

template <typename T>
ChunkKernels<T> chunk_kernels(bool masked, bool penalties, bool runner_up) {
  if (masked) {
    return penalties ? chunk_kernels<T, true, true>(runner_up)
                     : chunk_kernels<T, true, false>(runner_up);
  }
  return penalties ? chunk_kernels<T, false, true>(runner_up)
                   : chunk_kernels<T, false, false>(runner_up);
}

bool try_sample(const SampleRowsCall& c) {
  if ((c.out_logprobs && c.logprobs_mode == 1) || c.logits.size(1) > kMaxVocab)
    return false;
  // no_filter, min_p: no cut to find
  const bool histogram_rows = c.route != Route::kNoFilter && c.route != Route::kMinP;

  const int64_t rows = c.logits.size(0);
  Args a{};
  static_cast<split_row::Args&>(a) = split_row::common_args(c);
  const split_row::ChunkGeometry g =
      split_row::set_chunks(a, rows, split_row::kMaxSplits, kMaxChunkTokens);
  // Kernel 3 spreads the undecided top-p rows only where the rows alone do not fill the machine
  // (balance_splits: before kMaxChunkTokens' floor of 3 splits at vocab 151936): where they do,
  // the grid is full already, and spreading would only add each block a second setup.
  a.spread = g.balance_splits > 1;

  // Chunk results, cut lists, histogram masses and counts, list lengths, row cuts, spread rows
  // (and their count behind them), the spread blocks' best, the chunks' decide data, histogram
  // rows (and their count).
  static_assert(split_row::kMaxSplits * (sizeof(ChunkResult) + sizeof(Candidate) + sizeof(ChunkDecide)) +
                    kCutCap * sizeof(Candidate) +
                    kBins * (sizeof(unsigned long long) + sizeof(int32_t)) + sizeof(int32_t) +
                    sizeof(RowCut) + 4 * sizeof(int32_t) <=
                kSectionBytesPerRow);
  at::Tensor storage;
  const int64_t chunks = rows * a.splits;
  const auto sections = split_row::workspace_sections<10>(
      c, {chunks * int64_t{sizeof(ChunkResult)}, rows * kCutCap * int64_t{sizeof(Candidate)},
          rows * kBins * int64_t{sizeof(unsigned long long)}, rows * kBins * int64_t{sizeof(int32_t)},
          rows * int64_t{sizeof(int32_t)}, rows * int64_t{sizeof(RowCut)},
          (rows + 1) * int64_t{sizeof(int32_t)}, chunks * int64_t{sizeof(Candidate)},
          chunks * int64_t{sizeof(ChunkDecide)}, (rows + 1) * int64_t{sizeof(int32_t)}},
      storage);
  a.results = reinterpret_cast<ChunkResult*>(sections[0]);
  a.chunk_candidates = reinterpret_cast<Candidate*>(sections[1]);
  a.bin_masses = reinterpret_cast<unsigned long long*>(sections[2]);
  a.bin_counts = reinterpret_cast<int32_t*>(sections[3]);
  a.cut_count = reinterpret_cast<int32_t*>(sections[4]);
  a.row_cuts = reinterpret_cast<RowCut*>(sections[5]);
  a.spread_rows = reinterpret_cast<int32_t*>(sections[6]);
  a.spread_count = a.spread_rows + rows;
  a.spread_best = reinterpret_cast<Candidate*>(sections[7]);
  a.chunk_decide = reinterpret_cast<ChunkDecide*>(sections[8]);
  a.hist_rows = reinterpret_cast<int32_t*>(sections[9]);
  a.hist_count = a.hist_rows + rows;
  // Deciding top-p rows from float sums first costs two launches and a read of every row: worth
  // it where every row is top-p and the histogram read is long (H100 run 60: top-p bs 128 -17 %,
  // but mixed batches +5-14 %, bs 32 +2 %); small batches are latency-bound.
  a.decide = c.route == Route::kTopP && rows >= kDecideMinRows;
  // Kernel 1 keeps each top-p row's runner-up (ChunkDecide's first fields, written for every
  // chunk of the row) in every step whose kernels read it: kernels 1a-b (decide: top-p routes)
  // and 2b, which reads it for a mass-cut (top-p) row whose winner is dropped. Kernel 2b runs in
  // every step with histogram_rows, top-k routes too: their rows are count-cut rows, but a row
  // outside its step's route (the finish kernel's fallback covers those) may be a mass-cut row
  // there. Min-p and no-filter steps run neither kernel: no runner-up. Nor do steps of 1-3
  // rows: there kernel 1's second candidate cost more than the cuts it saved (H100 run 102:
  // top-p 1.07x at bs 1-2, 0.99x at bs 4, 0.92x at bs 8, 0.85x at bs 16). Decide steps are
  // top-p steps of kDecideMinRows >= kRunnerUpMinRows rows, so they keep them.
  const bool runner_up = histogram_rows && rows >= kRunnerUpMinRows;

  const size_t bitmap_smem = c.apply_penalties ? kPenaltyBitmapWords * sizeof(uint32_t) : 0;
  const bool masked = a.token_bitmask.words != nullptr;  // kMasked: unmasked steps skip its code
  // Programmatic dependent launch hides the 4-7 kernel boundaries where a step is short; at
  // 512 rows it cost min-p and mixed batches 3-7 % (H100 run 61), so long steps launch plainly.
  const bool pdl = split_row::use_pdl() && rows < kPdlMaxRows;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* x = c.logits.data_ptr<T>();
    const ChunkKernels<T> k = chunk_kernels<T>(masked, a.penalties, runner_up);
    split_row::launch(k.stats, chunks, kChunkThreads, bitmap_smem, pdl, x, a);
    if (a.decide) {
      split_row::launch(k.mass_sums, chunks, kChunkThreads, bitmap_smem, pdl, x, a);
      split_row::launch(decide_kernel, rows, kChunkThreads, 0, pdl, a);
    }
    if (histogram_rows) {
      split_row::launch(k.histogram, chunks, kChunkThreads, bitmap_smem, pdl, x, a);
      const auto cut_fn = runner_up ? cut_kernel<true> : cut_kernel<false>;
      split_row::launch(cut_fn, rows, kChunkThreads, 0, pdl, a);
    }
    split_row::launch(k.select, chunks, kChunkThreads, bitmap_smem, pdl, x, a);
    split_row::launch(finish_kernel<T>, rows, kFinishThreads, 0, pdl, x, a);
  };
  dispatch_logits_dtype(c.logits.scalar_type(), run);
  return true;
}

}  // namespace tokensampler::cuda::histogram_cut
