"""Exact sampling from vocabulary-parallel logits, without all-gathering them.

With a vocab-parallel LM head each tensor-parallel rank holds logits for its shard of the
vocabulary, `[rows, V_rank]` starting at token `vocab_offset`. Because tokensampler's Gumbel
noise is keyed by the *global* token id, the unsharded sample can be reproduced from a few
numbers per row:

- no filter / min-p rows: two all-reduces of the row maxima (+inf detection, the min-p
  threshold), then each rank's best `z + G` over its kept tokens, all-gathered and reduced
  (ties: lowest id);
- top-k rows (k <= `max_candidates`): each rank's top-k candidates `(z, id)` are all-gathered,
  and the row is finished over them (top-k, top-p within top-k, min-p, Gumbel-max) by the same
  kernel that samples unsharded rows, so the token is identical;
- top-p rows: each rank's `max_candidates` best tokens and the best z it left out are
  all-gathered; when every left-out token is 32 nats or more below the row's best, its mass
  cannot move the top-p total or cut, and the row is finished over the listed tokens (peaked
  rows); other rows are all-gathered;
- anything else (a mixed batch): the processed rows are all-gathered — exact, and no worse than
  the usual all-gather-then-sample.

Raw logprobs need the global log-sum-exp: two more small all-reduces. Every rank returns the same
tokens and records them in its own (replicated) slot state.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import _C
from .backends.gumbel import GumbelSamplingBackend
from .batch import LogitsProcessorOutput, SamplingBatchInfo
from .logprobs import raw_logprob_given, raw_values, row_partials

__all__ = ["VocabParallelSampler"]

_LOCAL_ARGMAX_ROUTES = (_C.Route.NO_FILTER, _C.Route.MIN_P)


class VocabParallelSampler:
    """Samples like `backend` from this rank's vocabulary shard.

    `backend` is a `gumbel` or `gumbel_full` backend built for the *global* vocabulary and driven
    identically on every rank (same prepare_step calls), so its slot state is replicated.
    """

    def __init__(self, backend: GumbelSamplingBackend, vocab_offset: int, shard_size: int,
                 group: dist.ProcessGroup | None = None, max_candidates: int = 1024) -> None:
        if not isinstance(backend, GumbelSamplingBackend):
            raise TypeError(f"backend must be a gumbel or gumbel_full backend, got {type(backend).__name__}")
        cfg = backend.config
        vocab = cfg.vocab_size
        # What it cannot publish yet is refused, not silently replaced by something else.
        if cfg.enable_output_logprobs and cfg.logprobs_mode == "processed":
            raise ValueError("logprobs_mode='processed' is not available from vocab-parallel "
                             "sampling (raw logprobs only): build the backend with "
                             "logprobs_mode='raw'")
        if cfg.top_logprobs_num > 0:
            raise ValueError(f"top_logprobs_num={cfg.top_logprobs_num}: top-N logprobs are not "
                             "available from vocab-parallel sampling yet")
        if not (0 <= vocab_offset and shard_size >= 1 and vocab_offset + shard_size <= vocab):
            raise ValueError(f"shard [{vocab_offset}, {vocab_offset + shard_size}) is outside "
                             f"the vocabulary [0, {vocab})")
        self.backend = backend
        self.vocab_offset = vocab_offset
        self.shard_size = shard_size
        self.group = group
        self.max_candidates = max_candidates
        self.last_gathered_rows = 0  # rows of the last step that needed their full logits
        self._shards: list[tuple[int, int]] | None = None
        self._local_ids = torch.arange(vocab_offset, vocab_offset + shard_size, dtype=torch.int32,
                                       device=backend.device)

    # ---- collectives ----
    def _all_reduce(self, t: torch.Tensor, op) -> torch.Tensor:
        dist.all_reduce(t, op=op, group=self.group)
        return t

    def _all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """[world, *t.shape]"""
        world = dist.get_world_size(self.group)
        out = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(out, t.contiguous(), group=self.group)
        return torch.stack(out)

    # ---- the three exact paths ----
    def _best_over(self, score: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Global argmax of per-rank (score, id) pairs, ties to the lowest id."""
        best_score, at = score.max(dim=-1)
        # among equal maxima, the lowest id
        tied = score == best_score.unsqueeze(-1)
        best_id = torch.where(tied, ids, torch.iinfo(torch.int32).max).min(dim=-1).values
        scores, all_ids = self._all_gather(best_score), self._all_gather(best_id)
        top = scores.max(dim=0).values
        return torch.where(scores == top, all_ids, torch.iinfo(torch.int32).max).min(dim=0).values

    def _local_argmax_path(self, l, z, l_max, min_p, seeds, positions) -> torch.Tensor:
        """DESIGN §3 for no-filter / min-p rows, as the kernels decide it: a row with a +inf
        processed logit l draws among those uniformly; otherwise every finite l is a token, kept
        when z = l / T reaches the min-p threshold of the row's best z (row_rules.h's arithmetic,
        through the min_p_threshold op), scored z + G, ties (z past fp32's range: +-inf) to the
        lowest kept id."""
        ids = self._local_ids.expand_as(z).contiguous()
        noise = torch.empty_like(z)
        torch.ops.tokensampler.gumbel_noise(seeds, positions, ids, _C.RNG_STREAMS["gumbel"], noise)
        inf_row = (l_max == float("inf")).unsqueeze(1)
        z_max = self._all_reduce(z.amax(dim=1), dist.ReduceOp.MAX)
        threshold = torch.empty_like(z_max)
        torch.ops.tokensampler.min_p_threshold(z_max, min_p, threshold)
        kept = torch.where(inf_row, l == float("inf"),
                           (l > float("-inf")) & (z >= threshold.unsqueeze(1)))
        score = torch.where(kept, torch.where(inf_row, noise, z + noise), float("-inf"))
        return self._best_over(score, torch.where(kept, ids, torch.iinfo(torch.int32).max))

    def _shard_layout(self) -> list[tuple[int, int]]:
        """Every rank's (vocab_offset, shard_size): gathered once, on first need."""
        if self._shards is None:
            mine = torch.tensor([self.vocab_offset, self.shard_size], device=self.backend.device)
            self._shards = [tuple(s) for s in self._all_gather(mine).tolist()]
        return self._shards

    def _full_rows(self, processed: torch.Tensor) -> torch.Tensor:
        """All-gather of processed rows into [rows, V] (shards may differ in size)."""
        shards = self._shard_layout()
        width = max(size for _, size in shards)
        padded = torch.full((processed.size(0), width), float("-inf"), device=processed.device)
        padded[:, :self.shard_size] = processed
        gathered = self._all_gather(padded)
        full = torch.full((processed.size(0), self.backend.config.vocab_size), float("-inf"),
                          device=processed.device)
        for (offset, size), part in zip(shards, gathered):
            full[:, offset:offset + size] = part[:, :size]
        return full

    def _top_columns(self, z: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's k best tokens by (z descending, id ascending) — the kernels' order — as
        shard columns [rows, k] in no particular order, and the best z it leaves out (-inf when
        it leaves none). Two top-k selections and a few elementwise passes instead of a sort of
        the shard: the first finds the k-th value, the tie rule picks which of the tokens equal
        to it come in, the second lists exactly those k tokens."""
        rows = z.size(0)
        if k >= self.shard_size:
            columns = torch.arange(self.shard_size, device=z.device).expand(rows, -1)
            return columns, torch.full((rows,), float("-inf"), device=z.device)
        top = torch.topk(z, k + 1, dim=1).values           # descending
        kth, left_out = top[:, k - 1:k], top[:, k]
        above = z > kth
        tied = z == kth
        need = k - above.sum(dim=1, keepdim=True)           # tied tokens to admit, lowest ids first
        take = above | (tied & (tied.cumsum(dim=1) <= need))  # exactly k per row
        return torch.topk(take.to(torch.float32), k, dim=1).indices, left_out

    def _candidate_rows(self, processed: torch.Tensor, temperature: torch.Tensor, k: int
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows of -inf holding only every rank's top-k tokens (by z, ties to lower id); also the
        gathered values [world, rows, k] and the best z this rank left out."""
        z = processed / temperature.unsqueeze(1)
        columns, left_out = self._top_columns(z, k)
        values, ids = processed.gather(1, columns), self._local_ids[columns]
        if columns.size(1) < k:  # a shard narrower than k: pad to the common width with -inf
            pad = (0, k - columns.size(1))
            values = F.pad(values, pad, value=float("-inf"))
            ids = F.pad(ids, pad, value=self.vocab_offset)
        all_values, all_ids = self._all_gather(values), self._all_gather(ids)
        rows = torch.full((processed.size(0), self.backend.config.vocab_size), float("-inf"),
                          device=processed.device)
        for v, i in zip(all_values, all_ids):
            # amax: a padding entry (-inf) never overwrites the real value at its id
            rows.scatter_reduce_(1, i.long(), v, reduce="amax")
        return rows, all_values, left_out

    def _nucleus_rows(self, processed: torch.Tensor, temperature: torch.Tensor,
                      greedy: torch.Tensor) -> torch.Tensor:
        """Top-p rows over every rank's best tokens where that is exact, full rows elsewhere.

        A token 32 nats or more below the row's best has mass below 2^-46 of it: adding it to
        the reference's fp32 sum (which already holds the best token's 1) changes nothing, and the
        CUDA path's integer masses round its bin to zero. So when every token a rank left out is
        that far down, the left-out tokens change neither the total nor the cut, and the listed
        ones sample the same token.
        """
        rows, all_values, left_out = self._candidate_rows(processed, temperature, self.max_candidates)
        bound = self._all_gather(left_out).amax(dim=0)  # the best z that no rank listed
        z_max = (all_values / temperature.view(1, -1, 1)).amax(dim=(0, 2))
        exact = (bound == float("-inf")) | ((z_max > bound) & (
            greedy | ((z_max < float("inf")) & (z_max - bound >= 32.0))))
        gathered = ~exact
        self.last_gathered_rows = int(gathered.sum())
        if self.last_gathered_rows:
            rows[gathered] = self._full_rows(processed[gathered])
        return rows

    def _finish(self, rows, info, n, out) -> None:
        """The unsharded kernel on rows whose penalties are already applied."""
        b = self.backend
        count = rows.size(0)
        # max_top_k 0: unknown to the kernels (they then take the path that serves any k).
        torch.ops.tokensampler.sample_rows(
            rows, info.req_pool_indices, info.valid_cache_lengths, b.slots.table,
            b.slots.history_capacity, b.slots.bias_capacity, n, None, False, 0, int(b._route), 0,
            out, b.invalid_rows[:count], None, None, None, b._workspace)

    # ---- the step ----
    def sample_rows(self, shard_logits: torch.Tensor, info: SamplingBatchInfo, n: int = 1,
                    candidates: torch.Tensor | None = None) -> torch.Tensor:
        """Tokens int32[rows] for shard logits [rows, shard_size] (rows = bs * n), after the
        backend's checks; `candidates` (verify, [bs, n]) put earlier drafts in the penalties.
        Records nothing: sample / verify do."""
        shard, candidates = self._checked(LogitsProcessorOutput(shard_logits), info, n, candidates)
        if candidates is not None and candidates.size(1) != n:
            raise ValueError(f"candidates shape {tuple(candidates.shape)} does not match n={n} "
                             f"rows per request")
        return self._sample_rows(shard, info, n, candidates)

    def _checked(self, logits_output: LogitsProcessorOutput, info: SamplingBatchInfo, n: int = 1,
                 candidates=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The shard logits (and the candidates, int32 [bs, n], when given) after the backend's
        checks of them and of `info`."""
        if isinstance(info, SamplingBatchInfo) and info.token_bitmask is not None:
            # Refused, not ignored: the shard would need its slice of the bits (DESIGN §3.0).
            raise ValueError("token_bitmask is not supported by vocab-parallel sampling yet: "
                             "mask the shard's logits before calling it")
        columns = ("shard_size", self.shard_size)
        if candidates is None:
            return self.backend._checked_logits(logits_output, info, n, columns), None
        return self.backend._checked_verify(logits_output, info, candidates, columns)

    def _sample_rows(self, shard_logits: torch.Tensor, info: SamplingBatchInfo, n: int,
                     candidates: torch.Tensor | None) -> torch.Tensor:
        """Tokens int32[rows] for checked shard logits [rows, shard_size] (rows = bs * n)."""
        b = self.backend
        rows = shard_logits.size(0)
        processed = torch.empty(rows, self.shard_size, dtype=torch.float32, device=shard_logits.device)
        torch.ops.tokensampler.penalize_logits(
            shard_logits, info.req_pool_indices, b.slots.table, b.slots.history_capacity,
            b.slots.bias_capacity, n, candidates if b._FULL else None, self.vocab_offset, processed)
        p = b.row_params(info, n, rows // n)
        temperature, min_p, greedy, seeds, positions = p.temperature, p.min_p, p.greedy, p.seed, p.position
        out = torch.empty(rows, dtype=torch.int32, device=shard_logits.device)
        route = b._route
        if route in _LOCAL_ARGMAX_ROUTES:
            z = processed / temperature.unsqueeze(1)
            l_max = self._all_reduce(processed.amax(dim=1), dist.ReduceOp.MAX)
            sampled = self._local_argmax_path(processed, z, l_max,
                                              min_p if b._FULL else torch.zeros_like(min_p),
                                              seeds, positions)
            # greedy rows: argmax of the processed logits, same reduction without noise
            greedy_best = self._best_over(processed, self._local_ids.expand_as(processed))
            invalid = (l_max == float("-inf")) | ~p.readable  # DESIGN §3.1, §5
            out.copy_(torch.where(greedy, greedy_best, sampled).masked_fill(invalid, 0))
            b.invalid_rows[:rows].copy_(invalid)
        elif _C.is_top_k_route(route) and b.step_max_top_k <= self.max_candidates:
            self._finish(self._candidate_rows(processed, temperature, b.step_max_top_k)[0], info, n, out)
        elif route == _C.Route.TOP_P:
            self._finish(self._nucleus_rows(processed, temperature, greedy), info, n, out)
        else:
            self._finish(self._full_rows(processed), info, n, out)
        return out

    # ---- public ----
    def raw_logprobs(self, shard_logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """DESIGN §3.8's raw logprob at `tokens`, from two all-reduces of the shards' partials."""
        x = raw_values(shard_logits)
        row_max = self._all_reduce(x.amax(dim=1, keepdim=True), dist.ReduceOp.MAX)
        _, sum_exp, inf_count = row_partials(x, row_max)
        local = tokens.long().unsqueeze(1) - self.vocab_offset
        mine = (local >= 0) & (local < self.shard_size)
        picked = x.gather(1, local.clamp(0, self.shard_size - 1))
        parts = torch.cat([sum_exp, torch.where(mine, picked, torch.zeros_like(picked)),
                           inf_count.float()], 1)
        sum_exp, value, inf_count = self._all_reduce(parts, dist.ReduceOp.SUM).unbind(1)
        return raw_logprob_given(value, row_max.squeeze(1), sum_exp, inf_count)

    def sample(self, logits_output: LogitsProcessorOutput, info: SamplingBatchInfo
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """`backend.sample` for a shard: same tokens on every rank, history recorded."""
        shard, _ = self._checked(logits_output, info)
        bs = shard.size(0)
        b = self.backend
        tokens, lengths = b._sample_outputs(bs)
        tokens.copy_(self._sample_rows(shard, info, 1, None))
        b._record_history(info, tokens, lengths, 1)
        if b._logprobs is not None:
            b._logprobs[:bs].copy_(self.raw_logprobs(shard, tokens))
            b._unreadable_logprobs(b._readable_rows(info, bs, 1))
            logits_output.next_token_logprobs = b._logprobs[:bs]
        return tokens, lengths

    def verify(self, logits_output: LogitsProcessorOutput, info: SamplingBatchInfo,
               candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`backend.verify` (target-sampled chain matching) for a shard: verify row j sees
        drafts 1..j in its penalties, exactly as the unsharded backend does."""
        b = self.backend
        if isinstance(info, SamplingBatchInfo) and info.draft_probs is not None:
            # Refused, not ignored: rejection sampling would need the shards' target masses.
            raise ValueError("draft_probs is not supported by vocab-parallel verify yet: it "
                             "verifies by target-sampled chain matching only")
        shard, candidates = self._checked(logits_output, info, candidates=candidates)
        n, rows = candidates.size(1), candidates.numel()
        target = self._sample_rows(shard, info, n, candidates)
        predict, accept = b._verify_outputs(rows, candidates.size(0))
        torch.ops.tokensampler.verify_chain(candidates, target, predict, accept,
                                            b.invalid_rows[:rows])
        b._record_history(info, predict, accept, n)
        if b._logprobs is not None:  # each row's own target, as the backend's chain verify
            b._logprobs[:rows].copy_(self.raw_logprobs(shard, target))
            b._unreadable_logprobs(b._readable_rows(info, candidates.size(0), n))
            logits_output.next_token_logprobs = b._logprobs[:rows]
        return predict, accept
