// One request's sampling parameters as the SlotStateManager receives them from Python.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "tokensampler/route.h"

namespace tokensampler {

struct SlotParams {
  float temperature = 1.0f;
  int32_t top_k = -1;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  uint64_t seed = 0;
  std::vector<std::pair<int64_t, float>> logit_bias;
};

const char* route_name(Route route);

// Route of a step: the filter set every non-greedy row shares, or generic when they differ.
// `with_min_p` is false for backends that ignore min-p.
Route select_route(const std::vector<SlotParams>& params, int64_t vocab_size, bool with_min_p);

}  // namespace tokensampler
