"""penalize_logits (the processed logits the FlashInfer adapters sample from) equals the
float64 reference of DESIGN §3.1–3.4, drafts of verify rows included."""

import numpy as np
import torch

import tokensampler as ts

from reference import penalized


def test_penalize_logits_matches_reference_with_drafts():
    V, n = 50, 3
    backend = ts.create_backend("gumbel_full", ts.SamplingBackendConfig(
        max_bs=2, max_draft_tokens_per_req=n, max_req_pool_size=4, vocab_size=V, device="cpu"))
    params = dict(repetition_penalty=1.7, frequency_penalty=0.3, presence_penalty=0.6,
                  logit_bias={4: 1.5, 8: -2.0, 9: 0.25})
    backend.prepare_step(["a"], [2], [ts.SamplingParams(seed=1, temperature=0.0, **params)],
                         prompt_token_ids=[[1, 4, 6]])
    forcing = torch.full((1, V), -50.0)
    forcing[0, 6] = 50.0
    info = ts.SamplingBatchInfo(torch.tensor([2], dtype=torch.int32),
                                torch.zeros(5, dtype=torch.int32), V, "cpu")
    backend.sample(ts.LogitsProcessorOutput(forcing), info)          # output history: {6: 1}
    logits = torch.randn(n, V)
    logits[1, 10] = float("nan")
    candidates = torch.tensor([[0, 9, 6]], dtype=torch.int32)
    out = torch.empty(n, V)
    torch.ops.tokensampler.penalize_logits(
        logits, torch.tensor([2], dtype=torch.int32), backend.slots.table,
        backend.slots.history_capacity, backend.slots.bias_capacity, n, candidates, 0, out)
    for j in range(n):
        counts = {6: 1}
        for d in candidates[0, 1:j + 1].tolist():
            counts[d] = counts.get(d, 0) + 1
        ref = penalized(logits[j].double().numpy(), counts, [1, 4, 6], 1.7, 0.3, 0.6,
                        params["logit_bias"])
        np.testing.assert_allclose(out[j].double().numpy(), ref, rtol=1e-6, atol=1e-6)


def test_drafts_new_to_a_full_history_count_as_nothing():
    """DESIGN §4: plain decoding drops a new token once the history holds H distinct ones, so a
    verify row does not count such a draft (nor its repeats); a draft already listed counts."""
    V, n = 20, 4
    backend = ts.create_backend("gumbel_full", ts.SamplingBackendConfig(
        max_bs=1, max_draft_tokens_per_req=n, max_req_pool_size=2, vocab_size=V, device="cpu",
        penalty_history_capacity=2))
    backend.prepare_step(["a"], [1], [ts.SamplingParams(seed=1, temperature=0.0,
                                                        frequency_penalty=1.0)])
    info = ts.SamplingBatchInfo(torch.tensor([1], dtype=torch.int32),
                                torch.zeros(3, dtype=torch.int32), V, "cpu")
    forcing = torch.full((1, V), -50.0)
    forcing[0, 3] = 50.0
    backend.sample(ts.LogitsProcessorOutput(forcing), info)  # history {3: 1}, one entry free
    logits = torch.zeros(n, V)
    candidates = torch.tensor([[0, 7, 8, 7]], dtype=torch.int32)  # 7 takes the entry, 8 cannot
    out = torch.empty(n, V)
    torch.ops.tokensampler.penalize_logits(
        logits, torch.tensor([1], dtype=torch.int32), backend.slots.table,
        backend.slots.history_capacity, backend.slots.bias_capacity, n, candidates, 0, out)
    assert out[3, 3].item() == -1.0 and out[3, 7].item() == -2.0 and out[3, 8].item() == 0.0
    assert out[2, 7].item() == -1.0 and out[2, 8].item() == 0.0
    # an id below 0 is never recorded (append_history skips it), so it takes no entry: 9 does
    candidates = torch.tensor([[0, -1, 9, 8]], dtype=torch.int32)
    torch.ops.tokensampler.penalize_logits(
        logits, torch.tensor([1], dtype=torch.int32), backend.slots.table,
        backend.slots.history_capacity, backend.slots.bias_capacity, n, candidates, 0, out)
    assert out[3, 9].item() == -1.0 and out[3, 8].item() == 0.0
