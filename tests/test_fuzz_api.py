"""Hypothesis fuzz of every public argument (issue 15): SamplingParams fields,
SamplingBackendConfig fields, prepare_step's lists, indices, num_tokens_per_req and prompts,
SamplingBatchInfo fields, logits, candidates and draft_probs.

The property, for every call: it returns tokens in [0, V) (verify: predictions in [0, V) up to
the accept length and -1 past it, accept lengths in [1, n]) or raises ValueError / TypeError,
never another exception and never a crash; after a refusal the slot table and the owners are
what they were (compared with torch.equal), and the backend still serves a valid step.

Each fuzz function runs in a child process (a segfault fails its test instead of killing the
suite; the child prints each kernel call's inputs before making it, so the last line says which
input crashed). TOKENSAMPLER_FUZZ_INPROCESS=1 runs them in the pytest process instead (for a
debugger); TOKENSAMPLER_FUZZ_EXAMPLES=N overrides the number of examples per function;
TOKENSAMPLER_HYPOTHESIS_SHRINK=1 shrinks a failure to a minimal one (off by default: it can take
minutes).
"""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import tokensampler as ts

inf, nan = math.inf, math.nan
LP = ts.LogitsProcessorOutput
OK_ERRORS = (ValueError, TypeError)
TRACE = os.environ.get("TOKENSAMPLER_FUZZ_TRACE") == "1"

_PHASES = [Phase.explicit, Phase.reuse, Phase.generate]
if os.environ.get("TOKENSAMPLER_HYPOTHESIS_SHRINK") == "1":
    _PHASES.append(Phase.shrink)


def fuzz_settings(examples: int):
    n = int(os.environ.get("TOKENSAMPLER_FUZZ_EXAMPLES", "0") or 0) or examples
    return settings(max_examples=n, deadline=None, database=None, phases=_PHASES,
                    print_blob=True, report_multiple_bugs=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


def trace(what, **kw):
    if TRACE:
        print(f"CALL {what} " + ", ".join(f"{k}={v!r}" for k, v in kw.items()),
              file=sys.stderr, flush=True)


# ---------------------------------------------------------------- wild values
HUGE = [10**400, -10**400, 10**400, -10**400, 2**63, 2**64, -2**63 - 1, 2**31, -2**31 - 1,
        10**30, 2**62]
ODD = [nan, inf, -inf, True, False, None, "1", "0.5", "", "nan", b"1", [1], (0.5,), {},
       1 + 2j, np.float32(0.5), np.float64(0.5), np.int64(3), np.int32(1), torch.tensor(0.5),
       torch.tensor(2), object()]


ODDS = st.one_of(st.sampled_from(HUGE), st.sampled_from(ODD),
                 st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3),
                 st.integers(-10**6, 10**6))


def wild(valid: st.SearchStrategy) -> st.SearchStrategy:
    """A field's valid values (half the draws) or something an engine might pass by mistake:
    a huge int, NaN/inf, a bool, a string, a container, a numpy/torch scalar."""
    return st.one_of(valid, ODDS)


@st.composite
def some_broken(draw, fields: dict, max_fields: int, max_broken: int = 2):
    """Up to `max_fields` of `fields` ({name: (valid, broken)}), at most `max_broken` of
    them drawn from their broken strategy: each check is reached with the rest valid."""
    chosen = sorted(draw(st.sets(st.sampled_from(sorted(fields)), max_size=max_fields)))
    broken = draw(st.sets(st.sampled_from(chosen), max_size=max_broken)) if chosen else set()
    return {f: draw(fields[f][1] if f in broken else fields[f][0]) for f in chosen}


def backend_snapshot(b):
    if not hasattr(b, "slots"):
        return None
    t = b.slots.table
    return t.clone(), [b.slots.owner(s) for s in range(t.size(0))]


def assert_unchanged(b, snap, what):
    if snap is None:
        return
    table, owners = snap
    assert torch.equal(b.slots.table, table), f"{what}: a refused call wrote the slot table"
    assert [b.slots.owner(s) for s in range(table.size(0))] == owners, \
        f"{what}: a refused call changed a slot's owner"


def call(fn, what, **kw):
    """fn() -> (result, None) or (None, the ValueError/TypeError it raised). Any other
    exception fails the property."""
    trace(what, **kw)
    try:
        return fn(), None
    except OK_ERRORS as e:
        return None, e
    except Exception as e:  # noqa: BLE001 - the property is about the exception type
        raise AssertionError(f"{what} raised {type(e).__name__}: {e} (only ValueError / "
                             f"TypeError are allowed); inputs: {kw}") from e


