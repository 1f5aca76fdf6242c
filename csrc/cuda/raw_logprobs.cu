// Launch code of raw_logprobs on CUDA (kernels in raw_logprobs_kernel.cuh), for the op and for
// sample_rows' top-N.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>

#include "../ops/op_checks.h"
#include "dispatch_logits.cuh"
#include "raw_logprobs_kernel.cuh"
#include "split_row_launch.cuh"
#include "workspace.h"

namespace tokensampler::cuda {

namespace raw_logprobs {

Args args_of(const at::Tensor& logits, const std::optional<at::Tensor>& token_bitmask,
             const at::Tensor* tokens, const std::optional<at::Tensor>& out_logprobs,
             const std::optional<at::Tensor>& out_top_values,
             const std::optional<at::Tensor>& out_top_ids,
             const std::optional<at::Tensor>& req_pool_indices, int64_t tokens_per_req,
             int64_t pool_rows) {
  Args a{};
  a.row_stride = logits.stride(0);
  a.token_bitmask = bitmask_rows(token_bitmask);
  a.vocab = static_cast<int32_t>(logits.size(1));
  if (tokens && out_logprobs) {
    a.tokens = tokens->data_ptr<int32_t>();
    a.out_logprobs = out_logprobs->data_ptr<float>();
  }
  a.top_n = out_top_values ? static_cast<int32_t>(out_top_values->size(1)) : 0;
  if (a.top_n > 0) {
    a.out_top_values = out_top_values->data_ptr<float>();
    a.out_top_ids = out_top_ids->data_ptr<int64_t>();
  }
  if (req_pool_indices) {
    a.req_pool_indices = req_pool_indices->data_ptr<int32_t>();
    a.tokens_per_req = static_cast<int32_t>(tokens_per_req);
    a.pool_rows = pool_rows;
  }
  return a;
}

void launch(const at::Tensor& logits, Args a, const std::optional<at::Tensor>& workspace) {
  const int64_t rows = logits.size(0);
  // The sampling paths' chunks; splits * N candidates fit the finish kernel's shared memory.
  const split_row::ChunkGeometry g = split_row::chunk_geometry(
      a.vocab, rows, a.top_n <= kMaxSplitTopN ? kMergeCap / std::max(a.top_n, 1) : 1);
  a.splits = g.splits;
  a.chunk_len = g.chunk_len;
  at::Tensor scratch;
  if (a.splits > 1) {
    const int64_t partial_bytes = workspace_aligned(rows * a.splits * int64_t{sizeof(Partial)});
    const int64_t total = partial_bytes + rows * a.splits * a.top_n * int64_t{sizeof(Candidate)};
    // A workspace's sections end before its tickets (workspace.h), which stay untouched.
    if (workspace && total <= ticket_offset(workspace_rows(workspace->numel())))
      scratch = *workspace;
    else
      scratch = at::empty({total}, logits.options().dtype(at::kByte));
    auto* p = static_cast<unsigned char*>(scratch.data_ptr());
    a.partials = reinterpret_cast<Partial*>(p);
    a.chunk_top = reinterpret_cast<Candidate*>(p + partial_bytes);
  }
  const auto stream = at::cuda::getCurrentCUDAStream();
  dispatch_logits_dtype(logits.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    chunk_kernel<T><<<rows * a.splits, kThreads, 0, stream>>>(logits.data_ptr<T>(), a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (a.splits > 1) {
      const size_t smem = size_t{sizeof(Candidate)} * a.splits * a.top_n;  // <= kMergeCap entries
      finish_kernel<T><<<rows, kThreads, smem, stream>>>(logits.data_ptr<T>(), a);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
}

}  // namespace raw_logprobs

namespace {

void raw_logprobs_op(const at::Tensor& logits, const at::Tensor& tokens,
                     const std::optional<at::Tensor>& out_logprobs,
                     const std::optional<at::Tensor>& out_top_values,
                     const std::optional<at::Tensor>& out_top_ids,
                     const std::optional<at::Tensor>& token_bitmask,
                     const std::optional<at::Tensor>& req_pool_indices, int64_t tokens_per_req,
                     int64_t pool_rows) {
  check_raw_logprobs_args(logits, tokens, out_logprobs, out_top_values, out_top_ids, token_bitmask,
                          req_pool_indices, tokens_per_req, pool_rows);
  const raw_logprobs::Args a =
      raw_logprobs::args_of(logits, token_bitmask, &tokens, out_logprobs, out_top_values,
                            out_top_ids, req_pool_indices, tokens_per_req, pool_rows);
  if (logits.size(0) == 0 || (!out_logprobs && a.top_n == 0)) return;
  const c10::cuda::CUDAGuard guard(logits.device());
  raw_logprobs::launch(logits, a, std::nullopt);
}

}  // namespace

TORCH_LIBRARY_IMPL(tokensampler, CUDA, m) { m.impl("raw_logprobs", &raw_logprobs_op); }

}  // namespace tokensampler::cuda
