"""A property-based soak of a `gumbel_full` backend against a Python model of its slot table
(issue 15): requests arrive, finish, move slots, change parameters, and steps mix `sample`,
target-sampled `verify` and rejection-sampling `verify`.

The model keeps, per slot, the parameters it holds (written when the slot flips: a new owner,
or a request moving in with its latest SamplingParams object; a new object for a request that
keeps its slot waits for the next flip) and its penalty history (prompt tokens with a
repetition penalty, output counts for slots whose parameters have a penalty). Checked after
every step: the pools hold the model's parameters and the route covers them; greedy rows are
the argmax of the float64 processed logits (DESIGN §3.1-3.5, NaN after penalties and bias
counts as -inf, ties to the lowest id); sampled rows lie in the support of the filtered
distribution; tokens are in [0, V); verify accept lengths are in [1, n] and consistent with
the drafts; the output counts equal the model's.

Bounded by default (50 examples of up to 30 rules: ~700 steps, ~5 s on 2 cores).
TOKENSAMPLER_SOAK_STEPS=N runs examples of up to 100 rules, in chunks, until at least N
sample/verify steps ran (~300 steps/s on 2 cores: 10^6 steps take about an hour), printing the
count after each chunk and at the end (outside pytest's capture). Failures are reported
unshrunk (shrinking a stateful run can take minutes); TOKENSAMPLER_HYPOTHESIS_SHRINK=1 shrinks.
"""

from __future__ import annotations

import math
import os
from collections import Counter

import numpy as np
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule, run_state_machine_as_test)

import tokensampler as ts
from tokensampler.params import derive_seed

MAX_BS, POOL, MAX_N = 4, 6, 3
GREEDY_EPS = 1e-5  # temperatures below this are greedy (vLLM's _SAMPLING_EPS)
inf = math.inf

STATS = Counter()

# ---------------------------------------------------------------- strategies
TEMPERATURES = [0.0, 0.0, 1e-45, 1e-38, 1e-6, 0.05, 0.3, 0.7, 1.0, 1.0, 2.0]
TOP_KS = [-1, -1, 1, 2, 3, 5, 50, 300]
TOP_PS = [1.0, 1.0, 0.95, 0.7, 0.3, 1e-6]
MIN_PS = [0.0, 0.0, 0.05, 0.3, 0.9999]
REPETITIONS = [1.0, 1.0, 1.3, 0.7, 2.0]
FREQUENCIES = [0.0, 0.0, 0.5, -0.5, 2.0, -2.0]
PRESENCES = [0.0, 0.0, 0.4, -1.0, 2.0]
BIASES = [-inf, -inf, inf, inf, 1e300, -1e300, -5.0, 5.0, 0.5, -0.5, 100.0, -100.0, 0.0]

params_st = st.fixed_dictionaries({
    "temperature": st.sampled_from(TEMPERATURES),
    "top_k": st.sampled_from(TOP_KS),
    "top_p": st.sampled_from(TOP_PS),
    "min_p": st.sampled_from(MIN_PS),
    "repetition_penalty": st.sampled_from(REPETITIONS),
    "frequency_penalty": st.sampled_from(FREQUENCIES),
    "presence_penalty": st.sampled_from(PRESENCES),
    "seed": st.one_of(st.none(), st.integers(0, 2**64 - 1)),
    "bias": st.one_of(st.none(), st.dictionaries(st.integers(0, 10**6), st.sampled_from(BIASES),
                                                 min_size=1, max_size=4)),
    "str_keys": st.booleans(),
})
prompt_st = st.one_of(st.none(), st.lists(st.integers(0, 10**6), max_size=24))


def make_params(d, V) -> ts.SamplingParams:
    bias = None
    if d["bias"] is not None:
        bias = {}
        for k, v in d["bias"].items():
            bias[k % V] = v
        if d["str_keys"]:
            bias = {str(k): v for k, v in bias.items()}
    return ts.SamplingParams(
        temperature=d["temperature"], top_k=d["top_k"], top_p=d["top_p"], min_p=d["min_p"],
        repetition_penalty=d["repetition_penalty"], frequency_penalty=d["frequency_penalty"],
        presence_penalty=d["presence_penalty"], seed=d["seed"], logit_bias=bias)


def f32(x) -> float:
    with np.errstate(over="ignore"):
        return float(np.float32(x))


