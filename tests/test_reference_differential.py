"""Differential test of the sampler against an independent reference of DESIGN §3, token for
token: numpy for the filters (float64 over the fp32 z the contract specifies) and a pure-Python
Philox-4x32-7 for the keyed Gumbel noise (§3.7), so neither the library's filter code nor its
noise code checks itself. Hypothesis draws small rows with ties, ±inf, NaN, grammar masks, prompt
repetition penalties, logit bias and every filter combination, in fp32 / bf16 / fp16.

A row whose token fp32 arithmetic and float64 could decide differently is not compared (top-p
cumulative mass or min-p threshold within rounding of a token, two best scores within rounding
of each other, |z| large enough to absorb the noise or past fp32's range: DESIGN §5); every other
row must give exactly the reference's token, on the CPU and (where a GPU is present) on CUDA.
TOKENSAMPLER_FUZZ_EXAMPLES=N widens the run.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import tokensampler as ts

M32 = 0xFFFFFFFF
STREAM = ts._C.RNG_STREAMS["gumbel"]
GREEDY_T = 1e-5  # README: temperatures below it sample greedily (not read from the library)
EXAMPLES = int(os.environ.get("TOKENSAMPLER_FUZZ_EXAMPLES", "0") or 0) or 500
f32 = np.float32


# ---------------------------------------------------------------- the noise, from its definition
def philox4x32_7(c: list[int], k0: int, k1: int) -> list[int]:
    """Philox-4x32 with 7 rounds (rng.h)."""
    c0, c1, c2, c3 = c
    for _ in range(7):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & M32, (p0 >> 32) ^ c3 ^ k1, p0 & M32
        k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
    return [c0, c1, c2, c3]


def gumbel_row(seed: int, position: int, vocab: int) -> np.ndarray:
    """float64 G(seed, position, i) for i < vocab: counter (i / 4, position, stream), key seed;
    u = (word >> 9 + 1/2) / 2^23, G = -log(-log u)."""
    g = np.empty(vocab)
    for group in range((vocab + 3) // 4):
        words = philox4x32_7([group, position & M32, position >> 32, STREAM], seed & M32,
                             seed >> 32)
        for q, w in enumerate(words[:vocab - 4 * group]):
            g[4 * group + q] = -math.log(-math.log(((w >> 9) + 0.5) / 8388608.0))
    return g


# ---------------------------------------------------------------- §3 on one row
def processed_row(raw: np.ndarray, allowed: np.ndarray, prompt: set[int], rho: float,
                  bias: dict[int, float]) -> np.ndarray:
    """Steps 0–4 in fp32: mask, NaN as -inf, repetition penalty over the prompt, bias."""
    l = raw.astype(f32).copy()
    l[~allowed | np.isnan(l)] = -np.inf
    with np.errstate(all="ignore"):
        for t in prompt | set(bias):
            x = l[t]
            if t in prompt and rho != 1.0:
                x = f32(x / f32(rho)) if x > 0 else f32(x * f32(rho))
            x = f32(x + f32(bias.get(t, 0.0)))
            l[t] = -np.inf if np.isnan(x) else x
    return l


def reference_token(l: np.ndarray, T: float, top_k: int, top_p: float, min_p: float,
                    g: np.ndarray) -> int | None:
    """The §3 token of processed fp32 logits l, or None where fp32 and float64 may differ."""
    V = l.size
    if not (np.isfinite(l).any() or (l == np.inf).any()):
        return 0                                               # §3.1: invalid row
    if T < GREEDY_T or top_k == 1:
        return int(np.argmax(l))                               # greedy, ties to the lowest id
    k_on = 0 < top_k < V
    p, mp = float(f32(top_p)), float(f32(min_p))
    if (l == np.inf).any():                                    # uniform among the +inf entries
        ids = np.flatnonzero(l == np.inf)[:top_k if k_on else None]
        m = len(ids)
        if any(abs(j / m - p) < 1e-6 for j in range(1, m)):
            return None
        ids = ids[:max(sum(j / m < p for j in range(m)), 1)]
        return best_score(ids, np.zeros(V), g)
    with np.errstate(all="ignore"):
        z = (l / f32(T)).astype(np.float64)                    # fp32 z, as the contract says
    finite = np.flatnonzero(np.isfinite(l))
    if not np.isfinite(z[finite]).all() or np.abs(z[finite]).max() >= 2.0**20:
        return None                                            # DESIGN §5's fp32 edges
    order = np.array(sorted(finite.tolist(), key=lambda i: (-z[i], i)))[:top_k if k_on else None]
    z_max = z[order[0]]
    if p < 1.0:
        e = np.exp(z[order] - z_max)
        before = np.concatenate([[0.0], np.cumsum(e)[:-1]]) / e.sum()
        if np.any(np.abs(before[1:] - p) < 2e-6):
            return None
        order = order[before < p]
    if mp > 0.0:
        tau = z_max + math.log(mp)
        if np.any(np.abs(z[order] - tau) < 1e-5 * max(1.0, abs(tau))):
            return None
        order = order[z[order] >= tau]
    return best_score(order, z, g)


def best_score(ids: np.ndarray, z: np.ndarray, g: np.ndarray) -> int | None:
    """argmax of z + G over ids (ties to the lowest id); None when the best two are within
    fp32 rounding of each other."""
    ids = np.sort(ids)
    s = z[ids] + g[ids]
    if len(ids) > 1:
        top2 = np.sort(s)[-2:]
        if top2[1] - top2[0] < 1e-5 * max(1.0, abs(top2[1])):
            return None
    return int(ids[int(np.argmax(s))])


# ---------------------------------------------------------------- the fuzz
@st.composite
def rows(draw):
    V = draw(st.integers(2, 160))
    bs = draw(st.integers(1, 4))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    style = draw(st.sampled_from(["randn", "ties", "peaked", "specials"]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    logits = torch.randn(bs, V, generator=gen) * draw(st.sampled_from([0.5, 2.0, 8.0]))
    if style == "ties":
        logits = logits.round()
    elif style == "peaked":
        logits[:, draw(st.integers(0, V - 1))] += 12.0
    elif style == "specials":
        for value in (math.nan, -math.inf, math.inf):
            hits = torch.rand(bs, V, generator=gen) < draw(st.sampled_from([0.0, 0.05, 0.4]))
            logits[hits] = value
    params, prompts = [], []
    for _ in range(bs):
        params.append(ts.SamplingParams(
            temperature=draw(st.sampled_from([0.0, 9e-6, 1e-5, 0.3, 0.7, 1.0, 1.7])),
            top_k=draw(st.sampled_from([-1, 1, 2, 5, V - 1, V, V + 3])),
            top_p=draw(st.sampled_from([1.0, 0.95, 0.8, 0.5, 0.1])),
            min_p=draw(st.sampled_from([0.0, 0.0, 0.02, 0.2])),
            repetition_penalty=draw(st.sampled_from([1.0, 1.3, 0.8])),
            logit_bias=draw(st.dictionaries(st.integers(0, V - 1),
                                            st.sampled_from([-5.0, 2.5, math.inf, -math.inf]),
                                            max_size=3)),
            seed=draw(st.integers(0, 2**64 - 1))))
        prompts.append(draw(st.lists(st.integers(0, V - 1), max_size=6)))
    words = (V + 31) // 32
    masked = draw(st.booleans())
    mask = (torch.randint(-2**31, 2**31, (bs, words), generator=gen, dtype=torch.int64)
            .to(torch.int32) | draw(st.sampled_from([0, 0x55555555]))) if masked else None
    positions = [draw(st.integers(0, 2**31 - 1)) for _ in range(bs)]
    return logits.to(dtype), params, prompts, mask, positions


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=rows())
def test_tokens_equal_an_independent_reference(device, case):
    logits, params, prompts, mask, positions = case
    bs, V = logits.shape
    backend = ts.create_backend("gumbel_full", ts.SamplingBackendConfig(
        max_bs=bs, max_req_pool_size=bs, vocab_size=V, device=device, enable_token_bitmask=True))
    backend.prepare_step([f"r{i}" for i in range(bs)], list(range(1, bs + 1)), params,
                         prompt_token_ids=prompts)
    lengths = torch.zeros(bs + 1, dtype=torch.int32)
    lengths[1:] = torch.tensor(positions, dtype=torch.int32)
    info = ts.SamplingBatchInfo(torch.arange(1, bs + 1, dtype=torch.int32, device=device),
                                lengths.to(device), V, device,
                                token_bitmask=None if mask is None else mask.to(device))
    tokens, _ = backend.sample(ts.LogitsProcessorOutput(logits.to(device)), info)
    tokens = tokens.cpu()
    checked = 0
    for r, sp in enumerate(params):
        sp = sp.normalize(V)
        allowed = np.ones(V, dtype=bool)
        if mask is not None:
            bits = mask[r].numpy().view(np.uint32)
            allowed = ((bits[np.arange(V) >> 5] >> (np.arange(V) & 31)) & 1).astype(bool)
        l = processed_row(logits[r].float().numpy(), allowed,
                          set(prompts[r]) if sp.repetition_penalty != 1.0 else set(),
                          sp.repetition_penalty, sp.logit_bias or {})
        want = reference_token(l, sp.temperature, sp.top_k, sp.top_p, sp.min_p,
                               gumbel_row(sp.seed, positions[r], V))
        if want is None:
            continue
        checked += 1
        assert int(tokens[r]) == want, (f"row {r}: token {int(tokens[r])}, reference {want}; "
                                        f"{sp}, position {positions[r]}")
    assume(checked > 0)