def check_tokens(tokens, V, bs, what):
    assert isinstance(tokens, torch.Tensor) and tokens.dtype == torch.int32, what
    t = tokens.tolist()
    assert len(t) == bs, f"{what}: {len(t)} tokens for {bs} rows"
    assert all(0 <= x < V for x in t), f"{what}: tokens {t} outside [0, {V})"


def check_verify(predict, accept, V, bs, n, what):
    p, a = predict.tolist(), accept.tolist()
    assert len(p) == bs * n and len(a) == bs, f"{what}: shapes {len(p)}, {len(a)}"
    for b in range(bs):
        assert 1 <= a[b] <= n, f"{what}: accept length {a[b]} outside [1, {n}]"
        row = p[b * n:(b + 1) * n]
        assert all(0 <= x < V for x in row[:a[b]]), f"{what}: predict {row}, accept {a[b]}"
        assert row[a[b]:] == [-1] * (n - a[b]), f"{what}: predict {row} past accept {a[b]}"


CACHE: dict = {}


def backend(name, V, *, bs=3, n=3, pool=4, **cfg):
    key = (name, V, bs, n, pool, tuple(sorted(cfg.items())))
    if key not in CACHE:
        CACHE[key] = ts.create_backend(name, ts.SamplingBackendConfig(
            max_bs=bs, max_draft_tokens_per_req=n, max_req_pool_size=pool, vocab_size=V,
            device="cpu", **cfg))
    return CACHE[key]


_rids = itertools.count()


def fresh_rid():
    return f"fuzz-{next(_rids)}"


def valid_step(b, V, what):
    """A well-formed prepare_step + sample on slot 1: the backend still works."""
    b.prepare_step([fresh_rid()], [1], [ts.SamplingParams(seed=3, temperature=0.8)])
    info = ts.SamplingBatchInfo(torch.tensor([1], dtype=torch.int32),
                                torch.zeros(b.config.pool_rows, dtype=torch.int32), V, "cpu")
    tokens, _ = b.sample(LP(torch.randn(1, V)), info)
    check_tokens(tokens, V, 1, f"{what}: the valid step after it")


# ---------------------------------------------------------------- SamplingParams
def bias_st():
    key = st.one_of(st.integers(-3, 70), st.sampled_from(["5", "05", "5_0", " 5", "+5", "5.0",
                                                          "-1", "", "0x5", "٥", "99999"]),
                    st.sampled_from([5.0, True, None, 2**64, (1,)]))
    value = st.one_of(st.floats(-50, 50), ODDS,
                      st.sampled_from([10**400, -10**400, 2**1024, inf, -inf, 1e300, nan]))
    return st.one_of(st.none(), st.dictionaries(key, value, max_size=4),
                     st.sampled_from([[(1, 1.0)], "x", 5, {1: 1.0}.items()]))


def _field(valid):
    return valid, st.one_of(ODDS, st.sampled_from([1e-45, 1e-38, 1e-300, 2**31, 2**62,
                                                   2**63 - 1, 2**64, 10**400]))


PARAM_FIELDS = dict(
    temperature=_field(st.one_of(st.floats(0, 5), st.sampled_from([0.0, 1e-45, 1e-38, 1e-6]))),
    top_k=_field(st.integers(-1, 80).filter(lambda k: k != 0)),
    top_p=_field(st.floats(1e-6, 1)),
    min_p=_field(st.floats(0, 1)),
    frequency_penalty=_field(st.floats(-2, 2)),
    presence_penalty=_field(st.floats(-2, 2)),
    repetition_penalty=_field(st.floats(0.1, 3)),
    seed=_field(st.one_of(st.none(), st.integers(0, 2**64 - 1))),
    logit_bias=(st.one_of(st.none(), st.dictionaries(
        st.one_of(st.integers(0, 6), st.integers(0, 6).map(str)),
        st.one_of(st.floats(-50, 50), st.sampled_from([inf, -inf, 1e300])), max_size=4)),
        bias_st()),
)


def params_kwargs():
    """Some of SamplingParams' fields, at most two of them broken."""
    return some_broken(PARAM_FIELDS, 5)


@fuzz_settings(1200)
@given(kw=params_kwargs(), V=st.sampled_from([1, 7, 64]),
       name=st.sampled_from(["gumbel", "gumbel_full", "greedy"]), data=st.data())
