// Layout of one slot's row in the slot table, shared by the SlotStateManager (which writes
// rows on flip), the CPU kernels and the CUDA kernels (which read them).
//
// The table is one int32 tensor [pool_rows, row_words(H, B)] on the config's device; float
// fields are stored as their bit patterns. One table means a flip is one host-to-device copy
// of the packed new rows plus one index_copy_, however many fields and slots change.
//
// Penalty state: a sorted list of the distinct output tokens with their counts (H entries at
// most) and, in tables that have a history, a bitmask of the prompt's tokens (P = ceil(V / 32)
// words, V / 8 bytes: a 128k-token prompt costs what a 1-token one does). A slot costs
// 4 * (kScalarWords + 2H + 2B + P) bytes, not 4 * V.
//
// Row order: scalars, bias list (B tokens, B values), prompt mask, history list (H tokens, H
// counts). What a flip writes comes first, so a flip writes a prefix of the row: the lists are
// read only up to their lengths (scalars), so emptying one is writing its length, and the prompt
// mask is written only where the slot had one or gets one (SlotStateManager::prepare_step).
#pragma once

#include "tokensampler/platform.h"

namespace tokensampler {

enum SlotColumn : int {
  kColTemperature = 0,   // f32, 0 = greedy
  kColTopK = 1,          // i32, <= 0 or >= V = disabled
  kColTopP = 2,          // f32, 1 = disabled
  kColMinP = 3,          // f32, 0 = disabled
  kColRepetition = 4,    // f32, 1 = disabled
  kColFrequency = 5,     // f32
  kColPresence = 6,      // f32
  kColSeedLo = 7,        // low 32 bits of the 64-bit seed
  kColSeedHi = 8,        // high 32 bits
  kColHistoryLen = 9,    // i32, distinct output tokens in the history list
  kColBiasLen = 10,      // i32, entries in the bias list
  kColHistoryDropped = 11,  // i32, output tokens not recorded because the list was full
  kScalarWords = 12,
};

struct SlotLayout {
  int32_t history_capacity;   // H
  int32_t bias_capacity;      // B
  int32_t prompt_mask_words;  // P: ceil(V / 32) with a history, else 0

