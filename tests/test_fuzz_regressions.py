"""Regression tests for issue 15: every defect the fuzz and the soak found, as the issue's
snippets, checked against the target policy. Cases that used to kill the process (draft ids
outside [0, V) under rejection sampling) and cases that hand the kernels malformed tensors run
in a child process, so a crash fails one test instead of taking the suite down."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence

import numpy as np
import pytest
import torch

import tokensampler as ts

inf = math.inf
LP = ts.LogitsProcessorOutput


def mk(V, name="gumbel_full", *, bs=2, n=2, pool=2, **kw):
    return ts.create_backend(name, ts.SamplingBackendConfig(
        max_bs=bs, max_draft_tokens_per_req=n, max_req_pool_size=pool, vocab_size=V,
        device="cpu", **kw))


def info(slots, V, dp=None, *, pool=2, t=0):
    lengths = torch.full((pool + 1,), t, dtype=torch.int32)
    return ts.SamplingBatchInfo(torch.tensor(slots, dtype=torch.int32), lengths, V, "cpu",
                                draft_probs=dp)


def snapshot(backend):
    """The backend's slot table and owners, to compare after a refusal."""
    slots = backend.slots
    return slots.table.clone(), [slots.owner(s) for s in range(slots.table.size(0))]


def assert_unchanged(backend, before):
    table, owners = before
    assert torch.equal(backend.slots.table, table), "a refused call wrote the slot table"
    assert [backend.slots.owner(s) for s in range(table.size(0))] == owners, \
        "a refused call changed a slot's owner"


# ---------------------------------------------------------------- child processes
CHILD_PRELUDE = '''
import json, math, sys, torch, tokensampler as ts
inf = math.inf; LP = ts.LogitsProcessorOutput
def mk(V, name="gumbel_full", *, bs=2, n=2, pool=2, **kw):
    return ts.create_backend(name, ts.SamplingBackendConfig(max_bs=bs,
        max_draft_tokens_per_req=n, max_req_pool_size=pool, vocab_size=V, device="cpu", **kw))
def info(s, V, dp=None, *, pool=2, t=0):
    return ts.SamplingBatchInfo(torch.tensor(s, dtype=torch.int32),
        torch.full((pool + 1,), t, dtype=torch.int32), V, "cpu", draft_probs=dp)
def report(case, **kw):
    print("CASE " + json.dumps({"case": case, **kw}), flush=True)
def attempt(case, fn):
    try:
        out = fn()
    except Exception as e:
        report(case, error=type(e).__name__, message=str(e))
    else:
        report(case, result=out)
'''


def run_child(body: str, timeout: int = 300):
    """Runs CHILD_PRELUDE + body in a fresh interpreter; returns (returncode, {case: record},
    output tail). Each case reports one JSON line as soon as it finishes, so a crash still
    says which cases ran."""
    body = textwrap.dedent(body).strip("\n")
    assert not body[0].isspace(), "the child's code must dedent to column 0"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    code = CHILD_PRELUDE + "\n" + body + "\nprint('CHILD DONE', flush=True)\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=timeout)
    cases = {}
    for line in proc.stdout.splitlines():
        if line.startswith("CASE "):
            record = json.loads(line[5:])
            cases[record.pop("case")] = record
    tail = (proc.stdout[-2000:] + "\n--- stderr ---\n" + proc.stderr[-3000:])
    if proc.returncode == 0:
        assert "CHILD DONE" in proc.stdout, f"the child did not run to its end:\n{tail}"
    return proc.returncode, cases, tail


# ---------------------------------------------------------------- 1. draft ids outside [0, V)
BAD_DRAFTS = [10**8, -1, "V", 2**31 - 1, -2**31]


@pytest.mark.parametrize("name", ["gumbel", "gumbel_full"])
def test_d1_out_of_vocab_draft_with_draft_probs_is_rejected_not_read(name):
    """Issue snippet 1 (segfault): a draft id outside [0, V) under rejection sampling is
    rejected; the row's token comes from the target distribution and accept length is 1,
    whatever q says (q < 0 used to return the out-of-vocab id as a prediction)."""
    V = 64
    rc, cases, tail = run_child(f'''
        V = {V}
        b = mk(V, {name!r})
        b.prepare_step(["a"], [1], [ts.SamplingParams(seed=1)], 2)
        g = torch.Generator().manual_seed(0)
        for bad in {BAD_DRAFTS!r}:
            bad = V if bad == "V" else bad
            for qname, q in [("uniform", torch.full((1, 1, V), 1 / V)),
                             ("negative", torch.full((1, 1, V), -1.0)),
                             ("nan", torch.full((1, 1, V), float("nan"))),
                             ("zero", torch.zeros(1, 1, V))]:
                for t in range(3):
                    def call():
                        p, a = b.verify(LP(torch.randn(2, V, generator=g)), info([1], V, q, t=t),
                                        torch.tensor([[0, bad]], dtype=torch.int32))
                        return [p.tolist(), a.tolist()]
                    attempt(f"{{bad}}/{{qname}}/{{t}}", call)
    ''')
    assert rc == 0, f"child exited with {rc} (a crash is the defect):\n{tail}"
    assert len(cases) == len(BAD_DRAFTS) * 4 * 3, tail
    for case, record in cases.items():
        assert "result" in record, f"{case}: refused with {record}"
        (predict, accept) = record["result"]
        assert accept == [1], f"{case}: an out-of-vocab draft was accepted: {record}"
        assert 0 <= predict[0] < V and predict[1] == -1, f"{case}: {record}"


