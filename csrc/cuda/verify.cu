// Launch code of verify_chain, verify_rejection and append_history on CUDA (DESIGN §4).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../ops/op_checks.h"
#include "dispatch_logits.cuh"
#include "rejection_verdict.cuh"
#include "sample_kernel.cuh"
#include "sample_rows_paths.h"

namespace tokensampler::cuda {

namespace {

__global__ void verify_chain_kernel(const int32_t* __restrict__ cand, const int32_t* __restrict__ y,
                                    const bool* __restrict__ invalid, int64_t bs, int64_t n,
                                    int32_t* __restrict__ predict, int32_t* __restrict__ accept) {
  const int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (b >= bs) return;
  const int32_t length =
      chain_accept_length(cand + b * n, y + b * n, invalid ? invalid + b * n : nullptr, n);
  for (int64_t j = 0; j < n; ++j) predict[b * n + j] = j < length ? y[b * n + j] : -1;
  accept[b] = length;
}

void verify_chain(const at::Tensor& candidates, const at::Tensor& target_tokens,
                  at::Tensor& out_predict, at::Tensor& out_accept_length,
                  const std::optional<at::Tensor>& target_invalid) {
  check_verify_chain_args(candidates, target_tokens, out_predict, out_accept_length,
                          target_invalid);
  const int64_t bs = candidates.size(0), n = candidates.size(1);
  const auto device = candidates.device();
  if (bs == 0) return;
  const c10::cuda::CUDAGuard guard(device);
  const auto stream = at::cuda::getCurrentCUDAStream();
  constexpr int kThreads = 128;
  verify_chain_kernel<<<(bs + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      candidates.data_ptr<int32_t>(), target_tokens.data_ptr<int32_t>(),
      target_invalid ? target_invalid->data_ptr<bool>() : nullptr, bs, n,
      out_predict.data_ptr<int32_t>(), out_accept_length.data_ptr<int32_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The first index of sorted ids[0, len) whose id is not below `token`, by a whole warp: each
// round the 32 lanes probe evenly spaced entries of the range still open and a ballot keeps the
// gap between the last probe below the token and the next, so a history of H entries costs
// log32(H) rounds of dependent loads (two up to 1024 entries), not log2(H). Uniform result.
__device__ int32_t warp_lower_bound(const int32_t* ids, int32_t len, int32_t token, int lane) {
  int32_t lo = 0, hi = len;  // the answer lies in [lo, hi]
  while (hi - lo > 32) {
    const int32_t step = (hi - lo + 31) / 32;
    const int32_t probe = lo + lane * step;
    // The probes below the token are a prefix of the lanes: ids ascend.
    const int n = __popc(__ballot_sync(0xffffffffu, probe < hi && ids[probe] < token));
    if (n > 0) {
      hi = min(hi, lo + n * step);
      lo += (n - 1) * step + 1;
    } else {
      hi = lo;
    }
  }
  const int32_t at = lo + lane;
  return lo + __popc(__ballot_sync(0xffffffffu, at < hi && ids[at] < token));
}

// One warp per request (requests own distinct slots): the warp finds each token's place in the
// sorted history (warp_lower_bound); an insertion shifts the tail up by one, 32 entries a step
// from the top (each step reads before it writes, and the step below writes only what this one
// has read), so a long history costs len / 32 steps, not len.
__global__ void append_history_kernel(int32_t* __restrict__ table, SlotLayout layout,
                                      int64_t pool_rows, const int32_t* __restrict__ slots,
                                      const int32_t* __restrict__ tokens,
                                      const int32_t* __restrict__ accept_length, int64_t bs,
                                      int32_t tokens_per_req) {
  const int64_t b = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (b >= bs) return;  // whole warps: everything below is uniform across the warp
  const int32_t slot = slots[b];
  if (slot < 0 || slot >= pool_rows) return;
  int32_t* w = table + layout.row_offset(slot);
  const SlotRow row{w, layout};
  if (row.repetition() == 1.0f && row.frequency() == 0.0f && row.presence() == 0.0f) return;
  int32_t* ids = w + layout.history_tokens_col();
  int32_t* counts = w + layout.history_counts_col();
  const int32_t accepted = min(accept_length[b], tokens_per_req);
  for (int32_t k = 0; k < accepted; ++k) {
    const int32_t token = tokens[b * tokens_per_req + k];
    if (token < 0) continue;
    const int32_t len = w[kColHistoryLen];
    const int32_t lo = warp_lower_bound(ids, len, token, lane);
    if (lo < len && ids[lo] == token) {
      if (lane == 0) ++counts[lo];
    } else if (len < layout.history_capacity) {
      for (int32_t top = len; top > lo; top -= 32) {
        const int32_t m = top - lane;  // destination of ids[m - 1]
        int32_t id = 0, count = 0;
        if (m > lo) {
          id = ids[m - 1];
          count = counts[m - 1];
        }
        __syncwarp();
        if (m > lo) {
          ids[m] = id;
          counts[m] = count;
        }
        __syncwarp();
      }
      if (lane == 0) {
        ids[lo] = token;
        counts[lo] = 1;
        w[kColHistoryLen] = len + 1;
      }
    } else if (lane == 0) {
      ++w[kColHistoryDropped];
    }
    __syncwarp();
  }
}

void append_history(at::Tensor& slot_table, int64_t history_capacity, int64_t bias_capacity,
                    const at::Tensor& req_pool_indices, const at::Tensor& tokens,
                    const at::Tensor& accept_length, int64_t tokens_per_req) {
  check_append_history_args(slot_table, history_capacity, bias_capacity, req_pool_indices, tokens,
                            accept_length, tokens_per_req);
  const auto device = slot_table.device();
  const int64_t bs = accept_length.numel();
  if (bs == 0) return;
  const c10::cuda::CUDAGuard guard(device);
  const auto stream = at::cuda::getCurrentCUDAStream();
  constexpr int kThreads = 128;  // four requests per block
  append_history_kernel<<<(bs * 32 + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      slot_table.data_ptr<int32_t>(),
      slot_layout_of(slot_table, history_capacity, bias_capacity),
      slot_table.size(0), req_pool_indices.data_ptr<int32_t>(), tokens.data_ptr<int32_t>(),
      accept_length.data_ptr<int32_t>(), bs, static_cast<int32_t>(tokens_per_req));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

struct RejectionArgs : StepRows {  // tokens_per_req: n, the candidates of a request
  const int32_t* candidates;
  const float* draft_probs;  // [bs, n-1, V] float32 contiguous
  bool apply_penalties;
  bool judged;  // out_predict holds the split-row finisher's verdicts
  int32_t* out_predict;
  int32_t* out_accept;
  bool* out_invalid;
};

// The kept set's total top-p mass (row_rules.h): the denominator of every target probability
// rejection sampling compares, exact in any summation order.
template <typename T>
__device__ unsigned long long kept_mass(const LogitsRow<T>& x, const RowInput& row, const RowPlan& p,
                                        SampleSmem& sm) {
  unsigned long long total = 0;
  for (int32_t i = threadIdx.x; i < row.vocab; i += kSampleThreads) {
    float z;
    const float l = p.kind == kRowGreedy ? 0.0f : load_processed(x, row, sm, i);
    if (kept_z(p, row, i, l, z)) total += top_p_mass(z, p.z_max);
  }
  return block_sum<kSampleThreads>(total, sm.red_u);
}

// The chain walk, one block per request: its rows in order until a draft is rejected. A row the
// split-row finisher judged (a.judged: its verdict waits in out_predict, rejection_verdict.cuh)
// costs a read; any other row runs here, the whole block on it: plan_row's passes, the kept
// mass, the draft's decision and the residual draw.
template <typename T>
__global__ void __launch_bounds__(kSampleThreads)
    verify_rejection_kernel(const T* __restrict__ logits, RejectionArgs a) {
  __shared__ SampleSmem sm;
  __shared__ int32_t decision;
  const int64_t b = blockIdx.x;
  const int32_t n = a.tokens_per_req, V = a.vocab;
  int32_t* predict = a.out_predict + b * n;
  bool* invalid = a.out_invalid + b * n;
  const int32_t slot = a.req_pool_indices[b];
  if (slot < 0 || slot >= a.pool_rows) {
    for (int32_t k = threadIdx.x; k < n; k += kSampleThreads) {
      invalid[k] = true;
      predict[k] = k == 0 ? 0 : -1;
    }
    if (threadIdx.x == 0) a.out_accept[b] = 1;
    return;
  }
  const int32_t* words = a.slot_table + a.layout.row_offset(slot);
  const int64_t t = a.valid_cache_lengths[slot];
  const int32_t* cand = a.candidates + b * n;
  int32_t j = 0;
  for (; j < n; ++j) {
    if (a.judged) {
      const int32_t verdict = predict[j];
      __syncthreads();  // every thread has read it before it is replaced
      if (verdict == kVerdictAccept) {
        if (threadIdx.x == 0) predict[j] = cand[j + 1];
        continue;
      }
      if (verdict != kVerdictUndecided) break;  // the token the request stops at
    }
    const LogitsRow<T> x = a.row_of(logits, b * n + j);
    const RowInput row = make_row(words, a.layout, t + j, cand + 1, j, V, a.apply_penalties);
    const RowPlan p = plan_row(x, row, sm, false);
    // The row's own §3 sample (block-uniform: every thread takes the same branches).
    auto target_token = [&]() -> int32_t {
      if (p.kind == kRowGreedy) return p.best;
      if (p.kind == kRowFilter && p.fused) return p.fused_token;
      if (p.kind == kRowInvalid) return 0;
      return kept_sample(x, row, p, sm, false, nullptr).id;
    };
    if (threadIdx.x == 0) invalid[j] = p.kind == kRowInvalid;
    const int32_t draft = j + 1 < n ? cand[j + 1] : -1;
    // The bonus row, a row with nothing to compare against, or a draft that is not a token
    // (rejected, read through nowhere): the row's token is its target sample.
    if (j == n - 1 || p.kind == kRowInvalid || draft < 0 || draft >= V) {
      const int32_t token = target_token();
      if (threadIdx.x == 0) predict[j] = token;
      break;
    }
    RowPlan q = p;
    q.fused = false;  // the kept mass needs its own pass
    const unsigned long long total = kept_mass(x, row, q, sm);
    const float* qrow = a.draft_probs + (b * (n - 1) + j) * static_cast<int64_t>(V);
    __syncthreads();
    if (threadIdx.x == 0) {
      double p_draft = 0.0;
      float z;
      const float l = q.kind == kRowGreedy ? 0.0f : load_processed(x, row, sm, draft);
      if (kept_z(q, row, draft, l, z)) p_draft = kept_probability(top_p_mass(z, q.z_max), total);
      decision = draft_accepted(row.seed, t + j, qrow[draft], p_draft) ? 1 : 0;
      if (decision) predict[j] = draft;
    }
    __syncthreads();
    if (decision) continue;
    // Rejected: Gumbel-max draw from normalise(max(p - q, 0)) over the kept set.
    Candidate best{kNegInf, kNoId};
    for (int32_t i = threadIdx.x; i < V; i += kSampleThreads) {
      float z;
      const float l = q.kind == kRowGreedy ? 0.0f : load_processed(x, row, sm, i);
      if (!kept_z(q, row, i, l, z)) continue;
      float score;
      if (residual_score(kept_probability(top_p_mass(z, q.z_max), total), qrow[i], row.seed,
                         t + j, i, score))
        best = best_of(best, Candidate{score, i});
    }
    best = block_best(best, sm);
    const int32_t token = best.id < V ? best.id : target_token();
    if (threadIdx.x == 0) predict[j] = token;
    break;
  }
  __syncthreads();
  for (int32_t k = j + 1 + threadIdx.x; k < n; k += kSampleThreads) {
    invalid[k] = false;
    predict[k] = -1;
  }
  if (threadIdx.x == 0) a.out_accept[b] = min(j, n - 1) + 1;
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
  if (bs == 0) return;
  const c10::cuda::CUDAGuard guard(logits.device());
  const auto stream = at::cuda::getCurrentCUDAStream();
  // float32 draft probabilities as given are read in place; other dtypes are converted
  // (stream-ordered caching allocation, graph-safe).
  const at::Tensor q = draft_probs.scalar_type() == at::kFloat && draft_probs.is_contiguous()
                           ? draft_probs
                           : draft_probs.to(at::kFloat).contiguous();
  // Top-k steps: every row judged at once on the split-row path, its verdict in out_predict.
  const SlotLayout layout = slot_layout_of(slot_table, history_capacity, bias_capacity);
  const std::optional<at::Tensor> drafts = candidates;
  const std::optional<at::Tensor> no_logprobs;
  const SampleRowsCall call{logits, req_pool_indices, valid_cache_lengths, slot_table, layout,
                            n, drafts, apply_penalties, /*logprobs_mode=*/0,
                            static_cast<Route>(route), max_top_k, out_predict, out_invalid,
                            no_logprobs, workspace, token_bitmask};
  RejectionArgs a{};
  static_cast<StepRows&>(a) = step_rows_of(call);
  a.judged = split_row::try_verify_rejection(call, q);
  a.candidates = candidates.data_ptr<int32_t>();
  a.draft_probs = q.data_ptr<float>();
  a.apply_penalties = apply_penalties;
  a.out_predict = out_predict.data_ptr<int32_t>();
  a.out_accept = out_accept_length.data_ptr<int32_t>();
  a.out_invalid = out_invalid.data_ptr<bool>();
  auto launch = [&](auto tag) {
    using scalar_t = decltype(tag);
    verify_rejection_kernel<scalar_t><<<bs, kSampleThreads, 0, stream>>>(
          logits.data_ptr<scalar_t>(), a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  dispatch_logits_dtype(logits.scalar_type(), launch);
}

}  // namespace

TORCH_LIBRARY_IMPL(tokensampler, CUDA, m) {
  m.impl("verify_chain", &verify_chain);
  m.impl("verify_rejection", &verify_rejection);
  m.impl("append_history", &append_history);
}

}  // namespace tokensampler::cuda
