"""DESIGN §3–§4 on the CPU kernels: penalties, invariance, verify, logprobs, edge cases."""

import math

import numpy as np
import pytest
import torch

import tokensampler as ts

from reference import chi_square_pvalue, filtered_probs, penalized


def make(name="gumbel_full", V=100, bs=4, pool=8, n=4, **cfg):
    return ts.create_backend(name, ts.SamplingBackendConfig(
        max_bs=bs, max_draft_tokens_per_req=n, max_req_pool_size=pool, vocab_size=V,
        device="cpu", **cfg))


def info(slots, lengths, pool=8, V=100, draft_probs=None):
    cache = torch.zeros(pool + 1, dtype=torch.int32)
    for s, t in zip(slots, lengths):
        cache[s] = t
    return ts.SamplingBatchInfo(torch.tensor(slots, dtype=torch.int32), cache, V, "cpu",
                                draft_probs=draft_probs)


def sample(backend, logits, slots, lengths, pool=8):
    out = ts.LogitsProcessorOutput(logits)
    tokens, _ = backend.sample(out, info(slots, lengths, pool, logits.size(1)))
    return tokens.clone(), out


# ---------------------------------------------------------------- penalties, step by step
PENALTY_CASES = [
    dict(repetition_penalty=1.8),
    dict(frequency_penalty=0.9),
    dict(presence_penalty=1.5),
    dict(repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.4,
         logit_bias={7: 0.8, 11: -0.5}),
]


@pytest.mark.parametrize("shift", [0.0, -6.0], ids=["mixed_sign", "negative_logits"])
@pytest.mark.parametrize("params", PENALTY_CASES)
def test_greedy_trajectory_with_penalties_matches_step_by_step_reference(params, shift):
    V, steps = 40, 30
    backend = make(V=V)
    prompt = [3, 5, 8, 5]
    backend.prepare_step(["a"], [2], [ts.SamplingParams(temperature=0.0, **params)],
                         prompt_token_ids=[prompt])
    g = torch.Generator().manual_seed(1)
    base = torch.randn(V, generator=g) + shift  # penalties must steer away from repeats
    counts: dict[int, int] = {}
    for step in range(steps):
        logits = (base + 0.05 * torch.randn(V, generator=g)).unsqueeze(0)
        token, _ = sample(backend, logits, [2], [len(prompt) + step])
        l = penalized(logits[0].double().numpy(), counts, prompt,
                      params.get("repetition_penalty", 1.0), params.get("frequency_penalty", 0.0),
                      params.get("presence_penalty", 0.0), params.get("logit_bias"))
        assert int(token) == int(np.argmax(l)), f"step {step}"
        counts[int(token)] = counts.get(int(token), 0) + 1
    assert len(counts) > 1, "the penalties never changed the argmax; the test is too weak"


# ---------------------------------------------------------------- invariance
def test_batch_invariance_across_rows_slots_and_batch_sizes():
    V = 500
    sp = ts.SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=77)
    row = torch.randn(V)
    alone = make("gumbel", V=V, bs=8)
    alone.prepare_step(["x"], [1], [sp])
    ref, _ = sample(alone, row.unsqueeze(0), [1], [123])
    big = make("gumbel", V=V, bs=8)
    others = [ts.SamplingParams(temperature=1.0, seed=i) for i in range(7)]
    big.prepare_step([f"o{i}" for i in range(7)] + ["x"], [1, 2, 3, 4, 5, 6, 7, 8], others + [sp])
    logits = torch.randn(8, V)
    logits[7] = row
    tokens, _ = sample(big, logits, list(range(1, 9)), [5] * 7 + [123])
    assert int(tokens[7]) == int(ref[0])
    # the same row again, in a mixed (generic route) batch at another row index
    mixed = make("gumbel", V=V, bs=8)
    mixed.prepare_step(["x", "k"], [3, 4], [sp, ts.SamplingParams(top_k=2, seed=1)])
    assert mixed.route == "generic"
    tokens, _ = sample(mixed, torch.stack([row, torch.randn(V)]), [3, 4], [123, 9])
    assert int(tokens[0]) == int(ref[0])


