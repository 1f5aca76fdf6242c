// Transcendental functions from exactly rounded fp32 operations only, so the CPU and CUDA
// kernels compute the same bits wherever a result decides a token (libm's and CUDA's logf /
// expf differ in the last ulp).
#pragma once

#include "tokensampler/platform.h"

namespace tokensampler {

// Natural log of a positive, finite, normal float, using only exactly-rounded operations so
// the CPU and CUDA kernels produce the same bits (libm's logf and CUDA's logf differ in the
// last ulp). x = m * 2^e with m in [sqrt(1/2), sqrt(2)); ln m = 2 atanh(s), s = (m-1)/(m+1),
// |s| < 0.172, odd series to s^11: relative error ~1e-7, far below what sampling needs.
TS_HD float portable_log(float x) {
  uint32_t bits = float_bits(x);
  int e = static_cast<int>((bits >> 23) & 0xFF) - 127;
  float m = bits_float((bits & 0x007FFFFFu) | 0x3F800000u);  // [1, 2)
  if (m > 1.41421356f) {
    m = f_mul(m, 0.5f);
    e += 1;
  }
  const float s = f_div(f_sub(m, 1.0f), f_add(m, 1.0f));
  const float s2 = f_mul(s, s);
  float poly = 2.0f / 11.0f;
  poly = f_fma(poly, s2, 2.0f / 9.0f);
  poly = f_fma(poly, s2, 2.0f / 7.0f);
  poly = f_fma(poly, s2, 2.0f / 5.0f);
  poly = f_fma(poly, s2, 2.0f / 3.0f);
  poly = f_fma(poly, s2, 2.0f);
  const float log_m = f_mul(poly, s);
  return f_fma(static_cast<float>(e), 0.693147180559945f, log_m);
}

// e^d for d <= 0 (d = z - z_max, the top-p masses of row_rules.h), 0 below -86 (no
// subnormals). d = k ln 2 + r with |r| <= ln 2 / 2 (k by round-half-up of -d log2 e, ln 2 split
// in two for an exact reduction), e^r by its Taylor series to r^7 (relative error < 2e-8, under
// the rounding of the result), scaled by 2^k through the exponent bits.
TS_HD float portable_exp(float d) {
  if (!(d > -86.0f)) return 0.0f;
  const int k = -static_cast<int>(f_add(f_mul(-d, 1.44269504f), 0.5f));
  const float kf = static_cast<float>(k);
  float r = f_fma(kf, -0.693145752f, d);  // ln 2's leading bits: k * them is exact
  r = f_fma(kf, -1.42860682e-6f, r);
  float poly = 1.0f / 5040.0f;
  poly = f_fma(poly, r, 1.0f / 720.0f);
  poly = f_fma(poly, r, 1.0f / 120.0f);
  poly = f_fma(poly, r, 1.0f / 24.0f);
  poly = f_fma(poly, r, 1.0f / 6.0f);
  poly = f_fma(poly, r, 0.5f);
  poly = f_fma(poly, r, 1.0f);
  poly = f_fma(poly, r, 1.0f);
  return f_mul(poly, bits_float(static_cast<uint32_t>(k + 127) << 23));
}

}  // namespace tokensampler
