"""The grammar bitmask inside the kernels (DESIGN §3.0): every op that reads logits, given
`token_bitmask`, returns exactly what it returns for logits with the disallowed tokens set to
-inf beforehand — tokens, invalid flags, raw and processed logprobs, top-N — on every CUDA path
(split-row single and two-kernel launches, histogram cut, one block per row, verify) and on CPU.
`torch.equal` throughout: the mask is applied in the same read, so nothing else may move."""

from __future__ import annotations

import random
import zlib

import pytest
import torch

import tokensampler as ts
from tokensampler.bitmask import pack_token_bitmask
from test_cuda_kernels import ROUTES, build_slots, random_params

OPS = torch.ops.tokensampler
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
MASKS = ["half", "sparse", "empty_row"]


def _vocabs(device):
    # CPU: not multiples of 32 (bits past V in the last word); CUDA: the engine's size too, so
    # rows are split into many chunks.
    return [1000, 4099] if device == "cpu" else [4099, 151936]


def _mask_bits(kind, rows, V, gen):
    words = (V + 31) // 32
    p = {"half": 0.5, "sparse": 0.01, "empty_row": 0.3}[kind]
    allowed = torch.rand(rows, words * 32, generator=gen) < p
    if kind == "empty_row":
        allowed[0] = False             # no allowed token: §3.1, token 0 and invalid
        allowed[1 % rows, :] = False
        allowed[1 % rows, V - 1] = True  # one allowed token, the last one
    return pack_token_bitmask(allowed), allowed[:, :V]


def _inputs(route, V, dtype, kind, rows, seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    params = [random_params(rng, route, V, greedy_frac=0.15, penalties=True) for _ in range(rows)]
    mgr, slots, _ = build_slots(params, V)
    lengths = torch.tensor([0] + [rng.randrange(1 << 20) for _ in slots], dtype=torch.int32)
    logits = torch.randn(rows, V, generator=gen) * 3
    logits[0, 3] = float("inf")
    logits[-1, 9] = float("nan")
    logits = logits.to(dtype)
    bits, allowed = _mask_bits(kind, rows, V, gen)
    premasked = logits.masked_fill(~allowed, float("-inf"))
    max_top_k = max((p.top_k for p in params if p.top_k and p.top_k > 0), default=0)
    return mgr, torch.tensor(slots, dtype=torch.int32), lengths, logits, bits, premasked, max_top_k


def _sample(logits, bits, mgr, slots, lengths, route, max_top_k, mode, top_n, device,
            logprobs=True):
    # logprobs False: a step that publishes none (the kernels then read no raw partials)
    rows = logits.size(0)
    out = torch.full((rows,), -7, dtype=torch.int32, device=device)
    invalid = torch.zeros(rows, dtype=torch.bool, device=device)
    logprobs = torch.zeros(rows, dtype=torch.float32, device=device) if logprobs else None
    top_values = torch.zeros(rows, top_n, dtype=torch.float32, device=device) if top_n else None
    top_ids = torch.zeros(rows, top_n, dtype=torch.int64, device=device) if top_n else None
    OPS.sample_rows(logits.to(device), slots.to(device), lengths.to(device), mgr.table.to(device),
                    mgr.history_capacity, mgr.bias_capacity, 1, None, True, mode, route,
                    max_top_k, out, invalid, logprobs, top_values, top_ids, None,
                    None if bits is None else bits.to(device))
    return [t for t in (out, invalid, logprobs, top_values, top_ids) if t is not None]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize("route", list(ROUTES))
def test_sample_rows_with_bitmask_equals_premasked_logits(route, kind, dtype, device):
    # (logprobs, mode, top-N): the multi-block paths without and with raw logprobs, then the
    # one-block kernel (processed, top-N)
    for V in _vocabs(device):
        for rows in (2, 24):  # the single launch (<= 4 rows) and the two-kernel launches
            seed = zlib.crc32(f"{route}-{kind}-{dtype}-{V}-{rows}".encode())
            mgr, slots, lengths, logits, bits, premasked, max_top_k = _inputs(
                route, V, dtype, kind, rows, seed)
            for logprobs, mode, top_n in ((False, 0, 0), (True, 0, 0), (True, 1, 0), (True, 0, 3)):
                fused = _sample(logits, bits, mgr, slots, lengths, ROUTES[route], max_top_k, mode,
                                top_n, device, logprobs)
                plain = _sample(premasked, None, mgr, slots, lengths, ROUTES[route], max_top_k,
                                mode, top_n, device, logprobs)
                for a, b in zip(fused, plain):
                    assert torch.equal(a, b), (V, rows, logprobs, mode, top_n, a, b)
                if kind == "empty_row":
                    assert fused[1][0].item() and fused[0][0].item() == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [2, 24])
