"""CUDA kernels against the CPU kernels (the specification): same inputs, same tokens.

Every test builds its inputs on the CPU, runs the op there and on the GPU with the same slot
table copied to the device, and compares. Skips cleanly without a CUDA device.
"""

from __future__ import annotations

import random
import zlib

import pytest
import torch

import tokensampler as ts
from tokensampler import _C
from tokensampler.backends.slot_params import to_slot_params

from helpers import capture_graph

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

OPS = torch.ops.tokensampler if hasattr(torch.ops, "tokensampler") else None
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
VOCABS = [1, 7, 1000, 50257, 151936]
ROUTES = {"generic": 0, "no_filter": 1, "top_k": 2, "top_p": 3, "top_k_top_p": 4, "min_p": 5,
          "top_k_top_p_min_p": 6}
H, B = 64, 16


# ------------------------------------------------------------------ builders
def random_params(rng: random.Random, route: str, V: int, greedy_frac=0.1,
                  penalties=False) -> ts.SamplingParams:
    kw = dict(temperature=rng.choice([0.3, 0.7, 1.0, 1.5]), seed=rng.randrange(1 << 62))
    r = route
    if route == "generic":
        r = rng.choice(["no_filter", "top_k", "top_p", "top_k_top_p", "min_p",
                        "top_k_top_p_min_p"])
    if "top_k" in r:
        kw["top_k"] = rng.choice([2, 5, 50, 1000, max(2, V - 1)])
    if "top_p" in r:
        kw["top_p"] = rng.choice([0.1, 0.5, 0.9, 0.99])
    if "min_p" in r:
        kw["min_p"] = rng.choice([0.01, 0.05, 0.3])
    if rng.random() < greedy_frac:
        kw["temperature"] = 0.0
    if penalties:
        kw.update(repetition_penalty=rng.choice([1.0, 1.3, 0.8]),
                  frequency_penalty=rng.choice([0.0, 0.5]),
                  presence_penalty=rng.choice([0.0, 0.7]))
        if V > 1:
            kw["logit_bias"] = {rng.randrange(V): rng.uniform(-3, 3) for _ in range(5)}
    return ts.SamplingParams(**kw)


def build_slots(params, V, prompts=None, with_min_p=True):
    pool = len(params) + 1
    mgr = _C.SlotStateManager(pool_rows=pool, vocab_size=V, history_capacity=min(H, V),
                              bias_capacity=B, with_min_p=with_min_p, device="cpu")
    rids = [f"r{i}" for i in range(len(params))]
    slots = list(range(1, len(params) + 1))
    sp = [to_slot_params(p, rid, V) for p, rid in zip(params, rids)]
    route = mgr.prepare_step(rids, slots, sp, prompts or [])
    return mgr, slots, int(route)


def run_sample(logits, slots, lengths, table, hcap, bcap, n=1, candidates=None,
               penalties=True, mode=0, route=0, top_n=0, logprobs=True, max_top_k=0):
    dev = logits.device
    rows = logits.size(0)
    out = torch.full((rows,), -7, dtype=torch.int32, device=dev)
    inv = torch.zeros(rows, dtype=torch.bool, device=dev)
    lp = torch.zeros(rows, dtype=torch.float32, device=dev) if logprobs else None
    tv = torch.zeros(rows, top_n, dtype=torch.float32, device=dev) if top_n else None
    ti = torch.zeros(rows, top_n, dtype=torch.int64, device=dev) if top_n else None
    OPS.sample_rows(logits, slots.to(dev), lengths.to(dev), table.to(dev), hcap, bcap, n,
                    None if candidates is None else candidates.to(dev), penalties, mode, route,
                    max_top_k, out, inv, lp, tv, ti)
    return out, inv, lp, tv, ti