@pytest.mark.parametrize("mode", ["chain", "rejection"])
def test_d1_out_of_vocab_draft_after_an_accepted_draft(mode):
    """Row j of a verify with penalties sees drafts 1..j: an out-of-vocab draft there must not
    be looked up in the history nor accepted. Greedy target: row 0's argmax is 3, row 1's is 5;
    draft 3 is accepted, the bad draft is rejected, the bonus comes from row 1."""
    V = 16
    rc, cases, tail = run_child(f'''
        V = {V}
        b = mk(V, "gumbel_full", n=3)
        sp = ts.SamplingParams(temperature=0.0, frequency_penalty=0.5, repetition_penalty=1.2,
                               seed=3)
        logits = torch.zeros(3, V)
        logits[0, 3] = 5.0
        logits[1, 5] = 5.0
        logits[2, 7] = 5.0
        q = torch.full((1, 2, V), 1 / V) if {mode!r} == "rejection" else None
        k = 0
        def fresh():  # a new request each call: a flip empties the penalty history
            global k
            k += 1
            b.prepare_step([f"r{{k}}"], [1], [sp], 3, prompt_token_ids=[[1, 2]])
        for bad in [10**8, -1, V, 2**31 - 1, -2**31]:
            fresh()
            attempt(str(bad), lambda: [t.tolist() for t in b.verify(LP(logits.clone()),
                info([1], V, q), torch.tensor([[0, 3, bad]], dtype=torch.int32))])
            fresh()
            attempt(str(bad) + "/bad-first", lambda: [t.tolist() for t in b.verify(
                LP(logits.clone()), info([1], V, q),
                torch.tensor([[0, bad, 5]], dtype=torch.int32))])
    ''')
    assert rc == 0, f"child exited with {rc} (a crash is the defect):\n{tail}"
    assert len(cases) == 10, tail
    for case, record in cases.items():
        assert "result" in record, f"{case}: refused with {record}"
        predict, accept = record["result"]
        if case.endswith("bad-first"):
            assert accept == [1] and predict == [3, -1, -1], f"{case}: {record}"
        else:
            assert accept == [2] and predict == [3, 5, -1], f"{case}: {record}"


@pytest.mark.parametrize("name", ["greedy", "gumbel", "gumbel_full"])
def test_d1_chain_verify_never_matches_out_of_vocab_candidates(name):
    """Without draft_probs an out-of-vocab draft never equals the target's token: rejected.
    (int64 candidates may be refused instead, naming candidates; int32 ones must not be.)"""
    V = 8
    rc, cases, tail = run_child(f'''
        V = {V}
        b = mk(V, {name!r})
        b.prepare_step(["a"], [1], [ts.SamplingParams(temperature=0.0, seed=1)], 2)
        for dtype in (torch.int32, torch.int64):
            bads = [V, -1, 10**8, 2**31 - 1, -2**31] + ([2**40, -2**40, 2**32 + 2]
                                                         if dtype == torch.int64 else [])
            for bad in bads:
                logits = torch.zeros(2, V)
                logits[:, 2] = 1.0
                attempt(f"{{bad}}/{{dtype}}", lambda: [t.tolist() for t in b.verify(
                    LP(logits), info([1], V), torch.tensor([[0, bad]], dtype=dtype))])
    ''')
    assert rc == 0, f"child exited with {rc}:\n{tail}"
    assert len(cases) == 13, tail
    for case, record in cases.items():
        if "error" in record and case.endswith("int64"):
            assert record["error"] in ("ValueError", "TypeError") and \
                "candidates" in record["message"], f"{case}: {record}"
            continue
        assert record.get("result") == [[2, -1], [1]], f"{case}: {record}"


# ---------------------------------------------------------------- 2. draft probabilities
DRAFT_PROBS_BAD = {
    "int32": "torch.ones(1, 1, V, dtype=torch.int32)",
    "int64": "torch.zeros(1, 1, V, dtype=torch.int64)",
    "bool": "torch.ones(1, 1, V, dtype=torch.bool)",
    "float64": "torch.full((1, 1, V), 1 / V, dtype=torch.float64)",
    "list": "[[[1 / V] * V]]",
    "2-D": "torch.full((1, V), 1 / V)",
    "0-D": "torch.tensor(0.5)",
    "n": "torch.full((1, 2, V), 1 / V)",
    "bs": "torch.full((2, 1, V), 1 / V)",
    "V+1": "torch.full((1, 1, V + 1), 1 / V)",
    "V-1": "torch.full((1, 1, V - 1), 1 / V)",
    "empty": "torch.zeros(1, 0, V)",
    "meta": "torch.empty(1, 1, V, device='meta')",
}


