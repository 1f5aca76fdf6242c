// Host-side setup shared by the launch code of the multi-block paths (split_row_sample.cu,
// top_p_sample.cu): how rows are cut into chunks, and the kernel arguments both fill alike.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include <algorithm>
#include <array>

#include "sample_rows_paths.h"
#include "split_row_kernel.cuh"
#include "workspace.h"

namespace tokensampler::cuda::split_row {

// Everything but the geometry, k_cap and the scratch pointers, which each path sets.
inline Args common_args(const SampleRowsCall& c) {
  Args a{};
  a.row_stride = c.logits.stride(0);
  a.vocab = static_cast<int32_t>(c.logits.size(1));
  a.req_pool_indices = c.req_pool_indices.data_ptr<int32_t>();
  a.valid_cache_lengths = c.valid_cache_lengths.data_ptr<int32_t>();
  a.table = c.slot_table.data_ptr<int32_t>();
  a.pool_rows = c.slot_table.size(0);
  a.layout = c.layout;
  a.tokens_per_req = static_cast<int32_t>(c.tokens_per_req);
  a.candidates = c.apply_penalties && c.drafts ? c.drafts->data_ptr<int32_t>() : nullptr;
  a.penalties = c.apply_penalties;
  a.want_raw = c.out_logprobs.has_value();
  a.out_tokens = c.out_tokens.data_ptr<int32_t>();
  a.out_invalid = c.out_invalid.data_ptr<bool>();
  a.out_logprobs = c.out_logprobs ? c.out_logprobs->data_ptr<float>() : nullptr;
  return a;
}

// Cuts each row into a.splits chunks of a.chunk_len tokens: about one full wave of blocks
// (8 per SM), at most max_splits, chunks of at least 1024 tokens starting 16-byte aligned.
inline void set_chunks(Args& a, int64_t rows, int64_t max_splits) {
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  int64_t splits = std::max<int64_t>(1, (8 * sms + rows - 1) / rows);
  splits = std::min<int64_t>({splits, max_splits, std::max<int64_t>(1, a.vocab / 1024)});
  int32_t chunk_len = static_cast<int32_t>((a.vocab + splits - 1) / splits);
  chunk_len = (chunk_len + 3) / 4 * 4;
  a.chunk_len = chunk_len;
  a.splits = static_cast<int32_t>((a.vocab + chunk_len - 1) / chunk_len);
}

// Consecutive sections of the given byte sizes, each workspace-aligned: carved from the call's
// workspace, or (a caller without one) from the caching allocator. `storage` keeps that alive.
template <int kSections>
std::array<unsigned char*, kSections> workspace_sections(const SampleRowsCall& c,
                                                         const std::array<int64_t, kSections>& bytes,
                                                         at::Tensor& storage) {
  static_assert(kSections <= kWorkspaceSections);
  int64_t total = 0;
  for (int64_t b : bytes) total += workspace_aligned(b);
  if (c.workspace) {
    const at::Tensor& w = *c.workspace;
    TORCH_CHECK_VALUE(w.scalar_type() == at::kByte && w.dim() == 1 && w.is_contiguous() &&
                          w.device() == c.logits.device(),
                      "workspace must be a contiguous 1-D uint8 tensor on ", c.logits.device(),
                      ", got ", w.scalar_type(), " ", w.sizes(), " on ", w.device());
    TORCH_CHECK_VALUE(w.numel() >= total, "workspace holds ", w.numel(), " bytes; a step of ",
                      c.logits.size(0), " rows needs ", total,
                      " (_C.sample_rows_workspace_bytes(rows))");
    storage = w;
  } else {
    storage = at::empty({total}, c.logits.options().dtype(at::kByte));
  }
  std::array<unsigned char*, kSections> at{};
  auto* p = static_cast<unsigned char*>(storage.data_ptr());
  for (int s = 0; s < kSections; ++s) {
    at[s] = p;
    p += workspace_aligned(bytes[s]);
  }
  return at;
}

}  // namespace tokensampler::cuda::split_row
