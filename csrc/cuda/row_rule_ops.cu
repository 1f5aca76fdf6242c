// CUDA kernels and launch code of the elementwise ops that give code outside the sampling
// kernels their arithmetic: gumbel_noise (tokensampler/rng.h), min_p_threshold (row_rules.h).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../ops/op_checks.h"
#include "tokensampler/rng.h"
#include "tokensampler/row_rules.h"

namespace tokensampler::cuda {

namespace {

__global__ void gumbel_noise_kernel(const int64_t* __restrict__ seeds,
                                    const int64_t* __restrict__ positions,
                                    const int32_t* __restrict__ token_ids, int64_t cols,
                                    int64_t total, uint32_t stream, float* __restrict__ out) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = k / cols;
    out[k] = tokensampler::gumbel_noise(static_cast<uint64_t>(seeds[r]), positions[r],
                                        token_ids[k], stream);
  }
}

void gumbel_noise(const at::Tensor& seeds, const at::Tensor& positions,
                  const at::Tensor& token_ids, int64_t stream, at::Tensor& out) {
  check_gumbel_noise_args(seeds, positions, token_ids, out);
  const int64_t total = token_ids.numel();
  if (total == 0) return;
  const c10::cuda::CUDAGuard guard(token_ids.device());
  const int blocks = static_cast<int>(std::min<int64_t>((total + 255) / 256, 4096));
  gumbel_noise_kernel<<<blocks, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
      seeds.data_ptr<int64_t>(), positions.data_ptr<int64_t>(), token_ids.data_ptr<int32_t>(),
      token_ids.size(1), total, static_cast<uint32_t>(stream), out.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

__global__ void min_p_threshold_kernel(const float* __restrict__ z_max,
                                       const float* __restrict__ min_p, int64_t rows,
                                       float* __restrict__ out) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (r < rows) out[r] = tokensampler::min_p_threshold(z_max[r], min_p[r]);
}

void min_p_threshold(const at::Tensor& z_max, const at::Tensor& min_p, at::Tensor& out) {
  check_min_p_threshold_args(z_max, min_p, out);
  const int64_t rows = z_max.numel();
  if (rows == 0) return;
  const c10::cuda::CUDAGuard guard(z_max.device());
  min_p_threshold_kernel<<<static_cast<unsigned>((rows + 255) / 256), 256, 0,
                           at::cuda::getCurrentCUDAStream()>>>(
      z_max.data_ptr<float>(), min_p.data_ptr<float>(), rows, out.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

TORCH_LIBRARY_IMPL(tokensampler, CUDA, m) {
  m.impl("gumbel_noise", &gumbel_noise);
  m.impl("min_p_threshold", &min_p_threshold);
}

}  // namespace tokensampler::cuda
