#include "slot_state_manager.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace tokensampler {

namespace {

int32_t float_word(float x) { return static_cast<int32_t>(float_bits(x)); }

template <typename... Parts>
std::invalid_argument value_error(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return std::invalid_argument(os.str());
}

}  // namespace

SlotStateManager::SlotStateManager(int64_t pool_rows, int64_t vocab_size, int64_t history_capacity,
                                   int64_t bias_capacity, bool with_min_p, torch::Device device)
    : pool_rows_(pool_rows),
      vocab_size_(vocab_size),
      layout_(layout_for(vocab_size, history_capacity, bias_capacity)),
      with_min_p_(with_min_p),
      device_(device),
      owners_(static_cast<size_t>(std::max<int64_t>(pool_rows, 0))),
      prompt_mask_set_(owners_.size()),
      flipping_(owners_.size()) {
  if (pool_rows < 1) throw value_error("pool_rows=", pool_rows, " must be >= 1");
  if (vocab_size < 1 || vocab_size > (int64_t{1} << 20))
    throw value_error("vocab_size=", vocab_size, " must be in [1, 2^20]");
  if (history_capacity < 0 || bias_capacity < 0)
    throw value_error("history_capacity=", history_capacity, ", bias_capacity=", bias_capacity,
                      " must be >= 0");
  auto neutral = torch::zeros({pool_rows, layout_.row_words()}, torch::kInt32);
  const SlotParams defaults;
  for (int64_t s = 0; s < pool_rows; ++s)
    pack_row(neutral[s].data_ptr<int32_t>(), kScalarWords, defaults, {});
  table_ = neutral.to(device_);
}

SlotLayout SlotStateManager::layout_for(int64_t vocab_size, int64_t history_capacity,
                                        int64_t bias_capacity) {
  return SlotLayout{static_cast<int32_t>(history_capacity), static_cast<int32_t>(bias_capacity),
                    history_capacity > 0 ? static_cast<int32_t>((vocab_size + 31) / 32) : 0};
}

std::optional<std::string> SlotStateManager::owner(int64_t slot) const {
  if (slot < 0 || slot >= pool_rows_) throw value_error("slot=", slot, " is outside [0, ", pool_rows_, ")");
  return owners_[slot];
}

void SlotStateManager::validate(
    const std::vector<std::string>& request_ids, const std::vector<int64_t>& pool_indices,
    const std::vector<SlotParams>& params,
    const std::vector<std::optional<std::vector<int64_t>>>& prompt_token_ids) const {
  if (request_ids.size() != pool_indices.size() || request_ids.size() != params.size() ||
      (!prompt_token_ids.empty() && prompt_token_ids.size() != request_ids.size()))
    throw value_error("prepare_step expects aligned per-request lists; got request_ids=",
                      request_ids.size(), ", request_pool_indices=", pool_indices.size(),
                      ", sampling_params_list=", params.size(),
                      ", prompt_token_ids=", prompt_token_ids.size());
  // One request per slot: entries sorted by (slot, index), so those naming one slot are
  // adjacent (O(n log n): a step can hold thousands of requests).
  std::vector<std::pair<int64_t, size_t>> by_slot(pool_indices.size());
  for (size_t i = 0; i < pool_indices.size(); ++i) {
    if (pool_indices[i] < 0 || pool_indices[i] >= pool_rows_)
      throw value_error("request_pool_indices[", i, "]=", pool_indices[i], " is outside [0, ",
                        pool_rows_, ") for rid=", request_ids[i]);
    by_slot[i] = {pool_indices[i], i};
  }
  std::sort(by_slot.begin(), by_slot.end());
  for (size_t k = 1; k < by_slot.size(); ++k) {
    const auto [slot, first] = by_slot[k - 1];
    const size_t i = by_slot[k].second;
    if (by_slot[k].first == slot && request_ids[first] != request_ids[i])
      throw value_error("request_pool_indices[", i, "]=", slot,
                        " is given to two requests in one step (", request_ids[first], ", ",
                        request_ids[i], ")");
  }
  for (size_t i = 0; i < pool_indices.size(); ++i) {
    // Parameter values are validated once, in Python (SamplingParams.normalize). What is
    // checked here keeps the table sound for any caller of this class: list sizes and token
    // ids the kernels index with, one request per slot, no NaN bias written to a slot.
    const SlotParams& p = params[i];
    if (static_cast<int64_t>(p.logit_bias.size()) > layout_.bias_capacity)
      throw value_error("request ", i, ": logit_bias has ", p.logit_bias.size(),
                        " entries, more than this backend's bias capacity ", layout_.bias_capacity);
    for (const auto& [token, bias] : p.logit_bias) {
      if (token < 0 || token >= vocab_size_)
        throw value_error("request ", i, ": logit_bias token ", token, " is outside [0, ",
                          vocab_size_, ")");
      if (std::isnan(bias))
        throw value_error("request ", i, ": logit_bias[", token, "]=nan is not a number");
    }
    if (!prompt_token_ids.empty() && prompt_token_ids[i]) {
      for (int64_t token : *prompt_token_ids[i])
        if (token < 0 || token >= vocab_size_)
          throw value_error("request ", i, ": prompt token ", token, " is outside [0, ",
                            vocab_size_, ")");
    }
  }
}

