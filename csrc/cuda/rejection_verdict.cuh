// DESIGN §4 rejection sampling of one verify row over an explicit kept set: the split-row
// finisher's ranked candidates (split_row_finish.cuh). The row's verdict is the draft accepted,
// or the token the request stops at (the residual draw, else the row's target sample), in the
// arithmetic of the CPU kernel and of verify.cu's one-block walker: integer top-p masses, their
// exact total, the accept coin and residual noise keyed by (seed, position, token).
#pragma once

#include <cuda_runtime.h>

#include "device_primitives.cuh"
#include "tokensampler/rng.h"
#include "tokensampler/row_rules.h"

namespace tokensampler::cuda {

// A row's verdict where it is not a token (>= 0, the one the request stops at).
constexpr int32_t kVerdictAccept = -1;     // the row's draft is accepted: the chain goes on
constexpr int32_t kVerdictUndecided = -2;  // left to verify.cu's one-block walker

// The kept set of a row among the first `count` candidates of buf (in rank order where top-p or
// +inf logits need it): those with z >= cut; a row with +inf processed logits keeps its first
// `count` (+inf) ones, each of z 0 (DESIGN §3.6). z_max is the one the top-p masses are taken
// against (0 in a +inf row).
struct KeptSet {
  const Candidate* buf;
  int count;
  float cut;
  float z_max;
  bool inf_row;

  __device__ __forceinline__ bool has(int j) const { return inf_row || buf[j].z >= cut; }
  __device__ __forceinline__ float z(int j) const { return inf_row ? 0.0f : buf[j].z; }
  __device__ __forceinline__ unsigned long long mass(int j) const { return top_p_mass(z(j), z_max); }
};

// A greedy row keeps only its argmax, at probability 1: the draft is accepted when it is that
// token (the coin test, in the CPU's arithmetic, always passes then), and otherwise the request
// stops at the argmax, which both the residual draw and the target sample give.
__device__ __forceinline__ int32_t greedy_verdict(int32_t argmax, int32_t draft, const float* q,
                                                  uint64_t seed, int64_t position) {
  const unsigned long long mass = top_p_mass(0.0f, 0.0f);
  const double p_draft = draft == argmax ? kept_probability(mass, mass) : 0.0;
  return draft_accepted(seed, position, q[draft], p_draft) ? kVerdictAccept : argmax;
}

// The verdict of a filtered row with draft `draft` (a token) and draft probabilities q (the
// row's [V] floats): accept when coin * q(draft) < p(draft), p the kept set's masses over their
// total; else a Gumbel-max draw from max(p - q, 0) over the kept set, or `target` where that is
// empty. Every thread of the block calls it and gets the verdict; red_u and scratch hold one
// value per warp.
template <int kThreads>
__device__ __noinline__ int32_t rejection_verdict(const KeptSet kept, int32_t draft, const float* q,
                                                  uint64_t seed, int64_t position, int32_t target,
                                                  unsigned long long* red_u, Candidate* scratch) {
  unsigned long long total = 0, draft_mass = 0;
  for (int j = threadIdx.x; j < kept.count; j += kThreads) {
    if (!kept.has(j)) continue;
    const unsigned long long m = kept.mass(j);
    total += m;
    if (kept.buf[j].id == draft) draft_mass = m;
  }
  total = block_sum<kThreads>(total, red_u);
  draft_mass = block_sum<kThreads>(draft_mass, red_u);
  if (draft_accepted(seed, position, q[draft], kept_probability(draft_mass, total)))
    return kVerdictAccept;
  Candidate best{kNegInf, kNoId};
  for (int j = threadIdx.x; j < kept.count; j += kThreads) {
    if (!kept.has(j)) continue;
    const int32_t id = kept.buf[j].id;
    float score;
    if (residual_score(kept_probability(kept.mass(j), total), q[id], seed, position, id, score))
      best = best_of(best, Candidate{score, id});
  }
  best = block_best<kThreads>(best, scratch);
  return best.id != kNoId ? best.id : target;
}

}  // namespace tokensampler::cuda