def test_different_positions_and_seeds_give_independent_draws():
    V = 1000
    backend = make("gumbel", V=V, bs=4)
    backend.prepare_step(["a", "b"], [1, 2], [ts.SamplingParams(seed=1), ts.SamplingParams(seed=2)])
    logits = torch.zeros(2, V)
    draws = {tuple(sample(backend, logits, [1, 2], [t, t])[0].tolist()) for t in range(20)}
    assert len(draws) == 20
    assert all(a != b for a, b in draws)


# ---------------------------------------------------------------- verify
def decode_then_verify(params, n=4, V=80, penalties_prompt=None):
    g = torch.Generator().manual_seed(3)
    L = torch.randn(n, V, generator=g) * 2
    t0 = 10
    plain = make(V=V)
    plain.prepare_step(["a"], [1], [ts.SamplingParams(seed=5, **params)],
                       prompt_token_ids=[penalties_prompt])
    decoded = [int(sample(plain, L[j:j + 1], [1], [t0 + j])[0]) for j in range(n)]
    spec = make(V=V)
    spec.prepare_step(["a"], [1], [ts.SamplingParams(seed=5, **params)], num_tokens_per_req=n,
                      prompt_token_ids=[penalties_prompt])
    candidates = torch.tensor([[42] + decoded[:-1]], dtype=torch.int32)
    predict, accept = spec.verify(ts.LogitsProcessorOutput(L), info([1], [t0], V=V), candidates)
    return decoded, predict.tolist(), int(accept[0]), plain, spec


@pytest.mark.parametrize("params", [
    dict(temperature=1.0), dict(temperature=0.7, top_k=10, top_p=0.9),
    dict(temperature=1.0, min_p=0.1, repetition_penalty=1.4, frequency_penalty=0.5),
])
def test_plain_decode_equals_verify(params):
    decoded, predict, accepted, plain, spec = decode_then_verify(params, penalties_prompt=[1, 2])
    assert accepted == 4
    assert predict == decoded
    assert spec.penalty_history(1) == plain.penalty_history(1)


def test_verify_rows_see_earlier_drafts_in_their_penalties():
    """Row j of a verify must be penalised for drafts 1..j, exactly as plain decoding is for
    the tokens it already produced: a strong frequency penalty forbids repeating token 5."""
    V, n = 30, 4
    logits = torch.zeros(n, V)
    logits[:, 5], logits[:, 6], logits[:, 7], logits[:, 8] = 9.0, 8.5, 8.0, 7.6
    params = ts.SamplingParams(seed=1, temperature=0.05, frequency_penalty=2.0)
    plain = make(V=V)
    plain.prepare_step(["a"], [1], [params])
    decoded = [int(sample(plain, logits[j:j + 1], [1], [j])[0]) for j in range(n)]
    assert decoded == [5, 6, 7, 8]
    spec = make(V=V)
    spec.prepare_step(["a"], [1], [params], num_tokens_per_req=n)
    candidates = torch.tensor([[0] + decoded[:-1]], dtype=torch.int32)
    predict, accept = spec.verify(ts.LogitsProcessorOutput(logits), info([1], [0], V=V), candidates)
    assert int(accept[0]) == n and predict.tolist() == decoded


@pytest.mark.parametrize("capacity", [1, 2, 3, 5])
def test_plain_decode_equals_verify_as_the_history_fills(capacity):
    """A penalty history of H distinct tokens drops a new token once full (append_history), so
    verify must not count a draft plain decoding dropped (DESIGN §4): for histories filled to
    every level by forced steps, then 4 sampled steps with strong penalties over a vocabulary
    of 6, verify accepts all 4 drafts and predicts the plain tokens."""
    V, n = 6, 4
    params = ts.SamplingParams(seed=2, temperature=0.4, repetition_penalty=1.6,
                               frequency_penalty=1.2, presence_penalty=0.3)
    g = torch.Generator().manual_seed(capacity)
    for case in range(12):
        forced = torch.randint(0, V, (case % 7,), generator=g).tolist()
        L = torch.randn(n, V, generator=g)
        backends = [make(V=V, penalty_history_capacity=capacity) for _ in range(2)]
        for b in backends:
            b.prepare_step(["a"], [1], [params], num_tokens_per_req=n)
            for t, token in enumerate(forced):
                one_hot = torch.full((1, V), -1e4)
                one_hot[0, token] = 1e4
                sample(b, one_hot, [1], [t])
        plain, spec = backends
        t0 = len(forced)
        decoded = [int(sample(plain, L[j:j + 1], [1], [t0 + j])[0]) for j in range(n)]
        candidates = torch.tensor([[0] + decoded[:-1]], dtype=torch.int32)
        predict, accept = spec.verify(ts.LogitsProcessorOutput(L), info([1], [t0], V=V),
                                      candidates)
        assert (int(accept[0]), predict.tolist()) == (n, decoded), (forced, decoded)
        assert spec.penalty_history(1) == plain.penalty_history(1)


