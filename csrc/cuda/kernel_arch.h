// What a loaded kernel was compiled for, asked of the CUDA runtime: code for sm_90 features
// (programmatic dependent launch, thread-block clusters) exists only in a kernel whose PTX
// targets compute_90 or later, so one JIT-compiled from older PTX (an "8.0+PTX" build on a
// newer GPU) must be launched without them. Cached per kernel and device, as is how many
// clusters of a kernel the device runs at once (fewer than its SMs suggest under MPS or MIG).
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

// Clusters of `ctas` blocks of `threads` threads (no dynamic shared memory) that can be resident
// at once; 0 when the kernel has no sm_90 code.
inline int max_active_clusters(const void* kernel, int ctas, int threads) {
  if (!has_sm90_code(kernel)) return 0;
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> known;
  const std::pair<const void*, int> key{kernel, at::cuda::current_device()};
  const std::lock_guard<std::mutex> lock(mutex);
  const auto it = known.find(key);
  if (it != known.end()) return it->second;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(ctas));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(ctas);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
  return known[key] = clusters;
}

}  // namespace tokensampler::cuda
