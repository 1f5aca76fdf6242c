// SlotStateManager: owns the per-slot sampling state of a backend (DESIGN §2).
//
// Host side: which request id owns each pool row, flip detection, validation. Device side: one
// int32 slot table [pool_rows, row_words] (layout in tokensampler/slot_layout.h) that the
// kernels read by req_pool_indices. A step's flipped rows are packed on the host into one
// staging buffer and reach the device in a single copy, followed by one index_copy_; only the
// prefix of the rows a flip must write travels (slot_layout.h).
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "slot_params.h"
#include "tokensampler/slot_layout.h"

namespace tokensampler {

class SlotStateManager {
 public:
  SlotStateManager(int64_t pool_rows, int64_t vocab_size, int64_t history_capacity,
                   int64_t bias_capacity, bool with_min_p, torch::Device device);

  // The row layout a manager of these capacities uses (a prompt mask only with a history).
  static SlotLayout layout_for(int64_t vocab_size, int64_t history_capacity, int64_t bias_capacity);
  // Bytes of the slot table such a manager allocates (on its device, and once on the host to
  // stage it): so a caller can refuse a config that cannot fit before any allocation.
  static int64_t table_bytes(int64_t pool_rows, int64_t vocab_size, int64_t history_capacity,
                             int64_t bias_capacity) {
    return pool_rows * layout_for(vocab_size, history_capacity, bias_capacity).row_words() *
           int64_t{sizeof(int32_t)};
  }

  // Validates every input first (ValueError via std::invalid_argument, nothing written on
  // failure), then rewrites the rows of slots whose owner changed. Returns the step's route.
  Route prepare_step(const std::vector<std::string>& request_ids,
                     const std::vector<int64_t>& pool_indices,
                     const std::vector<SlotParams>& params,
                     const std::vector<std::optional<std::vector<int64_t>>>& prompt_token_ids);

  // Rewrites `slot` with neutral values (what capture warm-up dirtied) and forgets its owner.
  void reset_slot(int64_t slot);

  const torch::Tensor& table() const { return table_; }
  SlotLayout layout() const { return layout_; }
  int64_t pool_rows() const { return pool_rows_; }
  int64_t vocab_size() const { return vocab_size_; }
  std::optional<std::string> owner(int64_t slot) const;
  // Rows rewritten by flips since construction: lets tests observe "steady state does not rewrite".
  int64_t rows_written() const { return rows_written_; }

 private:
  void validate(const std::vector<std::string>& request_ids,
                const std::vector<int64_t>& pool_indices, const std::vector<SlotParams>& params,
                const std::vector<std::optional<std::vector<int64_t>>>& prompt_token_ids) const;
  // Whether a flip to `p` sets bits in the slot's prompt mask.
  bool sets_prompt_mask(const SlotParams& p, const std::optional<std::vector<int64_t>>& prompt) const;
  // Words of the row prefix a flip to `p` writes: the scalars, its bias entries, and the prompt
  // mask when `with_mask` (the slot had one or gets one).
  int32_t flip_words(const SlotParams& p, bool with_mask) const;
  // Writes words [0, words) of a row for `p` (words from flip_words, or more).
  void pack_row(int32_t* row, int32_t words, const SlotParams& p,
                const std::optional<std::vector<int64_t>>& prompt) const;
  // Copies staged [n, w] into the first w words of the slots' rows.
  void upload(const std::vector<int64_t>& slots, const torch::Tensor& staged);

  int64_t pool_rows_;
  int64_t vocab_size_;
  SlotLayout layout_;
  bool with_min_p_;
  torch::Device device_;
  torch::Tensor table_;
  std::vector<std::optional<std::string>> owners_;
  std::unordered_map<std::string, int64_t> slot_of_;  // each owner's slot (owners_ inverted)
  std::vector<uint8_t> prompt_mask_set_;  // per slot: its prompt mask may hold bits
  std::vector<uint8_t> flipping_;         // per slot, during prepare_step: already listed

  // Gives `slot` to request `rid`: the slot's previous owner loses it, and so does the slot rid
  // held before, so that coming back to it is a flip (DESIGN §2).
  void claim(int64_t slot, const std::string& rid);
  // Leaves `slot` without an owner (a request owns one slot, so owners_ and slot_of_ invert).
  void release(int64_t slot);
  int64_t rows_written_ = 0;
};

}  // namespace tokensampler
