"""Sampled tokens follow the exact filtered distribution (chi-square against a float64
reference), for every route and for combined filters, on the CPU kernels and (GPU-marked) on
the CUDA kernels."""

import numpy as np
import pytest
import torch

import tokensampler as ts

from reference import chi_square_pvalue, filtered_probs, penalized

V = 60
ROWS = 250            # rows per call: independent draws at distinct positions
CALLS = 16            # 4000 samples per case
P_MIN = 1e-3          # fixed seeds make each p-value deterministic
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def draw(backend_name, params, logits_row, calls=CALLS, device="cpu", dtype=torch.float32):
    """Samples of one logits row: every row sits in its own slot at its own position."""
    cfg = ts.SamplingBackendConfig(max_bs=ROWS, max_req_pool_size=ROWS, vocab_size=V, device=device)
    backend = ts.create_backend(backend_name, cfg)
    slots = list(range(1, ROWS + 1))
    backend.prepare_step([f"r{s}" for s in slots], slots,
                         [ts.SamplingParams(seed=1234 + s, **params) for s in slots])
    logits = logits_row.to(dtype).expand(ROWS, V).contiguous().to(device)
    info = ts.SamplingBatchInfo(torch.tensor(slots, dtype=torch.int32, device=device),
                                torch.zeros(ROWS + 1, dtype=torch.int32, device=device), V, device)
    samples = []
    for call in range(calls):
        info.valid_cache_lengths.fill_(call * 7 + 3)
        tokens, _ = backend.sample(ts.LogitsProcessorOutput(logits), info)
        samples.append(tokens.cpu().numpy().copy())
    return np.concatenate(samples)


