// The block-wide prefix sum of top-p masses (row_rules.h's 64-bit integers) that every CUDA path
// scans in rank order: warp scans, so its shared storage is a word per warp, not one per thread.
#pragma once

#include <cub/block/block_scan.cuh>

namespace tokensampler::cuda {

template <int kThreads>
using MassScan = cub::BlockScan<unsigned long long, kThreads, cub::BLOCK_SCAN_WARP_SCANS>;

}  // namespace tokensampler::cuda
