"""Every route of bench/benchmark.py runs one step through the public API on CPU (small
vocabulary), so a device call never spends its minutes on a route that cannot be built."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def benchmark():
    sys.path.insert(0, str(BENCH))
    try:
        import benchmark
        yield benchmark
    finally:
        sys.path.remove(str(BENCH))


def test_every_benchmark_route_steps_on_cpu(benchmark):
    for name, route in benchmark.ROUTES.items():
        bs, V = 3, 5000  # (full_penalties: a prompt of ids below 4000)
        rows = bs * route.tokens_per_req
        tokens, lengths = benchmark.ours_step(route, bs, vocab=V, device="cpu")(
            torch.randn(rows, V, generator=torch.Generator().manual_seed(0)))
        assert tokens.numel() == rows and lengths.numel() == bs, name
        # (verify: -1 past a request's accepted tokens; its first row always holds one)
        assert int(tokens.max()) < V and int(tokens.min()) >= -1, name
        assert (tokens.view(bs, -1)[:, 0] >= 0).all(), name
