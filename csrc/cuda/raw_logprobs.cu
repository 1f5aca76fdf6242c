// Launch code of raw_logprobs on CUDA (kernel in raw_logprobs_kernel.cuh).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../ops/op_checks.h"
#include "dispatch_logits.cuh"
#include "raw_logprobs_kernel.cuh"

namespace tokensampler::cuda {

namespace {

void raw_logprobs(const at::Tensor& logits, const at::Tensor& tokens,
                  const std::optional<at::Tensor>& out_logprobs,
                  const std::optional<at::Tensor>& out_top_values,
                  const std::optional<at::Tensor>& out_top_ids,
                  const std::optional<at::Tensor>& token_bitmask) {
  check_raw_logprobs_args(logits, tokens, out_logprobs, out_top_values, out_top_ids, token_bitmask);
  const int64_t rows = logits.size(0);
  const int32_t top_n = out_top_values ? static_cast<int32_t>(out_top_values->size(1)) : 0;
  if (rows == 0 || (!out_logprobs && top_n == 0)) return;
  const c10::cuda::CUDAGuard guard(logits.device());
  constexpr int kThreads = 512;
  dispatch_logits_dtype(logits.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    raw_logprobs_kernel<T, kThreads><<<rows, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        logits.data_ptr<T>(), logits.stride(0), bitmask_rows(token_bitmask),
        static_cast<int32_t>(logits.size(1)), tokens.data_ptr<int32_t>(),
        out_logprobs ? out_logprobs->data_ptr<float>() : nullptr,
        top_n > 0 ? out_top_values->data_ptr<float>() : nullptr,
        top_n > 0 ? out_top_ids->data_ptr<int64_t>() : nullptr, top_n);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

TORCH_LIBRARY_IMPL(tokensampler, CUDA, m) { m.impl("raw_logprobs", &raw_logprobs); }

}  // namespace tokensampler::cuda