def logits_row(seed=0, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(V, generator=g) * scale


CASES = [
    ("no_filter", dict(temperature=1.0)),
    ("temperature", dict(temperature=0.6)),
    ("top_k", dict(temperature=0.9, top_k=12)),
    ("top_p", dict(temperature=1.1, top_p=0.8)),
    # top-k and top-p both bind (top-p over the top-k set's renormalised mass): dropping either
    # changes the kept set. Min-p cuts the same tail as they do, so at most two of the three
    # can bind in one row; min-p binds alone in the min_p case.
    ("top_k_top_p", dict(temperature=0.8, top_k=12, top_p=0.95)),
    ("top_k_top_p_min_p", dict(temperature=0.8, top_k=8, top_p=0.8, min_p=0.01)),
    ("min_p", dict(temperature=1.3, min_p=0.1)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,params", CASES, ids=[c[0] for c in CASES])
def test_route_distribution_matches_reference(name, params, device):
    row = logits_row(seed=len(name))
    backend = "gumbel_full" if "min_p" in params else "gumbel"
    samples = draw(backend, params, row, device=device)
    probs = filtered_probs(row.double().numpy(), **params)
    assert (probs > 0).sum() >= 5, "too few kept tokens for the test to see a distribution"
    for field, off in (("top_k", -1), ("top_p", 1.0)):  # every filter the case is about binds
        if field in params and name.startswith("top_k_top_p"):
            loose = filtered_probs(row.double().numpy(), **{**params, field: off})
            assert not np.array_equal(loose > 0, probs > 0), f"{field} does not bind"
    if name == "min_p":
        loose = filtered_probs(row.double().numpy(), **{**params, "min_p": 0.0})
        assert not np.array_equal(loose > 0, probs > 0), "min_p does not bind"
    assert probs[samples].min() > 0, "sampled a token outside the kept set"
    assert chi_square_pvalue(samples, probs) > P_MIN


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_batch_rows_follow_their_own_params(device):
    """A generic-route batch: each row's samples follow that row's own filters."""
    cfg = ts.SamplingBackendConfig(max_bs=200, max_req_pool_size=200, vocab_size=V, device=device)
    backend = ts.create_backend("gumbel_full", cfg)
    kinds = [dict(temperature=1.0), dict(temperature=0.7, top_k=8),
             dict(temperature=1.2, top_p=0.6), dict(temperature=1.0, min_p=0.2)]
    params = [kinds[i % 4] for i in range(200)]
    slots = list(range(1, 201))
    backend.prepare_step([f"r{s}" for s in slots], slots,
                         [ts.SamplingParams(seed=s, **p) for s, p in zip(slots, params)])
    assert backend.route == "generic"
    row = logits_row(seed=9)
    logits = row.expand(200, V).contiguous().to(device)
    info = ts.SamplingBatchInfo(torch.tensor(slots, dtype=torch.int32, device=device),
                                torch.zeros(201, dtype=torch.int32, device=device), V, device)
    per_kind = [[] for _ in kinds]
    for call in range(80):
        info.valid_cache_lengths.fill_(call)
        tokens, _ = backend.sample(ts.LogitsProcessorOutput(logits), info)
        for i, t in enumerate(tokens.tolist()):
            per_kind[i % 4].append(t)
    for kind, samples in zip(kinds, per_kind):
        probs = filtered_probs(row.double().numpy(), **kind)
        samples = np.array(samples)
        assert probs[samples].min() > 0
        assert chi_square_pvalue(samples, probs) > P_MIN, kind


@pytest.mark.parametrize("device", DEVICES)
def test_penalties_and_bias_shift_the_distribution_exactly(device):
    """Repetition over prompt ∪ output, frequency/presence over output, bias: the sampled
    distribution is the reference's for the penalised logits."""
    cfg = ts.SamplingBackendConfig(max_bs=ROWS, max_req_pool_size=ROWS, vocab_size=V, device=device)
    backend = ts.create_backend("gumbel_full", cfg)
    params = dict(temperature=1.0, top_k=25, repetition_penalty=1.5, frequency_penalty=0.4,
                  presence_penalty=0.3, logit_bias={3: 2.5, 4: -1.0})
    slots = list(range(1, ROWS + 1))
    prompt = [1, 2, 3, 5]
    backend.prepare_step([f"r{s}" for s in slots], slots,
                         [ts.SamplingParams(seed=s, **params) for s in slots],
                         prompt_token_ids=[prompt] * ROWS)
    # Give every slot the same output history: tokens 2, 7, 7 (through greedy-forced steps).
    row = logits_row(seed=4)
    info = ts.SamplingBatchInfo(torch.tensor(slots, dtype=torch.int32, device=device),
                                torch.zeros(ROWS + 1, dtype=torch.int32, device=device), V, device)
    for forced in (2, 7, 7):
        forcing = torch.full((ROWS, V), -1e4, device=device)
        forcing[:, forced] = 1e4
        backend.sample(ts.LogitsProcessorOutput(forcing), info)
    assert backend.penalty_history(1) == {1: 0, 2: 1, 3: 0, 5: 0, 7: 2}
    # Sample without recording more history: fresh positions, then compare distributions.
    samples = []
    snapshot = backend.slots.table.clone()
    for call in range(CALLS):
        backend.slots.table.copy_(snapshot)
        info.valid_cache_lengths.fill_(100 + call)
        logits = row.expand(ROWS, V).contiguous().to(device)
        tokens, _ = backend.sample(ts.LogitsProcessorOutput(logits), info)
        samples.append(tokens.cpu().numpy().copy())
    samples = np.concatenate(samples)
    l = penalized(row.double().numpy(), history_counts={2: 1, 7: 2}, prompt=prompt,
                  repetition=1.5, frequency=0.4, presence=0.3, bias={3: 2.5, 4: -1.0})
    probs = filtered_probs(l, temperature=1.0, top_k=25)
    assert probs[samples].min() > 0
    assert chi_square_pvalue(samples, probs) > P_MIN


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_logits_sample_the_upcast_distribution(dtype, device):
    row = logits_row(seed=5).to(dtype)
    params = dict(temperature=0.9, top_k=6, top_p=0.9)  # both bind on this row
    samples = draw("gumbel", params, row.float(), dtype=dtype, calls=8, device=device)
    probs = filtered_probs(row.double().numpy(), **params)
    assert probs[samples].min() > 0
    assert chi_square_pvalue(samples, probs) > P_MIN
