"""Full Gumbel-max backend: adds min-p, repetition / frequency / presence penalties and logit
bias to `gumbel`. Penalty state is a sparse per-slot history (distinct tokens seen, with output
counts), updated on the device after every sample and verify."""

from __future__ import annotations

import torch

from .. import _C
from ..graphs import CUDA_GRAPH_VARIANT_MIN_P, CUDA_GRAPH_VARIANT_TOP_K_TOP_P_MIN_P
from .gumbel import _VARIANT_ROUTES, GumbelSamplingBackend

__all__ = ["GumbelFullSamplingBackend"]

_FULL_VARIANT_ROUTES = {
    **_VARIANT_ROUTES,
    CUDA_GRAPH_VARIANT_MIN_P: _C.Route.MIN_P,
    CUDA_GRAPH_VARIANT_TOP_K_TOP_P_MIN_P: _C.Route.TOP_K_TOP_P_MIN_P,
}


class GumbelFullSamplingBackend(GumbelSamplingBackend):
    _FULL = True

    @property
    def min_p_pool(self) -> torch.Tensor:
        return self._column(3, torch.float32)

    @property
    def repetition_penalty_pool(self) -> torch.Tensor:
        return self._column(4, torch.float32)

    @property
    def frequency_penalty_pool(self) -> torch.Tensor:
        return self._column(5, torch.float32)

    @property
    def presence_penalty_pool(self) -> torch.Tensor:
        return self._column(6, torch.float32)

    def penalty_history(self, slot: int) -> dict[int, int]:
        """{token: output count} of a slot's history (prompt-only tokens count 0). Host copy,
        for tests and debugging."""
        row = self.slots.table[slot].cpu()
        n, cap = int(row[9]), self.slots.history_capacity
        ids, counts = row[12:12 + n].tolist(), row[12 + cap:12 + cap + n].tolist()
        return dict(zip(ids, counts))

    def logit_bias(self, slot: int) -> dict[int, float]:
        """{token: bias} of a slot. Host copy, for tests and debugging."""
        row = self.slots.table[slot].cpu()
        n, h, b = int(row[10]), self.slots.history_capacity, self.slots.bias_capacity
        base = 12 + 2 * h
        ids = row[base:base + n].tolist()
        values = row[base + b:base + b + n].view(torch.float32).tolist()
        return dict(zip(ids, values))

    def cuda_graph_capture_variants(self, num_tokens_per_req: int) -> tuple[str, ...]:
        return super().cuda_graph_capture_variants(num_tokens_per_req) + (
            CUDA_GRAPH_VARIANT_MIN_P, CUDA_GRAPH_VARIANT_TOP_K_TOP_P_MIN_P)

    def _variant_routes(self) -> dict:
        return _FULL_VARIANT_ROUTES