def compare(logits, mgr, slots, lengths, route, n=1, candidates=None, penalties=True, mode=0,
            top_n=0, lp_atol=1e-4, max_top_k=0):
    slots_t = torch.tensor(slots, dtype=torch.int32)
    table = mgr.table
    cpu = run_sample(logits, slots_t, lengths, table, mgr.history_capacity, mgr.bias_capacity, n,
                     candidates, penalties, mode, route, top_n, max_top_k=max_top_k)
    gpu = run_sample(logits.cuda(), slots_t, lengths, table, mgr.history_capacity,
                     mgr.bias_capacity, n, candidates, penalties, mode, route, top_n,
                     max_top_k=max_top_k)
    gpu = [None if t is None else t.cpu() for t in gpu]
    differ = (cpu[0] != gpu[0]).nonzero().flatten().tolist()
    assert not differ, f"rows {differ}: CPU {cpu[0][differ].tolist()}, CUDA {gpu[0][differ].tolist()}"
    assert torch.equal(cpu[1], gpu[1])
    a, b = cpu[2], gpu[2]
    fin = torch.isfinite(a)
    assert torch.equal(fin, torch.isfinite(b)) and torch.equal(a[~fin], b[~fin])
    torch.testing.assert_close(a[fin], b[fin], atol=lp_atol, rtol=0)
    if top_n:
        assert torch.equal(cpu[4], gpu[4])
        fin = torch.isfinite(cpu[3])  # -inf top-N values (rows with no finite logit) exactly
        assert torch.equal(fin, torch.isfinite(gpu[3])) and torch.equal(cpu[3][~fin], gpu[3][~fin])
        torch.testing.assert_close(cpu[3][fin], gpu[3][fin], atol=lp_atol, rtol=0)
    return cpu, gpu


def random_logits(rows, V, dtype, gen, scale=2.0):
    x = torch.randn(rows, V, generator=gen) * scale
    return x.to(dtype)


# ------------------------------------------------------------------ sample_rows
@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("V", VOCABS)
def test_sample_rows_matches_cpu(route, dtype, V):
    # crc32, not hash(): str hashes change with every interpreter (PYTHONHASHSEED)
    rng = random.Random(zlib.crc32(f"{route}-{dtype}-{V}".encode()))
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    bs = 64 if V <= 50257 else 24
    params = [random_params(rng, route, V) for _ in range(bs)]
    mgr, slots, sel = build_slots(params, V)
    lengths = torch.tensor([0] + [rng.randrange(1 << 20) for _ in slots], dtype=torch.int32)
    logits = random_logits(bs, V, dtype, gen)
    # The step's largest k, as the backends pass it for top-k routes: lets top-k steps take the
    # split-row path (0, "unknown", keeps them off it). A top-k route describes the step only
    # when every sampled row has a top-k (route.h; k >= V disables it), as the route the slot
    # manager selects always does; the fuzz's fixed route may not, and then it passes 0.
    sampled = [p for p in params if p.temperature > 0 and p.top_k != 1]
    every_row_top_k = all(p.top_k is not None and 0 < p.top_k < V for p in sampled)
    ks = [p.top_k for p in params if p.top_k is not None and 0 < p.top_k < V]
    for mode in (0, 1):
        # Processed logprobs of top-p rows: the kept mass summed in another order on each
        # device (double on both; the fused no-filter sum in fp32 on the GPU).
        atol = 1e-3 if mode == 1 and ("top_p" in route or route == "generic") else 1e-4
        for r in (ROUTES[route], sel):
            describes = r == sel or every_row_top_k
            max_top_k = max(ks, default=0) if _C.is_top_k_route(_C.Route(r)) and describes else 0
            compare(logits, mgr, slots, lengths, r, mode=mode, lp_atol=atol)
            if max_top_k:
                compare(logits, mgr, slots, lengths, r, mode=mode, lp_atol=atol,
                        max_top_k=max_top_k)


@pytest.mark.parametrize("V", [1000, 151936])
def test_many_seeds_and_positions(V):
    rng = random.Random(7)
    gen = torch.Generator().manual_seed(3)
    total, same = 0, 0
    for route in ROUTES:
        for _ in range(4 if V > 1000 else 16):
            bs = 32
            params = [random_params(rng, route, V, greedy_frac=0.0) for _ in range(bs)]
            mgr, slots, _ = build_slots(params, V)
            lengths = torch.tensor([0] + [rng.randrange(1 << 30) for _ in slots],
                                   dtype=torch.int32)
            logits = random_logits(bs, V, torch.float32, gen, scale=rng.choice([0.5, 2, 6]))
            slots_t = torch.tensor(slots, dtype=torch.int32)
            c = run_sample(logits, slots_t, lengths, mgr.table, H, B, route=ROUTES[route])[0]
            g = run_sample(logits.cuda(), slots_t, lengths, mgr.table, H, B,
                           route=ROUTES[route])[0].cpu()
            total += bs
            same += int((c == g).sum())
    assert same == total, f"{same}/{total}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("V", [7, 1000, 151936])
