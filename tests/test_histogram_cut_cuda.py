"""The CUDA histogram-cut path (top-p, min-p, mixed batches, top-k beyond the split-row path)
through the public API: same tokens as the CPU kernels, for distributions that put the cut in a
crowded bin, rows that overflow the cut list (the in-kernel fallback), penalties, verify rows,
and batch invariance."""

import math

import pytest
import torch

import tokensampler as ts
from helpers import accepted_drafts, backends, run

pytestmark = pytest.mark.cuda

CASES = {
    "top_p": dict(temperature=0.7, top_p=0.9),
    "top_p_small": dict(temperature=1.0, top_p=0.05),
    "top_p_large": dict(temperature=1.5, top_p=0.999),
    "min_p": dict(temperature=0.8, min_p=0.05),
    "top_p_min_p": dict(temperature=1.0, top_p=0.8, min_p=0.02),
    "top_k_1500": dict(temperature=1.0, top_k=1500, top_p=0.9),  # count cut (k > 512)
    "top_k_3000": dict(temperature=1.0, top_k=3000),             # beyond the count cut: fallback
}

LOGITS = {
    "randn": lambda g, bs, V: torch.randn(bs, V, generator=g) * 2,
    "peaked": lambda g, bs, V: torch.randn(bs, V, generator=g) * 8,  # LLM-like spread of 50+ nats
    "flat": lambda g, bs, V: torch.randn(bs, V, generator=g) * 0.05,  # thousands in a cut bin
    "quarter_steps": lambda g, bs, V: torch.round(torch.randn(bs, V, generator=g) * 4) / 4,
    "constant": lambda g, bs, V: torch.full((bs, V), 0.5),  # one bin: the list overflows
}


