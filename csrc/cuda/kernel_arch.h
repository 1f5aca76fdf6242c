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
#include <tuple>

namespace tokensampler::cuda {

// compute() once per (kernel, device, extra), then from a cache (one per call site).
template <typename V, typename F>
V cached_per_kernel(const void* kernel, int extra, F&& compute) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int>, V> known;
  const std::tuple<const void*, int, int> key{kernel, at::cuda::current_device(), extra};
  const std::lock_guard<std::mutex> lock(mutex);
  const auto it = known.find(key);
  if (it != known.end()) return it->second;
  return known[key] = compute();
}

inline bool has_sm90_code(const void* kernel) {
  return cached_per_kernel<bool>(kernel, 0, [&] {
    cudaFuncAttributes attr{};
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    return attr.ptxVersion >= 90;
  });
}

// A launch of `grid` blocks of `threads` threads in clusters of `ctas` blocks; `attr` holds the
// cluster attribute the config points at.
inline cudaLaunchConfig_t cluster_launch_config(unsigned grid, unsigned threads, unsigned ctas,
                                                cudaStream_t stream, cudaLaunchAttribute& attr) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(threads);
  cfg.stream = stream;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = ctas;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cfg;
}

// Clusters of `ctas` blocks of `threads` threads (no dynamic shared memory) that can be resident
// at once; 0 when the kernel has no sm_90 code.
inline int max_active_clusters(const void* kernel, int ctas, int threads) {
  if (!has_sm90_code(kernel)) return 0;
  return cached_per_kernel<int>(kernel, ctas, [&] {
    cudaLaunchAttribute attr{};
    const cudaLaunchConfig_t cfg = cluster_launch_config(
        static_cast<unsigned>(ctas), static_cast<unsigned>(threads), static_cast<unsigned>(ctas),
        nullptr, attr);
    int clusters = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
    return clusters;
  });
}

}  // namespace tokensampler::cuda
