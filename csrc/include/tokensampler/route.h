// The sampling route of a step: which filters its rows use (DESIGN §2). The host selects it
// (csrc/slot_state/route_selection.cpp) and passes it to sample_rows / verify_rejection as
// `int route` beside `int max_top_k`; the CUDA launch code picks a kernel from the pair. A
// route never changes tokens, only which kernel computes them.
#pragma once

#include <cstdint>

namespace tokensampler {

enum class Route : int32_t {
  kGeneric = 0,  // mixed rows: one kernel that handles every filter per row
  kNoFilter = 1,
  kTopK = 2,
  kTopP = 3,
  kTopKTopP = 4,
  kMinP = 5,
  kTopKTopPMinP = 6,
};

inline constexpr int64_t kRouteCount = 7;

inline constexpr bool is_valid_route(int64_t route) { return route >= 0 && route < kRouteCount; }

// Routes whose every sampled row has a top-k (so the step's largest k bounds the kept set).
inline constexpr bool is_top_k_route(Route route) {
  return route == Route::kTopK || route == Route::kTopKTopP || route == Route::kTopKTopPMinP;
}

// The largest step top-k the CUDA split-row path serves (one read of each row); a top-k route
// with a larger k takes the histogram-cut path. The Python layer picks CUDA-graph variants by it
// (_C.SPLIT_ROW_MAX_TOP_K).
inline constexpr int32_t kSplitRowMaxTopK = 512;

}  // namespace tokensampler