# ---------------------------------------------------------------- the model
class Held:
    """What a slot holds: the values of the parameters written at its last flip, in fp32 as
    the slot table stores them, plus its penalty history."""

    def __init__(self, rid, sp: ts.SamplingParams, prompt, V):
        self.rid = rid
        self.temperature = f32(sp.temperature)
        self.raw_temperature = float(sp.temperature)
        self.top_k = int(sp.top_k)
        self.top_p = f32(sp.top_p)
        self.min_p = f32(sp.min_p)
        self.repetition = f32(sp.repetition_penalty)
        self.frequency = f32(sp.frequency_penalty)
        self.presence = f32(sp.presence_penalty)
        self.seed = int(sp.seed) if sp.seed is not None else derive_seed(rid)
        self.bias = {int(k): f32(v) for k, v in (sp.logit_bias or {}).items()}
        self.V = V
        self.records = self.repetition != 1.0 or self.frequency != 0.0 or self.presence != 0.0
        self.prompt = set(prompt) if (prompt is not None and self.repetition != 1.0) else set()
        self.counts: Counter = Counter()

    @property
    def greedy(self) -> bool:
        return self.raw_temperature < GREEDY_EPS or self.top_k == 1

    @property
    def filters(self) -> set:
        out = set()
        if 0 < self.top_k < self.V:
            out.add("k")
        if self.top_p < 1.0:
            out.add("p")
        if self.min_p > 0.0:
            out.add("m")
        return out

    def processed(self, row: np.ndarray, drafts=(), dtype=np.float64) -> np.ndarray:
        """DESIGN §3.1-3.4 for a row that sees this slot's history plus `drafts` (verify row j
        sees drafts 1..j): in float64, or with dtype=np.float32 in the kernels' own fp32 steps
        (each operation rounded to fp32, in their order), which decides exact ties."""
        f = dtype
        l = row.astype(dtype)
        l[np.isnan(l)] = -inf
        counts = Counter(self.counts)
        for d in drafts:
            if 0 <= d < self.V:
                counts[d] += 1
        with np.errstate(invalid="ignore", over="ignore"):
            if self.repetition != 1.0:
                for t in self.prompt | {t for t, c in counts.items() if c > 0}:
                    l[t] = l[t] / f(self.repetition) if l[t] > 0 else l[t] * f(self.repetition)
            for t, c in counts.items():
                if c > 0:
                    l[t] -= f(self.frequency) * f(c) + f(self.presence)
            for t, b in self.bias.items():
                l[t] += f(b)
        l[np.isnan(l)] = -inf  # §3.1 holds after the bias too (issue 15, defect 3)
        return l


def check_row(held: Held, raw: np.ndarray, token: int, invalid: bool, what: str):
    """One row's token against the model: greedy -> argmax of the float64 processed logits;
    sampled -> in the support of the filtered distribution (with a small tolerance for
    fp32 boundaries)."""
    V = held.V
    assert 0 <= token < V, f"{what}: token {token} outside [0, {V})"
    raw_valid = ~np.isnan(raw) & (raw > -inf)
    if not raw_valid.any():
        assert token == 0 and invalid, f"{what}: an all -inf/NaN row gives token 0, flagged"
        return
    _check_processed(held, held.processed(raw), token, invalid, what,
                     held.processed(raw, dtype=np.float32))


def _check_processed(held, l, token, invalid, what, l32=None):
    valid = l > -inf
    if not valid.any():
        return  # every valid raw token masked by the bias: only the range is specified
    assert not invalid, f"{what}: a row with valid tokens was flagged invalid"
    assert valid[token], f"{what}: token {token} is masked (processed logit -inf)"
    pinf = np.flatnonzero(np.isposinf(l))
    if held.greedy:
        if pinf.size:
            assert token == pinf[0], f"{what}: greedy over +inf entries takes the lowest id"
            return
        m = l.max()
        tol = 1e-5 * max(1.0, abs(m))
        near = np.flatnonzero(l >= m - tol)
        if near.size == 1:
            assert token == near[0], f"{what}: greedy token {token}, argmax {near[0]} " \
                                     f"({l[token]!r} vs {m!r})"
        else:
            assert token in near, f"{what}: greedy token {token} is not a near-argmax {near}"
            if l32 is not None:  # near-ties: the kernels' fp32 values decide, lowest id first
                assert token == int(np.argmax(l32)), \
                    f"{what}: greedy token {token}, fp32 argmax {int(np.argmax(l32))} of {near}"
        return
    k = held.top_k if 0 < held.top_k < held.V else held.V
    if pinf.size:
        assert token in pinf[:k], f"{what}: with +inf entries {pinf}, top-k {k}: got {token}"
        return
    z = l / held.temperature
    zt = z[token]
    tol = 1e-4 * max(1.0, abs(zt))
    assert (z > zt + tol).sum() < k, f"{what}: token {token} is outside the top {k}"
    zmax = z[valid].max()
    if held.top_p < 1.0:
        ids = np.flatnonzero(valid)
        order = ids[np.lexsort((ids, -z[ids]))][:k]
        e = np.exp(z[order] - zmax)
        before = e[z[order] > zt + tol].sum() / e.sum()
        assert before < held.top_p + 1e-4, \
            f"{what}: token {token} has mass {before} before it, top_p {held.top_p}"
    if held.min_p > 0.0:
        assert zt >= zmax + math.log(held.min_p) - tol, f"{what}: token {token} fails min_p"