def test_penalties_history_drafts_bias(dtype, V):
    rng = random.Random(11)
    gen = torch.Generator().manual_seed(5)
    n, bs = 4, 16
    params = [random_params(rng, "generic", V, penalties=True) for _ in range(bs)]
    prompts = [[rng.randrange(V) for _ in range(rng.randrange(0, 20))] for _ in range(bs)]
    mgr, slots, _ = build_slots(params, V, prompts)
    slots_t = torch.tensor(slots, dtype=torch.int32)
    # output counts: append some tokens on the CPU table and on a device copy, compare tables
    toks = torch.tensor([[rng.randrange(V) for _ in range(n)] for _ in range(bs)],
                        dtype=torch.int32).view(-1)
    acc = torch.tensor([rng.randrange(1, n + 1) for _ in range(bs)], dtype=torch.int32)
    dev_table = mgr.table.cuda()
    OPS.append_history(dev_table, mgr.history_capacity, mgr.bias_capacity, slots_t.cuda(),
                       toks.cuda(), acc.cuda(), n)
    OPS.append_history(mgr.table, mgr.history_capacity, mgr.bias_capacity, slots_t, toks, acc, n)
    assert torch.equal(dev_table.cpu(), mgr.table)
    lengths = torch.tensor([0] + [rng.randrange(1000) for _ in slots], dtype=torch.int32)
    cands = torch.tensor([[rng.randrange(V) for _ in range(n)] for _ in range(bs)],
                         dtype=torch.int32)
    # strong logits on each request's prompt, history, draft and bias tokens, so that the
    # penalties decide tokens
    logits = random_logits(bs * n, V, dtype, gen)
    for b in range(bs):
        hot = (set(prompts[b]) | set(toks.view(bs, n)[b, :int(acc[b])].tolist())
               | set(cands[b].tolist()) | set(params[b].normalize(V).logit_bias or {}))
        logits[b * n:(b + 1) * n, sorted(hot)] += 6.0
    for mode in (0, 1):
        cpu, _ = compare(logits, mgr, slots, lengths, 0, n=n, candidates=cands, mode=mode,
                         lp_atol=1e-3 if mode == 1 else 1e-4)
    without = run_sample(logits, slots_t, lengths, mgr.table, mgr.history_capacity,
                         mgr.bias_capacity, n, cands, penalties=False)[0]
    assert not torch.equal(cpu[0], without)  # the penalties changed tokens: the test sees them
    compare(logits[:bs], mgr, slots, lengths, 0, mode=0, top_n=5)


@pytest.mark.parametrize("route,max_top_k", [(0, 0), (2, 40), (3, 0), (5, 0)],
                         ids=["generic", "top_k_split_row", "top_p_cut", "min_p"])
def test_verify_drafts_against_a_nearly_full_history(route, max_top_k):
    """DESIGN §4 with a history of H = 4 distinct tokens, 2–4 of them used: a draft new to a
    full history counts as nothing (plain decoding dropped it), others count. CPU == CUDA on
    every path, and penalize_logits (the FlashInfer adapters' processed logits) too."""
    rng = random.Random(29)
    gen = torch.Generator().manual_seed(29)
    V, n, bs, cap = 1000, 5, 12, 4
    kw = {0: {}, 2: dict(top_k=40), 3: dict(top_p=0.9), 5: dict(min_p=0.05)}[route]
    params = [ts.SamplingParams(seed=b, temperature=0.8, repetition_penalty=1.5,
                                frequency_penalty=1.5, presence_penalty=0.5, **kw)
              for b in range(bs)]
    pool = bs + 1
    mgr = _C.SlotStateManager(pool_rows=pool, vocab_size=V, history_capacity=cap,
                              bias_capacity=B, with_min_p=True, device="cpu")
    rids = [f"r{i}" for i in range(bs)]
    slots = list(range(1, bs + 1))
    mgr.prepare_step(rids, slots, [to_slot_params(p, r, V) for p, r in zip(params, rids)], [])
    slots_t = torch.tensor(slots, dtype=torch.int32)
    used = torch.tensor([rng.randrange(2, cap + 1) for _ in range(bs)], dtype=torch.int32)
    history = torch.tensor([[10 * b + k for k in range(cap)] for b in range(bs)], dtype=torch.int32)
    OPS.append_history(mgr.table, cap, B, slots_t, history.view(-1), used, cap)
    # drafts: new tokens (some repeated), history tokens, in every order
    pick = [[rng.choice([500 + b, 600 + b, 700 + b, 10 * b, 10 * b + 1]) for _ in range(n)]
            for b in range(bs)]
    cands = torch.tensor(pick, dtype=torch.int32)
    logits = random_logits(bs * n, V, torch.float32, gen)
    for b in range(bs):
        logits[b * n:(b + 1) * n, sorted(set(pick[b]))] += 5.0
    lengths = torch.tensor([0] + [rng.randrange(1000) for _ in slots], dtype=torch.int32)
    compare(logits, mgr, slots, lengths, route, n=n, candidates=cands, max_top_k=max_top_k)
    out = {}
    for dev in ("cpu", "cuda"):
        processed = torch.empty(bs * n, V, device=dev)
        OPS.penalize_logits(logits.to(dev), slots_t.to(dev), mgr.table.to(dev), cap, B, n,
                            cands.to(dev), 0, processed)
        out[dev] = processed.cpu()
    assert torch.equal(out["cpu"], out["cuda"])