def test_verify_rejects_at_first_mismatch():
    decoded, *_ = decode_then_verify(dict(temperature=1.0))
    V, n = 80, 4
    g = torch.Generator().manual_seed(3)
    L = torch.randn(n, V, generator=g) * 2
    spec = make(V=V)
    spec.prepare_step(["a"], [1], [ts.SamplingParams(seed=5)], num_tokens_per_req=n)
    wrong = (decoded[1] + 1) % V
    candidates = torch.tensor([[42, decoded[0], wrong, decoded[2]]], dtype=torch.int32)
    predict, accept = spec.verify(ts.LogitsProcessorOutput(L), info([1], [10], V=V), candidates)
    assert int(accept[0]) == 2
    assert predict.tolist()[:2] == decoded[:2]  # accepted draft, then the target's own token


def _rejection_draws(backend, slots, target_logits, q, calls, g, pool):
    """`calls` verify steps of one draft per request (n = 2) drawn from q, every row's target
    `target_logits`, with draft_probs q: the first emitted token of every request and step, and
    how many drafts were accepted."""
    bs, V, n = len(slots), target_logits.numel(), 2
    first, accepted_total = [], 0
    for call in range(calls):
        drafts = torch.multinomial(q, bs, replacement=True, generator=g).to(torch.int32)
        candidates = torch.stack([torch.zeros(bs, dtype=torch.int32), drafts], 1)
        logits = target_logits.expand(bs * n, V).contiguous()
        dp = q.expand(bs, n - 1, V).contiguous()
        predict, accept = backend.verify(
            ts.LogitsProcessorOutput(logits), info(slots, [call * 3] * bs, pool, V, dp), candidates)
        first.extend(predict.view(bs, n)[:, 0].tolist())
        accepted_total += int((accept == 2).sum())
    return first, accepted_total


def test_rejection_sampling_is_lossless():
    """With draft probabilities, emitted tokens follow the target distribution."""
    V, n, bs, pool = 12, 2, 200, 200
    g = torch.Generator().manual_seed(8)
    target_logits = torch.randn(V, generator=g) * 1.5
    q = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    backend = make("gumbel", V=V, bs=bs, pool=pool, n=n)
    slots = list(range(1, bs + 1))
    backend.prepare_step([f"r{s}" for s in slots], slots,
                         [ts.SamplingParams(seed=s) for s in slots], num_tokens_per_req=n)
    first, accepted_total = _rejection_draws(backend, slots, target_logits, q, 20, g, pool)
    probs = filtered_probs(target_logits.double().numpy())
    assert 0 < accepted_total < 20 * bs
    assert chi_square_pvalue(np.array(first), probs) > 1e-3


@pytest.mark.parametrize("filters", [dict(top_k=4), dict(top_k=6, top_p=0.9), dict(min_p=0.1),
                                     dict(temperature=0.7, top_p=0.8)], ids=str)