ROUTE_FILTERS = {"no_filter": set(), "top_k": {"k"}, "top_p": {"p"}, "top_k_top_p": {"k", "p"},
                 "min_p": {"m"}, "top_k_top_p_min_p": {"k", "p", "m"},
                 "generic": {"k", "p", "m"}}


class Request:
    def __init__(self, rid, slot, sp, prompt):
        self.rid, self.slot, self.sp, self.prompt = rid, slot, sp, prompt
        self.length = len(prompt) if prompt else 0


# ---------------------------------------------------------------- the machine
class SamplerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.V = None

    @initialize(V=st.sampled_from([7, 64, 257]))
    def setup(self, V):
        self.V = V
        self.backend = ts.create_backend("gumbel_full", ts.SamplingBackendConfig(
            max_bs=MAX_BS, max_draft_tokens_per_req=MAX_N, max_req_pool_size=POOL,
            vocab_size=V, device="cpu"))
        self.requests: dict[str, Request] = {}
        self.held: dict[int, Held] = {}       # slot -> what it holds (after its last flip)
        self.owner: dict[int, str] = {}       # slot -> last rid prepared there
        self.next_rid = 0
        STATS["examples"] += 1

    # ---- helpers
    def free_slots(self):
        taken = {r.slot for r in self.requests.values()}
        return [s for s in range(1, POOL + 1) if s not in taken]

    def prepare(self, rids, n, data):
        """prepare_step for `rids`, with the model's flip rules; checks pools and route."""
        reqs = [self.requests[r] for r in rids]
        pass_prompts = data.draw(st.booleans(), label="pass prompt_token_ids")
        prompts = [r.prompt for r in reqs] if pass_prompts else None
        self.backend.prepare_step([r.rid for r in reqs], [r.slot for r in reqs],
                                  [r.sp for r in reqs], n, prompt_token_ids=prompts)
        for r in reqs:
            if self.owner.get(r.slot) != r.rid:  # a flip: the request's latest params
                self.held[r.slot] = Held(r.rid, r.sp, r.prompt if pass_prompts else None, self.V)
                # a request owns one slot: the one it left is nobody's (DESIGN §2)
                self.owner = {s: o for s, o in self.owner.items() if o != r.rid}
                self.owner[r.slot] = r.rid
                STATS["flips"] += 1
        b = self.backend
        route_filters = ROUTE_FILTERS[b.route]
        for r in reqs:
            h, s = self.held[r.slot], r.slot
            assert b.slots.owner(s) == r.rid
            if h.raw_temperature < GREEDY_EPS:
                assert b.temperature_pool[s].item() in (0.0, h.temperature), s
            else:
                assert b.temperature_pool[s].item() == h.temperature, (s, h.temperature)
            assert b.top_k_pool[s].item() == h.top_k
            assert b.top_p_pool[s].item() == h.top_p
            assert b.min_p_pool[s].item() == h.min_p
            assert b.repetition_penalty_pool[s].item() == h.repetition
            assert b.frequency_penalty_pool[s].item() == h.frequency
            assert b.presence_penalty_pool[s].item() == h.presence
            seed = h.seed - 2**64 if h.seed >= 2**63 else h.seed
            assert b.seed_pool[s].item() == seed
            # (a zero bias does nothing: storing it or not is the backend's choice)
            assert {t: v for t, v in b.logit_bias(s).items() if v != 0} == \
                {t: v for t, v in h.bias.items() if v != 0}, s
            if not h.greedy:
                assert h.filters <= route_filters, \
                    f"route {b.route!r} does not cover slot {s}'s filters {h.filters}"
                if "k" in h.filters:
                    assert b.step_max_top_k >= h.top_k
        return reqs

    def make_logits(self, rows, data, helds=()):
        """Random logits (normal or tie-heavy rows, NaN/±inf sprinkled, a few all-invalid
        rows); row i belongs to the slot helds[i] when given, and then sometimes has NaN/±inf
        exactly where that slot has a bias entry (bias +inf on -inf makes NaN)."""
        seed = data.draw(st.integers(0, 2**32 - 1), label="logits seed")
        dtype = data.draw(st.sampled_from([torch.float32] * 4 + [torch.float16, torch.bfloat16]),
                          label="dtype")
        rng = np.random.default_rng(seed)
        V = self.V
        x = np.empty((rows, V), dtype=np.float32)
        for i in range(rows):
            style = rng.integers(0, 10)
            if style < 6:
                x[i] = rng.standard_normal(V) * rng.uniform(0.5, 4.0)
            else:
                x[i] = rng.integers(-2, 3, size=V)  # many exact ties
            if rng.random() < 0.3:
                hits = rng.integers(0, V, size=rng.integers(1, 4))
                x[i, hits] = rng.choice([np.nan, -np.inf, np.inf], size=hits.size,
                                        p=[0.4, 0.4, 0.2])
            if i < len(helds) and helds[i].bias and rng.random() < 0.5:
                keys = sorted(helds[i].bias)
                hits = rng.choice(keys, size=min(2, len(keys)), replace=False)
                x[i, hits] = rng.choice([np.nan, -np.inf, np.inf], size=hits.size)
            if rng.random() < 0.03:
                x[i] = rng.choice([np.nan, -np.inf])
        logits = torch.from_numpy(x).to(dtype)
        return logits, logits.float().numpy()

    def batch_info(self, reqs, draft_probs=None):
        lengths = torch.zeros(POOL + 1, dtype=torch.int32)
        for r in reqs:
            lengths[r.slot] = r.length
        return ts.SamplingBatchInfo(torch.tensor([r.slot for r in reqs], dtype=torch.int32),
                                    lengths, self.V, "cpu", draft_probs=draft_probs)

    def check_history(self, reqs):
        for r in reqs:
            h = self.held[r.slot]
            if h.records:
                got = {t: c for t, c in self.backend.penalty_history(r.slot).items() if c > 0}
                assert got == dict(h.counts), \
                    f"slot {r.slot}: output counts {got}, model {dict(h.counts)}"

    def pick_step(self, data):
        rids = sorted(self.requests, key=lambda r: int(r[1:]))
        return data.draw(st.lists(st.sampled_from(rids), min_size=1,
                                  max_size=min(MAX_BS, len(rids)), unique=True), label="step")

    # ---- rules
    @precondition(lambda self: self.V is not None)
    @rule(params=params_st, prompt=prompt_st, data=st.data())
    def churn(self, params, prompt, data):
        """One change of the engine's batch: a request arrives (new rid, free slot), finishes
        (its slot is free again), moves to another free slot, or brings a new SamplingParams
        object. Flips happen at the next step that includes the request."""
        actions = []
        if len(self.requests) < POOL:
            actions.append("arrive")
        if self.requests:
            actions += ["finish", "change_params"]
            if self.free_slots():
                actions.append("move")
        action = data.draw(st.sampled_from(actions), label="action")
        if action == "arrive":
            slot = data.draw(st.sampled_from(self.free_slots()), label="slot")
            rid = f"r{self.next_rid}"
            self.next_rid += 1
            prompt = None if prompt is None else [t % self.V for t in prompt]
            self.requests[rid] = Request(rid, slot, make_params(params, self.V), prompt)
            return
        rid = data.draw(st.sampled_from(sorted(self.requests)), label=action)
        if action == "finish":
            del self.requests[rid]
        elif action == "change_params":
            self.requests[rid].sp = make_params(params, self.V)
        else:
            # any free slot, the one it left included: coming back there is a flip too
            targets = self.free_slots()
            if targets:
                self.requests[rid].slot = data.draw(st.sampled_from(targets), label="to")
                STATS["moves"] += 1

    @precondition(lambda self: self.V is not None and self.requests)
    @rule(data=st.data())
    def sample(self, data):
        reqs = self.prepare(self.pick_step(data), 1, data)
        logits, raw = self.make_logits(len(reqs), data, [self.held[r.slot] for r in reqs])
        tokens, lengths = self.backend.sample(ts.LogitsProcessorOutput(logits),
                                              self.batch_info(reqs))
        tokens, lengths = tokens.tolist(), lengths.tolist()
        invalid = self.backend.invalid_rows[:len(reqs)].tolist()
        assert lengths == [1] * len(reqs)
        for i, r in enumerate(reqs):
            h = self.held[r.slot]
            check_row(h, raw[i], tokens[i], invalid[i], f"sample row {i} slot {r.slot}")
            if h.records:
                h.counts[tokens[i]] += 1
            r.length += 1
        self.check_history(reqs)
        STATS["steps"] += 1
        STATS["sample"] += 1

    @precondition(lambda self: self.V is not None and self.requests)
    @rule(data=st.data())
    def verify(self, data):
        n = data.draw(st.integers(2, MAX_N), label="n")
        reqs = self.prepare(self.pick_step(data), n, data)
        bs, V = len(reqs), self.V
        rejection = data.draw(st.booleans(), label="draft_probs")
        logits, raw = self.make_logits(bs * n, data,
                                       [self.held[r.slot] for r in reqs for _ in range(n)])
        # drafts: the model's greedy continuation (so chains get accepted), random ids, ids
        # the target bans (processed logit -inf), or ids outside [0, V)
        candidates = []
        for b, r in enumerate(reqs):
            h = self.held[r.slot]
            row = [data.draw(st.integers(0, V - 1), label="last token")]
            for j in range(1, n):
                kind = data.draw(st.sampled_from(["likely", "likely", "random", "banned",
                                                  "banned", "oob"]), label="draft")
                l = h.processed(raw[b * n + j - 1], row[1:])
                banned = np.flatnonzero(l == -inf)
                if kind == "likely":
                    draft = int(np.argmax(l))
                elif kind == "random" or (kind == "banned" and banned.size == 0):
                    draft = data.draw(st.integers(0, V - 1))
                elif kind == "banned":
                    draft = int(data.draw(st.sampled_from(banned.tolist())))
                else:
                    draft = data.draw(st.sampled_from([V, -1, 10**8, 2**31 - 1, -2**31]))
                row.append(draft)
            candidates.append(row)
        draft_probs = None
        q_over_one = set()  # (b, j) rows whose q no longer sums to <= 1 after the clamp
        if rejection:
            rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="q seed"))
            q = rng.standard_normal((bs, n - 1, V)) * 2
            q = np.exp(q - q.max(-1, keepdims=True))
            q /= q.sum(-1, keepdims=True)
            if rng.random() < 0.3:  # NaN counts as 0, negatives clamp to 0
                mask = rng.random(q.shape) < 0.2
                q[mask] = rng.choice([np.nan, -1.0, -1e-3], size=int(mask.sum()))
            for b in range(bs):  # at the draft itself also q > 1 (clamps to 1)
                for j in range(1, n):
                    d = candidates[b][j]
                    if 0 <= d < V and rng.random() < 0.4:
                        q[b, j - 1, d] = rng.choice([np.nan, -1.0, -1e-3, 0.0, 5.0, np.inf])
                        if q[b, j - 1, d] > 1.0:
                            q_over_one.add((b, j - 1))
            q_dtype = data.draw(st.sampled_from([torch.float32, torch.float32, torch.float16,
                                                 torch.bfloat16]), label="q dtype")
            draft_probs = torch.from_numpy(q.astype(np.float32)).to(q_dtype)
        cand = torch.tensor(candidates, dtype=torch.int32)
        predict, accept = self.backend.verify(ts.LogitsProcessorOutput(logits),
                                              self.batch_info(reqs, draft_probs), cand)
        predict, accept = predict.tolist(), accept.tolist()
        invalid = self.backend.invalid_rows[:bs * n].tolist()
        for b, r in enumerate(reqs):
            h = self.held[r.slot]
            a = accept[b]
            p = predict[b * n:(b + 1) * n]
            c = candidates[b]
            what = f"verify ({'rejection' if rejection else 'chain'}) req {b} slot {r.slot}"
            assert 1 <= a <= n, f"{what}: accept length {a}"
            assert all(0 <= t < V for t in p[:a]), f"{what}: {p} (accept {a})"
            assert p[a:] == [-1] * (n - a), f"{what}: {p} past accept length {a}"
            for j in range(1, a):
                assert c[j] == p[j - 1], f"{what}: accepted draft {c[j]} != predict {p[j - 1]}"
            for j in range(a):
                l = h.processed(raw[b * n + j], c[1:j + 1])
                l32 = h.processed(raw[b * n + j], c[1:j + 1], np.float32)
                rv = raw[b * n + j]
                if not (~np.isnan(rv) & (rv > -inf)).any():
                    assert p[j] == 0 and invalid[b * n + j], f"{what} row {j}: invalid row"
                    continue
                _check_processed(h, l, p[j], invalid[b * n + j], f"{what} row {j}", l32)
            if a < n:
                rv = raw[b * n + a - 1]
                row_invalid = not (~np.isnan(rv) & (rv > -inf)).any()
                # A rejected draft has p < q there, so max(p - q, 0) cannot return it, unless q is
                # no distribution (clamped to 1 at the draft: the residual can be empty and the
                # row then takes its target sample, which may be the draft). An invalid row ends
                # the chain in both modes (DESIGN §4), whatever the draft.
                ended = bool(invalid[b * n + a - 1])
                if not (ended or (rejection and (row_invalid or (b, a - 1) in q_over_one))):
                    assert c[a] != p[a - 1], f"{what}: draft {c[a]} equals the token yet rejected"
            if h.records:
                for t in p[:a]:
                    h.counts[t] += 1
            r.length += a
            STATS["accepted_drafts"] += a - 1
        self.check_history(reqs)
        STATS["steps"] += 1
        STATS["verify_rejection" if rejection else "verify_chain"] += 1

    @invariant()
    def owners_match_the_model(self):
        if self.V is None:
            return
        for s in range(1, POOL + 1):
            assert self.backend.slots.owner(s) == self.owner.get(s)