@pytest.mark.parametrize("name", ["gumbel", "gumbel_full"])
def test_d2_draft_probs_dtype_shape_and_device_are_checked(name):
    V = 16
    cases_src = "\n".join(f"            ({k!r}, lambda: {v})," for k, v in DRAFT_PROBS_BAD.items())
    rc, cases, tail = run_child(f'''
        V = {V}
        b = mk(V, {name!r})
        b.prepare_step(["a"], [1], [ts.SamplingParams(seed=1)], 2)
        before = b.slots.table.clone()
        for case, make in [
{cases_src}
        ]:
            attempt(case, lambda: [t.tolist() for t in b.verify(
                LP(torch.randn(2, V)), info([1], V, make()),
                torch.tensor([[0, 1]], dtype=torch.int32))])
        report("table-unchanged", result=bool(torch.equal(before, b.slots.table)))
    ''')
    assert rc == 0, f"child exited with {rc}:\n{tail}"
    for case in DRAFT_PROBS_BAD:
        record = cases.get(case)
        assert record is not None, f"{case} never reported:\n{tail}"
        assert record.get("error") in ("ValueError", "TypeError"), f"{case}: {record}"
        assert "draft_probs" in record["message"], f"{case}: {record}"
    assert cases["table-unchanged"]["result"] is True


def _rejection_verify(b, logits, q, draft, t):
    predict, accept = b.verify(LP(logits.clone()), info([1], logits.size(1), q, t=t),
                               torch.tensor([[0, draft]], dtype=torch.int32))
    return predict.tolist(), int(accept[0])


@pytest.mark.parametrize("q_case", ["all_negative", "draft_negative", "nan", "draft_nan",
                                    "above_one", "zero"])
@pytest.mark.parametrize("how", ["bias_minus_inf", "logit_minus_inf", "logit_nan"])
def test_d2_a_draft_the_target_bans_is_rejected_whatever_q_says(q_case, how):
    V, d = 16, 3
    g = torch.Generator().manual_seed(1)
    b = mk(V, "gumbel_full" if how == "bias_minus_inf" else "gumbel")
    bias = {d: -inf} if how == "bias_minus_inf" else None
    b.prepare_step(["a"], [1], [ts.SamplingParams(seed=7, logit_bias=bias)], 2)
    q = torch.full((1, 1, V), 1 / V)
    if q_case == "all_negative":
        q.fill_(-1.0)
    elif q_case == "draft_negative":
        q[0, 0, d] = -5.0
    elif q_case == "nan":
        q.fill_(float("nan"))
    elif q_case == "draft_nan":
        q[0, 0, d] = float("nan")
    elif q_case == "above_one":
        q[0, 0, d] = 7.0
    else:
        q.zero_()
    for t in range(40):
        logits = torch.randn(2, V, generator=g)
        logits[0, d] = 20.0  # the target would love it, were it not banned
        if how == "logit_minus_inf":
            logits[0, d] = -inf
        elif how == "logit_nan":
            logits[0, d] = float("nan")
        predict, accept = _rejection_verify(b, logits, q, d, t)
        assert accept == 1, f"t={t}: draft {d} accepted although the target bans it"
        assert 0 <= predict[0] < V and predict[0] != d and predict[1] == -1, f"t={t}: {predict}"


@pytest.mark.parametrize("name", ["gumbel", "gumbel_full"])
@pytest.mark.parametrize("q_value", [float("nan"), 5.0, inf])
def test_d2_q_nan_is_zero_and_q_above_one_is_clamped(name, q_value):
    """The target is certain of draft d (greedy): with q(d) NaN (-> 0) or > 1 (-> 1) the
    acceptance probability min(1, p/q) is 1, so the draft is accepted at every position
    (an unclamped q = 5 would reject ~80 % of them, a NaN q all of them)."""
    V, d = 16, 6
    b = mk(V, name)
    b.prepare_step(["a"], [1], [ts.SamplingParams(temperature=0.0, seed=2)], 2)
    q = torch.full((1, 1, V), 1 / V)
    q[0, 0, d] = q_value
    logits = torch.zeros(2, V)
    logits[0, d] = 4.0
    logits[1, 9] = 4.0
    for t in range(30):
        predict, accept = _rejection_verify(b, logits, q, d, t)
        assert (predict, accept) == ([d, 9], 2), f"t={t}"


def test_d2_q_nan_accepts_any_draft_the_target_allows():
    """Sampled target, p(d) > 0, q all NaN (-> 0): min(1, p/0) = 1, always accepted."""
    V, d = 8, 2
    b = mk(V, "gumbel")
    b.prepare_step(["a"], [1], [ts.SamplingParams(seed=4, temperature=1.0)], 2)
    q = torch.full((1, 1, V), float("nan"))
    g = torch.Generator().manual_seed(2)
    for t in range(30):
        predict, accept = _rejection_verify(b, torch.randn(2, V, generator=g), q, d, t)
        assert accept == 2 and predict[0] == d and 0 <= predict[1] < V, f"t={t}: {predict}"


