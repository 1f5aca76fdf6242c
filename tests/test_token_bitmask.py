"""Grammar token bitmasks (DESIGN §3.0): sampling with `token_bitmask` equals sampling logits that
xgrammar's own `apply_token_bitmask_inplace` masked, token for token, on every route of sample
and verify; empty rows follow §3.1; bad masks are refused naming `token_bitmask`."""

from __future__ import annotations

import zlib

import pytest
import torch
# The grammar extra (CI installs it). The device image lacks it: there the reference masks with
# torch ops, which test_reference_masking_is_xgrammars ties to xgrammar's wherever it is installed.
try:
    import xgrammar
except ImportError:
    xgrammar = None

import tokensampler as ts
from tokensampler.bitmask import bitmask_words, pack_token_bitmask

V = 1000                      # not a multiple of 32: the last word has bits past V
WORDS = bitmask_words(V)
BS, N = 4, 3
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
BIAS = {5: 50.0, 17: -3.0, 900: 20.0}

ROUTES = {
    "no_filter": [dict(temperature=0.9)],
    "top_k": [dict(temperature=0.9, top_k=20)],
    "top_p": [dict(temperature=1.1, top_p=0.8)],
    "top_k_top_p": [dict(temperature=0.8, top_k=30, top_p=0.9)],
    "min_p": [dict(temperature=1.0, min_p=0.1)],
    "mixed": [dict(temperature=0.0), dict(temperature=0.9, top_k=5),
              dict(temperature=1.0, top_p=0.7), dict(temperature=1.2, min_p=0.05)],
    "penalties_bias": [dict(temperature=0.9, repetition_penalty=1.3, frequency_penalty=0.5,
                            presence_penalty=0.4, logit_bias=BIAS)],
    "greedy": [dict(temperature=0.0)],
}
_FULL_ONLY = {"min_p", "mixed", "penalties_bias"}


def _backend_names(route, device):
    names = ["gumbel_full"] + ([] if route in _FULL_ONLY else ["gumbel"])
    names += ["greedy"] if route == "greedy" else []
    extra = ts.available_backends(ts.SamplingBackendConfig(vocab_size=V, device=device))
    return names + [f"flashinfer{n[6:]}" for n in names
                    if n.startswith("gumbel") and f"flashinfer{n[6:]}" in extra]


def _config(device, **kw):
    return ts.SamplingBackendConfig(max_bs=BS, max_draft_tokens_per_req=N, max_req_pool_size=BS,
                                    vocab_size=V, device=device, enable_output_logprobs=True, **kw)



def random_mask(rows, gen) -> torch.Tensor:
    """~30% allowed (bits past V random too); row 1 unconstrained, row 2 allows one token."""
    allowed = torch.rand(rows, WORDS * 32, generator=gen) < 0.3
    allowed[1 % rows] = True
    if rows > 2:
        allowed[2] = False
        allowed[2, 5] = True
    return pack_token_bitmask(allowed)


def random_logits(rows, dtype, gen) -> torch.Tensor:
    logits = torch.randn(rows, V, generator=gen) * 3
    logits[0, 7] = float("inf")   # +inf on a token the mask may ban
    logits[-1, 11] = float("nan")
    return logits.to(dtype)


