"""Tokens do not depend on how the CUDA kernels cut rows into chunks: 1, 4 (the default: one
wave), 8 and 32 chunk blocks per SM (TOKENSAMPLER_CHUNK_BLOCKS_PER_SM, read at every call) sample
the same tokens on the split-row and histogram-cut routes, at batch sizes whose chunk counts
differ."""

import pytest
import torch

import tokensampler as ts
from helpers import run

pytestmark = pytest.mark.cuda

V = 151936

# name: (backend, params)
ROUTES = {
    "no_filter": ("gumbel", dict(temperature=0.8)),
    "top_k_top_p": ("gumbel", dict(temperature=0.7, top_k=50, top_p=0.9)),
    "top_p": ("gumbel", dict(temperature=0.7, top_p=0.9)),
    "min_p": ("gumbel_full", dict(temperature=1.0, min_p=0.05)),
}


@pytest.mark.parametrize("bs", [5, 32, 128])
@pytest.mark.parametrize("route", list(ROUTES))
def test_tokens_do_not_depend_on_chunking(route, bs, monkeypatch):
    name, params = ROUTES[route]
    gpu = ts.create_backend(name, ts.SamplingBackendConfig(
        max_bs=bs, max_draft_tokens_per_req=1, max_req_pool_size=bs, vocab_size=V, device="cuda",
        enable_output_logprobs=True))
    sps = [ts.SamplingParams(seed=300 + i, **params) for i in range(bs)]
    gpu.prepare_step([f"r{i}" for i in range(bs)], list(range(1, bs + 1)), sps)
    logits = torch.randn(bs, V, generator=torch.Generator().manual_seed(bs)) * 2
    results = {}
    for blocks_per_sm in ("1", "4", "8", "32"):
        monkeypatch.setenv("TOKENSAMPLER_CHUNK_BLOCKS_PER_SM", blocks_per_sm)
        results[blocks_per_sm] = run(gpu, logits, bs, 23, "cuda")
    tokens, logprobs = results["4"]
    for blocks_per_sm, (t, lp) in results.items():
        assert torch.equal(t, tokens), f"{blocks_per_sm} blocks per SM"
        # Raw logprobs merge the chunks' (max, sum-exp) partials in another order.
        torch.testing.assert_close(lp, logprobs, atol=1e-5, rtol=0)