def _compare(params_of_row, logits, name="gumbel_full", prompts=None):
    bs, V = logits.size(0), logits.size(1)
    cpu, gpu = backends(V, bs, name=name, enable_output_logprobs=True)
    sps = [params_of_row(i) for i in range(bs)]
    for b in (cpu, gpu):
        b.prepare_step([f"r{i}" for i in range(bs)], list(range(1, bs + 1)), sps,
                       prompt_token_ids=prompts)
    t_cpu, lp_cpu = run(cpu, logits, bs, 11, "cpu")
    t_gpu, lp_gpu = run(gpu, logits, bs, 11, "cuda")
    assert torch.equal(t_cpu, t_gpu), (t_cpu != t_gpu).nonzero().flatten().tolist()
    torch.testing.assert_close(lp_gpu, lp_cpu, atol=1e-4, rtol=0)
    return gpu, t_gpu


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("kind", list(LOGITS))
@pytest.mark.parametrize("V", [151936, 50257, 1003])
def test_cut_path_matches_cpu(case, kind, V):
    bs = 6
    g = torch.Generator().manual_seed(V + len(kind))
    logits = LOGITS[kind](g, bs, V)
    params = dict(CASES[case])
    if "top_k" in params:
        params["top_k"] = min(params["top_k"], V - 1)

    def row(i):
        return (ts.SamplingParams(temperature=0.0) if i == 4
                else ts.SamplingParams(seed=500 + i, **params))

    _compare(row, logits)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top_p_rows_whose_winner_is_kept_or_cut(dtype):
    """The stats kernel finds each top-p row's best z + G over all its tokens (the winner); where
    that passes min-p and lies in a bin below the cut, the select and finish kernels take it
    without resolving the cut. The batch holds rows of both kinds (top-p token == the row's
    token with no filter, and not), and every row matches the CPU."""
    V, bs = 151936, 64
    g = torch.Generator().manual_seed(21)
    logits = (torch.randn(bs, V, generator=g) * 2).to(dtype)
    top_ps = [0.2, 0.5, 0.8, 0.95]
    _, filtered = _compare(
        lambda i: ts.SamplingParams(seed=300 + i, temperature=1.0, top_p=top_ps[i % 4]), logits)
    _, unfiltered = _compare(lambda i: ts.SamplingParams(seed=300 + i, temperature=1.0), logits)
    winner_kept = int((filtered == unfiltered).sum())
    assert 8 <= winner_kept <= bs - 8, winner_kept


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bs", [3, 32, 128])
def test_decided_rows_take_the_winner_or_the_runner_up(dtype, bs):
    """At p = 0.5 about half the winners are dropped, and where the runner-up (the best z + G
    after the winner: the unfiltered token once the winner is banned) is kept it is the row's
    token, found from float mass sums (kernels 1a-b, 128 rows), from the cut bin (kernel 2b,
    32 rows: no decide) or, in a step too small to keep runner-ups (3 rows: one of each kind, in
    both dtypes), by resolving the cut. Every row matches the CPU."""
    V = 151936
    g = torch.Generator().manual_seed(69)
    logits = (torch.randn(bs, V, generator=g) * 2).to(dtype)
    _, filtered = _compare(
        lambda i: ts.SamplingParams(seed=400 + i, temperature=1.0, top_p=0.5), logits)
    _, winners = _compare(lambda i: ts.SamplingParams(seed=400 + i, temperature=1.0), logits)
    _, runners_up = _compare(
        lambda i: ts.SamplingParams(seed=400 + i, temperature=1.0,
                                    logit_bias={int(winners[i]): -1e4}), logits)
    took_winner = int((filtered == winners).sum())
    took_runner_up = int((filtered == runners_up).sum())
    assert took_winner >= max(1, bs // 8), took_winner
    assert took_runner_up >= max(1, bs // 8), took_runner_up
    assert took_winner + took_runner_up < bs  # and rows that resolve their cut


@pytest.mark.parametrize("top_p_rows", [1, 3])
def test_few_top_p_rows_among_rows_without_a_cut(top_p_rows):
    """A large step where a few rows have a top-p cut (p = 0.3: their winner is often not kept)
    and the others none (min-p or no filter): every row matches the CPU however the kernels share
    the cut rows' work among their blocks."""
    V, bs = 151936, 128
    g = torch.Generator().manual_seed(31 + top_p_rows)
    logits = torch.randn(bs, V, generator=g) * 2

    def row(i):
        if i % (bs // top_p_rows) == 5:
            return ts.SamplingParams(seed=700 + i, temperature=1.0, top_p=0.3)
        return ts.SamplingParams(seed=700 + i, temperature=1.0, min_p=0.05 if i % 2 else 0.0)

    _compare(row, logits)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_every_row_a_small_top_p(dtype):
    """Every row of a large step cuts at p = 0.05, so few winners are kept and nearly every row
    resolves its cut; V is not a multiple of a block."""
    V, bs = 50257, 96
    g = torch.Generator().manual_seed(17)
    logits = (torch.randn(bs, V, generator=g) * 2).to(dtype)
    _compare(lambda i: ts.SamplingParams(seed=800 + i, temperature=1.0, top_p=0.05), logits)


def test_large_step_of_every_top_p_row_kind():
    """A step of 48 top-p rows of every kind, some with min-p (a generic route, which resolves
    every row's cut from the histogram: kernels 1a-b decide only all-top-p steps of 64 rows or
    more): winners kept and cut, ties at the winner's z (quarter steps), a winner that min-p
    removes, penalties and bias, and rows whose z reach 4000 (T = 0.002): every row matches the
    CPU."""
    V, bs = 50257, 48
    g = torch.Generator().manual_seed(43)
    logits = torch.randn(bs, V, generator=g) * 2
    logits[8:16] = torch.round(logits[8:16] * 2) / 4
    logits[16:24] *= 4
    top_ps = [0.1, 0.5, 0.9, 0.99]

    def row(i):
        extra = {}
        if 24 <= i < 32:
            extra = dict(repetition_penalty=1.3, frequency_penalty=0.4, logit_bias={7: 3.0, 9: -2.0})
        if 32 <= i < 36:
            extra = dict(min_p=0.5)
        temperature = 0.002 if 40 <= i < 44 else 0.8
        return ts.SamplingParams(seed=900 + i, temperature=temperature, top_p=top_ps[i % 4],
                                 **extra)

    prompts = [[7, 11, 13]] * bs
    _compare(row, logits, prompts=prompts)


def test_boundary_parameters_match_cpu():
    """Rows the CPU-only semantics tests cover, on the CUDA paths: top-p 1e-6 (cut bin 0, limit
    about 1), min-p 0.9999 (tau about z_max), temperatures at the greedy boundary (1e-5 is
    greedy, 2e-5 samples with z about 1e5) and top-k 1, in one mixed step."""
    V, bs = 151936, 8
    logits = torch.randn(bs, V, generator=torch.Generator().manual_seed(51)) * 2
    logits[3, 100:110] = logits[3].max()  # exact ties at the top
    rows = [dict(top_p=1e-6), dict(min_p=0.9999), dict(temperature=1e-5, top_p=0.9),
            dict(temperature=2e-5, top_p=0.9), dict(temperature=2e-5, min_p=0.1),
            dict(top_k=1), dict(temperature=2e-5), dict(top_p=1e-6, min_p=0.5)]
    _compare(lambda i: ts.SamplingParams(seed=40 + i, **rows[i]), logits)


def _nudged(x, steps):
    """x moved by steps[i] ulps (|steps| <= 2), element by element."""
    up, down = torch.tensor(float("inf")), torch.tensor(float("-inf"))
    for k in range(2):
        x = torch.where(steps > k, torch.nextafter(x, up), x)
        x = torch.where(steps < -k, torch.nextafter(x, down), x)
    return x


@pytest.mark.parametrize("temperature", [0.05, 0.3, 1.3, 2.7])
@pytest.mark.parametrize("case", ["top_p", "min_p", "top_p_min_p", "count_cut",
                                  "count_cut_top_p"])
def test_cut_path_decides_tokens_on_bin_edges(temperature, case):
    """A few dozen finite logits per row, each on or up to two ulps beside a histogram bin edge
    (z = z_max - j / 64) or the min-p threshold, at temperatures whose divisions round. The select
    kernel classifies tokens against raw-logit thresholds it finds once per block
    (lowest_logit_where), which must decide exactly as the per-token tests on z = x / T do; with
    so few finite tokens each one's class can change the row's token. The count cut (top-k past
    the split-row path's 512) gets 3000 such tokens, a dozen to a bin, so its k-th falls among
    ties on an edge."""
    bs, V = 32, 50257
    finite = 3000 if case.startswith("count_cut") else 48
    params = {"top_p": dict(top_p=0.8), "min_p": dict(min_p=0.05),
              "top_p_min_p": dict(top_p=0.9, min_p=0.1), "count_cut": dict(top_k=700),
              "count_cut_top_p": dict(top_k=1500, top_p=0.8)}[case]
    g = torch.Generator().manual_seed(int(temperature * 100) + len(case))
    x_max = torch.tensor(2.5 * temperature, dtype=torch.float32)
    z_max = x_max / temperature
    j = torch.randint(1, 256, (bs, finite), generator=g).float()
    z = z_max - j / 64
    if "min_p" in params:  # a quarter of the tokens at the min-p threshold instead
        z[:, : finite // 4] = z_max + math.log(params["min_p"])
    x = _nudged((z * temperature).float(), torch.randint(-2, 3, (bs, finite), generator=g))
    x[:, 0] = x_max
    logits = torch.full((bs, V), float("-inf"))
    cols = torch.stack([torch.randperm(V, generator=g)[:finite] for _ in range(bs)])
    logits.scatter_(1, cols, x)
    _compare(lambda i: ts.SamplingParams(seed=900 + i, temperature=temperature, **params), logits)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_mixed_batch_matches_cpu(dtype):
    """Rows of every filter set in one batch (the generic route)."""
    V, bs = 151936, 24
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(bs, V, generator=g) * 3).to(dtype)
    logits[5] = float("-inf")
    logits[7, [10, 20]] = float("inf")
    sets = [dict(), dict(top_k=50), dict(top_p=0.9), dict(min_p=0.1), dict(top_k=700, top_p=0.7),
            dict(top_p=0.5, min_p=0.05), dict(temperature=0.0), dict(top_k=5, top_p=0.3, min_p=0.2)]

    def row(i):
        p = dict(temperature=0.9)
        p.update(sets[i % len(sets)])
        return ts.SamplingParams(seed=40 + i, **p)

    gpu, _ = _compare(row, logits)
    assert gpu.route == "generic"


def test_cut_path_penalties_match_cpu():
    V, bs = 151936, 8
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(bs, V, generator=g) * 2
    prompts = [[(37 * i + 11 * j) % V for j in range(40)] for i in range(bs)]
    for i, prompt in enumerate(prompts):
        logits[i, prompt[:10]] += 6.0

    def row(i):
        return ts.SamplingParams(seed=9 + i, temperature=1.0, top_p=0.9 if i % 2 else 0.6,
                                 min_p=0.01 * (i % 3), repetition_penalty=1.3,
                                 frequency_penalty=0.4, presence_penalty=0.6,
                                 logit_bias={7 * i + 1: 4.0})

    _compare(row, logits, name="gumbel_full", prompts=prompts)


@pytest.mark.parametrize("params", [
    dict(top_p=0.85, presence_penalty=1.0),
    # the count cut (k > 512) with every penalty, drafts in their history
    dict(top_k=900, top_p=0.9, repetition_penalty=1.4, frequency_penalty=0.5,
         presence_penalty=0.7),
], ids=["top_p", "count_cut_penalties"])
def test_cut_path_verify_matches_cpu(params):
    V, bs, n = 151936, 5, 4
    cpu, gpu = backends(V, bs, n=n, name="gumbel_full")
    sps = [ts.SamplingParams(seed=3 + i, temperature=0.8, **params) for i in range(bs)]
    for b in (cpu, gpu):
        b.prepare_step([f"r{i}" for i in range(bs)], list(range(1, bs + 1)), sps,
                       num_tokens_per_req=n, prompt_token_ids=[[1, 2, 3]] * bs)
    g = torch.Generator().manual_seed(8)
    candidates = torch.randint(0, V, (bs, n), dtype=torch.int32, generator=g)
    logits = torch.randn(bs * n, V, generator=g) * 2
    logits[:, candidates.view(-1).long()] += 4.0
    candidates = accepted_drafts(cpu, logits, bs, 5, n, candidates)
    t_cpu, _ = run(cpu, logits, bs, 5, "cpu", n, candidates)
    t_gpu, _ = run(gpu, logits, bs, 5, "cuda", n, candidates)
    assert torch.equal(t_cpu, t_gpu)
    assert (t_cpu.view(bs, n)[:, -1] >= 0).any()  # rows past the first compared


def test_cut_path_is_batch_invariant():
    """A row's token does not depend on its batch (the mass sums are exact integers)."""
    V = 151936
    g = torch.Generator().manual_seed(12)
    logits = torch.randn(40, V, generator=g) * 1.5
    sp = ts.SamplingParams(seed=77, temperature=1.0, top_p=0.9)
    _, alone = backends(V, 1)
    alone.prepare_step(["a"], [1], [sp])
    tokens_alone = [run(alone, logits[i:i + 1], 1, 9, "cuda")[0].item() for i in (0, 17, 39)]
    _, batch = backends(V, 40)
    batch.prepare_step([f"r{i}" for i in range(40)], list(range(1, 41)), [sp] * 40)
    tokens_batch = run(batch, logits, 40, 9, "cuda")[0]
    assert tokens_alone == [tokens_batch[i].item() for i in (0, 17, 39)]