def torch_masked(logits, mask):
    bits = (mask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    allowed = bits.view(mask.size(0), -1)[:, :logits.size(1)].bool()
    return logits.masked_fill(~allowed, float("-inf"))


def xgrammar_masked(logits, mask):
    if xgrammar is None:
        return torch_masked(logits, mask)
    out = logits.clone()
    xgrammar.apply_token_bitmask_inplace(out, mask)
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reference_masking_is_xgrammars(dtype):
    pytest.importorskip("xgrammar")
    gen = torch.Generator().manual_seed(1)
    logits, mask = random_logits(8, dtype, gen), random_mask(8, gen)
    # bit-equal, -inf where masked (not a large negative number), NaN where NaN
    torch.testing.assert_close(xgrammar_masked(logits, mask), torch_masked(logits, mask),
                               rtol=0, atol=0, equal_nan=True)


class Pair:
    """Two backends fed identical steps: one given token_bitmask, one given logits that
    xgrammar masked."""

    def __init__(self, name, route, device):
        self.device = device
        self.masked = ts.create_backend(name, _config(device, enable_token_bitmask=True))
        self.plain = ts.create_backend(name, _config(device))
        params = ROUTES[route]
        self.params = [ts.SamplingParams(seed=100 + i, **params[i % len(params)]) for i in range(BS)]
        self.lengths = torch.full((BS + 1,), 7, dtype=torch.int32, device=device)

    def _info(self, **kw):
        slots = torch.arange(1, BS + 1, dtype=torch.int32, device=self.device)
        return ts.SamplingBatchInfo(slots, self.lengths, V, self.device, **kw)

    def step(self, logits, mask, candidates=None, draft_probs=None):
        d, n = self.device, 1 if candidates is None else candidates.size(1)
        results = []
        for backend, lg, bm in ((self.masked, logits, mask),
                                (self.plain, xgrammar_masked(logits, mask), None)):
            backend.prepare_step([f"r{i}" for i in range(BS)], list(range(1, BS + 1)),
                                 self.params, n)
            info = self._info(token_bitmask=None if bm is None else bm.to(d),
                              draft_probs=None if draft_probs is None else draft_probs.to(d))
            out = ts.LogitsProcessorOutput(lg.to(d))
            if candidates is None:
                tokens, lengths = backend.sample(out, info)
            else:
                tokens, lengths = backend.verify(out, info, candidates.to(d))
            lp = out.next_token_logprobs
            results.append((tokens.cpu().clone(), lengths.cpu().clone(),
                            None if lp is None else lp.cpu().clone()))
        self.lengths += n
        return results


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", ["sample", "verify_chain", "verify_rejection"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_bitmask_equals_xgrammar_masked_logits(route, mode, dtype, device):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{route} {mode} {dtype}".encode()))
    for name in _backend_names(route, device):
        pair = Pair(name, route, device)
        for _ in range(3):   # later steps see penalty histories built from earlier tokens
            rows = BS if mode == "sample" else BS * N
            logits, mask = random_logits(rows, dtype, gen), random_mask(rows, gen)
            candidates = draft_probs = None
            if mode != "sample":
                candidates = torch.randint(0, V, (BS, N), generator=gen, dtype=torch.int32)
                # drafts that the masked rows may sample: the greedy pick of the masked row
                picks = xgrammar_masked(logits, mask).float().nan_to_num(float("-inf")).argmax(-1)
                candidates[:, 1:] = picks.view(BS, N)[:, :-1].to(torch.int32)
            if mode == "verify_rejection":
                draft_probs = torch.softmax(torch.randn(BS, N - 1, V, generator=gen), -1)
            (tok, ln, lp), (ref_tok, ref_ln, ref_lp) = pair.step(logits, mask, candidates,
                                                                 draft_probs)
            assert torch.equal(tok, ref_tok), (name, tok, ref_tok)
            assert torch.equal(ln, ref_ln), (name, ln, ref_ln)
            if lp is not None and ref_lp is not None:
                # bit-exact (NaN where the backend gives NaN for both: greedy's +inf rows)
                torch.testing.assert_close(lp, ref_lp, rtol=0, atol=0, equal_nan=True)
            if mode == "sample":
                # Row 0 holds a +inf logit: tokensampler samples among the allowed +inf tokens
                # (§3.1); FlashInfer's softmax turns the row into NaN and returns token 0 whatever
                # the mask (the same token as for xgrammar-masked logits, checked above).
                rows = range(1 if name.startswith("flashinfer") else 0, BS)
                allowed = [(mask[r, tok[r] // 32] >> (tok[r] % 32)) & 1 for r in rows]
                assert all(bool(a) for a in allowed), (name, tok)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_fp32_copy_of_half_logits_changes_no_token(dtype, device):
    """The masked copy is fp32: the kernels compute in fp32 whatever the dtype, so the same
    masked values as bf16 / fp16 or converted to fp32 give the same tokens and logprobs."""
    gen = torch.Generator().manual_seed(3)
    for route in ("top_k_top_p", "min_p", "penalties_bias", "greedy"):
        half = xgrammar_masked(random_logits(BS, dtype, gen), random_mask(BS, gen))
        got = []
        for logits in (half, half.float()):
            backend = ts.create_backend("gumbel_full", _config(device))
            pair = Pair("gumbel_full", route, device)
            backend.prepare_step([f"r{i}" for i in range(BS)], list(range(1, BS + 1)), pair.params)
            out = ts.LogitsProcessorOutput(logits.to(device))
            tokens, _ = backend.sample(out, pair._info())
            got.append((tokens.cpu().clone(), out.next_token_logprobs.cpu().clone()))
        assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1]), route


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["gumbel", "gumbel_full", "greedy"])
def test_row_with_no_allowed_finite_token_is_invalid(name, device):
    gen = torch.Generator().manual_seed(5)
    logits = random_logits(BS, torch.float32, gen)
    allowed = torch.ones(BS, WORDS * 32, dtype=torch.bool)
    allowed[1] = False                          # nothing allowed
    allowed[3] = False
    allowed[3, 40:44] = True                    # only tokens whose logits are -inf / NaN
    logits[3, 40:43] = float("-inf")
    logits[3, 43] = float("nan")
    backend = ts.create_backend(name, _config(device, enable_token_bitmask=True))
    backend.prepare_step(["a", "b", "c", "d"], [1, 2, 3, 4],
                         [ts.SamplingParams(temperature=t, seed=1) for t in (0.9, 0.9, 0.0, 0.0)])
    info = ts.SamplingBatchInfo(torch.arange(1, BS + 1, dtype=torch.int32, device=device),
                                torch.zeros(BS + 1, dtype=torch.int32, device=device), V, device,
                                token_bitmask=pack_token_bitmask(allowed).to(device))
    tokens, _ = backend.sample(ts.LogitsProcessorOutput(logits.to(device)), info)
    tokens = tokens.cpu()
    assert tokens[1] == 0 and tokens[3] == 0, tokens
    assert tokens[0] == 7  # row 0's only +inf logit, allowed (§3.1: the +inf entries are drawn)
    assert backend.invalid_rows[:BS].cpu().tolist() == [False, True, False, True]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, mode", [(name, mode) for name in ("gumbel", "gumbel_full")
                                        for mode in ("verify_chain", "verify_rejection")]
                         + [("greedy", "verify_chain")])  # greedy verifies by chain matching
