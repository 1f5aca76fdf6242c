// Device workspace of sample_rows' multi-block paths (split_row_sample.cu, histogram_cut_sample.cu):
// a per-row upper bound, so a backend allocates it once, at construction, from its config
// (rows = max_bs * max tokens per request) and no step allocates. The launch code checks these
// bounds against its kernels' constants (static_assert) and each step against the tensor given.
#pragma once

#include <cstdint>

namespace tokensampler::cuda {

constexpr int64_t kWorkspaceAlign = 256;        // every section starts on this boundary
constexpr int64_t kWorkspaceSections = 10;       // the most sections a path carves
constexpr int64_t kWorkspaceBytesPerRow = 64 * 1024;
// Of each row's share, the bytes the sections may use; the rest (4 bytes a row) holds the
// single-launch kernel's per-row tickets, in an area no section ever covers (below).
constexpr int64_t kTicketBytesPerRow = 4;
constexpr int64_t kSectionBytesPerRow = kWorkspaceBytesPerRow - kTicketBytesPerRow;

constexpr int64_t workspace_aligned(int64_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

// Bytes a workspace needs to serve steps of up to `max_rows` logits rows. A template so the op
// checks can call it with a symbolic row count (c10::SymInt) as well.
template <typename Rows>
constexpr Rows sample_rows_workspace_bytes(Rows max_rows) {
  return max_rows * kWorkspaceBytesPerRow + kWorkspaceSections * kWorkspaceAlign;
}

// The rows a workspace of `bytes` serves (the inverse of sample_rows_workspace_bytes).
constexpr int64_t workspace_rows(int64_t bytes) {
  return bytes < kWorkspaceSections * kWorkspaceAlign
             ? 0
             : (bytes - kWorkspaceSections * kWorkspaceAlign) / kWorkspaceBytesPerRow;
}

// Layout of a workspace that serves M = workspace_rows(bytes) rows:
//   [0, ticket_offset(M))             sections of a step of R <= M rows; they end by
//                                     R * kSectionBytesPerRow + kWorkspaceSections * kWorkspaceAlign
//   [ticket_offset(M), + 4 * M)       uint32 ticket of row r at ticket_offset(M) + 4 r
// The tickets' place depends only on the workspace's size, so every step that passes the same
// workspace finds row r's ticket at the same address, and no step's sections overlap it.
// Invariant (the single-launch kernel relies on it): every ticket is zero whenever no
// sample_rows launch is running on the workspace. The allocation must zero it once (the
// gumbel backends allocate with torch.zeros); each launch leaves the tickets it used at zero.
constexpr int64_t ticket_offset(int64_t rows_served) {
  return rows_served * kSectionBytesPerRow + kWorkspaceSections * kWorkspaceAlign;
}
static_assert(ticket_offset(1) % 4 == 0 && kWorkspaceAlign % 4 == 0);

}  // namespace tokensampler::cuda
