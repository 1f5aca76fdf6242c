// Launch code of argmax_rows on CUDA (kernel in argmax_kernel.cuh).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../ops/op_checks.h"
#include "argmax_kernel.cuh"
#include "dispatch_logits.cuh"
#include "kernel_arch.h"

namespace tokensampler::cuda {

namespace {

constexpr int kArgmaxThreads = 1024;

template <typename T>
struct ArgmaxCall {
  const T* logits;
  int64_t row_stride;
  BitmaskRows token_bitmask;
  int32_t vocab;
  int32_t* out_tokens;
  bool* out_invalid;
};

// Launches argmax_rows_kernel with clusters of kCtas blocks a row when the rows' clusters are
// all resident at once (which needs sm_90 code); returns whether it did.
template <typename T, int kCtas>
bool launch_clusters(const ArgmaxCall<T>& c, int64_t rows, cudaStream_t stream) {
  auto* kernel = argmax_rows_kernel<T, kArgmaxThreads, kCtas>;
  if (rows * kCtas > at::cuda::getCurrentDeviceProperties()->multiProcessorCount ||
      rows > max_active_clusters(reinterpret_cast<const void*>(kernel), kCtas, kArgmaxThreads))
    return false;
  cudaLaunchAttribute attr{};
  const cudaLaunchConfig_t cfg = cluster_launch_config(static_cast<unsigned>(rows * kCtas),
                                                       kArgmaxThreads, kCtas, stream, attr);
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, c.logits, c.row_stride, c.token_bitmask, c.vocab,
                                    c.out_tokens, c.out_invalid));
  return true;
}

void argmax_rows(const at::Tensor& logits, at::Tensor& out_tokens,
                 const std::optional<at::Tensor>& token_bitmask,
                 const std::optional<at::Tensor>& out_invalid) {
  check_argmax_rows_args(logits, out_tokens, token_bitmask, out_invalid);
  const int64_t rows = logits.size(0);
  if (rows == 0) return;
  const c10::cuda::CUDAGuard guard(logits.device());
  const auto stream = at::cuda::getCurrentCUDAStream();
  dispatch_logits_dtype(logits.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const ArgmaxCall<T> call{logits.data_ptr<T>(), logits.stride(0), bitmask_rows(token_bitmask),
                             static_cast<int32_t>(logits.size(1)),
                             out_tokens.data_ptr<int32_t>(),
                             out_invalid ? out_invalid->data_ptr<bool>() : nullptr};
    // The largest cluster whose rows fit in one wave, all resident at once (else a block a row).
    if (!launch_clusters<T, 8>(call, rows, stream) &&
        !launch_clusters<T, 4>(call, rows, stream) &&
        !launch_clusters<T, 2>(call, rows, stream)) {
      argmax_rows_kernel<T, kArgmaxThreads, 1><<<rows, kArgmaxThreads, 0, stream>>>(
          call.logits, call.row_stride, call.token_bitmask, call.vocab, call.out_tokens,
          call.out_invalid);
    }
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

TORCH_LIBRARY_IMPL(tokensampler, CUDA, m) { m.impl("argmax_rows", &argmax_rows); }

}  // namespace tokensampler::cuda
