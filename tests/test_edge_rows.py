"""Rows at the edges of DESIGN §3 on every route (no filter, top-k, top-p, min-p, top-k + top-p:
on CUDA the split-row, histogram-cut and one-block-per-row kernels), each asserting the token
the CPU reference gives: a prompt-only token of a slot whose output history is full, a +inf
bias on a finite logit, a raw +inf logit banned by a -inf bias, z = l / T past fp32's range
(DESIGN §5: the tokens at z = +inf tie, the lowest id wins; they rank above a z of exactly
FLT_MAX, and a z of exactly -FLT_MAX above those at -inf), and a finite z whose estimate
l * (1 / T) overflows."""

from __future__ import annotations

import pytest
import torch

import tokensampler as ts
from helpers import run

V = 5000  # several chunks per row on the CUDA multi-block paths, not a multiple of a block
ROUTES = {
    "no_filter": dict(temperature=0.5),
    "top_k": dict(temperature=0.5, top_k=5),
    "top_p": dict(temperature=0.5, top_p=0.9),
    "min_p": dict(temperature=0.5, min_p=0.1),
    "top_k_top_p": dict(temperature=0.5, top_k=40, top_p=0.8),
}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
BS = 3


def _backend(device, route, history=4096, **extra):
    b = ts.create_backend("gumbel_full", ts.SamplingBackendConfig(
        max_bs=BS, max_req_pool_size=BS, vocab_size=V, device=device,
        penalty_history_capacity=history, enable_output_logprobs=True))
    params = [ts.SamplingParams(seed=40 + i, **ROUTES[route], **extra) for i in range(BS)]
    return b, params


def _step(b, params, logits, position, prompts=None):
    b.prepare_step([f"r{i}" for i in range(BS)], list(range(1, BS + 1)), params,
                   prompt_token_ids=prompts)
    tokens, logprobs = run(b, logits, BS, position, b.device)
    return tokens.tolist(), logprobs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route", list(ROUTES))
def test_prompt_only_token_keeps_a_zero_output_count_when_the_history_is_full(device, route):
    """Outputs 10..13 fill a 4-entry history; prompt token 7 is repetition-penalised only
    (40 / 1.1 = 36.4 beats token 20's 30 by 12.7 nats at T = 0.5). Reading an output count for
    it (the history's last entry, 13: 36.4 - 0.5 * 13 < 30) would hand the row to token 20."""
    b, params = _backend(device, route, history=4, repetition_penalty=1.1, frequency_penalty=0.5)
    prompts = [[7]] * BS
    for step, target in enumerate([10, 11, 12, 13]):
        logits = torch.zeros(BS, V)
        logits[:, target] = 100.0
        assert _step(b, params, logits, step, prompts)[0] == [target] * BS
        prompts = None  # read at the flip only
    logits = torch.zeros(BS, V)
    logits[:, 7], logits[:, 20] = 40.0, 30.0
    assert _step(b, params, logits, 4)[0] == [7] * BS


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route", list(ROUTES))
def test_plus_inf_bias_wins_over_finite_logits(device, route):
    """A +inf bias makes a processed +inf entry (§3.1's +inf rule applies to processed logits):
    the row samples among its +inf entries, here token 77 alone, whatever the raw logits."""
    b, params = _backend(device, route, logit_bias={77: float("inf")})
    logits = torch.randn(BS, V, generator=torch.Generator().manual_seed(1)) * 3
    tokens, logprobs = _step(b, params, logits, 5)
    assert tokens == [77] * BS
    assert torch.isfinite(logprobs).all()  # raw logprobs: the raw row is finite


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route", list(ROUTES))
def test_neutral_penalties_leave_history_and_prompt_tokens_as_they_are(device, route):
    """Repetition 1, frequency 0 and presence 0 with a prompt, a bias and a growing output
    history: the CUDA kernels mark the bias tokens only (the rest is the identity), and every
    step gives the CPU's token. The best logits are -0.0, which the CPU's penalty step turns into
    +0.0 on history tokens (a 0 bias added) and the kernels leave at -0.0: ties alike."""
    extra = dict(repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0,
                 logit_bias={42: 2.5, V - 1: -1.0})
    b, params = _backend(device, route, **extra)
    cpu_b, cpu_params = _backend("cpu", route, **extra)
    prompts = [[7, 20, 42, 100 + i] for i in range(BS)]
    g = torch.Generator().manual_seed(12)
    for step in range(6):
        logits = torch.randn(BS, V, generator=g) - 12.0
        logits[:, :24] = -0.0  # the best tokens, every one of them soon in the history
        logits[:, 42] = -2.0   # +2.5 bias: 0.5, the row's best
        tokens = _step(b, params, logits, step, prompts)[0]
        assert tokens == _step(cpu_b, cpu_params, logits, step, prompts)[0], step
        prompts = None  # read at the flip only


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route", list(ROUTES))
def test_raw_plus_inf_banned_by_a_minus_inf_bias_is_never_sampled(device, route):
    """+inf raw logit plus a -inf bias is NaN, which counts as -inf: the token is banned and the
    row samples its finite tokens like any other (the raw logprob of a finite token is -inf:
    the raw row has a +inf entry)."""
    b, params = _backend(device, route, logit_bias={3: float("-inf")})
    logits = torch.randn(BS, V, generator=torch.Generator().manual_seed(2)) * 3
    logits[:, 3] = float("inf")
    tokens, logprobs = _step(b, params, logits, 6)
    cpu_b, cpu_params = _backend("cpu", route, logit_bias={3: float("-inf")})
    assert tokens == _step(cpu_b, cpu_params, logits, 6)[0]
    assert all(0 <= t < V and t != 3 for t in tokens)
    assert torch.equal(logprobs, torch.full((BS,), float("-inf")))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route", list(ROUTES))
