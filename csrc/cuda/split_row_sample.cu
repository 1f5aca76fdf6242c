// Launch code of the split-row fast path (device code: split_row_kernel.cuh, split_row_finish.cuh,
// rejection_verdict.cuh). sample.cu tries it first for sample_rows; verify.cu for top-k steps of
// verify_rejection.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include "dispatch_logits.cuh"
#include "no_filter_small_kernel.cuh"
#include "split_row_launch.cuh"

namespace tokensampler::cuda::split_row {

// Steps of at most this many rows run as one kernel (chunk_kernel<T, true>); larger ones as the
// chunk kernel then the finish kernel. TOKENSAMPLER_SPLIT_ROW_FUSED_ROWS overrides it (tests
// and benchmarks run both launches at the same shapes; 0: always two kernels).
constexpr int64_t kFusedMaxRows = 4;  // A/B on the H200 (RESULTS.md): two kernels win from 8 rows

static int64_t fused_max_rows() {
  const char* v = std::getenv("TOKENSAMPLER_SPLIT_ROW_FUSED_ROWS");
  return v == nullptr ? kFusedMaxRows : std::strtoll(v, nullptr, 10);
}

// Whether the call's route is one the split-row kernels finish from their top-k candidates.
static bool top_k_step(const SampleRowsCall& c) {
  return is_top_k_route(c.route) && c.max_top_k >= 1 && c.max_top_k <= kSplitRowMaxTopK;
}

// The chunk kernel of a step: the single launch or not, masked or not, with penalties or not,
// wide loads or not.
template <typename T, bool kFused, bool kWide>
static auto chunk_kernel_of(bool masked, bool penalties) {
  return masked ? (penalties ? chunk_kernel<T, kFused, true, true, kWide>
                             : chunk_kernel<T, kFused, true, false, kWide>)
                : (penalties ? chunk_kernel<T, kFused, false, true, kWide>
                             : chunk_kernel<T, kFused, false, false, kWide>);
}
template <typename T, bool kWide>
static auto chunk_kernel_of(bool fused, bool masked, bool penalties) {
  return fused ? chunk_kernel_of<T, true, kWide>(masked, penalties)
               : chunk_kernel_of<T, false, kWide>(masked, penalties);
}

// Launches the split-row kernels over the call's rows, with the call's arguments in `a`.
static void launch_rows(const SampleRowsCall& c, Args a) {
  const int64_t max_top_k = c.max_top_k;
  const bool top_k_family = is_top_k_route(c.route);  // top_k, + top_p, + min_p
  const int64_t rows = c.logits.size(0);
  int k_cap = 0;
  if (top_k_family) {
    k_cap = 1;
    while (k_cap < max_top_k) k_cap <<= 1;
  }
  // Small steps run as one kernel (the last block of each row finishes it); rows without top-k
  // then take up to kFusedMaxSplits chunks (one wave, as every step), so even one row fills
  // the GPU: 148 chunks of 1028 tokens at V 151936, bs 1 (64 before).
  const bool fused = rows <= fused_max_rows();
  if (top_k_family) set_chunks(a, rows, std::min(kMaxSplits, kMergeCap / k_cap));
  else if (fused) set_chunks(a, rows, kFusedMaxSplits);
  else set_chunks(a, rows, kMaxSplits);
  a.k_cap = k_cap;

  static_assert(kMaxSplits * sizeof(ChunkResult) + kMergeCap * sizeof(Candidate) <=
                kSectionBytesPerRow);  // splits * k_cap <= kMergeCap
  static_assert(kFusedMaxSplits * sizeof(ChunkResult) <= kSectionBytesPerRow);
  at::Tensor storage;
  const auto sections = workspace_sections<2>(
      c, {rows * a.splits * int64_t{sizeof(ChunkResult)}, rows * a.splits * k_cap * int64_t{sizeof(Candidate)}},
      storage, fused ? &a.tickets : nullptr);
  a.results = reinterpret_cast<ChunkResult*>(sections[0]);
  a.chunk_candidates = reinterpret_cast<Candidate*>(sections[1]);
  // Masked steps also stage each chunk's bitmask words in shared memory for their rows without
  // top-k where that stays within the kernel's 48 KiB (no opt-in attribute; chunks of up to
  // ~10^5 tokens, ~2 * 10^4 with penalties); larger chunks read the words from global memory.
  // Top-k rows stage theirs a round at a time, at any chunk length (kRoundWords).
  const bool masked = a.token_bitmask.words != nullptr;  // kMasked: unmasked steps skip its code
  const size_t base_smem = (c.apply_penalties ? kPenaltyBitmapWords * sizeof(uint32_t) : 0) +
                           (top_k_family ? kBufferCap * sizeof(Candidate) : 0) +
                           (top_k_family && masked ? 2 * kRoundWords * sizeof(uint32_t) : 0);
  const size_t stage_bytes = staged_mask_words(a.chunk_len) * sizeof(int32_t);
  const bool pdl = use_pdl();
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* x = c.logits.data_ptr<T>();
    constexpr bool kHalf = sizeof(T) == 2;
    auto* chunk = kHalf && a.wide_loads() ? chunk_kernel_of<T, kHalf>(fused, masked, a.penalties)
                                          : chunk_kernel_of<T, false>(fused, masked, a.penalties);
    const size_t limit = dynamic_smem_limit(chunk);
    TORCH_CHECK(base_smem <= limit, "split-row chunk kernel: ", base_smem,
                " bytes of shared memory over its limit ", limit);
    a.stage_bitmask = masked && base_smem + stage_bytes <= limit;
    const size_t chunk_smem = base_smem + (a.stage_bitmask ? stage_bytes : 0);
    launch(chunk, rows * a.splits, kChunkThreads, chunk_smem, pdl, x, a);
    if (!fused) launch(finish_kernel<T>, rows, kFinishThreads, 0, pdl, x, a);
  };
  dispatch_logits_dtype(c.logits.scalar_type(), run);
}

