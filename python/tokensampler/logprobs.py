"""DESIGN §3.8's raw logprobs in torch ops, for the paths that do not run the sampling kernels
(the FlashInfer adapters, the vocab-parallel sampler): the kernels' rule
(`csrc/ops/row_reference.cpp`), rows with ±inf maxima included, and their top-N order."""

from __future__ import annotations

import torch

__all__ = ["raw_values", "row_partials", "raw_logprob_given", "raw_logprobs_at", "ranked_top"]

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


def ranked_top(x: torch.Tensor, n: int, rows_per_pass: int = 64) -> torch.Tensor:
    """int64 [rows, n]: the ids of each row's n first values in rank order (value descending,
    ties to the lower id, -0 == +0), the kernels' top-N order; x without NaN. One int64 key per
    value (order-preserving bits above, the inverted id below), rows_per_pass rows at a time so
    the keys stay small beside the logits."""
    low = 0xFFFFFFFF - torch.arange(x.size(-1), device=x.device, dtype=torch.int64)
    out = torch.empty(x.size(0), n, dtype=torch.int64, device=x.device)
    for start in range(0, x.size(0), rows_per_pass):
        bits = (x[start:start + rows_per_pass] + 0.0).view(torch.int32)  # + 0.0: -0 becomes +0
        key = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).long()  # signed, monotonic in x
        key.bitwise_left_shift_(32).bitwise_or_(low)  # equal values: the lower id ranks first
        out[start:start + rows_per_pass] = key.topk(n, dim=-1).indices
    return out


def raw_logprobs_at(logits: torch.Tensor, tokens: torch.Tensor, logprobs: torch.Tensor | None,
                    top_values: torch.Tensor | None, top_ids: torch.Tensor | None) -> None:
    """Writes the raw logprob of each row's token into logprobs[:rows] and the top-N (values,
    ids) into top_values / top_ids[:rows], where given."""
    x = raw_values(logits)
    rows = x.size(0)
    partials = row_partials(x)
    if logprobs is not None:
        picked = x.gather(1, tokens.long().view(rows, 1))
        logprobs[:rows].copy_(raw_logprob_given(picked, *partials).view(rows))
    if top_values is not None:
        ids = ranked_top(x, top_values.size(1))
        top_values[:rows].copy_(raw_logprob_given(x.gather(1, ids), *partials))
        top_ids[:rows].copy_(ids)