def test_verify_ends_at_a_row_with_no_allowed_token(name, mode, device):
    """An invalid row (§3.1: token 0, flagged) ends a verify chain: its token is the request's
    last, so a draft of token 0 after it is not accepted, in chain matching as in rejection
    sampling. Request 0's row 1 and request 1's row 0 allow nothing; greedy rows, so the other
    rows' tokens are their masked argmax."""
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(BS * N, V, generator=gen)
    allowed = torch.ones(BS * N, WORDS * 32, dtype=torch.bool)
    allowed[1] = False
    allowed[N] = False
    backend = ts.create_backend(name, _config(device, enable_token_bitmask=True))
    backend.prepare_step([f"r{i}" for i in range(BS)], list(range(1, BS + 1)),
                         [ts.SamplingParams(temperature=0.0, seed=i) for i in range(BS)],
                         num_tokens_per_req=N)
    argmax = int(logits[0].argmax())
    candidates = torch.zeros(BS, N, dtype=torch.int32)
    candidates[0, 1] = argmax  # accepted; row 1 gives token 0, and draft 2 is 0
    draft_probs = None
    if mode == "verify_rejection":
        draft_probs = torch.full((BS, N - 1, V), 1.0 / V).to(device)
    info = ts.SamplingBatchInfo(torch.arange(1, BS + 1, dtype=torch.int32, device=device),
                                torch.zeros(BS + 1, dtype=torch.int32, device=device), V, device,
                                token_bitmask=pack_token_bitmask(allowed).to(device),
                                draft_probs=draft_probs)
    predict, accept = backend.verify(ts.LogitsProcessorOutput(logits.to(device)), info,
                                     candidates.to(device))
    predict, accept = predict.cpu().view(BS, N), accept.cpu()
    invalid = backend.invalid_rows[:BS * N].cpu().view(BS, N)
    assert accept[:2].tolist() == [2, 1], (predict, accept)
    assert predict[0, :2].tolist() == [argmax, 0] and predict[1, 0] == 0, predict
    assert invalid[0, 1] and invalid[1, 0] and not invalid[0, 0], invalid