def test_rejection_sampling_is_lossless_with_filters(filters):
    """DESIGN §4: p of a kept token is its mass over the kept set, so accept / resample follow
    the filtered target. The draft q is correlated with the target (as a draft model's is): a
    ratio taken from the unfiltered softmax would then move the emitted distribution by a TV of
    0.02-0.04, which 16 000 draws detect."""
    V, n, bs, pool = 12, 2, 400, 400
    g = torch.Generator().manual_seed(9)
    target_logits = torch.randn(V, generator=g) * 1.5
    q = torch.softmax(1.2 * target_logits + 0.3 * torch.randn(V, generator=g), -1)
    backend = make("gumbel_full", V=V, bs=bs, pool=pool, n=n)
    slots = list(range(1, bs + 1))
    backend.prepare_step([f"r{s}" for s in slots], slots,
                         [ts.SamplingParams(seed=s, **filters) for s in slots], num_tokens_per_req=n)
    first, accepted_total = _rejection_draws(backend, slots, target_logits, q, 40, g, pool)
    probs = filtered_probs(target_logits.double().numpy(), temperature=filters.get("temperature", 1.0),
                           top_k=filters.get("top_k", -1), top_p=filters.get("top_p", 1.0),
                           min_p=filters.get("min_p", 0.0))
    assert 0 < accepted_total < 40 * bs
    assert chi_square_pvalue(np.array(first), probs) > 1e-3


# ---------------------------------------------------------------- logprobs
def test_raw_and_top_logprobs():
    V = 300
    backend = make("gumbel", V=V, enable_output_logprobs=True, top_logprobs_num=5)
    backend.prepare_step(["a", "b"], [1, 2], [ts.SamplingParams(seed=1, top_k=20),
                                              ts.SamplingParams(temperature=0.0)])
    logits = torch.randn(2, V)
    tokens, out = sample(backend, logits, [1, 2], [0, 0])
    ref = torch.log_softmax(logits.double(), -1)
    torch.testing.assert_close(out.next_token_logprobs.double(),
                               ref.gather(1, tokens.long().unsqueeze(1)).squeeze(1),
                               atol=1e-5, rtol=0)
    top = ref.topk(5, dim=-1)
    torch.testing.assert_close(out.next_token_top_logprobs_val.double(), top.values,
                               atol=1e-5, rtol=0)
    assert torch.equal(out.next_token_top_logprobs_idx, top.indices)


def test_processed_logprobs_are_of_the_sampled_distribution():
    V = 300
    backend = make(V=V, enable_output_logprobs=True, logprobs_mode="processed")
    params = dict(temperature=0.7, top_k=30, top_p=0.8, min_p=0.02)
    backend.prepare_step(["a", "b"], [1, 2], [ts.SamplingParams(seed=1, **params),
                                              ts.SamplingParams(temperature=0.0)])
    logits = torch.randn(2, V) * 2
    tokens, out = sample(backend, logits, [1, 2], [4, 4])
    probs = filtered_probs(logits[0].double().numpy(), **params)
    assert out.next_token_logprobs[0].item() == pytest.approx(math.log(probs[int(tokens[0])]), abs=1e-5)
    assert out.next_token_logprobs[1].item() == 0.0


# ---------------------------------------------------------------- edge cases
def test_top_k_one_and_tiny_top_p_and_min_p_near_one_are_argmax():
    V = 257
    backend = make("gumbel_full", V=V, bs=4)
    backend.prepare_step(["a", "b", "c"], [1, 2, 3], [
        ts.SamplingParams(top_k=1, seed=1), ts.SamplingParams(top_p=1e-6, seed=2),
        ts.SamplingParams(min_p=0.9999, seed=3)])
    gen = torch.Generator().manual_seed(0)
    for t in range(10):
        logits = torch.randn(3, V, generator=gen)
        # The largest logit 0.01 above the next: min-p 0.9999 keeps tokens within 1e-4 of it,
        # which two of 257 normals were, about one run in thirty (the test drew unseeded).
        logits.scatter_add_(1, logits.argmax(-1, keepdim=True), torch.full((3, 1), 0.01))
        tokens, _ = sample(backend, logits, [1, 2, 3], [t] * 3)
        assert tokens.tolist() == logits.argmax(-1).tolist()


