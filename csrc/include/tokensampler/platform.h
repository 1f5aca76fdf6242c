// Host/device qualifiers and exactly-rounded fp32 arithmetic shared by CPU and CUDA code.
//
// The CPU kernels are the specification the CUDA kernels must match token for token, so
// every float operation that decides a token is written with these helpers: on the device
// they map to the _rn intrinsics, which nvcc never contracts into FMAs; on the host the
// project is built with -ffp-contract=off. Both sides then round identically.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TS_HD __host__ __device__ __forceinline__
#else
#define TS_HD inline
#endif

namespace tokensampler {

TS_HD float f_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

TS_HD float f_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

TS_HD float f_sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

TS_HD float f_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

TS_HD float f_fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}

// Leading zero bits of a word (32 for zero).
TS_HD int leading_zeros(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __clz(static_cast<int>(bits));
#else
  return bits == 0u ? 32 : __builtin_clz(bits);
#endif
}

// Index of the lowest set bit of a nonzero word.
TS_HD int lowest_set_bit(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __ffs(static_cast<int>(bits)) - 1;
#else
  return __builtin_ctz(bits);
#endif
}

TS_HD uint32_t float_bits(float x) {
  union { float f; uint32_t u; } v{x};
  return v.u;
}

TS_HD float bits_float(uint32_t u) {
  union { uint32_t u; float f; } v{u};
  return v.f;
}

}  // namespace tokensampler
