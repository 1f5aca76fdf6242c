// The pybind11 module tokensampler._C: the SlotStateManager class and build facts. Importing
// it also loads the operator library (csrc/ops, csrc/cuda) into torch.ops.tokensampler.
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "cuda/workspace.h"
#include "slot_state/slot_state_manager.h"
#include "tokensampler/rng.h"

namespace py = pybind11;

namespace {

// "a,b,c" -> ["a", "b", "c"]; "" -> [].
std::vector<std::string> split_list(const std::string& joined) {
  std::vector<std::string> items;
  size_t start = 0;
  while (start < joined.size()) {
    const size_t comma = std::min(joined.find(',', start), joined.size());
    if (comma > start) items.push_back(joined.substr(start, comma - start));
    start = comma + 1;
  }
  return items;
}

std::optional<std::string> optional_string(const std::string& s) {
  return s.empty() ? std::nullopt : std::optional<std::string>(s);
}

}  // namespace
using tokensampler::Route;
using tokensampler::SlotParams;
using tokensampler::SlotStateManager;

PYBIND11_MODULE(_C, m) {
  m.doc() = "tokensampler native module: slot-state manager and operator library";
  m.def("sample_rows_workspace_bytes", &tokensampler::cuda::sample_rows_workspace_bytes<int64_t>,
        py::arg("max_rows"),
        "Bytes of the CUDA sample_rows workspace that serves steps of up to max_rows rows.");
#ifdef TOKENSAMPLER_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
  // What this build is (cmake/build_info.cmake records it at configure time).
  m.def("build_info", [] {
    py::dict info;
    info["version"] = TOKENSAMPLER_VERSION;
    info["torch"] = TOKENSAMPLER_TORCH_VERSION;
    info["torch_cuda"] = optional_string(TOKENSAMPLER_TORCH_CUDA_VERSION);
    info["cuda"] = optional_string(TOKENSAMPLER_CUDA_VERSION);
    info["cuda_archs"] = split_list(TOKENSAMPLER_CUDA_ARCHS);
    info["cuda_ptx"] = split_list(TOKENSAMPLER_CUDA_PTX);
#ifdef TOKENSAMPLER_WITH_CUDA
    info["with_cuda"] = true;
#else
    info["with_cuda"] = false;
#endif
    return info;
  });

  py::class_<SlotParams>(m, "SlotParams", "One request's sampling parameters, as stored per slot.")
      .def(py::init([](float temperature, int32_t top_k, float top_p, float min_p,
                       float repetition_penalty, float frequency_penalty, float presence_penalty,
                       uint64_t seed, std::vector<std::pair<int64_t, float>> logit_bias) {
             return SlotParams{temperature,       top_k,           top_p,
                               min_p,             repetition_penalty, frequency_penalty,
                               presence_penalty,  seed,            std::move(logit_bias)};
           }),
           py::arg("temperature") = 1.0f, py::arg("top_k") = -1, py::arg("top_p") = 1.0f,
           py::arg("min_p") = 0.0f, py::arg("repetition_penalty") = 1.0f,
           py::arg("frequency_penalty") = 0.0f, py::arg("presence_penalty") = 0.0f,
           py::arg("seed") = 0, py::arg("logit_bias") = std::vector<std::pair<int64_t, float>>{})
      .def_readonly("temperature", &SlotParams::temperature)
      .def_readonly("top_k", &SlotParams::top_k)
      .def_readonly("top_p", &SlotParams::top_p)
      .def_readonly("min_p", &SlotParams::min_p)
      .def_readonly("seed", &SlotParams::seed)
      .def_readonly("logit_bias", &SlotParams::logit_bias);

  py::enum_<Route>(m, "Route", "Sampling route of a step (which filters its rows use).")
      .value("GENERIC", Route::kGeneric)
      .value("NO_FILTER", Route::kNoFilter)
      .value("TOP_K", Route::kTopK)
      .value("TOP_P", Route::kTopP)
      .value("TOP_K_TOP_P", Route::kTopKTopP)
      .value("MIN_P", Route::kMinP)
      .value("TOP_K_TOP_P_MIN_P", Route::kTopKTopPMinP);
  m.def("route_name", &tokensampler::route_name);
  // Column of each scalar in a slot-table row (tokensampler/slot_layout.h): Python reads the
  // pools through these, never through numbers of its own.
  m.attr("SLOT_COLUMNS") = py::dict(
      py::arg("temperature") = int(tokensampler::kColTemperature),
      py::arg("top_k") = int(tokensampler::kColTopK), py::arg("top_p") = int(tokensampler::kColTopP),
      py::arg("min_p") = int(tokensampler::kColMinP),
      py::arg("repetition") = int(tokensampler::kColRepetition),
      py::arg("frequency") = int(tokensampler::kColFrequency),
      py::arg("presence") = int(tokensampler::kColPresence),
      py::arg("seed_lo") = int(tokensampler::kColSeedLo),
      py::arg("history_len") = int(tokensampler::kColHistoryLen),
      py::arg("bias_len") = int(tokensampler::kColBiasLen));
  // Stream ids of the keyed generator (tokensampler/rng.h), for gumbel_noise callers.
  m.attr("RNG_STREAMS") = py::dict(py::arg("gumbel") = int(tokensampler::kStreamGumbel));
  m.def("is_top_k_route", &tokensampler::is_top_k_route, py::arg("route"));
  m.attr("SPLIT_ROW_MAX_TOP_K") = int(tokensampler::kSplitRowMaxTopK);

  py::class_<SlotStateManager>(m, "SlotStateManager",
                               "Per-slot sampling state: owners, flips, the device slot table.")
      .def(py::init([](int64_t pool_rows, int64_t vocab_size, int64_t history_capacity,
                       int64_t bias_capacity, bool with_min_p, const std::string& device) {
             return std::make_unique<SlotStateManager>(pool_rows, vocab_size, history_capacity,
                                                       bias_capacity, with_min_p,
                                                       torch::Device(device));
           }),
           py::arg("pool_rows"), py::arg("vocab_size"), py::arg("history_capacity"),
           py::arg("bias_capacity"), py::arg("with_min_p"), py::arg("device"))
      .def_static("table_bytes", &SlotStateManager::table_bytes, py::arg("pool_rows"),
                  py::arg("vocab_size"), py::arg("history_capacity"), py::arg("bias_capacity"))
      .def("prepare_step", &SlotStateManager::prepare_step, py::arg("request_ids"),
           py::arg("pool_indices"), py::arg("params"), py::arg("prompt_token_ids"),
           "Validate, detect flips, upload flipped rows in one copy; returns the step's route.")
      .def("reset_slot", &SlotStateManager::reset_slot, py::arg("slot"))
      .def("owner", &SlotStateManager::owner, py::arg("slot"))
      .def_property_readonly("table", &SlotStateManager::table)
      .def_property_readonly("pool_rows", &SlotStateManager::pool_rows)
      .def_property_readonly("vocab_size", &SlotStateManager::vocab_size)
      .def_property_readonly("history_capacity",
                             [](const SlotStateManager& s) { return s.layout().history_capacity; })
      .def_property_readonly("bias_capacity",
                             [](const SlotStateManager& s) { return s.layout().bias_capacity; })
      .def_property_readonly("rows_written", &SlotStateManager::rows_written)
      .def_property_readonly("history_tokens_col",
                             [](const SlotStateManager& s) { return s.layout().history_tokens_col(); })
      .def_property_readonly("history_counts_col",
                             [](const SlotStateManager& s) { return s.layout().history_counts_col(); })
      .def_property_readonly("bias_tokens_col",
                             [](const SlotStateManager& s) { return s.layout().bias_tokens_col(); })
      .def_property_readonly("bias_values_col",
                             [](const SlotStateManager& s) { return s.layout().bias_values_col(); })
      .def_property_readonly("prompt_mask_col",
                             [](const SlotStateManager& s) { return s.layout().prompt_mask_col(); })
      .def_property_readonly("prompt_mask_words",
                             [](const SlotStateManager& s) { return s.layout().prompt_mask_words; });
}
