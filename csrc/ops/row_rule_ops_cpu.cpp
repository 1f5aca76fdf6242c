// CPU kernel of gumbel_noise: the keyed Gumbel noise of DESIGN §3.7 for given token ids.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "op_checks.h"
#include "tokensampler/rng.h"

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

}  // namespace

TORCH_LIBRARY_IMPL(tokensampler, CPU, m) { m.impl("gumbel_noise", &gumbel_noise); }

}  // namespace tokensampler::cpu