bool SlotStateManager::sets_prompt_mask(const SlotParams& p,
                                        const std::optional<std::vector<int64_t>>& prompt) const {
  return prompt && !prompt->empty() && p.repetition_penalty != 1.0f && layout_.prompt_mask_words > 0;
}

int32_t SlotStateManager::flip_words(const SlotParams& p, bool with_mask) const {
  if (with_mask) return layout_.prompt_mask_col() + layout_.prompt_mask_words;
  if (p.logit_bias.empty()) return kScalarWords;
  return layout_.bias_values_col() + static_cast<int32_t>(p.logit_bias.size());
}

void SlotStateManager::pack_row(int32_t* row, int32_t words, const SlotParams& p,
                                const std::optional<std::vector<int64_t>>& prompt) const {
  std::fill(row, row + words, 0);
  row[kColTemperature] = float_word(p.temperature);
  row[kColTopK] = p.top_k;
  row[kColTopP] = float_word(p.top_p);
  row[kColMinP] = float_word(with_min_p_ ? p.min_p : 0.0f);
  row[kColRepetition] = float_word(p.repetition_penalty);
  row[kColFrequency] = float_word(p.frequency_penalty);
  row[kColPresence] = float_word(p.presence_penalty);
  row[kColSeedLo] = static_cast<int32_t>(static_cast<uint32_t>(p.seed));
  row[kColSeedHi] = static_cast<int32_t>(static_cast<uint32_t>(p.seed >> 32));

  // Prompt tokens matter only to the repetition penalty: one bit each in the prompt mask,
  // however long the prompt. The output history starts empty (fill above).
  if (sets_prompt_mask(p, prompt)) {
    auto* mask = reinterpret_cast<uint32_t*>(row + layout_.prompt_mask_col());
    for (int64_t token : *prompt) mask[token >> 5] |= 1u << (token & 31);
  }

  // Bias entries sorted by token; a repeated token keeps its last value.
  std::vector<std::pair<int64_t, float>> bias = p.logit_bias;
  std::stable_sort(bias.begin(), bias.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  int32_t n = 0;
  for (size_t j = 0; j < bias.size(); ++j) {
    if (n > 0 && row[layout_.bias_tokens_col() + n - 1] == bias[j].first) --n;
    row[layout_.bias_tokens_col() + n] = static_cast<int32_t>(bias[j].first);
    row[layout_.bias_values_col() + n] = float_word(bias[j].second);
    ++n;
  }
  row[kColBiasLen] = n;
}

void SlotStateManager::upload(const std::vector<int64_t>& slots, const torch::Tensor& staged) {
  if (slots.empty()) return;
  auto index = torch::tensor(slots, torch::kInt64);
  const int64_t w = staged.size(1);
  auto prefix = table_.narrow(1, 0, w);  // the rows' first w words (a strided view)
  if (device_.is_cpu()) {
    prefix.index_copy_(0, index, staged);
    return;
  }
  // Slot indices travel in the same pinned buffer as the rows: one host-to-device copy.
  auto packed = torch::empty({static_cast<int64_t>(slots.size()), w + 1},
                             torch::TensorOptions().dtype(torch::kInt32).pinned_memory(true));
  packed.narrow(1, 0, w).copy_(staged);
  packed.select(1, w).copy_(index);
  auto on_device = packed.to(device_, /*non_blocking=*/true);
  prefix.index_copy_(0, on_device.select(1, w).to(torch::kInt64), on_device.narrow(1, 0, w));
}

Route SlotStateManager::prepare_step(
    const std::vector<std::string>& request_ids, const std::vector<int64_t>& pool_indices,
    const std::vector<SlotParams>& params,
    const std::vector<std::optional<std::vector<int64_t>>>& prompt_token_ids) {
  validate(request_ids, pool_indices, params, prompt_token_ids);

  std::vector<int64_t> flipped;
  std::vector<size_t> sources;
  flipped.reserve(request_ids.size());  // nothing below throws while a flipping_ flag is set
  sources.reserve(request_ids.size());
  for (size_t i = 0; i < request_ids.size(); ++i) {
    const int64_t slot = pool_indices[i];
    if (owners_[slot] == request_ids[i] || flipping_[slot]) continue;  // (a rid listed twice)
    flipping_[slot] = 1;
    flipped.push_back(slot);
    sources.push_back(i);
  }
  for (int64_t slot : flipped) flipping_[slot] = 0;
  if (!flipped.empty()) {
    const std::optional<std::vector<int64_t>> no_prompt;
    auto prompt_of = [&](size_t i) -> const std::optional<std::vector<int64_t>>& {
      return prompt_token_ids.empty() ? no_prompt : prompt_token_ids[i];
    };
    // One prefix width for the step: the widest any flipped row needs.
    int32_t words = kScalarWords;
    for (size_t f = 0; f < flipped.size(); ++f) {
      const size_t i = sources[f];
      const bool with_mask = prompt_mask_set_[flipped[f]] || sets_prompt_mask(params[i], prompt_of(i));
      words = std::max(words, flip_words(params[i], with_mask));
    }
    auto staged = torch::empty({static_cast<int64_t>(flipped.size()), words}, torch::kInt32);
    for (size_t f = 0; f < flipped.size(); ++f)
      pack_row(staged.data_ptr<int32_t>() + f * words, words, params[sources[f]],
               prompt_of(sources[f]));
    upload(flipped, staged);
    for (size_t f = 0; f < flipped.size(); ++f) {
      const size_t i = sources[f];
      prompt_mask_set_[flipped[f]] = sets_prompt_mask(params[i], prompt_of(i));
      claim(flipped[f], request_ids[i]);
    }
    rows_written_ += static_cast<int64_t>(flipped.size());
  }
  return select_route(params, vocab_size_, with_min_p_);
}

void SlotStateManager::release(int64_t slot) {
  if (!owners_[slot]) return;
  slot_of_.erase(*owners_[slot]);
  owners_[slot].reset();
}

void SlotStateManager::claim(int64_t slot, const std::string& rid) {
  release(slot);
  const auto held = slot_of_.find(rid);
  if (held != slot_of_.end()) release(held->second);
  owners_[slot] = rid;
  slot_of_[rid] = slot;
}

void SlotStateManager::reset_slot(int64_t slot) {
  if (slot < 0 || slot >= pool_rows_) throw value_error("slot=", slot, " is outside [0, ", pool_rows_, ")");
  const SlotParams neutral;
  const int32_t words = flip_words(neutral, prompt_mask_set_[slot] != 0);
  auto staged = torch::empty({1, words}, torch::kInt32);
  pack_row(staged.data_ptr<int32_t>(), words, neutral, std::nullopt);
  upload({slot}, staged);
  prompt_mask_set_[slot] = 0;
  release(slot);
}

}  // namespace tokensampler