  TS_HD int32_t row_words() const {
    return kScalarWords + 2 * history_capacity + 2 * bias_capacity + prompt_mask_words;
  }
  // Offset of a slot's row in the table, in 64 bits (a pool of 2^20 slots at V = 2^20 spans
  // more than 2^31 words).
  TS_HD int64_t row_offset(int64_t slot) const { return slot * row_words(); }
  TS_HD int32_t bias_tokens_col() const { return kScalarWords; }
  TS_HD int32_t bias_values_col() const { return kScalarWords + bias_capacity; }
  TS_HD int32_t prompt_mask_col() const { return kScalarWords + 2 * bias_capacity; }
  TS_HD int32_t history_tokens_col() const { return prompt_mask_col() + prompt_mask_words; }
  TS_HD int32_t history_counts_col() const { return history_tokens_col() + history_capacity; }
};

// Index of `token` in the ascending list[0, n), or -1.
TS_HD int32_t sorted_index(const int32_t* list, int32_t n, int32_t token) {
  int32_t lo = 0, hi = n;
  while (lo < hi) {
    const int32_t mid = (lo + hi) >> 1;
    if (list[mid] < token) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && list[lo] == token ? lo : -1;
}

// Read-only view of one slot's row.
struct SlotRow {
  const int32_t* w;
  SlotLayout layout;

  TS_HD float temperature() const { return bits_float(static_cast<uint32_t>(w[kColTemperature])); }
  TS_HD int32_t top_k() const { return w[kColTopK]; }
  TS_HD float top_p() const { return bits_float(static_cast<uint32_t>(w[kColTopP])); }
  TS_HD float min_p() const { return bits_float(static_cast<uint32_t>(w[kColMinP])); }
  TS_HD float repetition() const { return bits_float(static_cast<uint32_t>(w[kColRepetition])); }
  TS_HD float frequency() const { return bits_float(static_cast<uint32_t>(w[kColFrequency])); }
  TS_HD float presence() const { return bits_float(static_cast<uint32_t>(w[kColPresence])); }
  TS_HD uint64_t seed() const {
    return (static_cast<uint64_t>(static_cast<uint32_t>(w[kColSeedHi])) << 32) |
           static_cast<uint32_t>(w[kColSeedLo]);
  }
  TS_HD int32_t history_len() const { return w[kColHistoryLen]; }
  // The history's entries as kernels read them: the stored count, clamped to [0, H].
  TS_HD int32_t history_size() const {
    const int32_t n = history_len();
    return n < 0 ? 0 : n > layout.history_capacity ? layout.history_capacity : n;
  }
  // The bias list's entries as kernels read them: clamped to [0, B].
  TS_HD int32_t bias_size() const {
    const int32_t n = bias_len();
    return n < 0 ? 0 : n > layout.bias_capacity ? layout.bias_capacity : n;
  }
  // Index of `token` in the sorted history list, or -1.
  TS_HD int32_t history_index(int32_t token) const { return sorted_index(history_tokens(), history_size(), token); }
  TS_HD int32_t bias_len() const { return w[kColBiasLen]; }
  TS_HD const int32_t* history_tokens() const { return w + layout.history_tokens_col(); }
  TS_HD const int32_t* history_counts() const { return w + layout.history_counts_col(); }
  TS_HD const int32_t* bias_tokens() const { return w + layout.bias_tokens_col(); }
  TS_HD float bias_value(int i) const {
    return bits_float(static_cast<uint32_t>(w[layout.bias_values_col() + i]));
  }
  TS_HD const uint32_t* prompt_mask() const {
    return reinterpret_cast<const uint32_t*>(w + layout.prompt_mask_col());
  }
  // Whether `token` is one of the prompt tokens the repetition penalty reads (bit token % 32
  // of word token / 32; the mask is written only for slots with a repetition penalty).
  TS_HD bool in_prompt(int32_t token) const {
    return token >= 0 && (token >> 5) < layout.prompt_mask_words &&
           ((prompt_mask()[token >> 5] >> (token & 31)) & 1u);
  }
  // Calls f(token) for each prompt token in mask words w_begin, w_begin + step, ... below
  // w_end (and the mask's end), lowest token first within a word.
  template <typename F>
  TS_HD void for_each_prompt_token(int32_t w_begin, int32_t w_end, int32_t step, F&& f) const {
    if (w_end > layout.prompt_mask_words) w_end = layout.prompt_mask_words;
    for (int32_t w = w_begin; w < w_end; w += step)
      for (uint32_t bits = prompt_mask()[w]; bits != 0u; bits &= bits - 1u)
        f(32 * w + lowest_set_bit(bits));
  }
};

// §4 penalties in verify: how many of a row's earlier drafts (drafts[0, n)) count as `token` in
// its history, so that verify equals plain decoding: there each accepted token was appended
// (append_history), a token already listed adding to its count and a new one taking an entry
// while fewer than H are used. A new token first drafted once the list is full was dropped, and
// so were its repeats; every other occurrence counts.
TS_HD int32_t recorded_draft_count(const SlotRow& s, const int32_t* drafts, int32_t n, int32_t token) {
  if (token < 0) return 0;  // append_history skips ids below 0 (never an accepted draft)
  int32_t count = 0, first = -1;
  for (int32_t k = 0; k < n; ++k) {
    if (drafts[k] != token) continue;
    if (first < 0) first = k;
    ++count;
  }
  const int32_t room = s.layout.history_capacity - s.history_size();
  // fewer drafts before the first than free entries: room was left whatever they were
  if (count == 0 || first < room || s.history_index(token) >= 0) return count;
  int32_t fresh = 0;  // distinct tokens new to the list among drafts[0, first)
  for (int32_t a = 0; a < first && fresh < room; ++a) {
    bool seen = drafts[a] < 0 || s.history_index(drafts[a]) >= 0;
    for (int32_t b = 0; b < a && !seen; ++b) seen = drafts[b] == drafts[a];
    fresh += !seen;
  }
  return fresh < room ? count : 0;
}

}  // namespace tokensampler