# ---------------------------------------------------------------- 3. NaN after penalties / bias
D3_CASES = [
    # (logits, bias, params, allowed tokens)
    ([-inf, 1., 2., 3.], {0: inf}, dict(top_p=0.5), {1, 2, 3}),   # the snippet
    ([-inf, 1., 2., 3.], {0: inf}, dict(min_p=0.2), {1, 2, 3}),
    ([-inf, 1., 2., 3.], {0: inf}, dict(top_k=2), {2, 3}),
    ([-inf, 1., 2., 3.], {0: inf}, dict(), {1, 2, 3}),
    ([-inf, 1., 2., 3.], {0: inf}, dict(temperature=0.0), {3}),
    ([-inf, 1., 2., 3.], {"0": 1e300}, dict(top_p=0.5), {1, 2, 3}),
    ([-inf, 1., 2., 3.], {0: 1e300}, dict(temperature=0.0), {3}),
    ([float("nan"), 1., 2., 3.], {0: inf}, dict(top_p=0.9, min_p=0.05), {1, 2, 3}),
    ([inf, 1., 2., 3.], {0: -inf}, dict(top_p=0.5), {1, 2, 3}),
    ([inf, 1., 2., 3.], {0: -inf}, dict(min_p=0.5), {1, 2, 3}),
    ([inf, 1., 2., 3.], {0: -inf}, dict(temperature=0.0), {3}),
    ([inf, 1., inf, 3.], {0: -inf}, dict(top_p=0.5), {2}),
    ([inf, 1., inf, 3.], {0: -1e300}, dict(temperature=0.0), {2}),
]


@pytest.mark.parametrize("logits,bias,params,allowed", D3_CASES)
def test_d3_nan_after_bias_counts_as_minus_inf(logits, bias, params, allowed):
    b = mk(4)
    b.prepare_step(["a"], [1], [ts.SamplingParams(seed=1, logit_bias=bias, **params)])
    seen = set()
    for t in range(25):
        tokens, _ = b.sample(LP(torch.tensor([logits])), info([1], 4, t=t))
        seen.add(int(tokens[0]))
        assert not bool(b.invalid_rows[0]), f"t={t}: the row has valid tokens"
    assert seen <= allowed, f"sampled {seen}, allowed {allowed}"


def test_d3_chain_verify_never_accepts_the_nan_token():
    b = mk(4)
    b.prepare_step(["a"], [1], [ts.SamplingParams(seed=5, logit_bias={0: inf}, top_p=0.7)], 2)
    for t in range(20):
        logits = torch.tensor([[-inf, 1., 2., 3.], [-inf, 3., 2., 1.]])
        predict, accept = b.verify(LP(logits), info([1], 4, t=t),
                                   torch.tensor([[1, 0]], dtype=torch.int32))
        assert int(accept[0]) == 1 and predict.tolist()[0] in (1, 2, 3), f"t={t}"


# ---------------------------------------------------------------- 4. parameter changes
def test_d4_a_move_writes_the_latest_params_object():
    """Issue snippet 4: the request moves to slot 2 with Y; slot 2 must hold Y."""
    b = mk(32)
    X = ts.SamplingParams(temperature=0., seed=1)
    Y = ts.SamplingParams(temperature=.7, top_k=5, seed=2)
    b.prepare_step(["a"], [1], [X])
    b.prepare_step(["a"], [1], [Y])
    # a new object while the request keeps its slot takes effect at its next flip
    assert b.temperature_pool[1].item() == 0.0 and b.top_k_pool[1].item() == -1
    b.prepare_step(["a"], [2], [Y])
    assert b.top_k_pool[2].item() == 5
    assert b.temperature_pool[2].item() == np.float32(0.7)
    assert b.seed_pool[2].item() == 2
    assert b.route == "top_k"
    # and the step samples Y: temperature 0.7 within the top 5, not X's argmax
    logits = torch.full((1, 32), 1.0)
    logits[0, 20:25] = torch.tensor([3.0, 2.9, 2.95, 2.85, 2.9])
    tokens = {int(b.sample(LP(logits.clone()), info([2], 32, t=t))[0][0]) for t in range(40)}
    assert tokens <= set(range(20, 25)) and len(tokens) > 1, tokens


def test_d4_new_object_while_keeping_the_slot_waits_for_the_next_flip():
    b = mk(16)
    X = ts.SamplingParams(temperature=0.0, seed=1)
    b.prepare_step(["a"], [1], [X])
    b.prepare_step(["a"], [1], [ts.SamplingParams(temperature=1.0, top_p=0.5, seed=9)])
    assert b.temperature_pool[1].item() == 0.0 and b.top_p_pool[1].item() == 1.0
    assert b.route == "no_filter"  # the slot's params: greedy
    logits = torch.randn(1, 16)
    for t in range(10):
        assert int(b.sample(LP(logits.clone()), info([1], 16, t=t))[0][0]) == int(logits.argmax())


@pytest.mark.parametrize("name", ["gumbel", "gumbel_full"])
def test_d4_absent_request_returning_with_a_new_object_keeps_slot_params_and_route(name):
    """The request skips a step, comes back to its still-owned slot with a new object: the
    slot keeps top_k=5 and the route must say top-k (it used to say no-filter, and the CUDA
    split-row path then dropped top-k)."""
    V = 32
    b = mk(V, name)
    b.prepare_step(["a"], [1], [ts.SamplingParams(temperature=0.7, top_k=5, seed=1)])
    b.prepare_step(["b"], [2], [ts.SamplingParams(seed=3)])
    b.prepare_step(["a"], [1], [ts.SamplingParams(temperature=0.7, seed=1)])
    assert b.top_k_pool[1].item() == 5
    assert b.route == "top_k"
    logits = torch.full((1, V), 2.9)
    logits[0, 10:15] = 3.0
    for t in range(40):
        token = int(b.sample(LP(logits.clone()), info([1], V, t=t))[0][0])
        assert 10 <= token < 15, f"t={t}: token {token} is outside the slot's top 5"


