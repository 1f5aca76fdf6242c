// Counter-based random numbers keyed by (seed, position, token id), shared by CPU and CUDA.
//
// Why this keying: the noise added to token i of a request at sequence position t depends on
// nothing but (the request's seed, t, i, stream). It does not see the batch row, the batch
// size, the route or kernel that evaluates it, whether the call is eager or a CUDA-graph
// replay, the device, or whether the row is a plain decode or a speculative verify position.
// Gumbel-max sampling `argmax_i z_i + G(seed, t, i)` therefore returns the same token in all
// of those settings, and a kernel may generate noise only for the candidates it keeps: the
// value for token i is the same whichever thread computes it.
//
// Generator: Philox-4x32 with 7 rounds (Salmon et al., SC'11: Philox-4x32 passes all of
// TestU01's BigCrush from 7 rounds; their default of 10 adds a margin of 3 that a sampler's
// noise does not need, and the rounds are most of the per-token work of the kernels that
// score every token), key = the 64-bit seed, counter = (token_id / 4, position low word,
// position high word, stream). One call yields four words; token i uses word i % 4, so four
// neighbouring tokens share one Philox evaluation.
#pragma once

#include "tokensampler/platform.h"
#include "tokensampler/portable_math.h"

namespace tokensampler {

// Streams separate independent uses of the same (seed, position) key.
enum RngStream : uint32_t {
  kStreamGumbel = 0,      // per-token Gumbel noise for sampling (DESIGN §3.7)
  kStreamAcceptCoin = 1,  // one uniform per verify position for rejection sampling (§4)
  kStreamResidual = 2,    // per-token Gumbel noise for the residual max(p - q, 0) (§4)
};

struct Philox4 {
  uint32_t v[4];
};

TS_HD uint32_t mulhi32(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

constexpr int kPhiloxRounds = 7;

TS_HD Philox4 philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                         uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
#pragma unroll
  for (int round = 0; round < kPhiloxRounds; ++round) {
    const uint32_t hi0 = mulhi32(kMul0, c0), lo0 = kMul0 * c0;
    const uint32_t hi1 = mulhi32(kMul1, c2), lo1 = kMul1 * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
    k0 += kWeyl0; k1 += kWeyl1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// The four raw words for tokens [4*group, 4*group + 4) at (seed, position, stream).
TS_HD Philox4 random_words(uint64_t seed, int64_t position, uint32_t group, uint32_t stream) {
  const uint64_t pos = static_cast<uint64_t>(position);
  return philox4x32(group, static_cast<uint32_t>(pos), static_cast<uint32_t>(pos >> 32),
                    stream, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// Uniform in the open interval (0, 1): 23 random bits, centred in their bin, so the values
// are k/2^23 + 2^-24 for k in [0, 2^23): never 0, never 1, all exactly representable.
TS_HD float uniform_open01(uint32_t word) {
  return f_mul(static_cast<float>(word >> 9) + 0.5f, 1.0f / 8388608.0f);
}

// Standard Gumbel noise G = -ln(-ln u) from one random word. With u in [2^-24, 1 - 2^-24],
// -ln u lies in [5.96e-8, 16.64] and G in [-2.81, 16.64]: finite, never NaN.
TS_HD float gumbel_from_word(uint32_t word) {
  const float u = uniform_open01(word);
  return -portable_log(-portable_log(u));
}

// An upper bound of gumbel_from_word(word) from the word's leading bits alone, so a kernel can
// skip the two logs of a token whose z plus this bound cannot reach the best score so far
// (exact pruning). With q = 2^23 - 1 - (word >> 9), 1 - u >= 2^(31 - clz(q) - 23), so
// G <= -ln(1 - u) <= (clz(q) - 8) ln 2; the margin covers the rounding of the computed G (every
// one of the 2^23 values checked, sixteenth session).
TS_HD float gumbel_upper_bound(uint32_t word) {
  const uint32_t q = 8388607u - (word >> 9);
  return static_cast<float>(leading_zeros(q) - 8) * 0.693147180559945f + 1e-3f;
}

// Gumbel noise for one token: what every kernel uses when it needs a single value.
TS_HD float gumbel_noise(uint64_t seed, int64_t position, int32_t token, uint32_t stream) {
  const Philox4 w = random_words(seed, position, static_cast<uint32_t>(token) >> 2, stream);
  return gumbel_from_word(w.v[token & 3]);
}

// One uniform in (0, 1) per (seed, position, stream): the rejection-sampling coin.
TS_HD float uniform_coin(uint64_t seed, int64_t position, uint32_t stream) {
  return uniform_open01(random_words(seed, position, 0, stream).v[0]);
}

}  // namespace tokensampler