def test_top_k_at_least_vocab_equals_no_top_k():
    V = 97
    a, b = make("gumbel", V=V), make("gumbel", V=V)
    a.prepare_step(["x"], [1], [ts.SamplingParams(seed=9, top_k=V)])
    b.prepare_step(["x"], [1], [ts.SamplingParams(seed=9, top_k=-1)])
    for t in range(20):
        logits = torch.randn(1, V)
        assert torch.equal(sample(a, logits, [1], [t])[0], sample(b, logits, [1], [t])[0])


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.999])
def test_top_p_selection_equals_the_sorted_top_k_cut(top_p):
    """Top-p alone selects its kept set by partitioning (row_reference.cpp top_p_kept); top-k
    + top-p sorts its top-k set and scans it. With k = V - 1 and the last-ranked token 30 nats
    below the rest (top-p mass 0, so the totals agree), both cut the same set: the same tokens
    on rows of ties (logits on a grid of 0.25) and of distinct values, at V = 5000, and the same
    processed logprobs up to the order of a float64 sum."""
    V = 5000
    gen = torch.Generator().manual_seed(int(top_p * 1000))
    config = dict(logprobs_mode="processed", enable_output_logprobs=True)
    select, scan = make("gumbel", V=V, **config), make("gumbel", V=V, **config)
    select.prepare_step(["x"], [1], [ts.SamplingParams(seed=3, temperature=0.8, top_p=top_p)])
    scan.prepare_step(["x"], [1], [ts.SamplingParams(seed=3, temperature=0.8, top_p=top_p,
                                                     top_k=V - 1)])
    for t in range(40):
        logits = torch.randn(1, V, generator=gen) * 2
        if t % 2:
            logits = (logits * 4).round() / 4  # ties
        logits[0, int(logits.argmin())] = -1e4
        a, out_a = sample(select, logits, [1], [t])
        b, out_b = sample(scan, logits, [1], [t])
        assert torch.equal(a, b), t
        torch.testing.assert_close(out_a.next_token_logprobs, out_b.next_token_logprobs,
                                   atol=1e-6, rtol=0)


def test_all_minus_inf_rows_return_zero_and_are_flagged():
    V = 50
    backend = make("gumbel", V=V)
    backend.prepare_step(["a", "b", "c"], [1, 2, 3], [ts.SamplingParams(seed=1),
                                                     ts.SamplingParams(temperature=0.0),
                                                     ts.SamplingParams(seed=3)])
    logits = torch.randn(3, V)
    logits[0] = float("-inf")
    logits[1] = float("nan")
    tokens, _ = sample(backend, logits, [1, 2, 3], [0, 0, 0])
    assert tokens.tolist()[:2] == [0, 0]
    assert backend.invalid_rows[:3].tolist() == [True, True, False]


def test_nan_logits_are_never_sampled():
    V = 20
    backend = make("gumbel", V=V, bs=4)
    backend.prepare_step(["a"], [1], [ts.SamplingParams(seed=1, temperature=5.0)])
    logits = torch.zeros(1, V)
    logits[0, ::2] = float("nan")
    seen = {int(sample(backend, logits, [1], [t])[0]) for t in range(300)}
    assert seen == set(range(1, V, 2))


def test_plus_inf_entries_are_sampled_uniformly():
    V = 30
    backend = make("gumbel", V=V, bs=4)
    backend.prepare_step(["a"], [1], [ts.SamplingParams(seed=1)])
    logits = torch.randn(1, V)
    inf_ids = [3, 17, 29]
    logits[0, inf_ids] = float("inf")
    samples = np.array([int(sample(backend, logits, [1], [t])[0]) for t in range(1500)])
    assert set(samples.tolist()) == set(inf_ids)
    probs = np.zeros(V)
    probs[inf_ids] = 1 / 3
    assert chi_square_pvalue(samples, probs) > 1e-3


@pytest.mark.parametrize("V", [1, 7, 50257, 151936])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_vocab_sizes_and_dtypes(V, dtype):
    backend = make("gumbel_full", V=V, bs=3)
    backend.prepare_step(["a", "b", "c"], [1, 2, 3], [
        ts.SamplingParams(seed=1, top_k=min(5, V), top_p=0.9),
        ts.SamplingParams(temperature=0.0), ts.SamplingParams(seed=3, min_p=0.1)])
    logits = torch.randn(3, V).to(dtype)
    tokens, _ = sample(backend, logits, [1, 2, 3], [0, 0, 0])
    assert all(0 <= t < V for t in tokens.tolist())
    assert int(tokens[1]) == int(logits[1].float().argmax())
    for r, params in ((0, dict(top_k=min(5, V), top_p=0.9)), (2, dict(min_p=0.1))):
        assert filtered_probs(logits[r].double().numpy(), **params)[int(tokens[r])] > 0