def test_d4_route_covers_a_mixed_step_after_moves():
    b = mk(32, bs=2, pool=4)
    P = ts.SamplingParams(temperature=0.8, top_p=0.6, seed=1)
    K = ts.SamplingParams(temperature=0.8, top_k=3, seed=2)
    b.prepare_step(["a", "b"], [1, 2], [P, K])
    assert b.route == "generic"
    K2 = ts.SamplingParams(temperature=0.8, top_p=0.6, seed=2)
    b.prepare_step(["a", "b"], [1, 3], [P, K2])  # b moves with its latest params
    assert b.top_k_pool[3].item() == -1 and b.top_p_pool[3].item() == np.float32(0.6)
    assert b.route == "top_p"


# ---------------------------------------------------------------- 5. stale logprobs
@pytest.mark.parametrize("mode", ["raw", "processed"])
@pytest.mark.parametrize("name", ["gumbel", "gumbel_full"])
@pytest.mark.parametrize("bad_slot", [99, -1, 3, 2**31 - 1])
def test_d5_row_outside_the_pool_gets_fresh_minus_inf_logprobs(name, mode, bad_slot):
    V, N = 8, 3
    b = mk(V, name, enable_output_logprobs=True, top_logprobs_num=N, logprobs_mode=mode)
    b.prepare_step(["a", "b"], [1, 2], [ts.SamplingParams(seed=1), ts.SamplingParams(seed=2)])
    logits = torch.randn(2, V)
    out = LP(logits.clone())
    b.sample(out, info([1, 2], V))
    assert torch.isfinite(out.next_token_logprobs).all()
    out = LP(logits.clone())
    tokens, _ = b.sample(out, ts.SamplingBatchInfo(
        torch.tensor([1, bad_slot], dtype=torch.int32), torch.zeros(3, dtype=torch.int32), V,
        "cpu"))
    assert int(tokens[1]) == 0
    assert b.invalid_rows[:2].tolist() == [False, True]
    assert math.isfinite(out.next_token_logprobs[0].item())
    assert out.next_token_logprobs[1].item() == -inf
    assert out.next_token_top_logprobs_val[1].tolist() == [-inf] * N
    assert out.next_token_top_logprobs_idx[1].tolist() == list(range(N))
    assert torch.isfinite(out.next_token_top_logprobs_val[0]).all()


# ---------------------------------------------------------------- 6. tiny temperatures
@pytest.mark.parametrize("T", [1e-38, 1e-45, 1e-30, 1e-10, 5e-6])
@pytest.mark.parametrize("name", ["gumbel", "gumbel_full"])
def test_d6_tiny_temperature_is_greedy(name, T):
    V = 8
    b = mk(V, name, enable_output_logprobs=True, logprobs_mode="processed")
    b.prepare_step(["a"], [1], [ts.SamplingParams(temperature=T, seed=1, top_p=0.9)])
    logits = torch.tensor([[0.5, 3.0, -1.0, 2.0, 2.9, -3.0, 0.0, 1.0]])
    for t in range(10):
        out = LP(logits.clone())
        tokens, _ = b.sample(out, info([1], V, t=t))
        assert int(tokens[0]) == 1, f"t={t}: not the argmax"
        assert out.next_token_logprobs[0].item() == 0.0, "greedy rows' processed logprob is 0"


@pytest.mark.parametrize("T,greedy", [(9.9e-6, True), (1e-5, False), (2e-5, False)])
def test_d6_greedy_temperature_boundary(T, greedy):
    """README: temperatures below 1e-5 sample greedily, 1e-5 and above sample. On a flat row
    (z = 0 everywhere) a sampling row draws different tokens across positions; a greedy one
    always takes the lowest id."""
    V = 8
    b = mk(V)
    b.prepare_step(["a"], [1], [ts.SamplingParams(temperature=T, seed=2)])
    tokens = {int(b.sample(LP(torch.zeros(1, V)), info([1], V, t=t))[0][0]) for t in range(40)}
    assert tokens == {0} if greedy else len(tokens) > 1


@pytest.mark.parametrize("T", [1e-38, 1e-45])
def test_d6_tiny_temperature_raw_logprob_and_verify(T):
    V = 8
    b = mk(V, enable_output_logprobs=True)
    b.prepare_step(["a"], [1], [ts.SamplingParams(temperature=T, seed=1)], 2)
    logits = torch.tensor([[0.5, 3.0, -1.0, 2.0, 2.9, -3.0, 0.0, 1.0],
                           [4.0, 3.0, -1.0, 2.0, 2.9, -3.0, 0.0, 1.0]])
    out = LP(logits.clone())
    predict, accept = b.verify(out, info([1], V), torch.tensor([[0, 1]], dtype=torch.int32))
    assert predict.tolist() == [1, 0] and accept.tolist() == [2]
    expect = torch.log_softmax(logits.double(), -1)[[0, 1], [1, 0]]
    torch.testing.assert_close(out.next_token_logprobs.double(), expect, atol=1e-5, rtol=0)


