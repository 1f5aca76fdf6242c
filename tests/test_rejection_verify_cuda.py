"""Rejection-sampling verify of top-k steps on CUDA: the split-row finisher judges every row's
draft at once over the kept set it holds, and verify.cu's walker walks each request's chain (and
runs the rows the finisher leaves undecided). Same predictions, accept lengths and invalid flags
as the CPU kernel, token for token, for both split-row launches (single kernel at <= 4 rows, two
kernels above), with and without a workspace, penalties, grammar masks, greedy, +inf, -inf and
overflowing rows, and drafts that are not tokens."""

from __future__ import annotations

import random

import pytest
import torch

import tokensampler as ts
from tokensampler import _C
from tokensampler.bitmask import bitmask_words, pack_token_bitmask

from helpers import capture_graph, tickets_are_zero
from test_cuda_kernels import build_slots

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

OPS = torch.ops.tokensampler if hasattr(torch.ops, "tokensampler") else None
ROUTES = {"top_k": 2, "top_k_top_p": 4, "top_k_top_p_min_p": 6}


def step_params(rng: random.Random, route: str, V: int, bs: int) -> list[ts.SamplingParams]:
    """Every non-greedy row with a top-k the split-row path serves (k <= 512), as the route says."""
    params = []
    for i in range(bs):
        kw = dict(temperature=rng.choice([0.3, 0.7, 1.0, 1.5]), seed=rng.randrange(1 << 62),
                  top_k=min(rng.choice([1, 2, 50, 300, 512]), V - 1),
                  repetition_penalty=rng.choice([1.0, 1.3]), frequency_penalty=rng.choice([0.0, 0.5]),
                  logit_bias={rng.randrange(V): rng.uniform(-3, 3) for _ in range(3)})
        if "top_p" in route:
            kw["top_p"] = rng.choice([0.5, 0.9, 0.99])
        if "min_p" in route:
            kw["min_p"] = rng.choice([0.01, 0.3])
        if i % 5 == 3:
            kw["temperature"] = 0.0  # greedy rows ride along on every route
        if i == 4:
            kw["temperature"] = 0.3  # its row of +-3e38 overflows z
        params.append(ts.SamplingParams(**kw))
    return params