# ---------------------------------------------------------------- the test
SOAK_STEPS = int(os.environ.get("TOKENSAMPLER_SOAK_STEPS", "0") or 0)
# Shrinking a stateful failure can take minutes; CI reports the unshrunk failing run (its
# steps are printed). TOKENSAMPLER_HYPOTHESIS_SHRINK=1 shrinks it to a minimal one.
_PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
if os.environ.get("TOKENSAMPLER_HYPOTHESIS_SHRINK") == "1":
    _PHASES.append(Phase.shrink)
_COMMON = dict(deadline=None, database=None, print_blob=True, phases=_PHASES,
               report_multiple_bugs=False,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much])
if SOAK_STEPS > 0:
    # run in chunks of at most 200 examples (~8,000 steps) until SOAK_STEPS steps have run
    SETTINGS = settings(max_examples=200, stateful_step_count=100, **_COMMON)
else:
    SETTINGS = settings(max_examples=50, stateful_step_count=30, **_COMMON)


def _summary() -> str:
    return (f"[state machine] {STATS['steps']} sample/verify steps ({STATS['sample']} sample, "
            f"{STATS['verify_chain']} chain verify, {STATS['verify_rejection']} rejection "
            f"verify) over {STATS['examples']} examples; {STATS['flips']} flips, "
            f"{STATS['moves']} moves, {STATS['accepted_drafts']} drafts accepted")


def test_slot_state_machine(capsys):
    STATS.clear()
    try:
        if SOAK_STEPS > 0:  # chunks of examples until the requested number of steps ran
            while STATS["steps"] < SOAK_STEPS:
                left = SOAK_STEPS - STATS["steps"]  # ~40 steps an example
                run_state_machine_as_test(SamplerMachine, settings=settings(
                    SETTINGS, max_examples=max(1, min(200, math.ceil(left / 40)))))
                with capsys.disabled():
                    print(f"\n[soak progress] {STATS['steps']} / {SOAK_STEPS} steps", flush=True)
        else:
            run_state_machine_as_test(SamplerMachine, settings=SETTINGS)
    finally:
        with capsys.disabled():
            print(f"\n{_summary()}", flush=True)
    # the run must have exercised what it claims to check
    assert STATS["sample"] > 0 and STATS["verify_chain"] > 0 and STATS["verify_rejection"] > 0
    assert STATS["moves"] > 0 and STATS["accepted_drafts"] > 0
