"""Device-side inputs the host cannot check without a sync (issue 15): pool indices outside the
pool, draft ids outside [0, V), NaN / negative / > 1 draft probabilities, and the NaN a +-inf bias
makes. The CUDA kernels must flag or reject, never read through them, and give the CPU kernels'
tokens (torch.equal). Also the prompt mask of a long prompt, CUDA against CPU."""

from __future__ import annotations

import math

import pytest
import torch

import tokensampler as ts
from helpers import backends, run

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

V = 151936
ROUTE_PARAMS = {
    "top_k": dict(temperature=0.7, top_k=50),
    "top_k_top_p": dict(temperature=0.7, top_k=50, top_p=0.9),
    "top_p": dict(temperature=0.7, top_p=0.9),
    "min_p": dict(temperature=0.7, min_p=0.05),
    "no_filter": dict(temperature=0.7),
    "greedy": dict(temperature=0.0),
}


def _prepare(pair, params, n=1, prompts=None):
    rids = [f"r{i}" for i in range(len(params))]
    for b in pair:
        b.prepare_step(rids, list(range(1, len(params) + 1)), params, n,
                       prompt_token_ids=prompts)


@pytest.mark.parametrize("route", ["top_k", "top_p", "no_filter"])
@pytest.mark.parametrize("mode,top_n", [("raw", 0), ("processed", 0), ("raw", 3)])
def test_pool_index_outside_the_pool_gives_fresh_invalid_outputs(route, mode, top_n):
    bs = 3
    cpu, gpu = backends(V, bs, name="gumbel_full", enable_output_logprobs=True,
                        logprobs_mode=mode, top_logprobs_num=top_n)
    _prepare((cpu, gpu), [ts.SamplingParams(seed=i, **ROUTE_PARAMS[route]) for i in range(bs)])
    logits = torch.randn(bs, V)
    run(gpu, logits, bs, 5, "cuda")  # leaves logprobs behind in the output buffers
    for bad in (bs + 7, -1, 2**31 - 1):
        info = ts.SamplingBatchInfo(torch.tensor([1, bad, 3], dtype=torch.int32, device="cuda"),
                                    torch.full((bs + 1,), 5, dtype=torch.int32, device="cuda"),
                                    V, "cuda")
        out = ts.LogitsProcessorOutput(logits.cuda())
        tokens, _ = gpu.sample(out, info)
        assert tokens[1].item() == 0 and gpu.invalid_rows[1].item()
        assert out.next_token_logprobs[1].item() == -math.inf
        if top_n:
            assert torch.equal(out.next_token_top_logprobs_val[1].cpu(),
                               torch.full((top_n,), -math.inf))
            assert out.next_token_top_logprobs_idx[1].tolist() == list(range(top_n))
        assert not gpu.invalid_rows[0].item() and not gpu.invalid_rows[2].item()


@pytest.mark.parametrize("route", ["top_k_top_p", "top_p", "greedy"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rejection_verify_with_untrusted_drafts_equals_cpu(route, dtype):
    bs, n = 6, 4
    cpu, gpu = backends(V, bs, n, name="gumbel_full")
    _prepare((cpu, gpu), [ts.SamplingParams(seed=10 + i, repetition_penalty=1.2,
                                            **ROUTE_PARAMS[route]) for i in range(bs)], n)
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(bs * n, V, generator=g) * 3).to(dtype)
    target = logits.float().argmax(-1).view(bs, n)
    candidates = torch.cat([torch.zeros(bs, 1, dtype=torch.int32),
                            target[:, :-1].to(torch.int32)], 1)
    # drafts that are not tokens, at every position
    candidates[0, 1], candidates[1, 2], candidates[2, 3] = V, -1, 10**8
    candidates[3, 1], candidates[4, 1] = 2**31 - 1, -2**31
    q = torch.rand(bs, n - 1, V, generator=g) / V
    q[5, 0] = float("nan")
    q[4, 1] = -1.0
    q[3, 2] = 7.0
    results = []
    for b, device in ((cpu, "cpu"), (gpu, "cuda")):
        info = ts.SamplingBatchInfo(torch.arange(1, bs + 1, dtype=torch.int32, device=device),
                                    torch.full((bs + 1,), 11, dtype=torch.int32, device=device),
                                    V, device, draft_probs=q.to(device))
        predict, accept = b.verify(ts.LogitsProcessorOutput(logits.to(device)), info,
                                   candidates.to(device))
        results.append((predict.cpu().clone(), accept.cpu().clone()))
    (p_cpu, a_cpu), (p_gpu, a_gpu) = results
    assert torch.equal(p_cpu, p_gpu) and torch.equal(a_cpu, a_gpu)
    assert a_cpu[0].item() == 1 and a_cpu[1].item() <= 2 and a_cpu[2].item() <= 3
    for b in range(bs):
        k = a_cpu[b].item()
        assert ((p_cpu.view(bs, n)[b, :k] >= 0) & (p_cpu.view(bs, n)[b, :k] < V)).all()
        assert (p_cpu.view(bs, n)[b, k:] == -1).all()


@pytest.mark.parametrize("route", ["top_k_top_p", "top_p", "min_p", "no_filter", "greedy"])
def test_infinite_bias_on_infinite_logits_equals_cpu(route):
    bs = 4
    cpu, gpu = backends(V, bs, name="gumbel_full")
    bias = {0: math.inf, 1: -math.inf, 2: 1e300, 5: math.inf}
    _prepare((cpu, gpu), [ts.SamplingParams(seed=i, logit_bias=bias, **ROUTE_PARAMS[route])
                          for i in range(bs)])
    logits = torch.randn(bs, V)
    logits[:, 0] = -math.inf   # +inf bias on -inf: NaN -> banned
    logits[:, 1] = math.inf    # -inf bias on +inf: NaN -> banned
    logits[:2, 2] = -math.inf
    tokens_cpu, _ = run(cpu, logits, bs, 3, "cpu")
    tokens_gpu, _ = run(gpu, logits, bs, 3, "cuda")
    assert torch.equal(tokens_cpu, tokens_gpu)
    assert ((tokens_gpu >= 0) & (tokens_gpu < V)).all()
    assert not (tokens_gpu == 0).any() and not (tokens_gpu == 1).any()
    assert not gpu.invalid_rows[:bs].any()


@pytest.mark.parametrize("route", ["top_k_top_p", "top_p", "no_filter", "greedy"])
def test_long_prompt_mask_equals_cpu(route):
    """A 131072-token prompt with a repetition penalty: every path that marks penalised tokens
    reads the prompt mask (split-row chunks, histogram path, one-block-per-row)."""
    bs = 3
    cpu, gpu = backends(V, bs, name="gumbel_full", enable_output_logprobs=True)
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, V, (131072,), generator=g).tolist() for _ in range(bs)]
    _prepare((cpu, gpu), [ts.SamplingParams(seed=i, repetition_penalty=1.5,
                                            **ROUTE_PARAMS[route]) for i in range(bs)],
             prompts=prompts)
    assert cpu.penalty_history(1) == {t: 0 for t in sorted(set(prompts[0]))}
    logits = torch.randn(bs, V, generator=g) * 4
    tokens_cpu, lp_cpu = run(cpu, logits, bs, 7, "cpu")
    tokens_gpu, lp_gpu = run(gpu, logits, bs, 7, "cuda")
    assert torch.equal(tokens_cpu, tokens_gpu)
    torch.testing.assert_close(lp_cpu, lp_gpu, rtol=0, atol=1e-4)