@pytest.mark.parametrize("dtype", DTYPES)
def test_edge_rows(dtype):
    V = 1000
    rng = random.Random(2)
    rows = []
    params = []
    gen = torch.Generator().manual_seed(9)
    for route in ["no_filter", "top_k", "top_p", "top_k_top_p", "min_p", "generic"]:
        for kind in ["posinf", "posinf_many", "neginf", "nan", "nan_some", "ties", "const",
                     "greedy_ties", "one_finite"]:
            x = torch.randn(V, generator=gen) * 2
            if kind == "posinf":
                x[[3, 500, 999]] = float("inf")
            elif kind == "posinf_many":
                x[torch.randperm(V, generator=gen)[:300]] = float("inf")
            elif kind == "neginf":
                x[:] = float("-inf")
            elif kind == "nan":
                x[:] = float("nan")
            elif kind == "nan_some":
                x[torch.randperm(V, generator=gen)[:400]] = float("nan")
            elif kind == "ties":
                x = torch.round(x * 2) / 2
            elif kind == "const":
                x[:] = 1.25
            elif kind == "greedy_ties":
                x[[10, 20, 30]] = 50.0
            elif kind == "one_finite":
                x[:] = float("-inf")
                x[123] = 0.5
            rows.append(x)
            p = random_params(rng, route, V, greedy_frac=0.0)
            if kind == "greedy_ties":
                p = ts.SamplingParams(temperature=0.0)
            params.append(p)
    logits = torch.stack(rows).to(dtype)
    mgr, slots, _ = build_slots(params, V)
    lengths = torch.tensor([0] + [rng.randrange(1 << 20) for _ in slots], dtype=torch.int32)
    for mode in (0, 1):  # with top-N: the one-block-per-row kernel
        compare(logits, mgr, slots, lengths, 0, mode=mode, top_n=3)
    compare(logits, mgr, slots, lengths, 0)  # the histogram-cut path


def test_invalid_slot_rows():
    V = 100
    params = [ts.SamplingParams(temperature=1.0, seed=1)]
    mgr, _, _ = build_slots(params, V)
    slots = torch.tensor([1, 57, -3], dtype=torch.int32)
    lengths = torch.zeros(mgr.pool_rows, dtype=torch.int32)
    logits = torch.randn(3, V)
    c = run_sample(logits, slots, lengths, mgr.table, H, B)
    g = run_sample(logits.cuda(), slots, lengths, mgr.table, H, B)
    assert torch.equal(c[0], g[0].cpu()) and torch.equal(c[1], g[1].cpu())
    assert g[1].cpu().tolist() == [False, True, True]


# ------------------------------------------------------------------ verify ops
def test_verify_chain_matches_cpu():
    gen = torch.Generator().manual_seed(0)
    for bs, n in [(1, 1), (5, 4), (300, 3)]:
        cand = torch.randint(0, 3, (bs, n), generator=gen, dtype=torch.int32)
        y = torch.randint(0, 3, (bs * n,), generator=gen, dtype=torch.int32)
        invalid = torch.rand(bs * n, generator=gen) < 0.2
        for bad in (None, invalid):
            pc, ac = torch.empty(bs * n, dtype=torch.int32), torch.empty(bs, dtype=torch.int32)
            OPS.verify_chain(cand, y, pc, ac, bad)
            pg = torch.empty(bs * n, dtype=torch.int32, device="cuda")
            ag = torch.empty(bs, dtype=torch.int32, device="cuda")
            OPS.verify_chain(cand.cuda(), y.cuda(), pg, ag, None if bad is None else bad.cuda())
            assert torch.equal(pc, pg.cpu()) and torch.equal(ac, ag.cpu())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("V", [7, 1000, 50257])
