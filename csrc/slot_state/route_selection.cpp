// Route selection: which kernel specialisation a step can use, decided on the host from the
// step's parameters so that graph replay picks a captured graph without a device sync.
#include <array>

#include "slot_params.h"
#include "tokensampler/row_rules.h"

namespace tokensampler {

namespace {

constexpr std::array<std::pair<Route, const char*>, kRouteCount> kRouteNames{{
    {Route::kGeneric, "generic"},
    {Route::kNoFilter, "no_filter"},
    {Route::kTopK, "top_k"},
    {Route::kTopP, "top_p"},
    {Route::kTopKTopP, "top_k_top_p"},
    {Route::kMinP, "min_p"},
    {Route::kTopKTopPMinP, "top_k_top_p_min_p"},
}};

// Filter set of one row as bits: 1 = top-k, 2 = top-p, 4 = min-p.
int filter_bits(const SlotParams& p, int64_t vocab_size, bool with_min_p) {
  int bits = 0;
  if (!top_k_disabled(p.top_k, static_cast<int32_t>(vocab_size))) bits |= 1;
  if (p.top_p < 1.0f) bits |= 2;
  if (with_min_p && p.min_p > 0.0f) bits |= 4;
  return bits;
}

}  // namespace

const char* route_name(Route route) {
  for (const auto& [r, name] : kRouteNames)
    if (r == route) return name;
  return "generic";
}

Route select_route(const std::vector<SlotParams>& params, int64_t vocab_size, bool with_min_p) {
  int shared = -1;
  for (const auto& p : params) {
    if (is_greedy_row(p.temperature, p.top_k)) continue;  // every route handles greedy rows
    const int bits = filter_bits(p, vocab_size, with_min_p);
    if (shared == -1) shared = bits;
    else if (shared != bits) return Route::kGeneric;
  }
  switch (shared) {
    case -1:
    case 0: return Route::kNoFilter;
    case 1: return Route::kTopK;
    case 2: return Route::kTopP;
    case 3: return Route::kTopKTopP;
    case 4: return Route::kMinP;
    case 7: return Route::kTopKTopPMinP;
    default: return Route::kGeneric;
  }
}

}  // namespace tokensampler
