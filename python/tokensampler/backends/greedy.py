"""Greedy backend: argmax sampling and greedy chain verification. No per-slot state."""

from __future__ import annotations

import torch

from ..batch import LogitsProcessorOutput, SamplingBatchInfo
from ..logprobs import raw_logprobs_at
from ..params import SamplingParams
from .base import SamplingBackend
from .slot_params import bias_field, penalty_field

__all__ = ["GreedySamplingBackend"]


class GreedySamplingBackend(SamplingBackend):
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
        self._argmax(logits, sampling_info.token_bitmask, tokens)
        if self._wants_logprobs:
            self._raw_logprobs(self._masked(logits, sampling_info), tokens)
            self._publish_logprobs(logits_output, bs)
        return tokens, lengths

    def _reads_masked_logits(self) -> bool:
        # argmax_rows applies token_bitmask itself; only logprobs read masked logits.
        return self._wants_logprobs

    def _argmax(self, logits: torch.Tensor, bitmask: torch.Tensor | None, out: torch.Tensor) -> None:
        """out = each row's argmax of the logits (DESIGN §3.0–3.1: tokens the bitmask disallows
        and NaN as -inf, ties to the lowest id), and invalid_rows (§3.1: no allowed finite or
        +inf entry), in one kernel."""
        torch.ops.tokensampler.argmax_rows(logits, out, bitmask, self.invalid_rows[:out.numel()])

    def _raw_logprobs(self, logits: torch.Tensor, tokens: torch.Tensor) -> None:
        """DESIGN §3.8 logprobs: raw, or in processed mode 0.0 (-inf for an invalid row); the
        top-N raw in both."""
        rows = tokens.numel()
        processed = self.config.logprobs_mode == "processed"
        raw_logprobs_at(logits, tokens, None if processed else self._logprobs,
                        self._top_values, self._top_ids)
        if processed and self._logprobs is not None:
            self._logprobs[:rows].zero_().masked_fill_(self.invalid_rows[:rows], float("-inf"))

    def verify(self, logits_output: LogitsProcessorOutput, sampling_info: SamplingBatchInfo,
               candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, candidates = self._checked_verify(logits_output, sampling_info, candidates)
        rows = logits.size(0)
        target = self._target[:rows]
        self._argmax(logits, sampling_info.token_bitmask, target)
        predict, accept = self._verify_outputs(rows, candidates.size(0))
        torch.ops.tokensampler.verify_chain(candidates, target, predict, accept,
                                            self.invalid_rows[:rows])
        if self._wants_logprobs:
            # each row's own target, as the sampling backends' chain verify gives
            self._raw_logprobs(self._masked(logits, sampling_info), target)
            self._publish_logprobs(logits_output, rows)
        return predict, accept