# ---------------------------------------------------------------- 7. raw logprobs of huge logits
@pytest.mark.parametrize("row", [[1e17, 1e17], [3e38, 3e38], [-1e17, -1e17]])
@pytest.mark.parametrize("name", ["greedy", "gumbel", "gumbel_full"])
def test_d7_raw_logprobs_of_huge_logits(name, row):
    b = mk(2, name, enable_output_logprobs=True, top_logprobs_num=2)
    b.prepare_step(["a"], [1], [ts.SamplingParams(seed=1)])
    out = LP(torch.tensor([row]))
    tokens, _ = b.sample(out, info([1], 2))
    assert int(tokens[0]) in (0, 1)
    assert out.next_token_logprobs[0].item() == pytest.approx(-math.log(2), abs=1e-4)
    assert out.next_token_top_logprobs_val[0].tolist() == \
        pytest.approx([-math.log(2)] * 2, abs=1e-4)


# ---------------------------------------------------------- 8. gumbel refuses what it cannot do
D8_FIELDS = [
    ("min_p", dict(min_p=0.1)),
    ("frequency_penalty", dict(frequency_penalty=0.5)),
    ("frequency_penalty", dict(frequency_penalty=-0.5)),
    ("presence_penalty", dict(presence_penalty=0.3)),
    ("repetition_penalty", dict(repetition_penalty=1.2)),
    ("repetition_penalty", dict(repetition_penalty=0.9)),
    ("logit_bias", dict(logit_bias={1: 0.5})),
    ("logit_bias", dict(logit_bias={"1": -inf})),
]


@pytest.mark.parametrize("field,params", D8_FIELDS)
def test_d8_gumbel_refuses_what_it_cannot_honour(field, params):
    b = mk(8, "gumbel", pool=3)
    b.prepare_step(["x"], [3], [ts.SamplingParams(seed=1)])
    before = snapshot(b)
    with pytest.raises(ValueError) as err:
        b.prepare_step(["a", "x"], [1, 3], [ts.SamplingParams(seed=1, **params),
                                            ts.SamplingParams(seed=1)],
                       prompt_token_ids=[[2], None])
    message = str(err.value)
    assert field in message and "gumbel_full" in message, message
    assert_unchanged(b, before)


@pytest.mark.parametrize("field,params", D8_FIELDS)
def test_d8_gumbel_full_accepts_them(field, params):
    b = mk(8, "gumbel_full")
    b.prepare_step(["a"], [1], [ts.SamplingParams(seed=1, **params)], prompt_token_ids=[[2]])
    tokens, _ = b.sample(LP(torch.randn(1, 8)), info([1], 8))
    assert 0 <= int(tokens[0]) < 8


def test_d8_gumbel_accepts_neutral_values():
    b = mk(8, "gumbel")
    b.prepare_step(["a", "b"], [1, 2], [
        ts.SamplingParams(seed=1, min_p=0.0, repetition_penalty=1.0, frequency_penalty=0.0,
                          presence_penalty=0.0, logit_bias={}),
        ts.SamplingParams(seed=2, logit_bias=None)], prompt_token_ids=[[1, 2, 3], None])
    tokens, _ = b.sample(LP(torch.randn(2, 8)), info([1, 2], 8))
    assert all(0 <= t < 8 for t in tokens.tolist())


# ---------------------------------------------------------------- smaller findings
@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "frequency_penalty",
                                   "presence_penalty", "repetition_penalty"])
@pytest.mark.parametrize("value", [10**400, -10**400])
def test_number_beyond_float_range_is_a_value_error(field, value):
    with pytest.raises(ValueError, match=field):
        ts.SamplingParams(**{field: value}).normalize(8)
    b = mk(8)
    before = snapshot(b)
    with pytest.raises(ValueError, match=field):
        b.prepare_step(["a"], [1], [ts.SamplingParams(**{field: value})])
    assert_unchanged(b, before)


@pytest.mark.skipif(torch.cuda.is_available() and ts.built_with_cuda,
                    reason="CUDA is usable here: device='cuda' is valid")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
@pytest.mark.parametrize("name", ["greedy", "gumbel", "gumbel_full"])
def test_cuda_device_without_cuda_is_a_value_error(name, device):
    with pytest.raises(ValueError, match="device"):
        ts.create_backend(name, ts.SamplingBackendConfig(
            max_bs=1, max_req_pool_size=1, vocab_size=8, device=device))


BAD_CANDIDATES = {
    "bs-by-0": lambda: torch.zeros(1, 0, dtype=torch.int32),
    "0-D": lambda: torch.tensor(1, dtype=torch.int32),
    "1-D": lambda: torch.tensor([0, 1], dtype=torch.int32),
    "3-D": lambda: torch.zeros(1, 2, 1, dtype=torch.int32),
    "list": lambda: [[0, 1]],
    "float32": lambda: torch.tensor([[0.0, 1.7]]),
    "float64": lambda: torch.tensor([[0.0, 1.0]], dtype=torch.float64),
    "bool": lambda: torch.tensor([[False, True]]),
    "meta": lambda: torch.empty(1, 2, dtype=torch.int32, device="meta"),
}


