// Launch code of argmax_rows on CUDA (kernel in argmax_kernel.cuh).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../ops/op_checks.h"
#include "argmax_kernel.cuh"
#include "dispatch_logits.cuh"

namespace tokensampler::cuda {

namespace {

void argmax_rows(const at::Tensor& logits, at::Tensor& out_tokens,
                 const std::optional<at::Tensor>& token_bitmask,
                 const std::optional<at::Tensor>& out_invalid) {
  check_argmax_rows_args(logits, out_tokens, token_bitmask, out_invalid);
  const int64_t rows = logits.size(0);
  if (rows == 0) return;
  const c10::cuda::CUDAGuard guard(logits.device());
  const auto stream = at::cuda::getCurrentCUDAStream();
  constexpr int kThreads = 1024;
  dispatch_logits_dtype(logits.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    argmax_rows_kernel<T, kThreads><<<rows, kThreads, 0, stream>>>(
        logits.data_ptr<T>(), logits.stride(0), bitmask_rows(token_bitmask),
        static_cast<int32_t>(logits.size(1)), out_tokens.data_ptr<int32_t>(),
        out_invalid ? out_invalid->data_ptr<bool>() : nullptr);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

TORCH_LIBRARY_IMPL(tokensampler, CUDA, m) { m.impl("argmax_rows", &argmax_rows); }

}  // namespace tokensampler::cuda
