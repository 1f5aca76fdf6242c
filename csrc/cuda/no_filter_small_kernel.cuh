// The single launch of small no-filter steps (launch code: split_row_sample.cu): steps of at most
// a few rows whose route is no_filter, without penalties, logprobs or a grammar bitmask, the
// case a latency-bound bs-1 decode step is. Each block takes 1024 tokens of a row, one group of
// four a thread, so a row's first tokens reach the SMs after one load, not a round of them, and a
// thread keeps only the three maxima the row's token needs: the argmax of the logits (greedy rows,
// and a row with none finite is invalid), the best z + G of the finite tokens and the best G of
// the +inf ones (DESIGN §3.1, §3.7). The chunk kernel's general machinery (penalty bitmaps,
// top-k buffers, raw partials) costs this case most of its instructions (run 91: ~10 warp
// instructions a token at bs 1). As there, the block that draws its row's last ticket finishes
// the row and resets the ticket.
#pragma once

#include <cuda_runtime.h>

#include "split_row_args.cuh"
#include "split_row_kernel.cuh"

namespace tokensampler::cuda::split_row {

constexpr int kSmallThreads = 256;
constexpr int32_t kSmallChunk = 4 * kSmallThreads;  // tokens a block: one group a thread

// Grid: rows * a.splits blocks of kSmallThreads (a.chunk_len == kSmallChunk); a.results holds
// a.splits Partials a row (the three maxima; the counts stay 0), a.tickets one zeroed ticket a
// row.
template <typename T>
__global__ void __launch_bounds__(kSmallThreads)
    no_filter_small_kernel(const T* __restrict__ logits, Args a) {
  __shared__ Partial scratch[kSmallThreads / 32];
  __shared__ bool finishes_row;
  const int64_t r = blockIdx.x / a.splits;
  const int32_t split = blockIdx.x % a.splits;
  const int32_t i = split * kSmallChunk + 4 * static_cast<int32_t>(threadIdx.x);
  wait_for_prior_grids();
  // The logits first: their address needs no slot, so their load overlaps the slot's.
  float x[4];
  load4(a.row_of<false>(logits, r), i, a.vocab, x);  // -inf past the row
  const RowParams p = row_params(a, r);
  auto* results = reinterpret_cast<Partial*>(a.results);
  if (!p.valid_slot) {  // the row is flagged without reading its chunks; no ticket is taken
    if (split == 0) write_unreadable_row(r, a.out_tokens, a.out_invalid, a.out_logprobs);
    return;
  }
  const Candidate hole{kNegInf, kNoId};
  Partial v{hole, hole, hole, 0, 0};
  float x_max = kNegInf;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    x[q] = fmaxf(x[q], kNegInf);  // sanitize_logit: NaN -> -inf
    if (i + q < a.vocab) v.argmax = best_of(v.argmax, Candidate{x[q], i + q});
    x_max = fmaxf(x_max, x[q]);
  }
  if (!p.greedy && x_max > kNegInf) {
    const Philox4 w = random_words(p.seed, p.position, static_cast<uint32_t>(i) >> 2, kStreamGumbel);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (x[q] == INFINITY) {
        v.inf_best = best_of(v.inf_best, Candidate{gumbel_of_word(w.v[q]), i + q});
      } else if (x[q] > kNegInf) {
        // Exact pruning: rounding is monotone and gumbel_upper_bound bounds the noise, so a
        // token whose z plus the bound falls below the best so far cannot win (ties are scored).
        const float z = scaled_logit(x[q], p.temperature);
        if (f_add(z, gumbel_upper_bound(w.v[q])) < v.best.z) continue;
        v.best = best_of(v.best, Candidate{f_add(z, gumbel_of_word(w.v[q])), i + q});
      }
    }
  }
  v = block_partial<kSmallThreads>(v, scratch);
  if (threadIdx.x == 0) results[blockIdx.x] = v;
  // The block that draws the row's last ticket merges the row's results.
  if (!last_block_of_row(a.tickets, r, a.splits, finishes_row)) return;
  Partial row{hole, hole, hole, 0, 0};
  for (int32_t s = threadIdx.x; s < a.splits; s += kSmallThreads) {
    const Partial* c = results + r * a.splits + s;
    row.argmax = best_of(row.argmax, load_candidate(&c->argmax));
    row.best = best_of(row.best, load_candidate(&c->best));
    row.inf_best = best_of(row.inf_best, load_candidate(&c->inf_best));
  }
  row = block_partial<kSmallThreads>(row, scratch);
  if (threadIdx.x == 0) {
    // finish_row's no-filter rows: an invalid row takes token 0, a greedy one its argmax, any
    // other a +inf logit's best noise where it has one, else its best score.
    const bool invalid = row.argmax.z == kNegInf;
    a.out_tokens[r] = invalid ? 0
                      : p.greedy ? row.argmax.id
                      : row.inf_best.id != kNoId ? row.inf_best.id : row.best.id;
    a.out_invalid[r] = invalid;
  }
}

}  // namespace tokensampler::cuda::split_row
