// CPU kernel of penalize_logits: DESIGN §3.1–3.4 written out as processed fp32 logits.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "op_checks.h"
#include "row_reference.h"

namespace tokensampler::cpu {

namespace {

void penalize_logits(const at::Tensor& logits, const at::Tensor& req_pool_indices,
                     const at::Tensor& slot_table, int64_t history_capacity, int64_t bias_capacity,
                     int64_t tokens_per_req, const std::optional<at::Tensor>& candidates,
                     int64_t vocab_offset, at::Tensor& out) {
  check_penalize_args(logits, req_pool_indices, slot_table, history_capacity, bias_capacity,
                      tokens_per_req, candidates, out);
  out.copy_(logits);
  const int32_t V = static_cast<int32_t>(logits.size(1));
  const SlotLayout layout = slot_layout_of(slot_table, history_capacity, bias_capacity);
  const int32_t* slots = req_pool_indices.data_ptr<int32_t>();
  const int32_t* cand = candidates ? candidates->data_ptr<int32_t>() : nullptr;
  at::parallel_for(0, out.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / tokens_per_req, j = r % tokens_per_req;
      float* row = out.data_ptr<float>() + r * V;
      const int32_t slot = slots[b];
      if (slot < 0 || slot >= slot_table.size(0)) {  // untrusted index: sanitize only
        for (int32_t i = 0; i < V; ++i) row[i] = row[i] != row[i] ? -INFINITY : row[i];
        continue;
      }
      const RowContext ctx{SlotRow{slot_table.data_ptr<int32_t>() + layout.row_offset(slot), layout},
                           0, V, cand ? cand + b * tokens_per_req + 1 : nullptr,
                           cand ? static_cast<int32_t>(j) : 0, true,
                           static_cast<int32_t>(vocab_offset)};
      penalize_row(row, ctx);
    }
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(tokensampler, CPU, m) { m.impl("penalize_logits", &penalize_logits); }

}  // namespace tokensampler::cpu