def test_verify_rejection_matches_cpu(dtype, V):
    rng = random.Random(V)
    gen = torch.Generator().manual_seed(V)
    bs, n = 24, 4
    params = [random_params(rng, "generic", V, penalties=True) for _ in range(bs)]
    mgr, slots, _ = build_slots(params, V)
    slots_t = torch.tensor(slots + [999], dtype=torch.int32)  # last request: bad slot
    lengths = torch.tensor([0] + [rng.randrange(1 << 20) for _ in slots], dtype=torch.int32)
    bs += 1
    logits = random_logits(bs * n, V, dtype, gen, scale=1.0)
    q = torch.softmax(logits.float().view(bs, n, V)[:, :-1] + 0.3 *
                      torch.randn(bs, n - 1, V, generator=gen), -1)
    # drafts: mostly the draft model's argmax, so that some get accepted
    cands = torch.cat([torch.zeros(bs, 1, dtype=torch.int32),
                       q.argmax(-1).to(torch.int32)], 1).contiguous()
    outs = []
    for dev in ("cpu", "cuda"):
        pred = torch.empty(bs * n, dtype=torch.int32, device=dev)
        acc = torch.empty(bs, dtype=torch.int32, device=dev)
        inv = torch.empty(bs * n, dtype=torch.bool, device=dev)
        OPS.verify_rejection(logits.to(dev), slots_t.to(dev), lengths.to(dev),
                             mgr.table.to(dev), mgr.history_capacity, mgr.bias_capacity,
                             cands.to(dev), q.to(dev), True, 0, 0, pred, acc, inv)
        outs.append((pred.cpu(), acc.cpu(), inv.cpu()))
    (pc, ac, ic), (pg, ag, ig) = outs
    assert torch.equal(ac, ag)
    assert torch.equal(ic, ig)
    assert torch.equal(pc, pg)


def test_append_history_matches_cpu_and_overflows():
    V = 50
    rng = random.Random(1)
    params = [ts.SamplingParams(frequency_penalty=0.5, seed=i) for i in range(6)]
    params[2] = ts.SamplingParams(seed=3)  # no penalties: nothing recorded
    mgr = _C.SlotStateManager(pool_rows=7, vocab_size=V, history_capacity=8, bias_capacity=2,
                              with_min_p=True, device="cpu")
    mgr.prepare_step([f"r{i}" for i in range(6)], list(range(1, 7)),
                     [to_slot_params(p, f"r{i}", V) for i, p in enumerate(params)], [])
    table = mgr.table.clone()
    dev = table.cuda()
    slots = torch.tensor([1, 2, 3, 4, 5, 99], dtype=torch.int32)
    for _ in range(6):
        toks = torch.tensor([rng.randrange(-1, V) for _ in range(6 * 3)], dtype=torch.int32)
        acc = torch.tensor([rng.randrange(0, 5) for _ in range(6)], dtype=torch.int32)
        OPS.append_history(table, 8, 2, slots, toks, acc, 3)
        OPS.append_history(dev, 8, 2, slots.cuda(), toks.cuda(), acc.cuda(), 3)
        assert torch.equal(table, dev.cpu())


def test_append_history_places_tokens_in_long_histories():
    """Histories past one warp's probes (32) and past 1024 entries, so the warp's search takes
    two and three rounds: new tokens below, between and above every entry, repeats, and a list
    that fills up (row 3). Same table as the CPU op after every step."""
    V, cap, n = 20000, 3000, 64
    rng = random.Random(2)
    params = [ts.SamplingParams(presence_penalty=0.5, seed=i) for i in range(3)]
    mgr = _C.SlotStateManager(pool_rows=4, vocab_size=V, history_capacity=cap, bias_capacity=2,
                              with_min_p=True, device="cpu")
    mgr.prepare_step([f"r{i}" for i in range(3)], [1, 2, 3],
                     [to_slot_params(p, f"r{i}", V) for i, p in enumerate(params)], [])
    table = mgr.table.clone()
    dev = table.cuda()
    slots = torch.tensor([1, 2, 3], dtype=torch.int32)
    seen = [[], [], []]
    for step in range(60):
        toks = []
        for r in range(3):
            for _ in range(n):  # rows 1 and 2 repeat a third of their tokens, row 3 none
                repeat = r < 2 and seen[r] and rng.random() < 0.33
                t = rng.choice(seen[r]) if repeat else rng.randrange(V)
                seen[r].append(t)
                toks.append(t)
        toks = torch.tensor(toks, dtype=torch.int32)
        acc = torch.tensor([n, rng.randrange(n + 1), n], dtype=torch.int32)
        OPS.append_history(table, cap, 2, slots, toks, acc, n)
        OPS.append_history(dev, cap, 2, slots.cuda(), toks.cuda(), acc.cuda(), n)
        assert torch.equal(table, dev.cpu()), f"step {step}"
    distinct = [len(set(s)) for s in seen]
    assert distinct[0] > 1024 and distinct[2] > cap, distinct


