"""Full Gumbel-max backend: adds min-p, repetition / frequency / presence penalties and logit
bias to `gumbel`. Penalty state is a sparse per-slot history (distinct tokens seen, with output
counts), updated on the device after every sample and verify."""

from __future__ import annotations

import torch

from .. import _C
from ..graphs import CUDA_GRAPH_VARIANT_MIN_P, CUDA_GRAPH_VARIANT_TOP_K_TOP_P_MIN_P
from .gumbel import _COL, _VARIANT_ROUTES, GumbelSamplingBackend

__all__ = ["GumbelFullSamplingBackend"]

_FULL_VARIANT_ROUTES = {
    **_VARIANT_ROUTES,
    CUDA_GRAPH_VARIANT_MIN_P: _C.Route.MIN_P,
    CUDA_GRAPH_VARIANT_TOP_K_TOP_P_MIN_P: _C.Route.TOP_K_TOP_P_MIN_P,
}


class GumbelFullSamplingBackend(GumbelSamplingBackend):
    _FULL = True
    _NAME = "gumbel_full"

    @property
    def min_p_pool(self) -> torch.Tensor:
        return self._column(_COL["min_p"], torch.float32)

    @property
    def repetition_penalty_pool(self) -> torch.Tensor:
        return self._column(_COL["repetition"], torch.float32)

    @property
    def frequency_penalty_pool(self) -> torch.Tensor:
        return self._column(_COL["frequency"], torch.float32)

    @property
    def presence_penalty_pool(self) -> torch.Tensor:
        return self._column(_COL["presence"], torch.float32)

    def penalty_history(self, slot: int) -> dict[int, int]:
        """{token: output count} of a slot's history (prompt-only tokens count 0). Host copy,
        for tests and debugging."""
        row, s = self.slots.table[slot].cpu(), self.slots
        n = int(row[_COL["history_len"]])
        ids = row[s.history_tokens_col:s.history_tokens_col + n].tolist()
        counts = row[s.history_counts_col:s.history_counts_col + n].tolist()
        mask = row[s.prompt_mask_col:s.prompt_mask_col + s.prompt_mask_words].tolist()
        seen = {32 * w + b: 0 for w, word in enumerate(mask) if word
                for b in range(32) if (word >> b) & 1}
        seen.update(zip(ids, counts))
        return dict(sorted(seen.items()))

    def logit_bias(self, slot: int) -> dict[int, float]:
        """{token: bias} of a slot. Host copy, for tests and debugging."""
        row, s = self.slots.table[slot].cpu(), self.slots
        n = int(row[_COL["bias_len"]])
        ids = row[s.bias_tokens_col:s.bias_tokens_col + n].tolist()
        values = row[s.bias_values_col:s.bias_values_col + n].view(torch.float32).tolist()
        return dict(zip(ids, values))

    def _capture_variants(self, num_tokens_per_req: int) -> tuple[str, ...]:
        return super()._capture_variants(num_tokens_per_req) + (
            CUDA_GRAPH_VARIANT_MIN_P, CUDA_GRAPH_VARIANT_TOP_K_TOP_P_MIN_P)

    def _variant_routes(self) -> dict:
        return _FULL_VARIANT_ROUTES