def fuzz_sampling_params(kw, V, name, data):
    _, err = call(lambda: ts.SamplingParams(**kw).normalize(V), "normalize", **kw)
    b = backend(name, V)
    snap = backend_snapshot(b)
    slot = data.draw(st.integers(1, 4))
    rid = fresh_rid()
    _, err = call(lambda: b.prepare_step([rid], [slot], [ts.SamplingParams(**kw)]),
                  "prepare_step", slot=slot, **kw)
    if err is not None:
        assert_unchanged(b, snap, f"prepare_step({kw})")
        valid_step(b, V, f"after refusing {kw}")
        return
    info = ts.SamplingBatchInfo(torch.tensor([slot], dtype=torch.int32),
                                torch.zeros(5, dtype=torch.int32), V, "cpu")
    logits = torch.randn(1, V) * 3
    res, err = call(lambda: b.sample(LP(logits), info), "sample", **kw)
    assert err is None, f"sample refused a valid step after accepting {kw}: {err}"
    check_tokens(res[0], V, 1, f"sample with {kw}")


# ---------------------------------------------------------------- SamplingBackendConfig
def small_int(lo, hi):
    return st.integers(lo, hi)


CONFIG_FIELDS = dict(
    enable_nan_detection=_field(st.booleans()),
    enable_output_logprobs=_field(st.booleans()),
    max_bs=_field(small_int(1, 4)),
    max_draft_tokens_per_req=_field(small_int(1, 3)),
    max_req_pool_size=_field(small_int(0, 4)),
    vocab_size=_field(small_int(1, 64)),
    device=(st.sampled_from(["cpu", torch.device("cpu"), None]),
            st.sampled_from(["cuda", "meta", "tpu", "", 0, 5, "cpu:x", b"cpu", ["cpu"]])),
    random_seed=_field(st.integers(0, 2**63 - 1)),
    tp_group=(st.sampled_from([None, (), (0,)]), st.sampled_from([(0, 1), "0", [0], (0.5,)])),
    enable_tp_sync=_field(st.booleans()),
    logprobs_mode=(st.sampled_from(["raw", "processed"]),
                   st.sampled_from(["RAW", "", None, 1, b"raw", ["raw"]])),
    top_logprobs_num=_field(small_int(0, 4)),
    penalty_history_capacity=_field(small_int(0, 64)),
    logit_bias_capacity=_field(small_int(0, 8)),
)
_SIZE_FIELDS = ("max_bs", "max_draft_tokens_per_req", "max_req_pool_size", "vocab_size",
                "top_logprobs_num", "penalty_history_capacity", "logit_bias_capacity")


@st.composite
def config_kwargs(draw):
    kw = dict(max_bs=2, max_draft_tokens_per_req=2, max_req_pool_size=2, vocab_size=16,
              device="cpu")
    kw.update(draw(some_broken(CONFIG_FIELDS, 5)))
    # ints in [2^31, 2^62) that pass an "int >= 1" check would allocate for real: the fuzz
    # keeps sizes small or far beyond memory (>= 2^62 fails at once)
    for f in _SIZE_FIELDS:
        v = kw.get(f)
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 4096 < v < 2**62:
            kw[f] = 2**62
    return kw


@fuzz_settings(1600)
@given(kw=config_kwargs(), name=st.sampled_from(["greedy", "gumbel", "gumbel_full"]))
def fuzz_backend_config(kw, name):
    b, err = call(lambda: ts.create_backend(name, ts.SamplingBackendConfig(**kw)),
                  "create_backend", name=name, **kw)
    if err is not None:
        return
    V, cfg = b.config.vocab_size, b.config
    assert isinstance(V, int) and not isinstance(V, bool) and 1 <= V <= 2**20
    if cfg.max_req_pool_size > 4096:
        # only a backend without pools may take a pool size that cannot be allocated; a
        # step needs valid_cache_lengths of pool size, which this test cannot build
        assert name == "greedy", f"{name} accepted max_req_pool_size={cfg.max_req_pool_size}"
        return
    slot = min(1, cfg.max_req_pool_size)
    _, err = call(lambda: b.prepare_step(["a"], [slot], [ts.SamplingParams(seed=1)]),
                  "prepare_step on an accepted config", **kw)
    assert err is None, f"an accepted config {kw} refuses a valid prepare_step: {err}"
    info = ts.SamplingBatchInfo(torch.tensor([slot], dtype=torch.int32),
                                torch.zeros(cfg.max_req_pool_size + 1, dtype=torch.int32), V,
                                b.device)
    out = LP(torch.randn(1, V, device=b.device))
    res, err = call(lambda: b.sample(out, info), "sample on an accepted config", **kw)
    assert err is None, f"an accepted config {kw} refuses a valid step: {err}"
    check_tokens(res[0], V, 1, f"config {kw}")
    if cfg.enable_output_logprobs is True:
        assert out.next_token_logprobs is not None


# ---------------------------------------------------------------- prepare_step
class Gen:
    """Stands for a generator over `items` (a fresh one per call: see realize)."""

    def __init__(self, items):
        self.items = list(items)

    def __repr__(self):
        return f"Gen({self.items!r})"