# ------------------------------------------------------------------ graph safety
def _device_inputs(V=151936, bs=16, route="top_k_top_p"):
    rng = random.Random(5)
    params = [random_params(rng, route, V, penalties=True) for _ in range(bs)]
    mgr, slots, sel = build_slots(params, V)
    lengths = torch.tensor([0] + [rng.randrange(1 << 20) for _ in slots], dtype=torch.int32)
    logits = torch.randn(bs, V, generator=torch.Generator().manual_seed(1)).cuda()
    return mgr, torch.tensor(slots, dtype=torch.int32).cuda(), lengths.cuda(), logits, sel


def _outs(rows, top_n, dev="cuda"):
    return (torch.empty(rows, dtype=torch.int32, device=dev),
            torch.empty(rows, dtype=torch.bool, device=dev),
            torch.empty(rows, dtype=torch.float32, device=dev),
            torch.empty(rows, top_n, dtype=torch.float32, device=dev),
            torch.empty(rows, top_n, dtype=torch.int64, device=dev))


@pytest.mark.parametrize("route", ["no_filter", "top_k_top_p", "generic", "top_p"])
def test_sample_rows_no_host_sync(route):
    mgr, slots, lengths, logits, sel = _device_inputs(route=route)
    table = mgr.table.cuda()
    o = _outs(logits.size(0), 4)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        OPS.sample_rows(logits, slots, lengths, table, mgr.history_capacity, mgr.bias_capacity,
                        1, None, True, 1, sel, 0, *o)
        OPS.append_history(table, mgr.history_capacity, mgr.bias_capacity, slots, o[0],
                           torch.ones_like(o[0]), 1)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


@pytest.mark.parametrize("route", ["no_filter", "top_k_top_p", "generic"])
def test_cuda_graph_replay_equals_eager(route):
    mgr, slots, lengths, logits, sel = _device_inputs(route=route)
    table = mgr.table.cuda()
    static_logits = logits.clone()
    o = _outs(logits.size(0), 3)
    args = lambda: (static_logits, slots, lengths, table, mgr.history_capacity,
                    mgr.bias_capacity, 1, None, True, 0, sel, 0, *o)
    g, _ = capture_graph(lambda: OPS.sample_rows(*args()))
    for seed in range(3):
        new = torch.randn(logits.shape, generator=torch.Generator().manual_seed(seed + 10)).cuda()
        static_logits.copy_(new)
        lengths.add_(1)
        g.replay()
        replay = [t.clone() for t in o]
        OPS.sample_rows(*args())
        eager = [t.clone() for t in o]
        for a, b in zip(replay, eager):
            assert torch.equal(a, b)


def test_backend_workspace_serves_every_step():
    """A CUDA backend owns its kernels' scratch (sized from the config, so steps allocate
    nothing); the op gives the same tokens with or without it."""
    mgr, slots, lengths, logits, sel = _device_inputs(route="top_p")
    cfg = ts.SamplingBackendConfig(max_bs=4, max_draft_tokens_per_req=2, max_req_pool_size=4,
                                   vocab_size=1000, device="cuda")
    backend = ts.create_backend("gumbel", cfg)
    assert backend._workspace.numel() == _C.sample_rows_workspace_bytes(8)
    table = mgr.table.cuda()
    rows = logits.size(0)
    outs = []
    for workspace in (None, torch.zeros(_C.sample_rows_workspace_bytes(rows), dtype=torch.uint8,
                                        device="cuda")):
        o = _outs(rows, 0)[:3]
        OPS.sample_rows(logits, slots, lengths, table, mgr.history_capacity, mgr.bias_capacity,
                        1, None, True, 0, sel, 0, *o, None, None, workspace)
        outs.append(o[0].clone())
    assert torch.equal(outs[0], outs[1])
