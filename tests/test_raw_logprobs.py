"""The raw_logprobs op: DESIGN §3.8's raw logprobs of given tokens, which rejection verify and
the FlashInfer adapters publish (test_greedy.py checks it against what sample_rows publishes,
bit for bit on CPU). Here: a token outside [0, V) (a row that emitted none) gets NaN, the
grammar bitmask equals logits masked beforehand, exactly, and CUDA gives the CPU's top-N ids
exactly and its values to 1e-4 (±inf and NaN exactly), on rows with ties, ±inf and NaN."""

from __future__ import annotations

import pytest
import torch

from tokensampler.bitmask import pack_token_bitmask

OPS = torch.ops.tokensampler
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
INF, NAN = float("inf"), float("nan")


def _rows(V, dtype, gen):
    x = torch.randn(8, V, generator=gen) * 3
    x[0, [V - 1, 5, 9]] = 30.0           # a three-way tie at the top
    x[1] = -INF
    x[1, 3] = NAN                         # no finite logit
    x[2, [41, 40]] = INF                  # two +inf entries
    x[3] = 0.0
    x[3, [2, 6]] = -0.0                   # -0 ties +0
    x[4, : V // 2] = NAN
    x[5, 7] = 1e30                        # huge next to the rest
    tokens = torch.tensor([9, 3, 41, 6, V - 1, 7, -1, V], dtype=torch.int32)  # two emitted none
    allowed = torch.rand(8, (V + 31) // 32 * 32, generator=gen) < 0.6
    allowed[2, 40] = False                # one of row 2's +inf entries disallowed
    return x.to(dtype), tokens, allowed


def _run(logits, tokens, bits, top_n, device):
    rows = logits.size(0)
    lp = torch.empty(rows, device=device)
    tv = torch.empty(rows, top_n, device=device)
    ti = torch.empty(rows, top_n, dtype=torch.int64, device=device)
    OPS.raw_logprobs(logits.to(device), tokens.to(device), lp, tv, ti,
                     None if bits is None else bits.to(device))
    return lp.cpu(), tv.cpu(), ti.cpu()


def _close_to_cpu(got, want):
    """CUDA against CPU: top-N ids exactly, values to 1e-4 with ±inf and NaN in place."""
    assert torch.equal(got[2], want[2])
    for g, w in zip(got[:2], want[:2]):
        assert torch.equal(g.isfinite(), w.isfinite()) and torch.equal(g.isnan(), w.isnan())
        assert torch.equal(g[g.isinf()], w[w.isinf()])
        torch.testing.assert_close(g[g.isfinite()], w[w.isfinite()], atol=1e-4, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("V", [1000, 151936])
def test_raw_logprobs_rule_bitmask_and_devices(V, dtype, device):
    gen = torch.Generator().manual_seed(V)
    logits, tokens, allowed = _rows(V, dtype, gen)
    bits = pack_token_bitmask(allowed)
    premasked = logits.masked_fill(~allowed[:, :V], -INF)
    lp, tv, ti = _run(logits, tokens, None, 4, device)
    assert lp[6:].isnan().all() and not lp[:6].isnan().any()
    assert lp[1] == -INF and tv[1].eq(-INF).all() and ti[1].tolist() == [0, 1, 2, 3]
    assert ti[0, :3].tolist() == [5, 9, V - 1] and ti[2, :2].tolist() == [40, 41]
    assert lp[2].item() == pytest.approx(-0.6931472, abs=1e-6)  # -log 2
    masked = _run(logits, tokens, bits, 4, device)
    for a, b in zip(masked, _run(premasked, tokens, None, 4, device)):
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
    assert masked[0][2].item() == (0.0 if allowed[2, 41] else -INF)  # the one +inf left
    if device == "cpu":
        return
    _close_to_cpu((lp, tv, ti), _run(logits, tokens, None, 4, "cpu"))
    _close_to_cpu(masked, _run(logits, tokens, bits, 4, "cpu"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("V,top_n", [(300, 4), (1000, 600), (1000, 1000), (5000, 2)])
def test_raw_logprobs_top_n_shapes(V, top_n, device):
    """A vocabulary smaller than a block, N larger than a block's threads, N = V (the whole row
    in rank order) and N = 2, with the edge rows of _rows: the same ranks as a sort (CPU) and as
    the CPU (CUDA)."""
    logits, tokens, _ = _rows(V, torch.float32, torch.Generator().manual_seed(V + top_n))
    tokens = tokens.clamp(max=V - 1)
    got = _run(logits, tokens, None, top_n, device)
    if device != "cpu":
        _close_to_cpu(got, _run(logits, tokens, None, top_n, "cpu"))
        return
    x = logits.masked_fill(logits.isnan(), float("-inf"))
    for r in range(x.size(0)):  # rank order: value descending, ties to the lower id
        order = sorted(range(V), key=lambda i: (-x[r, i].item(), i))[:top_n]
        assert got[2][r].tolist() == order, r


def _run_slots(logits, tokens, slots, n, pool_rows, top_n, device):
    """The op with req_pool_indices, into outputs prefilled with 7 (so a row it skips shows)."""
    rows = logits.size(0)
    out = [torch.full((rows,), 7.0, device=device), torch.full((rows, top_n), 7.0, device=device),
           torch.full((rows, top_n), 7, dtype=torch.int64, device=device)]
    OPS.raw_logprobs(logits.to(device), tokens.to(device), *out, None, slots.to(device), n,
                     pool_rows)
    return tuple(t.cpu() for t in out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("V,top_n", [(1000, 3), (151936, 3), (151936, 12), (151936, 40)])
def test_raw_logprobs_rows_of_slots_outside_the_pool(V, top_n, device):
    """With req_pool_indices, a request whose slot lies outside [0, pool_rows) is not read: its
    rows get the outputs of a row with no finite logit (-inf at an emitted token, NaN where the
    row emitted none, top-N -inf at ids 0..N-1), whatever its logits; the other rows equal the
    op without slots. V 151936 cuts CUDA rows into chunks (the finish kernel); N 12 and 40 take
    the rank passes, N 40 with one chunk a row."""
    n = 2
    logits, tokens, _ = _rows(V, torch.float32, torch.Generator().manual_seed(V + top_n))
    slots = torch.tensor([0, -1, 5, 4], dtype=torch.int32)  # pool_rows 5: requests 1, 2 outside
    lp, tv, ti = _run_slots(logits, tokens, slots, n, 5, top_n, device)
    want = _run(logits, tokens, None, top_n, device)
    readable = torch.tensor([True, True, False, False, False, False, True, True])
    for got, w in zip((lp, tv, ti), want):
        assert torch.equal(got[readable].nan_to_num(7.0), w[readable].nan_to_num(7.0))
    assert lp[2:6].tolist() == [-INF] * 4  # tokens 41, 6, V - 1, 7: emitted
    assert tv[2:6].eq(-INF).all() and ti[2:6].tolist() == [list(range(top_n))] * 4
    assert lp[6:].isnan().all()  # tokens -1 and V, readable rows: emitted none
    # Request 3 (tokens -1 and V) outside the pool: NaN there too, top-N as any unread row.
    lp2, tv2, ti2 = _run_slots(logits, tokens, torch.tensor([0, 1, 2, -1], dtype=torch.int32), n,
                               5, top_n, device)
    assert lp2[6:].isnan().all() and tv2[6:].eq(-INF).all()
    assert ti2[6:].tolist() == [list(range(top_n))] * 2
    if device != "cpu":
        _close_to_cpu((lp, tv, ti), _run_slots(logits, tokens, slots, n, 5, top_n, "cpu"))