@pytest.mark.parametrize("case", list(BAD_CANDIDATES))
@pytest.mark.parametrize("name", ["greedy", "gumbel", "gumbel_full"])
def test_malformed_candidates_are_refused_naming_candidates(name, case):
    b = mk(8, name)
    b.prepare_step(["a"], [1], [ts.SamplingParams(seed=1)], 2)
    before = snapshot(b) if name != "greedy" else None
    with pytest.raises((ValueError, TypeError), match="candidates"):
        b.verify(LP(torch.randn(2, 8)), info([1], 8), BAD_CANDIDATES[case]())
    if before is not None:
        assert_unchanged(b, before)


@pytest.mark.parametrize("case", ["list", "float32", "float64"])
@pytest.mark.parametrize("call", ["sample", "verify"])
@pytest.mark.parametrize("name", ["greedy", "gumbel", "gumbel_full"])
def test_req_pool_indices_must_be_an_int_tensor(name, call, case):
    b = mk(8, name)
    b.prepare_step(["a"], [1], [ts.SamplingParams(seed=1)], 2 if call == "verify" else 1)
    pool = {"list": [1], "float32": torch.tensor([1.0]),
            "float64": torch.tensor([1.0], dtype=torch.float64)}[case]
    bad = ts.SamplingBatchInfo(pool, torch.zeros(3, dtype=torch.int32), 8, "cpu")
    with pytest.raises(TypeError, match="req_pool_indices"):
        if call == "sample":
            b.sample(LP(torch.randn(1, 8)), bad)
        else:
            b.verify(LP(torch.randn(2, 8)), bad, torch.tensor([[0, 1]], dtype=torch.int32))


@pytest.mark.parametrize("entry", [2.7, 1.0, "1", True, False, None])
@pytest.mark.parametrize("name", ["gumbel", "gumbel_full"])
def test_request_pool_indices_entries_must_be_ints(name, entry):
    b = mk(8, name)
    b.prepare_step(["x"], [2], [ts.SamplingParams(seed=1)])
    before = snapshot(b)
    with pytest.raises(TypeError, match="request_pool_indices"):
        b.prepare_step(["x", "a"], [2, entry], [ts.SamplingParams(seed=1)] * 2)
    assert_unchanged(b, before)


@pytest.mark.parametrize("value", [1.5, 2.0, True, "2"])
@pytest.mark.parametrize("name", ["gumbel", "gumbel_full"])
def test_num_tokens_per_req_must_be_an_int(name, value):
    b = mk(8, name)
    before = snapshot(b)
    with pytest.raises(TypeError, match="num_tokens_per_req"):
        b.prepare_step(["a"], [1], [ts.SamplingParams(seed=1)], value)
    assert_unchanged(b, before)


@pytest.mark.parametrize("key", ["5_0", " 5", "+5", "5.0", "5 ", "0x5", "", 5.0, True, None])
def test_logit_bias_key_must_be_an_int_or_decimal_digits(key):
    with pytest.raises(TypeError, match="logit_bias"):
        ts.SamplingParams(logit_bias={key: 1.0}).normalize(64)
    b = mk(64)
    before = snapshot(b)
    with pytest.raises(TypeError, match="logit_bias"):
        b.prepare_step(["a"], [1], [ts.SamplingParams(seed=1, logit_bias={key: 1.0})])
    assert_unchanged(b, before)


@pytest.mark.parametrize("key", ["5", 5, "05"])
def test_logit_bias_decimal_keys_are_accepted(key):
    b = mk(64)
    b.prepare_step(["a"], [1], [ts.SamplingParams(seed=1, logit_bias={key: 1.5})])
    assert b.logit_bias(1) == {5: 1.5}


CONFIG_INTS = ["max_bs", "max_draft_tokens_per_req", "max_req_pool_size", "vocab_size",
               "top_logprobs_num", "penalty_history_capacity", "logit_bias_capacity"]


@pytest.mark.parametrize("value", [True, False])
@pytest.mark.parametrize("field", CONFIG_INTS)
def test_bool_config_ints_are_type_errors(field, value):
    fields = dict(max_bs=2, max_draft_tokens_per_req=2, max_req_pool_size=2, vocab_size=8,
                  device="cpu")
    fields[field] = value
    for name in ("greedy", "gumbel", "gumbel_full"):
        with pytest.raises(TypeError, match=field):
            ts.create_backend(name, ts.SamplingBackendConfig(**fields))


@pytest.mark.parametrize("slots", [[1, 2], [1, 1]])
@pytest.mark.parametrize("name", ["gumbel", "gumbel_full"])
def test_the_same_request_id_twice_in_one_step_is_refused(name, slots):
    b = mk(8, name)
    before = snapshot(b)
    with pytest.raises(ValueError, match="request_ids"):
        b.prepare_step(["a", "a"], slots, [ts.SamplingParams(seed=1), ts.SamplingParams(seed=2)])
    assert_unchanged(b, before)


@pytest.mark.parametrize("name", ["gumbel", "gumbel_full"])
def test_more_requests_than_max_bs_are_refused_before_any_flip(name):
    b = mk(8, name, bs=2, pool=4)
    b.prepare_step(["x"], [4], [ts.SamplingParams(seed=1)])
    before = snapshot(b)
    with pytest.raises(ValueError, match="max_bs"):
        b.prepare_step(["a", "b", "c"], [1, 2, 3], [ts.SamplingParams(seed=i) for i in range(3)])
    assert_unchanged(b, before)
    assert [b.slots.owner(s) for s in (1, 2, 3)] == [None, None, None]


