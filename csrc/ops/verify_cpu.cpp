// CPU kernels of the speculative-decoding verify ops (DESIGN §4) and of append_history.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "op_checks.h"
#include "row_reference.h"
#include "tokensampler/rng.h"
#include "tokensampler/row_rules.h"

namespace tokensampler::cpu {

namespace {

void verify_chain(const at::Tensor& candidates, const at::Tensor& target_tokens,
                  at::Tensor& out_predict, at::Tensor& out_accept_length,
                  const std::optional<at::Tensor>& target_invalid) {
  check_verify_chain_args(candidates, target_tokens, out_predict, out_accept_length,
                          target_invalid);
  const int64_t bs = candidates.size(0), n = candidates.size(1);
  const int32_t* cand = candidates.data_ptr<int32_t>();
  const int32_t* y = target_tokens.data_ptr<int32_t>();
  const bool* invalid = target_invalid ? target_invalid->data_ptr<bool>() : nullptr;
  int32_t* predict = out_predict.data_ptr<int32_t>();
  int32_t* accept = out_accept_length.data_ptr<int32_t>();
  for (int64_t b = 0; b < bs; ++b) {
    accept[b] =
        chain_accept_length(cand + b * n, y + b * n, invalid ? invalid + b * n : nullptr, n);
    for (int64_t j = 0; j < n; ++j) predict[b * n + j] = j < accept[b] ? y[b * n + j] : -1;
  }
}

// Gumbel-max draw from normalise(max(p - q, 0)) over the kept set; -1 if that is empty.
int32_t sample_residual(const RowDistribution& dist, const std::vector<double>& p,
                        const float* q, uint64_t seed, int64_t position) {
  int32_t best = -1;
  float best_score = 0.0f;
  for (size_t k = 0; k < dist.kept.size(); ++k) {
    const int32_t i = dist.kept[k];
    float score;
    if (!residual_score(p[k], q[i], seed, position, i, score)) continue;
    if (best < 0 || ranks_before(score, i, best_score, best)) {
      best = i;
      best_score = score;
    }
  }
  return best;
}

void verify_rejection(const at::Tensor& logits, const at::Tensor& req_pool_indices,
                      const at::Tensor& valid_cache_lengths, const at::Tensor& slot_table,
                      int64_t history_capacity, int64_t bias_capacity,
                      const at::Tensor& candidates, const at::Tensor& draft_probs,
                      bool apply_penalties, int64_t route, int64_t max_top_k,
                      at::Tensor& out_predict, at::Tensor& out_accept_length,
                      at::Tensor& out_invalid, const std::optional<at::Tensor>& token_bitmask,
                      const std::optional<at::Tensor>& workspace) {
  check_verify_rejection_args(logits, req_pool_indices, valid_cache_lengths, slot_table,
                              history_capacity, bias_capacity, candidates, draft_probs, route,
                              max_top_k, out_predict, out_accept_length, out_invalid,
                              token_bitmask, workspace);
  const int64_t bs = candidates.size(0), n = candidates.size(1);
  const int32_t V = static_cast<int32_t>(logits.size(1));
  const auto x = logits.to(at::kFloat).contiguous();
  const auto q_all = draft_probs.to(at::kFloat).contiguous();
  const SlotLayout layout = slot_layout_of(slot_table, history_capacity, bias_capacity);
  const int32_t* cand = candidates.data_ptr<int32_t>();
  int32_t* predict = out_predict.data_ptr<int32_t>();
  bool* invalid = out_invalid.data_ptr<bool>();
  const BitmaskRows masks = bitmask_rows(token_bitmask);

  for (int64_t b = 0; b < bs; ++b) {
    const int32_t slot = req_pool_indices.data_ptr<int32_t>()[b];
    std::fill(predict + b * n, predict + (b + 1) * n, -1);
    if (slot < 0 || slot >= slot_table.size(0)) {
      std::fill(invalid + b * n, invalid + (b + 1) * n, true);
      predict[b * n] = 0;
      out_accept_length.data_ptr<int32_t>()[b] = 1;
      continue;
    }
    const SlotRow row{slot_table.data_ptr<int32_t>() + layout.row_offset(slot), layout};
    const int64_t t = valid_cache_lengths.data_ptr<int32_t>()[slot];
    int64_t j = 0;
    for (; j < n; ++j) {
      RowContext ctx{row, t + j, V, cand + b * n + 1, static_cast<int32_t>(j), apply_penalties};
      ctx.allowed = masks.row(b * n + j);
      const RowDistribution dist = filter_row(x.data_ptr<float>() + (b * n + j) * V, ctx);
      invalid[b * n + j] = dist.invalid;
      if (j == n - 1 || dist.invalid) {  // bonus token, or nothing to compare against
        predict[b * n + j] = sample_kept(dist, ctx);
        break;
      }
      const int32_t draft = cand[b * n + j + 1];
      if (draft < 0 || draft >= V) {  // not a token: rejected, the row samples its target
        predict[b * n + j] = sample_kept(dist, ctx);
        break;
      }
      const float* q = q_all.data_ptr<float>() + (b * (n - 1) + j) * V;
      const std::vector<double> p = rejection_probabilities(dist);
      double p_draft = 0.0;
      for (size_t k = 0; k < dist.kept.size(); ++k)
        if (dist.kept[k] == draft) p_draft = p[k];
      if (draft_accepted(row.seed(), t + j, q[draft], p_draft)) {
        predict[b * n + j] = draft;
        continue;
      }
      const int32_t recovered = sample_residual(dist, p, q, row.seed(), t + j);
      predict[b * n + j] = recovered >= 0 ? recovered : sample_kept(dist, ctx);
      break;
    }
    for (int64_t k = j + 1; k < n; ++k) invalid[b * n + k] = false;
    out_accept_length.data_ptr<int32_t>()[b] = static_cast<int32_t>(j + 1);
  }
}

void append_history(at::Tensor& slot_table, int64_t history_capacity, int64_t bias_capacity,
                    const at::Tensor& req_pool_indices, const at::Tensor& tokens,
                    const at::Tensor& accept_length, int64_t tokens_per_req) {
  check_append_history_args(slot_table, history_capacity, bias_capacity, req_pool_indices, tokens,
                            accept_length, tokens_per_req);
  const int64_t bs = accept_length.numel();
  const SlotLayout layout = slot_layout_of(slot_table, history_capacity, bias_capacity);
  int32_t* table = slot_table.data_ptr<int32_t>();
  for (int64_t b = 0; b < bs; ++b) {
    const int32_t slot = req_pool_indices.data_ptr<int32_t>()[b];
    if (slot < 0 || slot >= slot_table.size(0)) continue;
    int32_t* w = table + layout.row_offset(slot);
    const SlotRow row{w, layout};
    if (row.repetition() == 1.0f && row.frequency() == 0.0f && row.presence() == 0.0f) continue;
    int32_t* ids = w + layout.history_tokens_col();
    int32_t* counts = w + layout.history_counts_col();
    const int32_t accepted = std::min<int32_t>(accept_length.data_ptr<int32_t>()[b], tokens_per_req);
    for (int32_t k = 0; k < accepted; ++k) {
      const int32_t token = tokens.data_ptr<int32_t>()[b * tokens_per_req + k];
      if (token < 0) continue;
      int32_t& len = w[kColHistoryLen];
      const int32_t pos = static_cast<int32_t>(std::lower_bound(ids, ids + len, token) - ids);
      if (pos < len && ids[pos] == token) {
        ++counts[pos];
      } else if (len < history_capacity) {  // keep the list sorted: shift the tail right
        std::copy_backward(ids + pos, ids + len, ids + len + 1);
        std::copy_backward(counts + pos, counts + len, counts + len + 1);
        ids[pos] = token;
        counts[pos] = 1;
        ++len;
      } else {
        ++w[kColHistoryDropped];
      }
    }
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(tokensampler, CPU, m) {
  m.impl("verify_chain", &verify_chain);
  m.impl("verify_rejection", &verify_rejection);
  m.impl("append_history", &append_history);
}

}  // namespace tokensampler::cpu
