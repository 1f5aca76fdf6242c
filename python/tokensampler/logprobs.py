"""DESIGN §3.8's raw logprobs for the paths that do not run the sampling kernels: given tokens
of whole rows (rejection verify, the FlashInfer adapters) through the `raw_logprobs` op, and
the per-shard partials of the vocab-parallel sampler in torch ops, by the kernels' rule
(`csrc/ops/row_reference.cpp`), rows with ±inf maxima included."""

from __future__ import annotations

import torch

__all__ = ["raw_values", "row_partials", "raw_logprob_given", "raw_logprobs_at"]

_INF = float("inf")


def raw_values(logits: torch.Tensor) -> torch.Tensor:
    """fp32 logits with NaN as -inf (§3.1); ±inf kept."""
    return logits.float().nan_to_num(float("-inf"), _INF, float("-inf"))


def row_partials(x: torch.Tensor, row_max: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[rows, 1] each: the row maximum (`row_max` when given: the whole row's, for a vocabulary
    shard x), Σ exp(v - max) over x's values (any value when the maximum is ±inf) and x's count
    of +inf entries; the shards' sums and counts add up to the whole row's."""
    if row_max is None:
        row_max = x.amax(-1, keepdim=True)
    safe_max = torch.where(row_max.isfinite(), row_max, torch.zeros_like(row_max))
    return row_max, (x - safe_max).exp().sum(-1, keepdim=True), (x == _INF).sum(-1, keepdim=True)


def raw_logprob_given(x: torch.Tensor, row_max: torch.Tensor, sum_exp: torch.Tensor,
                      inf_count: torch.Tensor) -> torch.Tensor:
    """The raw logprob of values x of rows with the given partials (row_partials, broadcast
    against x): (x - max) - log Σ exp(v - max); a row whose maximum is +inf spreads its mass
    evenly over its +inf entries (-log inf_count, -inf elsewhere); a row with no finite or +inf
    value is -inf throughout."""
    finite_row = (x - row_max) - sum_exp.log()
    inf_row = torch.where(x == _INF, -inf_count.double().log().float(), float("-inf"))
    out = torch.where(row_max == _INF, inf_row, finite_row)
    return out.masked_fill(row_max == float("-inf"), float("-inf"))


def raw_logprobs_at(logits: torch.Tensor, tokens: torch.Tensor, logprobs: torch.Tensor | None,
                    top_values: torch.Tensor | None, top_ids: torch.Tensor | None,
                    token_bitmask: torch.Tensor | None = None,
                    req_pool_indices: torch.Tensor | None = None, tokens_per_req: int = 1,
                    pool_rows: int = 0) -> None:
    """Writes the raw logprob of each row's token (int32 [rows]; NaN for a token outside
    [0, V), a row that emitted none) into logprobs[:rows] and the rows' top-N (values, ids) into
    top_values / top_ids[:rows], where given: the `raw_logprobs` op, under the grammar bitmask,
    by the sampling kernels' rule (on CUDA, rows cut into chunks whose top N are merged). With
    req_pool_indices (a slot per tokens_per_req rows), rows whose slot lies outside
    [0, pool_rows) are written as the kernels write them (DESIGN §5), without a read."""
    if logprobs is None and top_values is None:
        return
    torch.ops.tokensampler.raw_logprobs(logits, tokens, logprobs, top_values, top_ids,
                                        token_bitmask, req_pool_indices, tokens_per_req, pool_rows)
