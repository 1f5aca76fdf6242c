// Host-side setup shared by the launch code of the multi-block paths (split_row_sample.cu,
// histogram_cut_sample.cu): how rows are cut into chunks, and the kernel arguments both fill alike.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "../ops/op_checks.h"
#include "kernel_arch.h"
#include "sample_rows_paths.h"
#include "split_row_kernel.cuh"
#include "workspace.h"

namespace tokensampler::cuda::split_row {

// Everything but the geometry, k_cap and the scratch pointers, which each path sets.
inline Args common_args(const SampleRowsCall& c) {
  Args a{};
  static_cast<StepRows&>(a) = step_rows_of(c);
  a.candidates = c.apply_penalties && c.drafts ? c.drafts->data_ptr<int32_t>() : nullptr;
  a.penalties = c.apply_penalties;
  a.want_raw = c.out_logprobs.has_value();
  a.out_tokens = c.out_tokens.data_ptr<int32_t>();
  a.out_invalid = c.out_invalid.data_ptr<bool>();
  a.out_logprobs = c.out_logprobs ? c.out_logprobs->data_ptr<float>() : nullptr;
  return a;
}

struct ChunkGeometry {
  int32_t splits;
  int32_t chunk_len;
  int32_t balance_splits;  // the splits one wave asks for, before max_chunk_len's floor: 1 where
                           // the rows alone fill the wave
};

// No limit on a chunk's length: the largest that align_tokens cannot overflow.
constexpr int32_t kNoChunkLimit = INT32_MAX / kAlignTokens * kAlignTokens;

// Cuts rows of `vocab` tokens into `splits` chunks of `chunk_len` tokens: at most one wave of
// blocks (the chunk kernels' kChunkBlocksPerSm resident blocks per SM; A/B on the H200,
// RESULTS.md run 41: one wave beat two by 0-29 % at every route and batch size, fewer chunks
// paying their start (the first group's exact scores, the buffer setup) and their reductions
// fewer times), at most max_splits, chunks of at least 1024 tokens (and at most max_chunk_len, a
// multiple of kAlignTokens) starting 16-byte aligned in every dtype (load4, load8).
// TOKENSAMPLER_CHUNK_BLOCKS_PER_SM overrides kChunkBlocksPerSm (benchmarks compare waves). Shared
// by the sampling paths and raw_logprobs.
inline ChunkGeometry chunk_geometry(int32_t vocab, int64_t rows, int64_t max_splits,
                                    int32_t max_chunk_len = kNoChunkLimit) {
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const char* v = std::getenv("TOKENSAMPLER_CHUNK_BLOCKS_PER_SM");
  const int blocks_per_sm = v != nullptr ? std::max(1, std::atoi(v)) : kChunkBlocksPerSm;
  int64_t splits = std::max<int64_t>(1, blocks_per_sm * sms / rows);
  splits = std::min<int64_t>({splits, max_splits, std::max<int64_t>(1, vocab / 1024)});
  const auto balance_splits = static_cast<int32_t>(splits);
  splits = std::max<int64_t>(splits, (vocab + max_chunk_len - 1) / max_chunk_len);
  int32_t chunk_len = static_cast<int32_t>((vocab + splits - 1) / splits);
  chunk_len = align_tokens(chunk_len);
  return {static_cast<int32_t>((vocab + chunk_len - 1) / chunk_len), chunk_len, balance_splits};
}

// Sets a's chunks (chunk_geometry) and returns the geometry.
inline ChunkGeometry set_chunks(Args& a, int64_t rows, int64_t max_splits,
                                int32_t max_chunk_len = kNoChunkLimit) {
  const ChunkGeometry g = chunk_geometry(a.vocab, rows, max_splits, max_chunk_len);
  a.splits = g.splits;
  a.chunk_len = g.chunk_len;
  return g;
}

// Consecutive sections of the given byte sizes, each workspace-aligned: carved from the call's
// workspace, or (a caller without one) from the caching allocator. `storage` keeps that alive.
// With `tickets` (the single launch), *tickets is set to the rows' zeroed tickets: the
// workspace's ticket area (workspace.h: zero between launches), or a fresh zeroed area behind the
// sections of an allocated scratch.
template <int kSections>
std::array<unsigned char*, kSections> workspace_sections(const SampleRowsCall& c,
                                                         const std::array<int64_t, kSections>& bytes,
                                                         at::Tensor& storage,
                                                         uint32_t** tickets = nullptr) {
  static_assert(kSections <= kWorkspaceSections);
  const int64_t rows = c.logits.size(0);
  int64_t total = 0;
  for (int64_t b : bytes) total += workspace_aligned(b);
  int64_t ticket_at = 0;
  if (c.workspace) {
    const at::Tensor& w = *c.workspace;  // its type, device and size: check_sample_rows_call
    const int64_t served = workspace_rows(w.numel());
    TORCH_INTERNAL_ASSERT(rows <= served && total <= ticket_offset(served));  // the static_asserts
    storage = w;
    ticket_at = ticket_offset(served);
  } else {
    ticket_at = workspace_aligned(total);
    storage = at::empty({ticket_at + (tickets ? 4 * rows : 0)}, c.logits.options().dtype(at::kByte));
  }
  std::array<unsigned char*, kSections> at{};
  auto* p = static_cast<unsigned char*>(storage.data_ptr());
  if (tickets) {
    *tickets = reinterpret_cast<uint32_t*>(p + ticket_at);
    if (!c.workspace)
      C10_CUDA_CHECK(cudaMemsetAsync(*tickets, 0, 4 * rows, at::cuda::getCurrentCUDAStream()));
  }
  for (int s = 0; s < kSections; ++s) {
    at[s] = p;
    p += workspace_aligned(bytes[s]);
  }
  return at;
}

// Dynamic shared memory `kernel` can take without the opt-in attribute: 48 KiB less its static
// shared memory (its reductions' and the radix select's __shared__ arrays). Cached: every
// launch asks, and an eager step pays each runtime query on the host.
template <typename... Params>
size_t dynamic_smem_limit(void (*kernel)(Params...)) {
  return cached_per_kernel<size_t>(reinterpret_cast<const void*>(kernel), 0, [&] {
    cudaFuncAttributes attr{};
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    return size_t{48 * 1024} - attr.sharedSizeBytes;
  });
}

// Whether launches use programmatic dependent launch (default on; TOKENSAMPLER_PDL=0 turns it off).
inline bool use_pdl() {
  const char* v = std::getenv("TOKENSAMPLER_PDL");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// Launches kernel<<<grid, threads, smem, stream>>>(args...), with the programmatic-serialization
// attribute when `pdl` (and the kernel was compiled with its wait, kernel_arch.h): the kernel
// may be scheduled while the one ahead of it in the stream drains, and waits for it in
// wait_for_prior_grids() before touching global memory.
template <typename... Params, typename... ArgTypes>
void launch(void (*kernel)(Params...), int64_t grid, int threads, size_t smem, bool pdl,
            ArgTypes&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = at::cuda::getCurrentCUDAStream();
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl && has_sm90_code(reinterpret_cast<const void*>(kernel)) ? 1 : 0;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<ArgTypes>(args)...));
}

}  // namespace tokensampler::cuda::split_row