def _bad_masks(device):
    good = torch.full((BS, WORDS), -1, dtype=torch.int32, device=device)
    other = "meta" if device == "cpu" else "cpu"
    return [
        ([[-1] * WORDS] * BS, TypeError, "must be a tensor"),
        (good.to(torch.int64), TypeError, "torch.int32"),
        (good.to(torch.uint8), TypeError, "torch.int32"),
        (good[:, :-1], ValueError, "[4, 32]"),
        (good[:-1], ValueError, "[4, 32]"),
        (good.reshape(-1), ValueError, "[4, 32]"),
        (torch.full((BS, WORDS + 1), -1, dtype=torch.int32, device=device), ValueError, "[4, 32]"),
        (good.to(other), ValueError, "is on"),
        (torch.full((WORDS, BS), -1, dtype=torch.int32, device=device).t(), ValueError,
         "contiguous"),
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["gumbel", "gumbel_full", "greedy"])
def test_bad_token_bitmask_is_refused_naming_it(name, device):
    backend = ts.create_backend(name, _config(device, enable_token_bitmask=True))
    backend.prepare_step(["a", "b", "c", "d"], [1, 2, 3, 4], [ts.SamplingParams(seed=1)] * BS)
    logits = torch.randn(BS, V, device=device)
    for bad, exc, fragment in _bad_masks(device):
        info = ts.SamplingBatchInfo(torch.arange(1, BS + 1, dtype=torch.int32, device=device),
                                    torch.zeros(BS + 1, dtype=torch.int32, device=device), V,
                                    device, token_bitmask=bad)
        with pytest.raises(exc, match="token_bitmask") as raised:
            backend.sample(ts.LogitsProcessorOutput(logits), info)
        assert fragment in str(raised.value), (fragment, raised.value)
        # verify: the same BS rows, as BS / 2 requests of 2 rows
        cand = torch.zeros(BS // 2, 2, dtype=torch.int32, device=device)
        with pytest.raises(exc, match="token_bitmask"):
            backend.verify(ts.LogitsProcessorOutput(logits), info, cand)


@pytest.mark.parametrize("name", ["gumbel", "gumbel_full", "greedy"])
def test_token_bitmask_needs_enable_token_bitmask(name):
    backend = ts.create_backend(name, _config("cpu"))
    assert backend._bitmask_scratch is None
    backend.prepare_step(["a"], [1], [ts.SamplingParams(seed=1)])
    info = ts.SamplingBatchInfo(torch.ones(1, dtype=torch.int32),
                                torch.zeros(BS + 1, dtype=torch.int32), V, "cpu",
                                token_bitmask=torch.full((1, WORDS), -1, dtype=torch.int32))
    with pytest.raises(ValueError, match="token_bitmask.*enable_token_bitmask=False"):
        backend.sample(ts.LogitsProcessorOutput(torch.randn(1, V)), info)


@pytest.mark.parametrize("value", [1, "yes", None])
def test_enable_token_bitmask_must_be_bool(value):
    with pytest.raises(TypeError, match="enable_token_bitmask"):
        _config("cpu", enable_token_bitmask=value).validate()


def test_all_ones_mask_changes_nothing():
    gen = torch.Generator().manual_seed(9)
    pair = Pair("gumbel_full", "mixed", "cpu")
    logits = random_logits(BS, torch.float32, gen)
    ones = torch.full((BS, WORDS), -1, dtype=torch.int32)
    (tok, _, lp), (ref_tok, _, ref_lp) = pair.step(logits, ones)
    assert torch.equal(tok, ref_tok) and torch.equal(lp, ref_lp)
    plain = ts.create_backend("gumbel_full", _config("cpu"))
    plain.prepare_step([f"r{i}" for i in range(BS)], list(range(1, BS + 1)), pair.params)
    pair.lengths -= 1
    out = ts.LogitsProcessorOutput(logits)
    assert torch.equal(plain.sample(out, pair._info())[0], tok)


@pytest.mark.cuda
def test_masked_step_does_not_sync_the_host():
    pair = Pair("gumbel_full", "mixed", "cuda")
    gen = torch.Generator().manual_seed(4)
    mask = random_mask(BS * N, gen).cuda()
    logits = random_logits(BS * N, torch.bfloat16, gen).cuda()
    cand = torch.randint(0, V, (BS, N), generator=gen, dtype=torch.int32).cuda()
    backend = pair.masked
    backend.prepare_step([f"r{i}" for i in range(BS)], list(range(1, BS + 1)), pair.params, N)
    sample_info = pair._info(token_bitmask=mask[:BS])
    verify_info = pair._info(token_bitmask=mask)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        backend.sample(ts.LogitsProcessorOutput(logits[:BS]), sample_info)
        backend.verify(ts.LogitsProcessorOutput(logits), verify_info, cand)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


def test_vocab_parallel_sampler_refuses_a_mask():
    from tokensampler.vocab_parallel import VocabParallelSampler

    backend = ts.create_backend("gumbel", _config("cpu", enable_token_bitmask=True))
    sampler = VocabParallelSampler(backend, 0, V // 2)
    backend.prepare_step(["a"], [1], [ts.SamplingParams(seed=1)])
    info = ts.SamplingBatchInfo(torch.ones(1, dtype=torch.int32),
                                torch.zeros(BS + 1, dtype=torch.int32), V, "cpu",
                                token_bitmask=torch.full((1, WORDS), -1, dtype=torch.int32))
    with pytest.raises(ValueError, match="token_bitmask is not supported by vocab-parallel"):
        sampler.sample(ts.LogitsProcessorOutput(torch.randn(1, V // 2)), info)


def test_bitmask_bench_equality_check_runs_and_can_fail():
    """bench/bitmask_bench.py's token check (ours+mask == xgrammar-masked + ours), on CPU."""
    pytest.importorskip("xgrammar")
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "bench"
    ran = subprocess.run([sys.executable, str(bench / "bitmask_bench.py"), "--check-only",
                          "--device", "cpu", "--vocab", "1000", "--bs", "1", "3",
                          "--dtypes", "fp32", "bf16"], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0 and "all equal" in ran.stdout, ran.stderr[-2000:]
    sys.path.insert(0, str(bench))
    try:
        import bitmask_bench
        with pytest.raises(AssertionError, match="masked in the kernel"):
            bitmask_bench.check_equal("no_filter", 4, torch.float32, 0.5, lambda x, m: None,
                                      1000, "cpu")
    finally:
        sys.path.remove(str(bench))