def test_fields_accepted_and_ignored_do_not_change_tokens():
    """README: SamplingBackendConfig.enable_nan_detection / random_seed and
    SamplingBatchInfo.is_all_greedy are accepted and ignored: the same steps give the same tokens
    whatever their values (is_all_greedy=True on sampled rows included)."""
    logits = torch.randn(3, 100, generator=torch.Generator().manual_seed(8))
    logits[1, 5] = float("nan")
    params = [ts.SamplingParams(temperature=1.0, seed=3), ts.SamplingParams(temperature=0.8, top_p=0.9),
              ts.SamplingParams(temperature=1.2, top_k=40, seed=9)]
    runs = []
    for nan_detection, random_seed, all_greedy in ((False, 0, False), (True, 12345, True)):
        b = make(enable_nan_detection=nan_detection, random_seed=random_seed)
        b.prepare_step(["a", "b", "c"], [1, 2, 3], params)
        step = info([1, 2, 3], [4, 4, 4])
        step.is_all_greedy = all_greedy
        runs.append(b.sample(ts.LogitsProcessorOutput(logits.clone()), step)[0].clone())
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[1], logits.nan_to_num(float("-inf")).argmax(-1).int())  # sampled


@pytest.mark.parametrize("name", ["gumbel", "gumbel_full"])
def test_rejection_verify_publishes_its_own_raw_logprobs(name):
    """§3.8 after rejection-sampling verify: each emitted token's raw logprob and every row's
    top-N, NaN past a request's accepted tokens, never the previous call's values."""
    V, n = 50, 3
    backend = make(name, V=V, bs=2, n=n, enable_output_logprobs=True, top_logprobs_num=2)
    backend.prepare_step(["a", "b"], [1, 2], [ts.SamplingParams(seed=1), ts.SamplingParams(seed=2)],
                         num_tokens_per_req=n)
    g = torch.Generator().manual_seed(9)
    chain_logits = torch.randn(2 * n, V, generator=g)
    candidates = torch.tensor([[0, 1, 2], [0, 3, 4]], dtype=torch.int32)
    backend.verify(ts.LogitsProcessorOutput(chain_logits), info([1, 2], [4, 4], V=V), candidates)
    logits = torch.randn(2 * n, V, generator=g)
    logits[:, 5] += 20.0  # every row is near certain of token 5
    draft_probs = torch.full((2, n - 1, V), 1.0 / V)
    out = ts.LogitsProcessorOutput(logits)
    predict, accept = backend.verify(out, info([1, 2], [7, 7], V=V, draft_probs=draft_probs),
                                     torch.tensor([[0, 5, 5], [0, 6, 5]], dtype=torch.int32))
    want = torch.log_softmax(logits.double(), -1)
    for r, token in enumerate(predict.tolist()):
        if token < 0:
            assert math.isnan(float(out.next_token_logprobs[r]))
        else:
            assert abs(float(out.next_token_logprobs[r]) - float(want[r, token])) < 1e-5
    assert out.next_token_top_logprobs_idx[:, 0].tolist() == [5] * (2 * n)
    assert accept.tolist()[0] == n and predict.tolist()[:n] == [5, 5, 5]


def test_rejection_verify_refuses_processed_logprobs():
    backend = make(V=50, bs=1, n=2, enable_output_logprobs=True, logprobs_mode="processed")
    backend.prepare_step(["a"], [1], [ts.SamplingParams(seed=1)], num_tokens_per_req=2)
    before = backend.slots.table.clone()
    with pytest.raises(ValueError, match="draft_probs"):
        backend.verify(ts.LogitsProcessorOutput(torch.randn(2, 50)),
                       info([1], [3], V=50, draft_probs=torch.full((1, 1, 50), 0.02)),
                       torch.tensor([[0, 5]], dtype=torch.int32))
    assert torch.equal(backend.slots.table, before)