def realize(x):
    """(what to pass, what it held): a Gen becomes a one-shot generator."""
    if isinstance(x, Gen):
        return (v for v in x.items), x.items
    return x, x


def sequence_of(elem, max_size=5):
    """A list of elements, or the list as a tuple, a generator, a string, a dict, a tensor."""
    return st.one_of(
        st.lists(elem, max_size=max_size), st.lists(elem, max_size=max_size).map(tuple),
        st.lists(elem, max_size=max_size).map(lambda l: Gen(l)),
        st.sampled_from(["ab", None, 3, {"a": 1}, b"ab"]))


VALID_PARAMS = some_broken(PARAM_FIELDS, 5, max_broken=0).map(lambda kw: ts.SamplingParams(**kw))
ODD_RID = st.sampled_from([None, b"a", 1.5, ("a",), "", 3, True])
ODD_PARAM = st.one_of(st.sampled_from([None, {}, "greedy", 0.5, {"temperature": 0.0}]),
                      some_broken(PARAM_FIELDS, 3, max_broken=1).map(
                          lambda kw: ts.SamplingParams(**kw)))
ODD_PROMPT = st.one_of(
    st.lists(wild(st.integers(0, 6)), min_size=1, max_size=6),
    st.lists(st.integers(0, 6), max_size=6).map(lambda l: torch.tensor(l, dtype=torch.int64)),
    st.lists(st.integers(0, 6), max_size=6).map(lambda l: Gen(l)),
    st.sampled_from([torch.tensor([1.5, 2.0]), torch.zeros(2, 2, dtype=torch.int64), "abc", 7,
                     np.array([1, 2]), range(3), [70], [-1], [2**31], torch.tensor([1, 99])]))
CONTAINERS = st.sampled_from(["tuple", "gen", "str", "dict", "none", "int", "set"])
CORRUPTIONS = ["rids_container", "rid_entry", "rid_dup", "slots_container", "slot_entry",
               "slot_dup", "params_container", "param_entry", "n", "prompts_container",
               "prompt_entry", "misalign", "too_many"]


def container(kind, items):
    return {"tuple": lambda: tuple(items), "gen": lambda: Gen(items), "str": lambda: "ab",
            "dict": lambda: dict(enumerate(items)), "none": lambda: None, "int": lambda: 3,
            "set": lambda: set(map(repr, items))}[kind]()


@st.composite
def step_args(draw):
    """A valid prepare_step (1-3 requests, distinct rids and slots, valid params and prompts)
    with up to two corruptions an engine could make."""
    k = draw(st.integers(1, 3), label="requests")
    rids = draw(st.lists(st.sampled_from("abcdefgh"), min_size=k, max_size=k, unique=True))
    slots = draw(st.lists(st.integers(0, 4), min_size=k, max_size=k, unique=True))
    params = draw(st.lists(VALID_PARAMS, min_size=k, max_size=k))
    n = draw(st.integers(1, 3))
    prompts = draw(st.one_of(st.none(), st.lists(
        st.one_of(st.none(), st.lists(st.integers(0, 6), max_size=8)), min_size=k, max_size=k)))
    args = dict(rids=rids, slots=slots, params=params, n=n, prompts=prompts)
    for c in sorted(draw(st.sets(st.sampled_from(CORRUPTIONS), max_size=2), label="corrupt")):
        i = draw(st.integers(0, k - 1))

        def lst(name):  # the field if it is still a non-empty list (an earlier corruption
            v = args[name]  # may have replaced or shortened it); entries are indexed mod len
            return v if isinstance(v, list) and v else None

        if c.endswith("_container"):
            name = c[:-len("_container")]
            if isinstance(args[name], list):
                args[name] = container(draw(CONTAINERS), args[name])
        elif c == "rid_entry" and lst("rids"):
            args["rids"][i % len(args["rids"])] = draw(ODD_RID)
        elif c == "rid_dup" and lst("rids"):
            args["rids"].append(args["rids"][i % len(args["rids"])])
            for name in ("slots", "params", "prompts"):
                if lst(name):
                    args[name].append(args[name][i % len(args[name])] if name != "slots"
                                      else draw(st.integers(0, 4)))
        elif c == "slot_entry" and lst("slots"):
            args["slots"][i % len(args["slots"])] = draw(
                st.one_of(ODDS, st.sampled_from([5, -1, 2**31, -2**31])))
        elif c == "slot_dup" and lst("slots") and len(args["slots"]) > 1:
            m = len(args["slots"])
            args["slots"][(i + 1) % m] = args["slots"][i % m]
        elif c == "param_entry" and lst("params"):
            args["params"][i % len(args["params"])] = draw(ODD_PARAM)
        elif c == "n":
            args["n"] = draw(st.one_of(ODDS, st.sampled_from([0, 4, -1, 2.0, True])))
        elif c == "prompt_entry" and lst("prompts"):
            args["prompts"][i % len(args["prompts"])] = draw(ODD_PROMPT)
        elif c == "misalign":
            name = draw(st.sampled_from(["rids", "slots", "params", "prompts"]))
            if lst(name) is not None:
                args[name] = (args[name][:-1] if draw(st.booleans())
                              else args[name] + args[name][:1])
        elif c == "too_many" and lst("rids") and lst("slots") and lst("params"):
            extra = [r for r in "ijkl"]
            args["rids"] += extra
            args["slots"] = list(range(len(args["rids"]))) if len(args["rids"]) <= 5 else \
                args["slots"] + [0] * len(extra)
            args["params"] += [ts.SamplingParams(seed=1)] * len(extra)
            if lst("prompts"):
                args["prompts"] += [None] * len(extra)
    return args


