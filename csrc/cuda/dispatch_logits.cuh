// Calls f(T{}) with T the logits' element type: float, at::Half or at::BFloat16, the three
// dtypes check_logits admits. One instantiation per dtype, none for double.
#pragma once

#include <ATen/ATen.h>

namespace tokensampler::cuda {

template <typename F>
void dispatch_logits_dtype(at::ScalarType dtype, F&& f) {
  switch (dtype) {
    case at::kFloat: f(float{}); break;
    case at::kHalf: f(at::Half{}); break;
    default: f(at::BFloat16{}); break;
  }
}

}  // namespace tokensampler::cuda
