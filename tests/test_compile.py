"""torch.compile traces the ops: a function that calls sample_rows directly compiles with
fullgraph=True (no graph break) and returns the eager tokens, logprobs and invalid flags, on the
CPU and on CUDA."""

from __future__ import annotations

import pytest
import torch

import tokensampler as ts
from tokensampler import _C
from tokensampler.backends.slot_params import to_slot_params

V = 257
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _step_inputs():
    mgr = _C.SlotStateManager(pool_rows=5, vocab_size=V, history_capacity=16, bias_capacity=4,
                              with_min_p=True, device="cpu")
    params = [ts.SamplingParams(temperature=0.7, top_k=20, top_p=0.9, seed=11),
              ts.SamplingParams(min_p=0.05, repetition_penalty=1.2, seed=12),
              ts.SamplingParams(temperature=0.0, logit_bias={5: 30.0}),
              ts.SamplingParams(seed=14)]
    rids = [f"r{i}" for i in range(4)]
    route = mgr.prepare_step(rids, [1, 2, 3, 4],
                             [to_slot_params(p, r, V) for p, r in zip(params, rids)],
                             [[1, 2, 3], [4, 4], [], [9]])
    return mgr, int(route)


def _sample_rows(logits, slots, lengths, table, mgr, route, tokens, invalid, logprobs):
    """The test's one call of the op (keyword arguments: a new optional argument of the schema
    needs no change here)."""
    torch.ops.tokensampler.sample_rows(
        logits=logits, req_pool_indices=slots, valid_cache_lengths=lengths, slot_table=table,
        history_capacity=mgr.history_capacity, bias_capacity=mgr.bias_capacity,
        tokens_per_req=1, candidates=None, apply_penalties=True, logprobs_mode=0, route=route,
        max_top_k=0, out_tokens=tokens, out_invalid=invalid, out_logprobs=logprobs,
        out_top_values=None, out_top_ids=None, workspace=None)


@pytest.mark.parametrize("device", DEVICES)
def test_sample_rows_compiles_fullgraph_and_matches_eager(device):
    mgr, route = _step_inputs()
    table = mgr.table.to(device)
    slots = torch.tensor([1, 2, 3, 4], dtype=torch.int32, device=device)
    lengths = torch.tensor([0, 3, 8, 1, 40], dtype=torch.int32, device=device)

    def step(logits, temperature_scale):
        tokens = torch.empty(4, dtype=torch.int32, device=device)
        invalid = torch.empty(4, dtype=torch.bool, device=device)
        logprobs = torch.empty(4, dtype=torch.float32, device=device)
        _sample_rows(logits * temperature_scale, slots, lengths, table, mgr, route, tokens,
                     invalid, logprobs)
        return tokens, invalid, logprobs

    compiled = torch.compile(step, fullgraph=True)
    for seed in range(3):
        logits = torch.randn(4, V, generator=torch.Generator().manual_seed(seed)).to(device)
        eager = step(logits, 1.0)
        traced = compiled(logits, 1.0)
        assert torch.equal(traced[0], eager[0])
        assert torch.equal(traced[1], eager[1])
        assert torch.equal(traced[2], eager[2])  # the same op on the same inputs
    assert eager[0][2].item() == 5  # the greedy row with its +30 bias: the op really ran