def test_top_p_limit_is_the_exact_ceiling_of_p_times_the_total():
    """§3.6 keeps a token while the mass before it is below ceil(p * total), exactly: here
    total = 1024 * 2^32 + M_A + M_B = 4398382047316 and the mass before the last token is
    4398381785152 = floor(p * total) for p = 1 - 2^-24, so the ceiling keeps it (a double
    product rounds p * total down to that integer and would drop it). Rejection verify of a
    draft of it with q ~ 0 then accepts it: its target probability is positive."""
    V = 1026
    x = torch.zeros(2, V)
    x[:, 1024] = -2.550251007080078  # mass 335274048
    x[:, 1025] = -9.703984260559082  # mass 262164, ranked last
    b = make(V=V, bs=1, n=2)
    b.prepare_step(["r"], [1], [ts.SamplingParams(temperature=1.0, top_p=1 - 2**-24, seed=1)],
                   num_tokens_per_req=2)
    q = torch.full((1, 1, V), 1.0 / V)
    q[0, 0, 1025] = 1e-30
    predict, accept = b.verify(ts.LogitsProcessorOutput(x), info([1], [0], V=V, draft_probs=q),
                               torch.tensor([[0, 1025]], dtype=torch.int32))
    assert int(accept[0]) == 2 and predict.tolist()[0] == 1025


def test_min_p_threshold_op_is_the_kernels_rule():
    """The min_p_threshold op (for code outside the kernels, e.g. vocab-parallel sampling):
    z_max + ln(min_p) with the kernels' portable_log, -inf where min-p is off, within an ulp or
    two of float64's log (test_vocab_parallel's min_p_log_edge case holds it to the kernels'
    decision where the two logs differ)."""
    z_max = torch.tensor([0.0, 2.0, float("inf"), float("-inf"), 1.0, 0.0])
    min_p = torch.tensor([0.05, 0.9611896872520447, 0.1, 0.3, 0.0, -1.0])
    out = torch.empty(6)
    torch.ops.tokensampler.min_p_threshold(z_max, min_p, out)
    expect = [math.log(0.05), 2.0 + math.log(0.9611896872520447)]
    for got, want in zip(out[:2].tolist(), expect):
        assert abs(got - want) <= 2 * abs(math.ulp(want)) + 1e-7
    assert out[2:].tolist() == [float("inf"), float("-inf"), float("-inf"), float("-inf")]


def test_rejection_verify_logprobs_of_a_slot_outside_the_pool():
    """A request whose slot lies outside the pool emits token 0 and ends its chain in both
    verify modes, and publishes what the kernels write for it in chain verify: logprob -inf
    (NaN past the chain in rejection verify, which emits nothing there) and top-N -inf at ids
    0..N-1 on every row."""
    V, n = 50, 3
    b = make(V=V, bs=2, n=n, enable_output_logprobs=True, top_logprobs_num=2)
    b.prepare_step(["a", "b"], [1, 2], [ts.SamplingParams(seed=1), ts.SamplingParams(seed=2)],
                   num_tokens_per_req=n)
    cache = torch.zeros(9, dtype=torch.int32)
    for draft_probs in (None, torch.full((2, n - 1, V), 1.0 / V)):
        info = ts.SamplingBatchInfo(torch.tensor([1, 20], dtype=torch.int32), cache, V, "cpu",
                                    draft_probs=draft_probs)
        out = ts.LogitsProcessorOutput(torch.randn(2 * n, V))
        predict, accept = b.verify(out, info, torch.tensor([[0, 4, 5], [0, 6, 7]], dtype=torch.int32))
        assert predict.tolist()[n:] == [0, -1, -1] and accept.tolist()[1] == 1
        assert out.next_token_logprobs[n].item() == float("-inf")
        if draft_probs is not None:
            assert out.next_token_logprobs[n + 1:].isnan().all()
        assert out.next_token_top_logprobs_val[n:].eq(float("-inf")).all()
        assert out.next_token_top_logprobs_idx[n:].tolist() == [[0, 1]] * n