def test_z_past_fp32_range_ties_to_the_lowest_id(device, route):
    """DESIGN §5: 3e38 / 0.5 is +inf in fp32, so tokens 9 and 5 tie at z = +inf: token 5."""
    b, params = _backend(device, route)
    logits = torch.randn(BS, V, generator=torch.Generator().manual_seed(3))
    logits[:, 9] = logits[:, 5] = 3e38
    assert _step(b, params, logits, 7)[0] == [5] * BS


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route", list(ROUTES))
def test_plus_inf_logit_wins_over_z_past_fp32_range(device, route):
    """A +inf logit makes a +inf row (§3.1): token 1 alone is drawn; token 0, whose z = 3e38 /
    0.5 overflows to +inf, is not a +inf entry (it must not share the draw nor push token 1 out
    of a top-k set)."""
    b, params = _backend(device, route)
    logits = torch.randn(BS, V, generator=torch.Generator().manual_seed(4))
    logits[:, 0], logits[:, 1] = 3e38, float("inf")
    assert _step(b, params, logits, 9)[0] == [1] * BS


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route", list(ROUTES))
def test_every_z_at_minus_inf_ties_to_the_lowest_finite_id(device, route):
    """DESIGN §5: -3e38 / 0.5 is -inf in fp32; when every finite logit's z is -inf they all tie
    and the lowest finite id wins (ids below 12 are -inf logits)."""
    b, params = _backend(device, route)
    logits = torch.full((BS, V), -3e38)
    logits[:, :12] = float("-inf")
    assert _step(b, params, logits, 8)[0] == [12] * BS


FLT_MAX = torch.finfo(torch.float32).max


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route", list(ROUTES))
def test_z_past_fp32_range_ranks_above_a_z_of_exactly_flt_max(device, route):
    """(FLT_MAX / 2) / 0.5 is exactly FLT_MAX; 3e38 / 0.5 overflows to +inf and ranks above it,
    so token 4000 wins (the lowest id past the range), even with more than k tokens at FLT_MAX
    of lower ids (the split-row top-k path holds an overflowed z at FLT_MAX, where it ties with
    them)."""
    b, params = _backend(device, route)
    logits = torch.randn(BS, V, generator=torch.Generator().manual_seed(5))
    logits[:, :50] = FLT_MAX / 2
    logits[:, 4000] = logits[:, 4321] = 3e38
    assert _step(b, params, logits, 10)[0] == [4000] * BS


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route", list(ROUTES))
def test_z_of_exactly_minus_flt_max_ranks_above_a_z_past_fp32_range(device, route):
    """-3e38 / 0.5 overflows to -inf; (-FLT_MAX / 2) / 0.5 is exactly -FLT_MAX, the row's largest
    z, so token 4000 wins (the lowest id there), not a lower id past the range."""
    b, params = _backend(device, route)
    logits = torch.full((BS, V), float("-inf"))
    logits[:, :50] = -3e38
    logits[:, 4000] = logits[:, 4321] = -FLT_MAX / 2
    assert _step(b, params, logits, 11)[0] == [4000] * BS


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route", list(ROUTES))
def test_finite_z_whose_estimate_overflows_is_still_scored(device, route):
    """x / T = -3.4028235e38 is finite, but the kernels' estimate x * (1 / T) overflows to -inf,
    which makes the noise bounds NaN: a NaN bound must let the token be scored, not skipped (the
    histogram-cut select kernel skipped every token of such a min-p row and wrote no token). All
    z tie at -FLT_MAX, so the lowest finite id wins (ids below 12 are -inf logits)."""
    b = ts.create_backend("gumbel_full", ts.SamplingBackendConfig(
        max_bs=BS, max_req_pool_size=BS, vocab_size=V, device=device,
        enable_output_logprobs=True))
    params = [ts.SamplingParams(seed=40 + i, **{**ROUTES[route], "temperature": 0.9414544})
              for i in range(BS)]
    logits = torch.full((BS, V), -3.2036031e38)
    logits[:, :12] = float("-inf")
    assert _step(b, params, logits, 8)[0] == [12] * BS


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m, top_p, keep", [(5, 0.8, 5), (10, 0.1, 2), (3, 0.6666667, 3),
                                            (4, 0.5, 2)])
def test_plus_inf_row_top_p_keeps_the_first_ceil_p_m_entries(device, m, top_p, keep):
    """§3.1: a row's m +inf entries share its mass evenly, so top-p keeps the first ceil(p * m)
    of them, p as stored in fp32 (0.8 is 0.800000012: 4.00000006 keeps all 5; 0.1 * 10 keeps 2),
    as for m tied finite tokens. Over many positions exactly those ids are drawn, with top-p
    alone and under a top-k."""
    ids = [3 + 7 * j for j in range(m)]
    logits = torch.randn(BS, V, generator=torch.Generator().manual_seed(6))
    logits[:, ids] = float("inf")
    for extra in ({}, {"top_k": 40}):
        b = ts.create_backend("gumbel_full", ts.SamplingBackendConfig(
            max_bs=BS, max_req_pool_size=BS, vocab_size=V, device=device))
        params = [ts.SamplingParams(seed=60 + i, temperature=0.5, top_p=top_p, **extra)
                  for i in range(BS)]
        drawn = set()
        for position in range(40):
            b.prepare_step([f"r{i}" for i in range(BS)], list(range(1, BS + 1)), params)
            tokens, _ = run(b, logits, BS, position, b.device)
            drawn.update(tokens.tolist())
        assert drawn == set(ids[:keep]), (extra, sorted(drawn))