@fuzz_settings(1000)
@given(name=st.sampled_from(["greedy", "gumbel", "gumbel_full"]), V=st.sampled_from([7, 64]),
       args=step_args())
def fuzz_prepare_step(name, V, args):
    b = backend(name, V)
    snap = backend_snapshot(b)
    (rids_in, rids), (slots_in, slots), (params_in, _), (prompts_in, _) = (
        realize(args["rids"]), realize(args["slots"]), realize(args["params"]),
        realize(args["prompts"]))
    n = args["n"]
    _, err = call(lambda: b.prepare_step(rids_in, slots_in, params_in, n,
                                         prompt_token_ids=prompts_in), "prepare_step", **args)
    if err is not None:
        assert_unchanged(b, snap, f"prepare_step({args})")
        valid_step(b, V, f"after refusing prepare_step({args})")
        return
    if name == "greedy":
        return
    # accepted: the step it prepared must sample (and verify) to tokens in [0, V)
    k, nn = len(rids), int(n)
    assert 1 <= k <= b.config.max_bs and 1 <= nn <= b.config.max_draft_tokens_per_req, args
    pool = torch.tensor([int(s) for s in slots], dtype=torch.int32)
    info = ts.SamplingBatchInfo(pool, torch.zeros(5, dtype=torch.int32), V, "cpu")
    if nn == 1:
        res, err = call(lambda: b.sample(LP(torch.randn(k, V)), info), "sample", **args)
        assert err is None, f"sample refused the step prepare_step accepted: {err}"
        check_tokens(res[0], V, k, f"sample after prepare_step({args})")
    else:
        cand = torch.randint(0, V, (k, nn), dtype=torch.int32)
        res, err = call(lambda: b.verify(LP(torch.randn(k * nn, V)), info, cand), "verify",
                        **args)
        assert err is None, f"verify refused the step prepare_step accepted: {err}"
        check_verify(*res, V, k, nn, f"verify after prepare_step({args})")


# ---------------------------------------------------------------- sample / verify inputs
POOL_VARIANTS = ["ok", "list", "float32", "int64", "2-D", "0-D", "short", "long", "oob99",
                 "oob-1", "oob-pool", "int32max", "noncontig", "meta", "empty"]
LENGTH_VARIANTS = ["ok", "list", "int64", "float32", "short", "empty", "2-D", "negative",
                   "huge", "long", "meta", "noncontig"]
LOGITS_VARIANTS = ["ok", "ok", "ok", "float16", "bfloat16", "float64", "int32", "bool",
                   "1-D", "3-D", "V+1", "V-1", "rows+1", "rows-1", "zero-rows", "too-many-rows",
                   "meta", "transposed", "list", "numpy", "nan", "inf", "-inf", "huge", "mixed"]
VOCAB_VARIANTS = ["ok", "ok", "plus1", "minus1", "zero", "str", "none", "float", "bool", "huge"]
DEVICE_VARIANTS = ["ok", "ok", "device", "cuda", "meta", "none", "junk", "int"]
# values an engine may legitimately send (q with NaN / negative / > 1 entries, fp16 q, draft
# ids outside [0, V)) ...
DRAFT_VALUES = ["ok", "none", "nan", "negative", "above1", "inf", "float16", "bfloat16",
                "one-hot", "zeros"]
CAND_VALUES = ["ok", "ok", "int64", "oob", "oob", "int64-huge", "noncontig"]
# ... and malformed ones (a quarter of the draws)
DRAFT_MALFORMED = ["float64", "int32", "bool", "list", "2-D", "0-D", "n", "bs", "V+1", "meta"]
CAND_MALFORMED = ["float32", "bool", "list", "0-D", "1-D", "3-D", "bs-by-0", "n+1", "bs+1",
                  "meta"]


