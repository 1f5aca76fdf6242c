"""Greedy backend: argmax sampling and greedy chain verification. No per-request state."""

from __future__ import annotations

import torch

from .. import _C
from ..batch import LogitsProcessorOutput, SamplingBatchInfo
from ..logprobs import raw_logprobs_at
from ..params import SamplingParams
from .base import SamplingBackend
from .slot_params import bias_field, penalty_field, to_slot_params

__all__ = ["GreedySamplingBackend"]


class GreedySamplingBackend(SamplingBackend):
    def __init__(self, config) -> None:
        super().__init__(config)
        # Without logprobs, argmax_rows is the whole step; with raw logprobs, the raw_logprobs
        # op follows it (the tokens' logprobs and top-N in one pass of chunk kernels, where the
        # sampling kernels paid a log-sum-exp term per token on top of it: run 55). Processed
        # logprobs (0.0 at the argmax) run the sampling kernels, which read a row's parameters
        # from a slot table: here one slot, of a greedy request, that every row reads (all
        # rows greedy: the no-filter route).
        self._greedy_table = None
        if self._wants_logprobs and self.config.logprobs_mode == "processed":
            config = self.config
            slots = _C.SlotStateManager(pool_rows=1, vocab_size=config.vocab_size,
                                        history_capacity=0, bias_capacity=0, with_min_p=False,
                                        device=str(self.device))
            slots.prepare_step(["greedy"], [0], [to_slot_params(
                SamplingParams(temperature=0.0), "greedy", config.vocab_size)], [None])
            self._greedy_table = slots.table
            self._slot_of_every_row = torch.zeros(config.max_bs, dtype=torch.int32,
                                                  device=self.device)
            self._slot_length = torch.zeros(1, dtype=torch.int32, device=self.device)

    def _uses_kernel_workspace(self, config) -> bool:
        # Read by sample_rows' top-N kernels (processed logprobs; the rows themselves take the
        # one-block kernel). The raw_logprobs op takes its scratch from the allocator.
        return (config.torch_device.type == "cuda" and config.top_logprobs_num > 0
                and config.logprobs_mode == "processed")

    def _check_applicable(self, sp: SamplingParams, rid: str) -> None:
        # Penalties and bias change which token is the argmax, and this backend keeps no
        # history or bias: refused, not ignored. Temperature and the filters never change it.
        field = penalty_field(sp) or bias_field(sp)
        if field is not None:
            raise ValueError(f"rid={rid!r}: backend 'greedy' does not apply {field}; use "
                             f"'gumbel_full' (temperature 0 samples the argmax there)")

    def sample(self, logits_output: LogitsProcessorOutput, sampling_info: SamplingBatchInfo
               ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self._checked_logits(logits_output, sampling_info, 1)
        bs = logits.size(0)
        tokens, lengths = self._sample_outputs(bs)
        self._argmax(logits, sampling_info.token_bitmask, 1, tokens)
        self._publish_logprobs(logits_output, bs)
        return tokens, lengths

    def _reads_masked_logits(self) -> bool:
        return False  # argmax_rows and the sampling kernels apply token_bitmask in their read

    def _argmax(self, logits: torch.Tensor, bitmask: torch.Tensor | None, rows_per_req: int,
                out: torch.Tensor) -> None:
        """out = each row's argmax of the logits (DESIGN §3.0–3.1: tokens the bitmask disallows
        and NaN as -inf, ties to the lowest id), and invalid_rows (§3.1: no allowed finite or
        +inf entry), in one kernel; with logprobs, the rows' logprobs and top-N too (§3.8)."""
        views = self._rows(out.numel())
        if self._greedy_table is None:
            torch.ops.tokensampler.argmax_rows(logits, out, bitmask, views.invalid)
            if self._wants_logprobs:  # raw
                raw_logprobs_at(logits, out, views.logprobs, views.top_values, views.top_ids,
                                bitmask)
            return
        torch.ops.tokensampler.sample_rows(
            logits, self._slot_of_every_row, self._slot_length, self._greedy_table, 0, 0,
            rows_per_req, None, False, self._logprobs_mode, int(_C.Route.NO_FILTER), 0, out,
            views.invalid, views.logprobs, views.top_values, views.top_ids, self._workspace,
            bitmask)

    def verify(self, logits_output: LogitsProcessorOutput, sampling_info: SamplingBatchInfo,
               candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, candidates = self._checked_verify(logits_output, sampling_info, candidates)
        rows, n = logits.size(0), candidates.size(1)
        target = self._rows(rows).target
        # logprobs: each row's own target, as the sampling backends' chain verify gives
        self._argmax(logits, sampling_info.token_bitmask, n, target)
        predict, accept = self._verify_outputs(rows, candidates.size(0))
        torch.ops.tokensampler.verify_chain(candidates, target, predict, accept,
                                            self._rows(rows).invalid)
        self._publish_logprobs(logits_output, rows)
        return predict, accept
