"""Greedy backend: argmax sampling and greedy chain verification. No per-slot state."""

from __future__ import annotations

import torch

from ..batch import LogitsProcessorOutput, SamplingBatchInfo
from .base import SamplingBackend

__all__ = ["GreedySamplingBackend"]


class GreedySamplingBackend(SamplingBackend):
    _HAS_POOL_STATE = False

    def sample(self, logits_output: LogitsProcessorOutput, sampling_info: SamplingBatchInfo
               ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self._checked_logits(logits_output, 1)
        bs = logits.size(0)
        tokens = self._packed[0, :bs]
        torch.ops.tokensampler.argmax_rows(logits, tokens)
        lengths = self._packed[1, :bs]
        lengths.fill_(1)
        return tokens, lengths

    def verify(self, logits_output: LogitsProcessorOutput, sampling_info: SamplingBatchInfo,
               candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self._checked_logits(logits_output, candidates.size(-1))
        rows = logits.size(0)
        candidates = self._checked_candidates(candidates, rows)
        target = self._target[:rows]
        torch.ops.tokensampler.argmax_rows(logits, target)
        predict, accept = self._packed[0, :rows], self._packed[1, :candidates.size(0)]
        torch.ops.tokensampler.verify_chain(candidates, target, predict, accept)
        return predict, accept