def mostly(values, malformed):
    return st.one_of(st.sampled_from(values), st.sampled_from(values), st.sampled_from(values),
                     st.sampled_from(malformed))


def make_pool(variant, slots, pool_rows):
    t = torch.tensor(slots, dtype=torch.int32)
    bs = len(slots)
    return {
        "ok": lambda: t, "list": lambda: list(slots), "float32": lambda: t.float(),
        "int64": lambda: t.long(), "2-D": lambda: t.view(1, -1), "0-D": lambda: t[0],
        "short": lambda: t[:-1], "long": lambda: torch.cat([t, t]),
        "oob99": lambda: torch.full((bs,), 99, dtype=torch.int32),
        "oob-1": lambda: torch.cat([t[:-1], torch.tensor([-1], dtype=torch.int32)]),
        "oob-pool": lambda: torch.full((bs,), pool_rows, dtype=torch.int32),
        "int32max": lambda: torch.full((bs,), 2**31 - 1, dtype=torch.int32),
        "noncontig": lambda: torch.stack([t, t], 1)[:, 0],
        "meta": lambda: t.to("meta"), "empty": lambda: t[:0],
    }[variant]()


def make_lengths(variant, pool_rows, rng):
    t = torch.from_numpy(rng.integers(0, 1000, pool_rows).astype(np.int32))
    return {
        "ok": lambda: t, "list": lambda: t.tolist(), "int64": lambda: t.long(),
        "float32": lambda: t.float(), "short": lambda: t[:-1], "empty": lambda: t[:0],
        "2-D": lambda: t.view(1, -1), "negative": lambda: -t - 1,
        "huge": lambda: torch.full((pool_rows,), 2**31 - 1, dtype=torch.int32),
        "long": lambda: torch.cat([t, t]), "meta": lambda: t.to("meta"),
        "noncontig": lambda: torch.stack([t, t], 1)[:, 0],
    }[variant]()


def make_logits(variant, rows, V, rng, max_bs, n):
    x = torch.from_numpy((rng.standard_normal((rows, V)) * 3).astype(np.float32))
    special = x.clone()
    if variant in ("nan", "inf", "-inf", "mixed"):
        mask = torch.from_numpy(rng.random((rows, V)) < 0.5)
        fill = {"nan": nan, "inf": inf, "-inf": -inf}.get(variant)
        if fill is None:
            vals = torch.tensor([nan, inf, -inf, 3e38, -3e38])
            special[mask] = vals[torch.from_numpy(rng.integers(0, 5, int(mask.sum())))]
        else:
            special[mask] = fill
    return {
        "ok": lambda: x, "float16": lambda: x.half(), "bfloat16": lambda: x.bfloat16(),
        "float64": lambda: x.double(), "int32": lambda: x.int(), "bool": lambda: x > 0,
        "1-D": lambda: x[0], "3-D": lambda: x.unsqueeze(0), "V+1": lambda: torch.randn(rows, V + 1),
        "V-1": lambda: x[:, :-1], "rows+1": lambda: torch.randn(rows + 1, V),
        "rows-1": lambda: x[:-1], "zero-rows": lambda: x[:0],
        "too-many-rows": lambda: torch.randn((max_bs + 1) * n, V), "meta": lambda: x.to("meta"),
        "transposed": lambda: x.t().contiguous().t(), "list": lambda: x.tolist(),
        "numpy": lambda: x.numpy(), "nan": lambda: special, "inf": lambda: special,
        "-inf": lambda: special, "huge": lambda: x * 1e37, "mixed": lambda: special,
    }[variant]()


def make_draft_probs(variant, bs, n, V, rng):
    q = rng.random((bs, max(n - 1, 0), V)).astype(np.float32)
    q /= np.maximum(q.sum(-1, keepdims=True), 1e-9)
    t = torch.from_numpy(q)

    def put(value):
        s = t.clone()
        s[torch.from_numpy(rng.random(t.shape) < 0.3)] = value
        return s

    return {
        "ok": lambda: t, "none": lambda: None, "nan": lambda: put(nan),
        "negative": lambda: put(-1.0), "above1": lambda: put(5.0), "inf": lambda: put(inf),
        "float16": lambda: t.half(), "bfloat16": lambda: t.bfloat16(),
        "float64": lambda: t.double(),
        "int32": lambda: (t * 10).int(), "bool": lambda: t > 0.5, "list": lambda: t.tolist(),
        "2-D": lambda: t.reshape(bs, -1), "0-D": lambda: torch.tensor(0.5),
        "n": lambda: torch.rand(bs, n, V), "bs": lambda: torch.rand(bs + 1, max(n - 1, 0), V),
        "V+1": lambda: torch.rand(bs, max(n - 1, 0), V + 1), "meta": lambda: t.to("meta"),
        "one-hot": lambda: torch.nn.functional.one_hot(
            torch.from_numpy(rng.integers(0, V, (bs, max(n - 1, 0)))), V).float(),
        "zeros": lambda: torch.zeros_like(t),
    }[variant]()


