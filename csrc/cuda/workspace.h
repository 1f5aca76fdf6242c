// Device workspace of sample_rows' multi-block paths (split_row_sample.cu, top_p_sample.cu):
// a per-row upper bound, so a backend allocates it once, at construction, from its config
// (rows = max_bs * max tokens per request) and no step allocates. The launch code checks these
// bounds against its kernels' constants (static_assert) and each step against the tensor given.
#pragma once

#include <cstdint>

namespace tokensampler::cuda {

constexpr int64_t kWorkspaceAlign = 256;        // every section starts on this boundary
constexpr int64_t kWorkspaceSections = 5;       // the most sections a path carves
constexpr int64_t kWorkspaceBytesPerRow = 60 * 1024;

constexpr int64_t workspace_aligned(int64_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

// Bytes a workspace needs to serve steps of up to `max_rows` logits rows.
constexpr int64_t sample_rows_workspace_bytes(int64_t max_rows) {
  return max_rows * kWorkspaceBytesPerRow + kWorkspaceSections * kWorkspaceAlign;
}

}  // namespace tokensampler::cuda
