"""torch.compile traces the ops: a function that calls sample_rows directly compiles with
fullgraph=True (no graph break) and returns the eager tokens, logprobs and invalid flags."""

from __future__ import annotations

import torch

import tokensampler as ts
from tokensampler import _C
from tokensampler.backends.slot_params import to_slot_params

V = 257


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


def test_sample_rows_compiles_fullgraph_and_matches_eager():
    mgr, route = _step_inputs()
    slots = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    lengths = torch.tensor([0, 3, 8, 1, 40], dtype=torch.int32)

    def step(logits, temperature_scale):
        tokens = torch.empty(4, dtype=torch.int32)
        invalid = torch.empty(4, dtype=torch.bool)
        logprobs = torch.empty(4, dtype=torch.float32)
        torch.ops.tokensampler.sample_rows(
            logits * temperature_scale, slots, lengths, mgr.table, mgr.history_capacity,
            mgr.bias_capacity, 1, None, True, 0, route, 0, tokens, invalid, logprobs, None, None,
            None)
        return tokens, invalid, logprobs

    compiled = torch.compile(step, fullgraph=True)
    for seed in range(3):
        logits = torch.randn(4, V, generator=torch.Generator().manual_seed(seed))
        eager = step(logits, 1.0)
        traced = compiled(logits, 1.0)
        assert torch.equal(traced[0], eager[0])
        assert torch.equal(traced[1], eager[1])
        torch.testing.assert_close(traced[2], eager[2])
    assert eager[0][2].item() == 5  # the greedy row with its +30 bias: the op really ran