@pytest.mark.parametrize("vocab", [7, 9, 0, 2**20])
@pytest.mark.parametrize("call", ["sample", "verify"])
@pytest.mark.parametrize("name", ["greedy", "gumbel", "gumbel_full"])
def test_batch_info_vocab_size_must_match_the_config(name, call, vocab):
    b = mk(8, name)
    b.prepare_step(["a"], [1], [ts.SamplingParams(seed=1)], 2 if call == "verify" else 1)
    bad = ts.SamplingBatchInfo(torch.tensor([1], dtype=torch.int32),
                               torch.zeros(3, dtype=torch.int32), vocab, "cpu")
    with pytest.raises(ValueError, match="vocab_size"):
        if call == "sample":
            b.sample(LP(torch.randn(1, 8)), bad)
        else:
            b.verify(LP(torch.randn(2, 8)), bad, torch.tensor([[0, 1]], dtype=torch.int32))


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "meta", torch.device("meta")])
@pytest.mark.parametrize("call", ["sample", "verify"])
@pytest.mark.parametrize("name", ["greedy", "gumbel", "gumbel_full"])
def test_batch_info_device_must_match_the_backend(name, call, device):
    b = mk(8, name)
    b.prepare_step(["a"], [1], [ts.SamplingParams(seed=1)], 2 if call == "verify" else 1)
    bad = ts.SamplingBatchInfo(torch.tensor([1], dtype=torch.int32),
                               torch.zeros(3, dtype=torch.int32), 8, device)
    with pytest.raises(ValueError, match="device"):
        if call == "sample":
            b.sample(LP(torch.randn(1, 8)), bad)
        else:
            b.verify(LP(torch.randn(2, 8)), bad, torch.tensor([[0, 1]], dtype=torch.int32))


# ---------------------------------------------------------------- long prompts
def test_long_prompt_with_repetition_penalty_is_accepted_and_penalises_every_prompt_token():
    """A 131072-token prompt over 20000 distinct ids (more than the old 4096-entry history)
    with the default config: accepted, and every prompt token is penalised. Row 0: prompt
    tokens 10 -> 10/1.3 lose to a non-prompt 9; row 1: prompt tokens -1 -> -1.3 lose to -1.2.
    One prompt token left unpenalised would win either row."""
    V = 32768
    rng = np.random.default_rng(15)
    distinct = rng.choice(V, size=20000, replace=False)
    prompt = np.concatenate([distinct, rng.choice(distinct, size=131072 - distinct.size)])
    rng.shuffle(prompt)
    prompt = prompt.tolist()
    outside = int(np.setdiff1d(np.arange(V), distinct)[123])
    b = ts.create_backend("gumbel_full", ts.SamplingBackendConfig(
        max_bs=2, max_draft_tokens_per_req=1, max_req_pool_size=2, vocab_size=V, device="cpu"))
    sp = ts.SamplingParams(temperature=0.0, repetition_penalty=1.3)
    b.prepare_step(["pos", "neg"], [1, 2], [sp, ts.SamplingParams(temperature=0.0,
                                                                  repetition_penalty=1.3)],
                   prompt_token_ids=[prompt, prompt])
    logits = torch.full((2, V), -5.0)
    index = torch.tensor(distinct, dtype=torch.long)
    logits[0, index] = 10.0
    logits[0, outside] = 9.0
    logits[1, index] = -1.0
    logits[1, outside] = -1.2
    tokens, _ = b.sample(LP(logits), info([1, 2], V))
    assert tokens.tolist() == [outside, outside]


class PromptRead(Exception):
    pass


class UnreadablePrompt(Sequence):
    """A prompt whose tokens cannot be read: any conversion raises."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        raise PromptRead("prompt_token_ids were read on a step without a flip")

    def __iter__(self):
        raise PromptRead("prompt_token_ids were read on a step without a flip")


@pytest.mark.parametrize("name", ["gumbel", "gumbel_full"])
def test_a_steady_step_does_not_read_prompt_token_ids(name):
    V = 64
    b = mk(V, name)
    params = ts.SamplingParams(temperature=0.0, seed=1,
                               **({"repetition_penalty": 1.5} if name == "gumbel_full" else {}))
    prompt = list(range(0, V, 3)) * 50
    b.prepare_step(["a"], [1], [params], prompt_token_ids=[prompt])
    table = b.slots.table.clone()
    # same rid, same slot, same params object: no flip, the prompt must not be touched
    b.prepare_step(["a"], [1], [params], prompt_token_ids=[UnreadablePrompt(len(prompt))])
    assert torch.equal(b.slots.table, table)
    # a new params object without a flip does not read it either
    b.prepare_step(["a"], [1], [ts.SamplingParams(temperature=0.0, seed=1)],
                   prompt_token_ids=[UnreadablePrompt(len(prompt))])
    assert torch.equal(b.slots.table, table)
    if name == "gumbel_full":  # a flip with a repetition penalty does read it
        with pytest.raises(PromptRead):
            b.prepare_step(["new"], [1], [params], prompt_token_ids=[UnreadablePrompt(3)])