def test_masked_top_k_with_penalties_at_the_split_row_limit(rows, device):
    """k in (256, 512] with penalties: the split-row chunk kernel's shared memory (penalty
    bitmap, a 512-slot candidate buffer, its static arrays) leaves the least room for the
    staged bitmask words, which are staged only where they fit the kernel's 48 KiB."""
    V = 151936
    gen = torch.Generator().manual_seed(rows)
    params = [ts.SamplingParams(temperature=0.8, top_k=300 + 50 * (i % 5), top_p=0.9, seed=i,
                                repetition_penalty=1.2, frequency_penalty=0.4,
                                logit_bias={17: 2.0}) for i in range(rows)]
    mgr, slots, _ = build_slots(params, V, prompts=[[5, 17, 900]] * rows)
    slots = torch.tensor(slots, dtype=torch.int32)
    lengths = torch.arange(rows + 1, dtype=torch.int32)
    logits = torch.randn(rows, V, generator=gen) * 3
    bits, allowed = _mask_bits("half", rows, V, gen)
    premasked = logits.masked_fill(~allowed, float("-inf"))
    k = max(p.top_k for p in params)
    for logprobs in (False, True):
        fused = _sample(logits, bits, mgr, slots, lengths, ROUTES["top_k_top_p"], k, 0, 0, device,
                        logprobs)
        plain = _sample(premasked, None, mgr, slots, lengths, ROUTES["top_k_top_p"], k, 0, 0,
                        device, logprobs)
        for a, b in zip(fused, plain):
            assert torch.equal(a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_masked_top_k_rows_in_chunks_of_many_rounds(dtype, monkeypatch):
    """One chunk block per SM and more rows than SMs: each chunk of the split-row path is a whole
    row, 38 rounds of 4,096 tokens at V 151936, past what a chunk's bitmask words staged at once
    would take. The top-k loop stages them a round ahead; every round's bits must be its own.
    Rows of k 5 / 50 / 300, greedy rows and rows with penalties among them."""
    monkeypatch.setenv("TOKENSAMPLER_CHUNK_BLOCKS_PER_SM", "1")
    V, rows = 151936, 160
    gen = torch.Generator().manual_seed(zlib.crc32(f"many-rounds-{dtype}".encode()))
    params = [ts.SamplingParams(temperature=0.0 if i % 7 == 3 else 0.8, top_k=(5, 50, 300)[i % 3],
                                top_p=0.9, seed=i, repetition_penalty=1.3 if i % 4 == 0 else 1.0,
                                logit_bias={17: 2.0} if i % 4 == 0 else None)
              for i in range(rows)]
    mgr, slots, _ = build_slots(params, V)
    slots = torch.tensor(slots, dtype=torch.int32)
    lengths = torch.arange(rows + 1, dtype=torch.int32)
    logits = (torch.randn(rows, V, generator=gen) * 3).to(dtype)
    bits, allowed = _mask_bits("half", rows, V, gen)
    premasked = logits.masked_fill(~allowed, float("-inf"))
    for logprobs in (False, True):
        fused = _sample(logits, bits, mgr, slots, lengths, ROUTES["top_k_top_p"], 300, 0, 0,
                        "cuda", logprobs)
        plain = _sample(premasked, None, mgr, slots, lengths, ROUTES["top_k_top_p"], 300, 0, 0,
                        "cuda", logprobs)
        for a, b in zip(fused, plain):
            assert torch.equal(a, b), (logprobs, (a != b).nonzero().flatten()[:8].tolist())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route", ["no_filter", "top_k_top_p"])
@pytest.mark.parametrize("n", [1, 4])  # plain rows; verify rows (their drafts count as penalties)
@pytest.mark.parametrize("rows", [4, 24])  # the single launch and the two-kernel launches
def test_masked_edge_rows_without_logprobs_equal_premasked_logits(rows, n, route, device):
    """Steps without logprobs, where the split-row loops may apply the bitmask late, on the rows
    where that could go wrong: a +inf or huge bias on a disallowed token, a row whose allowed
    tokens are all -inf or NaN (invalid), an allowed +inf beside a disallowed one, an allowed
    set smaller than k, small and large k, penalties from the history and the drafts."""
    V = _vocabs(device)[-1]
    bs = rows // n
    gen = torch.Generator().manual_seed(rows * 10 + n)
    banned = [11, 12, 13]  # disallowed in every row, and biased
    params = []
    for q in range(bs):
        kw = dict(temperature=0.8, seed=q, repetition_penalty=1.3, frequency_penalty=0.5,
                  logit_bias={11: float("inf"), 12: 1e30, 13: 5.0, 40 + q: 2.0})
        if route == "top_k_top_p":
            kw.update(top_k=[20, 200, 450][q % 3], top_p=0.9)
        params.append(ts.SamplingParams(**kw))
    mgr, slots, _ = build_slots(params, V, prompts=[[40 + q, 41 + q] for q in range(bs)])
    slots = torch.tensor(slots, dtype=torch.int32)
    lengths = torch.arange(bs + 1, dtype=torch.int32)
    logits = torch.randn(rows, V, generator=gen) * 3
    words = (V + 31) // 32
    allowed = torch.rand(rows, words * 32, generator=gen) < 0.3
    allowed[1] = False  # row 1: allowed tokens only where its logits are -inf or NaN
    allowed[1, 100:110] = True
    logits[1, 100:105] = float("-inf")
    logits[1, 105:110] = float("nan")
    allowed[2, 7] = True  # row 2: an allowed +inf, and a disallowed one before it
    allowed[2, 5] = False
    logits[2, 7] = float("inf")
    logits[2, 5] = float("inf")
    allowed[rows - 1] = False  # last row: 12 allowed tokens, fewer than any k here
    allowed[rows - 1, torch.randperm(V, generator=gen)[:12]] = True
    allowed[:, banned] = False
    allowed = allowed[:, :V]
    bits = pack_token_bitmask(torch.nn.functional.pad(allowed, (0, words * 32 - V)))
    premasked = logits.masked_fill(~allowed, float("-inf"))
    drafts = torch.randint(0, 64, (bs, n), generator=gen, dtype=torch.int32) if n > 1 else None
    max_top_k = max((p.top_k for p in params if p.top_k > 0), default=0)
    outs = []
    for x, m in ((logits, bits), (premasked, None)):
        out = torch.full((rows,), -7, dtype=torch.int32, device=device)
        invalid = torch.zeros(rows, dtype=torch.bool, device=device)
        OPS.sample_rows(x.to(device), slots.to(device), lengths.to(device), mgr.table.to(device),
                        mgr.history_capacity, mgr.bias_capacity, n,
                        None if drafts is None else drafts.to(device), True, 0, ROUTES[route],
                        max_top_k, out, invalid, None, None, None, None,
                        None if m is None else m.to(device))
        outs.append((out, invalid))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert outs[0][1][1].item() and outs[0][0][1].item() == 0  # no allowed finite token
    assert not outs[0][1][2].item() and outs[0][0][2].item() == 7  # the allowed +inf
    assert not torch.isin(outs[0][0].cpu(), torch.tensor(banned)).any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_argmax_rows_with_bitmask_equals_premasked_logits(dtype, device):
    for V in _vocabs(device):
        _, _, _, logits, bits, premasked, _ = _inputs("no_filter", V, dtype, "empty_row", 16, V)
        fused = torch.empty(16, dtype=torch.int32, device=device)
        plain = torch.empty(16, dtype=torch.int32, device=device)
        OPS.argmax_rows(logits.to(device), fused, bits.to(device))
        OPS.argmax_rows(premasked.to(device), plain)
        assert torch.equal(fused, plain)
        assert fused[0].item() == 0 and fused[1].item() == V - 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route", ["top_k_top_p", "top_k_top_p_min_p", "no_filter"])
def test_verify_rejection_with_bitmask_equals_premasked_logits(route, device):
    bs, n = 6, 4
    for V in _vocabs(device):
        rng = random.Random(V)
        gen = torch.Generator().manual_seed(V)
        params = [random_params(rng, route, V, greedy_frac=0.15, penalties=True) for _ in range(bs)]
        mgr, slots, _ = build_slots(params, V)
        lengths = torch.tensor([0] + [rng.randrange(1 << 20) for _ in slots], dtype=torch.int32)
        logits = (torch.randn(bs * n, V, generator=gen) * 2).to(torch.bfloat16)
        bits, allowed = _mask_bits("half", bs * n, V, gen)
        premasked = logits.masked_fill(~allowed, float("-inf"))
        # drafts: allowed tokens mostly, a disallowed one now and then
        candidates = torch.multinomial(allowed.float() + 0.02, n, generator=gen).to(torch.int32)
        candidates = candidates.view(bs * n, n)[::n].contiguous()
        draft_probs = torch.softmax(torch.randn(bs, n - 1, V, generator=gen), -1)
        max_top_k = max((p.top_k for p in params if p.top_k and p.top_k > 0), default=0)
        outs = []
        for x, m in ((logits, bits), (premasked, None)):
            predict = torch.empty(bs * n, dtype=torch.int32, device=device)
            accept = torch.empty(bs, dtype=torch.int32, device=device)
            invalid = torch.empty(bs * n, dtype=torch.bool, device=device)
            OPS.verify_rejection(x.to(device), torch.tensor(slots, dtype=torch.int32, device=device),
                                 lengths.to(device), mgr.table.to(device), mgr.history_capacity,
                                 mgr.bias_capacity, candidates.to(device), draft_probs.to(device),
                                 True, ROUTES[route], max_top_k, predict, accept, invalid,
                                 None if m is None else m.to(device))
            outs.append((predict, accept, invalid))
        for a, b in zip(*outs):
            assert torch.equal(a, b)


@pytest.mark.parametrize("shape", [(2, 31), (3, 32), (2, 33)])
def test_bitmask_of_wrong_shape_is_refused_by_the_op(shape, cpp_exceptions_reach_python):
    if not cpp_exceptions_reach_python:
        pytest.skip("C++ exceptions kill the interpreter on this image (conftest.py)")
    logits = torch.zeros(2, 1000)
    out = torch.empty(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="token_bitmask"):
        OPS.argmax_rows(logits, out, torch.zeros(shape, dtype=torch.int32))
    with pytest.raises(TypeError, match="token_bitmask"):
        OPS.argmax_rows(logits, out, torch.zeros(2, 32, dtype=torch.int64))