def build_inputs(route: str, V: int, bs: int, n: int, dtype, seed: int):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    params = step_params(rng, route, V, bs)
    prompts = [[rng.randrange(V) for _ in range(20)] for _ in range(bs)]
    mgr, slots, got_route = build_slots(params, V, prompts)
    sampled = [p for p in params if p.temperature > 0 and p.top_k != 1]  # top-k 1 is greedy
    assert got_route == ROUTES[route] or not sampled
    max_top_k = max([p.top_k for p in sampled] or [1])
    rows = bs * n
    x = torch.randn(rows, V, generator=gen) * 2
    if bs >= 6:  # rows the finisher judges by their own rules, and one it leaves to the walker
        x[0, [5, 7, V // 2]] = float("inf")          # +inf row at the start of a chain
        x[n * 1] = float("-inf")                     # no finite logit: invalid, ends the chain
        x[n * 3 + 1, [3, V - 1]] = float("inf")      # +inf row after the first draft
        x[n * 4] = x[n * 4].sign() * 3e38            # z past fp32's range (T 0.3): the walker
    logits = x.to(dtype)
    T = torch.tensor([max(p.temperature, 0.3) for p in params]).repeat_interleave(n)[:, None]
    q = torch.softmax(logits.float().clamp(-1e4, 1e4) / T +
                      0.5 * torch.randn(rows, V, generator=gen), -1).view(bs, n, V)[:, :-1]
    # drafts: mostly the draft model's argmax so that some are accepted; some not tokens
    cands = torch.cat([torch.zeros(bs, 1, dtype=torch.int32),
                       q.argmax(-1).to(torch.int32)], 1).contiguous()
    if bs >= 6:  # drafts that are not tokens
        cands[2, 1] = -1
        cands[bs - 2, n - 1] = V
    lengths = torch.tensor([0] + [rng.randrange(1 << 20) for _ in slots], dtype=torch.int32)
    slots_t = torch.tensor(slots[:-1] + [999] if bs >= 6 else slots, dtype=torch.int32)  # bad slot
    return mgr, logits, slots_t, lengths, cands, q.contiguous(), ROUTES[route], max_top_k


def verify(inputs, device, route=None, workspace=False, bitmask=None):
    mgr, logits, slots, lengths, cands, q, step_route, max_top_k = inputs
    bs, n = cands.shape
    if route is None:
        route = step_route
    pred = torch.full((bs * n,), -7, dtype=torch.int32, device=device)
    acc = torch.empty(bs, dtype=torch.int32, device=device)
    inv = torch.empty(bs * n, dtype=torch.bool, device=device)
    ws = (torch.zeros(_C.sample_rows_workspace_bytes(bs * n), dtype=torch.uint8, device=device)
          if workspace else None)
    OPS.verify_rejection(logits.to(device), slots.to(device), lengths.to(device),
                         mgr.table.to(device), mgr.history_capacity, mgr.bias_capacity,
                         cands.to(device), q.to(device), True, route,
                         max_top_k if route else 0, pred, acc, inv,
                         None if bitmask is None else bitmask.to(device), ws)
    return pred.cpu(), acc.cpu(), inv.cpu()


def assert_same(cpu, gpu):
    (pc, ac, ic), (pg, ag, ig) = cpu, gpu
    assert torch.equal(ac, ag), f"accept lengths: CPU {ac.tolist()}, CUDA {ag.tolist()}"
    assert torch.equal(pc, pg), f"predictions: CPU {pc.tolist()}, CUDA {pg.tolist()}"
    assert torch.equal(ic, ig)


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("V,bs", [(1000, 1), (1000, 24), (151936, 1), (151936, 9), (7, 3)])
def test_split_row_verdicts_match_cpu(route, dtype, V, bs):
    n = 4
    inputs = build_inputs(route, V, bs, n, dtype, seed=V + bs + ROUTES[route])
    cpu = verify(inputs, "cpu")
    gpu = verify(inputs, "cuda")
    assert_same(cpu, gpu)
    assert_same(cpu, verify(inputs, "cuda", workspace=True))
    assert_same(cpu, verify(inputs, "cuda", route=0))  # the walker alone (no split-row verdicts)
    if bs >= 9:  # the inputs exercise both outcomes
        acc = cpu[1]
        assert (acc > 1).any() and (acc < n).any(), acc.tolist()


@pytest.mark.parametrize("fused_rows", ["0", "64"])
def test_both_launches_match_cpu(fused_rows, monkeypatch):
    monkeypatch.setenv("TOKENSAMPLER_SPLIT_ROW_FUSED_ROWS", fused_rows)
    inputs = build_inputs("top_k_top_p", 50257, 8, 3, torch.float32, seed=11)
    assert_same(verify(inputs, "cpu"), verify(inputs, "cuda", workspace=True))


def test_grammar_mask_in_verdicts():
    V, bs, n = 5000, 6, 4
    inputs = build_inputs("top_k_top_p", V, bs, n, torch.float32, seed=5)
    gen = torch.Generator().manual_seed(3)
    allowed = torch.zeros(bs * n, bitmask_words(V) * 32, dtype=torch.bool)
    allowed[:, :V] = torch.rand(bs * n, V, generator=gen) < 0.3
    allowed[:, :4] = True
    bitmask = pack_token_bitmask(allowed)
    assert_same(verify(inputs, "cpu", bitmask=bitmask),
                verify(inputs, "cuda", workspace=True, bitmask=bitmask))


def test_backend_verify_with_draft_probs_matches_cpu():
    """Through the public API: the gumbel backend passes its workspace and the step's route."""
    V, bs, n = 151936, 4, 4
    cfg = dict(max_bs=bs, max_draft_tokens_per_req=n, max_req_pool_size=bs, vocab_size=V)
    outs = []
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(bs * n, V, generator=gen) * 3
    q = torch.softmax(logits.view(bs, n, V)[:, :-1] / 0.7 + 0.3 * torch.randn(bs, n - 1, V,
                                                                              generator=gen), -1)
    cands = torch.cat([torch.zeros(bs, 1, dtype=torch.int32), q.argmax(-1).to(torch.int32)], 1)
    for device in ("cpu", "cuda"):
        backend = ts.create_backend("gumbel", ts.SamplingBackendConfig(device=device, **cfg))
        sps = [ts.SamplingParams(temperature=0.7, top_k=50, top_p=0.9, seed=i) for i in range(bs)]
        backend.prepare_step([f"r{i}" for i in range(bs)], list(range(1, bs + 1)), sps,
                             num_tokens_per_req=n)
        info = ts.SamplingBatchInfo(torch.arange(1, bs + 1, dtype=torch.int32, device=device),
                                    torch.full((bs + 1,), 9, dtype=torch.int32, device=device),
                                    V, device, draft_probs=q.contiguous().to(device))
        predict, accept = backend.verify(ts.LogitsProcessorOutput(logits.to(device)), info,
                                         cands.to(device))
        outs.append((predict.cpu().clone(), accept.cpu().clone()))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert (outs[0][1] > 1).any()


@pytest.mark.parametrize("bs", [1, 8])
def test_graph_replays_match_cpu(bs):
    """verify with draft_probs captured once and replayed with new logits, drafts, draft
    probabilities and positions: the CPU backend's predictions each time, and the single
    launch's tickets (bs 1: 4 rows) back at zero after every replay."""
    V, n = 50257, 4
    cfg = dict(max_bs=bs, max_draft_tokens_per_req=n, max_req_pool_size=bs, vocab_size=V)
    cpu = ts.create_backend("gumbel", ts.SamplingBackendConfig(device="cpu", **cfg))
    gpu = ts.create_backend("gumbel", ts.SamplingBackendConfig(device="cuda", **cfg))
    sps = [ts.SamplingParams(temperature=0.8, top_k=64, top_p=0.95, seed=90 + i) for i in range(bs)]
    if bs == 8:
        sps[2] = ts.SamplingParams(temperature=0.0)  # a greedy request rides along
    for b in (cpu, gpu):
        b.prepare_step([f"r{i}" for i in range(bs)], list(range(1, bs + 1)), sps,
                       num_tokens_per_req=n)
    slots = torch.arange(1, bs + 1, dtype=torch.int32, device="cuda")
    lengths = torch.full((bs + 1,), 3, dtype=torch.int32, device="cuda")
    logits_d = torch.zeros(bs * n, V, device="cuda")
    q_d = torch.full((bs, n - 1, V), 1.0 / V, device="cuda")
    drafts_d = torch.zeros(bs, n, dtype=torch.int32, device="cuda")
    info = ts.SamplingBatchInfo(slots, lengths, V, "cuda", draft_probs=q_d)
    out = ts.LogitsProcessorOutput(logits_d)
    graph, (predict, accept) = capture_graph(lambda: gpu.verify(out, info, drafts_d))
    g = torch.Generator().manual_seed(bs)
    accepted_any = False
    for t in range(4):
        logits = torch.randn(bs * n, V, generator=g) * 3
        q = torch.softmax(logits.view(bs, n, V)[:, :-1] / 0.8 +
                          1.5 * torch.randn(bs, n - 1, V, generator=g), -1)
        drafts = torch.cat([torch.zeros(bs, 1, dtype=torch.int32), q.argmax(-1).to(torch.int32)], 1)
        logits_d.copy_(logits)
        q_d.copy_(q)
        drafts_d.copy_(drafts)
        lengths.fill_(20 + t)
        graph.replay()
        cpu_info = ts.SamplingBatchInfo(torch.arange(1, bs + 1, dtype=torch.int32),
                                        torch.full((bs + 1,), 20 + t, dtype=torch.int32), V, "cpu",
                                        draft_probs=q)
        p_cpu, a_cpu = cpu.verify(ts.LogitsProcessorOutput(logits), cpu_info, drafts)
        assert torch.equal(predict.cpu(), p_cpu) and torch.equal(accept.cpu(), a_cpu), t
        accepted_any |= bool((a_cpu > 1).any())
        assert tickets_are_zero(gpu._workspace)
    assert accepted_any


def test_empty_residual_stops_at_the_target_sample():
    """Draft probabilities of 1 everywhere (clamped, unnormalised input): a rejected draft leaves
    max(p - q, 0) zero on the whole kept set, so the row's token is its own sample (DESIGN §4)."""
    inputs = list(build_inputs("top_k_top_p", 50257, 12, 4, torch.float32, seed=21))
    inputs[5] = torch.ones_like(inputs[5])  # q
    cpu = verify(inputs, "cpu")
    assert (cpu[1] < 4).any()  # some drafts rejected: their rows took the fallback
    assert_same(cpu, verify(inputs, "cuda", workspace=True))
