// CPU kernels of the ops that give code outside the sampling kernels their arithmetic:
// gumbel_noise (the keyed noise of DESIGN §3.7, rng.h) and min_p_threshold (§3.6, row_rules.h).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "op_checks.h"
#include "tokensampler/rng.h"
#include "tokensampler/row_rules.h"

namespace tokensampler::cpu {

namespace {

void gumbel_noise(const at::Tensor& seeds, const at::Tensor& positions,
                  const at::Tensor& token_ids, int64_t stream, at::Tensor& out) {
  check_gumbel_noise_args(seeds, positions, token_ids, out);
  const int64_t rows = token_ids.size(0), cols = token_ids.size(1);
  for (int64_t r = 0; r < rows; ++r) {
    const auto seed = static_cast<uint64_t>(seeds.data_ptr<int64_t>()[r]);
    const int64_t position = positions.data_ptr<int64_t>()[r];
    for (int64_t c = 0; c < cols; ++c) {
      out.data_ptr<float>()[r * cols + c] = tokensampler::gumbel_noise(
          seed, position, token_ids.data_ptr<int32_t>()[r * cols + c], static_cast<uint32_t>(stream));
    }
  }
}

void min_p_threshold(const at::Tensor& z_max, const at::Tensor& min_p, at::Tensor& out) {
  check_min_p_threshold_args(z_max, min_p, out);
  for (int64_t r = 0; r < z_max.numel(); ++r)
    out.data_ptr<float>()[r] =
        tokensampler::min_p_threshold(z_max.data_ptr<float>()[r], min_p.data_ptr<float>()[r]);
}

}  // namespace

TORCH_LIBRARY_IMPL(tokensampler, CPU, m) {
  m.impl("gumbel_noise", &gumbel_noise);
  m.impl("min_p_threshold", &min_p_threshold);
}

}  // namespace tokensampler::cpu
