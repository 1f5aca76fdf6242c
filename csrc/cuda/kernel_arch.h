// What a loaded kernel was compiled for, asked of the CUDA runtime: code for sm_90 features
// (programmatic dependent launch, thread-block clusters) exists only in a kernel whose PTX
// targets compute_90 or later, so one JIT-compiled from older PTX (an "8.0+PTX" build on a
// newer GPU) must be launched without them. Cached per kernel and device.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <map>
#include <mutex>
#include <utility>

namespace tokensampler::cuda {

inline bool has_sm90_code(const void* kernel) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, bool> known;
  const std::pair<const void*, int> key{kernel, at::cuda::current_device()};
  const std::lock_guard<std::mutex> lock(mutex);
  const auto it = known.find(key);
  if (it != known.end()) return it->second;
  cudaFuncAttributes attr{};
  C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  return known[key] = attr.ptxVersion >= 90;
}

}  // namespace tokensampler::cuda
