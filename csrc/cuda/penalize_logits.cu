// Launch code of penalize_logits on CUDA (kernel in penalize_kernel.cuh).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cmath>

#include "../ops/op_checks.h"
#include "penalize_kernel.cuh"

namespace tokensampler::cuda {

namespace {

void penalize_logits(const at::Tensor& logits, const at::Tensor& req_pool_indices,
                     const at::Tensor& slot_table, int64_t history_capacity, int64_t bias_capacity,
                     int64_t tokens_per_req, const std::optional<at::Tensor>& candidates,
                     int64_t vocab_offset, at::Tensor& out) {
  check_penalize_args(logits, req_pool_indices, slot_table, history_capacity, bias_capacity,
                      tokens_per_req, candidates, out);
  const int64_t rows = logits.size(0);
  if (rows == 0) return;
  const c10::cuda::CUDAGuard guard(logits.device());
  out.copy_(logits);
  out.nan_to_num_(-INFINITY, INFINITY, -INFINITY);  // §3.1, ±inf kept
  const SlotLayout layout = slot_layout_of(slot_table, history_capacity, bias_capacity);
  penalize_rows_kernel<<<rows, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
      out.data_ptr<float>(), static_cast<int32_t>(logits.size(1)),
      req_pool_indices.data_ptr<int32_t>(), slot_table.data_ptr<int32_t>(), slot_table.size(0),
      layout, static_cast<int32_t>(tokens_per_req),
      candidates ? candidates->data_ptr<int32_t>() : nullptr, static_cast<int32_t>(vocab_offset));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

TORCH_LIBRARY_IMPL(tokensampler, CUDA, m) { m.impl("penalize_logits", &penalize_logits); }

}  // namespace tokensampler::cuda
