"""The CUDA split-row fast path (no-filter, top-k, top-k+top-p(+min-p) rows, penalties and bias)
through the public API: same tokens as the CPU kernels, eager and under CUDA-graph replay."""

import pytest
import torch

import tokensampler as ts
from helpers import accepted_drafts, backends, capture_graph, run

pytestmark = pytest.mark.cuda

CASES = {
    "no_filter": dict(temperature=0.8),
    "top_k": dict(temperature=0.7, top_k=50),
    "top_k_512": dict(temperature=1.0, top_k=512),
    "top_k_256": dict(temperature=0.9, top_k=256),  # k == the chunk kernel's threads
    "top_k_top_p": dict(temperature=0.7, top_k=50, top_p=0.9),
    "top_k_top_p_min_p_free": dict(temperature=1.3, top_k=200, top_p=0.5),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("V,bs", [(1000, 1), (50257, 3), (151936, 1), (151936, 64), (7, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_row_matches_cpu(case, V, bs, dtype):
    params = dict(CASES[case])
    if "top_k" in params:
        params["top_k"] = min(params["top_k"], V - 1) if V > 2 else 1
    cpu, gpu = backends(V, bs, enable_output_logprobs=True)
    sps = [ts.SamplingParams(seed=1000 + i, **params) for i in range(bs)]
    if bs > 2:
        sps[1] = ts.SamplingParams(temperature=0.0)  # greedy rows ride along on every route
    for b in (cpu, gpu):
        b.prepare_step([f"r{i}" for i in range(bs)], list(range(1, bs + 1)), sps)
    g = torch.Generator().manual_seed(V + bs)
    agree = total = 0
    for step in range(4):
        logits = (torch.randn(bs, V, generator=g) * 2).to(dtype)
        if step == 2 and bs > 2:
            logits[0] = float("-inf")
            logits[2, [3, V - 1]] = float("inf")
        t_cpu, lp_cpu = run(cpu, logits, bs, 17 + step, "cpu")
        t_gpu, lp_gpu = run(gpu, logits, bs, 17 + step, "cuda")
        agree += int((t_cpu == t_gpu).sum())
        total += bs
        assert gpu.invalid_rows[:bs].cpu().tolist() == cpu.invalid_rows[:bs].tolist()
        same = t_cpu == t_gpu
        torch.testing.assert_close(lp_gpu[same], lp_cpu[same], atol=1e-4, rtol=0)
    assert agree == total, f"{agree}/{total} rows agree"


@pytest.mark.parametrize("case", ["no_filter", "top_k_top_p"])
def test_split_row_verify_matches_cpu(case):
    V, bs, n = 151936, 8, 4
    cpu, gpu = backends(V, bs, n=n)
    sps = [ts.SamplingParams(seed=7 + i, **CASES[case]) for i in range(bs)]
    for b in (cpu, gpu):
        b.prepare_step([f"r{i}" for i in range(bs)], list(range(1, bs + 1)), sps, num_tokens_per_req=n)
    logits = torch.randn(bs * n, V) * 2
    candidates = accepted_drafts(cpu, logits, bs, 5, n, torch.randint(0, V, (bs, n), dtype=torch.int32))
    t_cpu, _ = run(cpu, logits, bs, 5, "cpu", n, candidates)
    t_gpu, _ = run(gpu, logits, bs, 5, "cuda", n, candidates)
    assert torch.equal(t_cpu, t_gpu)
    assert (t_cpu.view(bs, n)[:, -1] >= 0).any()  # some chains accepted to the end


@pytest.mark.parametrize("variant,params", [("no_filter", dict(temperature=0.9)),
                                            ("top_k", dict(temperature=0.9, top_k=40)),
                                            ("top_k_top_p", dict(temperature=0.9, top_k=300, top_p=0.8))])
def test_captured_variant_replays_eager_tokens(variant, params):
    V, bs = 151936, 4
    _, gpu = backends(V, bs)
    eager_backend = backends(V, bs)[1]
    gpu.prepare_capture_variant(bs=bs, num_tokens_per_req=1, variant=variant)
    logits = torch.randn(bs, V, device="cuda")
    info = ts.SamplingBatchInfo(torch.arange(1, bs + 1, dtype=torch.int32, device="cuda"),
                                torch.full((bs + 1,), 3, dtype=torch.int32, device="cuda"), V, "cuda")
    out = ts.LogitsProcessorOutput(logits)
    graph, (tokens, _) = capture_graph(lambda: gpu.sample(out, info))
    sps = [ts.SamplingParams(seed=50 + i, **params) for i in range(bs)]
    for b in (gpu, eager_backend):
        b.prepare_step([f"r{i}" for i in range(bs)], list(range(1, bs + 1)), sps)
    assert gpu.cuda_graph_replay_variant(1) == variant
    for step in range(3):
        logits.copy_(torch.randn(bs, V, device="cuda"))
        info.valid_cache_lengths.fill_(10 + step)
        graph.replay()
        expected, _ = eager_backend.sample(ts.LogitsProcessorOutput(logits), info)
        assert torch.equal(tokens, expected)


FULL_CASES = {
    "top_k": dict(temperature=0.7, top_k=50),
    "top_k_top_p": dict(temperature=0.9, top_k=300, top_p=0.8),
    "top_k_top_p_min_p": dict(temperature=1.1, top_k=40, top_p=0.95, min_p=0.05),
    "no_filter": dict(temperature=0.8),
}


@pytest.mark.parametrize("case", list(FULL_CASES))
@pytest.mark.parametrize("V,bs", [(151936, 4), (50257, 40), (1000, 3)])
def test_split_row_penalties_match_cpu(case, V, bs):
    """gumbel_full rows with repetition / frequency / presence penalties and bias: the history
    grows every step (the CUDA append_history against the CPU one), tokens stay identical."""
    cpu, gpu = backends(V, bs, name="gumbel_full", enable_output_logprobs=True)
    sps = [ts.SamplingParams(seed=300 + i, repetition_penalty=1.3, frequency_penalty=0.4,
                             presence_penalty=0.6, logit_bias={7 * i + 1: 4.0, V - 1 - i: -2.0},
                             **FULL_CASES[case]) for i in range(bs)]
    prompts = [[(37 * i + 11 * j) % V for j in range(30)] for i in range(bs)]
    for b in (cpu, gpu):
        b.prepare_step([f"r{i}" for i in range(bs)], list(range(1, bs + 1)), sps,
                       prompt_token_ids=prompts)
    assert gpu.route == case  # a split-row route ...
    assert case == "no_filter" or gpu.step_max_top_k <= 512  # ... with k in its range
    g = torch.Generator().manual_seed(V + bs)
    for step in range(5):
        logits = torch.randn(bs, V, generator=g) * 2
        # strong logits on the history tokens so the penalties decide tokens
        for i, prompt in enumerate(prompts):
            logits[i, prompt[:10]] += 6.0
        t_cpu, lp_cpu = run(cpu, logits, bs, 40 + step, "cpu")
        t_gpu, lp_gpu = run(gpu, logits, bs, 40 + step, "cuda")
        assert torch.equal(t_cpu, t_gpu), f"step {step}"
        torch.testing.assert_close(lp_gpu, lp_cpu, atol=1e-4, rtol=0)
        assert torch.equal(gpu.slots.table.cpu(), cpu.slots.table)


@pytest.mark.parametrize("case", ["top_k_top_p", "no_filter"])
def test_split_row_verify_penalties_count_drafts(case):
    V, bs, n = 50257, 6, 4
    cpu, gpu = backends(V, bs, n=n, name="gumbel_full")
    sps = [ts.SamplingParams(seed=9 + i, repetition_penalty=2.0, presence_penalty=1.5,
                             **FULL_CASES[case]) for i in range(bs)]
    for b in (cpu, gpu):
        b.prepare_step([f"r{i}" for i in range(bs)], list(range(1, bs + 1)), sps,
                       num_tokens_per_req=n, prompt_token_ids=[[5, 6, 7]] * bs)
    g = torch.Generator().manual_seed(1)
    candidates = torch.randint(0, V, (bs, n), dtype=torch.int32, generator=g)
    logits = torch.randn(bs * n, V, generator=g)
    logits[:, candidates.view(-1).long()] += 5.0  # the drafts compete, so their penalty matters
    candidates = accepted_drafts(cpu, logits, bs, 5, n, candidates)
    t_cpu, _ = run(cpu, logits, bs, 5, "cpu", n, candidates)
    t_gpu, _ = run(gpu, logits, bs, 5, "cuda", n, candidates)
    assert torch.equal(t_cpu, t_gpu)
    assert (t_cpu.view(bs, n)[:, -1] >= 0).any()  # rows past the first see drafts in penalties


@pytest.mark.parametrize("kind", ["half_steps", "constant", "ascending", "descending"])
@pytest.mark.parametrize("top_k", [3, 50, 64, 65, 300, 512])
def test_split_row_top_k_ties_and_orders(kind, top_k):
    """Rows that stress the exact top-k select: many equal z (ties split by id), every token
    equal, and logits rising / falling along the row (each round admits all or nothing).
    k = 64 / 65: a kept set that fills one warp's registers (two candidates a lane), and one
    past it."""
    V, bs = 151936, 5
    cpu, gpu = backends(V, bs)
    sps = [ts.SamplingParams(seed=70 + i, temperature=0.6, top_k=top_k,
                             top_p=0.9 if i % 2 else 1.0) for i in range(bs)]
    for b in (cpu, gpu):
        b.prepare_step([f"r{i}" for i in range(bs)], list(range(1, bs + 1)), sps)
    g = torch.Generator().manual_seed(top_k)
    base = torch.randn(bs, V, generator=g)
    logits = {"half_steps": torch.round(base * 2) / 2,
              "constant": torch.full((bs, V), 0.25),
              "ascending": torch.linspace(-20, 20, V).expand(bs, V).clone(),
              "descending": torch.linspace(20, -20, V).expand(bs, V).clone()}[kind]
    t_cpu, _ = run(cpu, logits, bs, 3, "cpu")
    t_gpu, _ = run(gpu, logits, bs, 3, "cuda")
    assert torch.equal(t_cpu, t_gpu)


def boundary_tie_logits(bs, V, k, above, tied, dtype, seed):
    """Rows whose top-k ends inside a run of ties on z: three tokens at H with the lowest ids,
    and, in a window near V / 2, `above` tokens one ulp over H and `tied` at H (background far
    below). The row's top-k is the `above` ones, then the ties by id: the three low ids first,
    then the window's lowest, so a chunk that keeps the wrong ties, or too few, changes it (on
    the CPU reference, dropping the window's lowest tie changes 3-116 of a test's draws)."""
    H = 5.0
    up = H + 2.0 ** -5  # one bf16 ulp in [4, 8): distinct in every dtype
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(bs, V, generator=g) * 0.5 - 8).to(torch.bfloat16).float()
    logits[:, [11, 108, 205]] = H
    begin = V // 2 + 17
    for r in range(bs):
        spots = begin + torch.randperm(2 * (above + tied), generator=g)[:above + tied]
        logits[r, spots[:above]] = up
        logits[r, spots[above:]] = H
    return logits.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bs", [3, 64])
@pytest.mark.parametrize("k", [8, 20, 50])
@pytest.mark.parametrize("fit", ["k_cap-2", "k_cap", "k_cap+1", "none_above"])
def test_top_k_cut_inside_a_run_of_ties_matches_cpu(fit, k, bs, dtype):
    """The split-row chunks of 2-byte rows keep the k-th's ties on z where the kept set fits the
    step's k_cap slots (64 here: row 0 asks top_k 64) and break them by id otherwise (fp32
    chunks always break them); the finishing block's cut is exact. The ties straddle the row's
    k-th (the `above` tokens fill k - 5 places, the three low ids 3, the window's ties the last
    2; none above: k - 3 window ties), in the single launch (bs 3) and the two-kernel path
    (bs 64), half the rows with top-p 0.9, which cuts inside the ties by id order."""
    V, k_cap = 151936, 64
    above = 0 if fit == "none_above" else k - 5
    tied = {"k_cap-2": k_cap - 2, "k_cap": k_cap, "k_cap+1": k_cap + 1,
            "none_above": k + 3}[fit] - above
    cpu, gpu = backends(V, bs)
    sps = [ts.SamplingParams(seed=300 + i, temperature=0.7, top_k=64 if i == 0 else k,
                             top_p=0.9 if i % 2 else 1.0) for i in range(bs)]
    for b in (cpu, gpu):
        b.prepare_step([f"r{i}" for i in range(bs)], list(range(1, bs + 1)), sps)
    logits = boundary_tie_logits(bs, V, k, above, tied, dtype, seed=k * 10 + bs)
    for t0 in range(3, 3 + 192 // bs):  # 192 draws or more
        t_cpu, _ = run(cpu, logits, bs, t0, "cpu")
        t_gpu, _ = run(gpu, logits, bs, t0, "cuda")
        assert torch.equal(t_cpu, t_gpu)


VARIANT_PARAMS = {  # rows whose parameters select each capture variant at replay
    "default": [dict(temperature=0.9, top_k=40), dict(temperature=0.9, top_p=0.8)],
    "no_filter": [dict(temperature=0.9)],
    "verify_no_filter": [dict(temperature=0.9)],
    "top_p": [dict(temperature=0.9, top_p=0.8)],
    "top_k": [dict(temperature=0.9, top_k=40)],
    "top_k_top_p": [dict(temperature=0.9, top_k=300, top_p=0.8)],
    "min_p": [dict(temperature=0.9, min_p=0.05)],
    "top_k_top_p_min_p": [dict(temperature=0.9, top_k=40, top_p=0.9, min_p=0.02)],
}


@pytest.mark.parametrize("name", ["gumbel", "gumbel_full"])
@pytest.mark.parametrize("n", [1, 4])
def test_every_capture_variant_replays_eager_tokens_at_a_smaller_batch(name, n):
    """Each variant the backend reports is captured at 8 requests and replayed with 5 (the rest
    padding rows on pool row 0): the real rows' outputs equal an eager backend's, step after
    step (gumbel_full: histories recorded by the graph and by the eager backend stay equal)."""
    V, captured, bs = 50257, 8, 5
    _, graphed = backends(V, captured, n=n, name=name)
    _, eager = backends(V, captured, n=n, name=name)
    slots = torch.zeros(captured, dtype=torch.int32, device="cuda")
    slots[:bs] = torch.arange(1, bs + 1, dtype=torch.int32)
    lengths = torch.full((captured + 1,), 3, dtype=torch.int32, device="cuda")
    info = ts.SamplingBatchInfo(slots, lengths, V, "cuda")
    logits = torch.randn(captured * n, V, device="cuda")
    drafts = torch.randint(0, V, (captured, n), dtype=torch.int32, device="cuda")
    out = ts.LogitsProcessorOutput(logits)

    def step(backend, o, i, d):
        return backend.sample(o, i) if n == 1 else backend.verify(o, i, d)

    for variant in graphed.cuda_graph_capture_variants(n):
        graphed.prepare_capture_variant(bs=captured, num_tokens_per_req=n, variant=variant)
        graph, (tokens, accepted) = capture_graph(lambda: step(graphed, out, info, drafts))
        graphed.reset_capture_state()

        choices = VARIANT_PARAMS[variant]
        sps = [ts.SamplingParams(seed=20 + i, **choices[i % len(choices)]) for i in range(bs)]
        rids = [f"{variant}-{i}" for i in range(bs)]
        prompts = [[3 * i + 1, 7, 11] for i in range(bs)]
        for b in (graphed, eager):
            b.prepare_step(rids, list(range(1, bs + 1)), sps, num_tokens_per_req=n,
                           prompt_token_ids=prompts)
        # at n > 1 no-filter rows replay the verify_no_filter graph; this one still must be exact
        assert graphed.cuda_graph_replay_variant(n) in (variant, "verify_no_filter")
        for t in range(2):
            logits.copy_(torch.randn(captured * n, V, device="cuda"))
            drafts.copy_(torch.randint(0, V, (captured, n), dtype=torch.int32, device="cuda"))
            lengths.fill_(10 + t)
            graph.replay()
            e_info = ts.SamplingBatchInfo(slots[:bs].clone(), lengths.clone(), V, "cuda")
            e_tokens, e_accepted = step(eager, ts.LogitsProcessorOutput(logits[:bs * n].clone()),
                                        e_info, drafts[:bs].clone())
            assert torch.equal(tokens[:bs * n], e_tokens), (variant, t)
            assert torch.equal(accepted[:bs], e_accepted), (variant, t)
        if name == "gumbel_full":
            assert torch.equal(graphed.slots.table[1:bs + 1], eager.slots.table[1:bs + 1])


@pytest.mark.parametrize("params", [dict(temperature=0.8), dict(temperature=0.7, top_k=50),
                                    dict(temperature=0.7, top_k=50, top_p=0.9),
                                    dict(temperature=0.9, top_p=0.8), dict(temperature=0.9, min_p=0.05)],
                         ids=["no_filter", "top_k", "top_k_top_p", "top_p", "min_p"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_strided_logits_match_cpu(params, dtype):
    """Logits that are a view of wider rows (an engine's padded vocabulary: row stride V + 5, V
    odd) give the CPU's tokens on the split-row and histogram-cut paths: rows past the first
    start unaligned, so the vector loads fall back to narrower ones."""
    V, bs = 50257, 6
    wide = (torch.randn(bs, V + 5, generator=torch.Generator().manual_seed(8)) * 2).to(dtype)
    logits = wide[:, :V]
    cpu, gpu = backends(V, bs, name="gumbel_full")
    sps = [ts.SamplingParams(seed=70 + i, **params) for i in range(bs)]
    for b in (cpu, gpu):
        b.prepare_step([f"r{i}" for i in range(bs)], list(range(1, bs + 1)), sps)
    t_cpu, _ = run(cpu, logits, bs, 5, "cpu")
    t_gpu, _ = run(gpu, wide.cuda()[:, :V], bs, 5, "cuda")
    assert torch.equal(t_cpu, t_gpu.cpu())