// Small no-filter steps without penalties, logprobs or a bitmask: no_filter_small_kernel, one
// launch; returns whether it took the step.
static bool launch_no_filter_small(const SampleRowsCall& c, Args a) {
  const int64_t rows = c.logits.size(0);
  if (c.route != Route::kNoFilter || rows > fused_max_rows() || a.penalties || a.want_raw ||
      a.token_bitmask.words != nullptr)
    return false;
  a.chunk_len = kSmallChunk;
  a.splits = (a.vocab + kSmallChunk - 1) / kSmallChunk;
  if (int64_t{a.splits} * int64_t{sizeof(Partial)} > kSectionBytesPerRow) return false;
  at::Tensor storage;
  const auto sections = workspace_sections<1>(
      c, {rows * a.splits * int64_t{sizeof(Partial)}}, storage, &a.tickets);
  a.results = reinterpret_cast<ChunkResult*>(sections[0]);
  const bool pdl = use_pdl();
  dispatch_logits_dtype(c.logits.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    launch(no_filter_small_kernel<T>, rows * a.splits, kSmallThreads, 0, pdl,
           c.logits.data_ptr<T>(), a);
  });
  return true;
}

bool try_sample(const SampleRowsCall& c) {
  if (c.out_logprobs && c.logprobs_mode == 1) return false;
  if (c.route != Route::kNoFilter && !top_k_step(c)) return false;
  const Args a = common_args(c);
  if (!launch_no_filter_small(c, a)) launch_rows(c, a);
  return true;
}

bool try_verify_rejection(const SampleRowsCall& c, const at::Tensor& draft_probs) {
  if (!top_k_step(c)) return false;
  Args a = common_args(c);
  a.draft_probs = draft_probs.data_ptr<float>();
  a.drafts = c.drafts->data_ptr<int32_t>();
  launch_rows(c, a);
  return true;
}

}  // namespace tokensampler::cuda::split_row