def make_candidates(variant, bs, n, V, rng):
    c = torch.from_numpy(rng.integers(0, V, (bs, n)).astype(np.int32))
    oob = c.clone()
    if n > 1:
        bad = torch.tensor([V, -1, 10**8, 2**31 - 1, -2**31], dtype=torch.int32)
        mask = torch.from_numpy(rng.random((bs, n)) < 0.5)
        mask[:, 0] = False
        oob[mask] = bad[torch.from_numpy(rng.integers(0, 5, int(mask.sum())))]
    return {
        "ok": lambda: c, "int64": lambda: c.long(), "float32": lambda: c.float() + 0.5,
        "bool": lambda: c > 0, "list": lambda: c.tolist(), "0-D": lambda: c[0, 0],
        "1-D": lambda: c.view(-1), "3-D": lambda: c.unsqueeze(0), "bs-by-0": lambda: c[:, :0],
        "n+1": lambda: torch.zeros(bs, n + 1, dtype=torch.int32),
        "bs+1": lambda: torch.zeros(bs + 1, n, dtype=torch.int32), "meta": lambda: c.to("meta"),
        "oob": lambda: oob,
        "int64-huge": lambda: torch.full((bs, n), 2**40, dtype=torch.int64),
        "noncontig": lambda: torch.stack([c, c], 2)[:, :, 0],
    }[variant]()


VOCAB_OF = {"ok": lambda V: V, "plus1": lambda V: V + 1, "minus1": lambda V: V - 1,
            "zero": lambda V: 0, "str": lambda V: str(V), "none": lambda V: None,
            "float": lambda V: float(V), "bool": lambda V: True, "huge": lambda V: 2**64}
DEVICE_OF = {"ok": "cpu", "device": torch.device("cpu"), "cuda": "cuda", "meta": "meta",
             "none": None, "junk": "gpu0", "int": 0}

STEP_PARAMS = st.builds(
    ts.SamplingParams, temperature=st.sampled_from([0.0, 0.5, 1.0, 1e-30]),
    top_k=st.sampled_from([-1, 1, 3]), top_p=st.sampled_from([1.0, 0.5]),
    seed=st.integers(0, 2**64 - 1))
FULL_EXTRAS = st.fixed_dictionaries({
    "min_p": st.sampled_from([0.0, 0.2]),
    "repetition_penalty": st.sampled_from([1.0, 1.3]),
    "frequency_penalty": st.sampled_from([0.0, -2.0, 2.0]),
    "logit_bias": st.sampled_from([None, {0: inf}, {1: -inf, 2: 1e300}]),
})


def _prepared(data, name, V, n):
    """A backend with bs prepared requests (valid parameters) for the fuzzed call."""
    b = backend(name, V, enable_output_logprobs=True, top_logprobs_num=min(2, V))
    bs = data.draw(st.integers(1, 3), label="bs")
    slots = data.draw(st.lists(st.integers(1, 4), min_size=bs, max_size=bs, unique=True),
                      label="slots")
    params = []
    for _ in range(bs):
        sp = data.draw(STEP_PARAMS, label="params")
        if name == "gumbel_full":
            for k, v in data.draw(FULL_EXTRAS, label="extras").items():
                if k == "logit_bias" and v is not None:
                    v = {t % V: x for t, x in v.items()}
                setattr(sp, k, v)
        params.append(sp)
    b.prepare_step([fresh_rid() for _ in range(bs)], slots, params, n,
                   prompt_token_ids=[[t % V for t in (0, 1, 2)]] * bs)
    return b, bs, slots


BATCH_FIELDS = {"pool": POOL_VARIANTS, "lengths": LENGTH_VARIANTS, "logits": LOGITS_VARIANTS,
                "vocab": VOCAB_VARIANTS, "device": DEVICE_VARIANTS}


@st.composite
def batch_variants(draw):
    """Variant names of the batch fields: at most two of them malformed, the rest "ok", so
    every check (and the kernels behind them) is reached."""
    broken = draw(st.sets(st.sampled_from(sorted(BATCH_FIELDS)), max_size=2))
    return {f: draw(st.sampled_from(BATCH_FIELDS[f])) if f in broken else "ok"
            for f in sorted(BATCH_FIELDS)}


def make_batch(v, b, slots, V, bs, n, rng, draft_probs):
    pool_rows = b.config.pool_rows
    info = ts.SamplingBatchInfo(
        make_pool(v["pool"], slots, pool_rows), make_lengths(v["lengths"], pool_rows, rng),
        VOCAB_OF[v["vocab"]](V), DEVICE_OF[v["device"]], draft_probs=draft_probs)
    return info, LP(make_logits(v["logits"], bs * n, V, rng, b.config.max_bs, n))


@fuzz_settings(1200)
@given(name=st.sampled_from(["greedy", "gumbel", "gumbel_full"]), V=st.sampled_from([1, 7, 64]),
       v=batch_variants(), greedy_flag=wild(st.booleans()),
       draft_v=st.sampled_from(["none", "none", "ok", "nan", "list"]),
       seed=st.integers(0, 2**32 - 1), data=st.data())
def fuzz_sample(name, V, v, greedy_flag, draft_v, seed, data):
    rng = np.random.default_rng(seed)
    b, bs, slots = _prepared(data, name, V, 1)
    kw = dict(name=name, V=V, bs=bs, slots=slots, is_all_greedy=greedy_flag,
              draft_probs=draft_v, **v)
    info, out = make_batch(v, b, slots, V, bs, 1, rng, make_draft_probs(draft_v, bs, 2, V, rng))
    info.is_all_greedy = greedy_flag
    snap = backend_snapshot(b)
    res, err = call(lambda: b.sample(out, info), "sample", **kw)
    if err is not None:
        assert_unchanged(b, snap, f"sample({kw})")
        valid_step(b, V, f"after refusing sample({kw})")
        return
    tokens, lengths = res
    rows = tokens.numel()
    assert rows <= b.config.max_bs, kw
    check_tokens(tokens, V, rows, f"sample({kw})")
    assert lengths.tolist() == [1] * rows, kw
    if out.next_token_logprobs is not None:  # rows of finite logits: a logprob, never NaN
        lp = out.next_token_logprobs[:rows]
        finite = torch.isfinite(out.next_token_logits.float()).all(-1)[:rows]
        assert not torch.isnan(lp[finite]).any() and (lp[finite] <= 1e-4).all(), \
            f"logprobs {lp.tolist()} of finite rows ({kw})"


@fuzz_settings(1500)
@given(name=st.sampled_from(["greedy", "gumbel", "gumbel_full"]), V=st.sampled_from([1, 7, 64]),
       n=st.integers(1, 3), cand_v=mostly(CAND_VALUES, CAND_MALFORMED),
       draft_v=mostly(DRAFT_VALUES, DRAFT_MALFORMED), v=batch_variants(),
       seed=st.integers(0, 2**32 - 1), data=st.data())
def fuzz_verify(name, V, n, cand_v, draft_v, v, seed, data):
    rng = np.random.default_rng(seed)
    b, bs, slots = _prepared(data, name, V, n)
    kw = dict(name=name, V=V, bs=bs, n=n, slots=slots, candidates=cand_v, draft_probs=draft_v,
              **v)
    info, out = make_batch(v, b, slots, V, bs, n, rng, make_draft_probs(draft_v, bs, n, V, rng))
    candidates = make_candidates(cand_v, bs, n, V, rng)
    snap = backend_snapshot(b)
    res, err = call(lambda: b.verify(out, info, candidates), "verify", **kw)
    if err is not None:
        assert_unchanged(b, snap, f"verify({kw})")
        valid_step(b, V, f"after refusing verify({kw})")
        return
    predict, accept = res
    rb = accept.numel()
    rn = predict.numel() // rb if rb else 0
    assert rb * rn == predict.numel() and rb <= b.config.max_bs, kw
    check_verify(predict, accept, V, rb, rn, f"verify({kw})")


# ---------------------------------------------------------------- the tests
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
FUZZ_FUNCTIONS = ["fuzz_sampling_params", "fuzz_backend_config", "fuzz_prepare_step",
                  "fuzz_sample", "fuzz_verify"]


@pytest.mark.parametrize("fn", FUZZ_FUNCTIONS)
def test_fuzz(fn):
    if os.environ.get("TOKENSAMPLER_FUZZ_INPROCESS") == "1":
        globals()[fn]()
        return
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "TOKENSAMPLER_FUZZ_TRACE": "1"}
    code = (f"import sys; sys.path.insert(0, {TESTS_DIR!r}); import test_fuzz_api as m; "
            f"m.{fn}(); print('FUZZ DONE')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=600)
    calls = [l for l in proc.stderr.splitlines() if l.startswith("CALL ")]
    report = "\n".join(l for l in proc.stderr.splitlines() if not l.startswith("CALL "))
    last = calls[-1] if calls else "(none)"
    assert proc.returncode == 0 and "FUZZ DONE" in proc.stdout, (
        f"{fn} failed in its child process (exit {proc.returncode}) after {len(calls)} calls; "
        f"last call: {last}\n{report[-6000:]}")
