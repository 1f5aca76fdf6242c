"""The split-row path's single launch (one kernel per step; the last block of each row, picked by
a per-row ticket in the workspace, finishes the row) against the CPU kernels: torch.equal tokens
for every split-row route (no-filter, top-k, top-k + top-p, gumbel_full with penalties and bias,
verify) at bs 1, 2 and 8, eager and under CUDA-graph replay (several replays: the finishing
block must leave its ticket at zero), with the backend's workspace and without one (the op then
allocates and zeroes its tickets), and through the two-kernel launch at the same shapes
(TOKENSAMPLER_SPLIT_ROW_FUSED_ROWS=0). No-filter steps without penalties, logprobs or bitmask
take their own small kernel (no_filter_small_kernel.cuh): its edge rows at the end."""

import pytest
import torch

import tokensampler as ts
from tokensampler import _C
from helpers import accepted_drafts, backends, capture_graph, run, tickets_are_zero

pytestmark = pytest.mark.cuda

V = 151936
PENALTIES = dict(repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.6)

# name: (backend, params, tokens per request, capture variant)
ROUTES = {
    "no_filter": ("gumbel", dict(temperature=0.8), 1, "no_filter"),
    "top_k": ("gumbel", dict(temperature=0.7, top_k=50), 1, "top_k"),
    "top_k_512": ("gumbel", dict(temperature=1.0, top_k=512), 1, "top_k"),
    "top_k_top_p": ("gumbel", dict(temperature=0.7, top_k=50, top_p=0.9), 1, "top_k_top_p"),
    "full_no_filter": ("gumbel_full", dict(temperature=0.8, **PENALTIES), 1, "no_filter"),
    "full_top_k_top_p": ("gumbel_full", dict(temperature=0.7, top_k=50, top_p=0.9, **PENALTIES), 1,
                         "top_k_top_p"),
    "full_top_k_top_p_min_p": ("gumbel_full", dict(temperature=1.1, top_k=40, top_p=0.95, min_p=0.05,
                                                   **PENALTIES), 1, "top_k_top_p_min_p"),
    "verify_no_filter": ("gumbel", dict(temperature=0.8), 4, "verify_no_filter"),
    "verify_top_k_top_p": ("gumbel", dict(temperature=0.7, top_k=50, top_p=0.9), 4, "top_k_top_p"),
    "verify_full_top_k_top_p": ("gumbel_full", dict(temperature=0.7, top_k=50, top_p=0.9, **PENALTIES),
                                4, "top_k_top_p"),
}


def _params(name, bs):
    backend, params, n, _ = ROUTES[name]
    sps = []
    for i in range(bs):
        p = dict(params)
        if backend == "gumbel_full":
            p["logit_bias"] = {7 * i + 1: 4.0, V - 1 - i: -2.0}
        sps.append(ts.SamplingParams(seed=500 + i, **p))
    if bs == 8:
        sps[3] = ts.SamplingParams(temperature=0.0)  # a greedy row rides along
    return sps


def _prompts(bs):
    return [[(37 * i + 11 * j) % V for j in range(30)] for i in range(bs)]


def _logits(g, bs, n, prompts):
    logits = torch.randn(bs * n, V, generator=g) * 2
    for i, prompt in enumerate(prompts):  # strong logits on history tokens: penalties decide
        logits[i * n:(i + 1) * n, prompt[:10]] += 6.0
    return logits


@pytest.fixture(params=["single", "two_kernels"])
def launch(request, monkeypatch):
    if request.param == "two_kernels":
        monkeypatch.setenv("TOKENSAMPLER_SPLIT_ROW_FUSED_ROWS", "0")
    return request.param


@pytest.mark.parametrize("workspace", [True, False])
@pytest.mark.parametrize("bs", [1, 2, 8])
@pytest.mark.parametrize("name", list(ROUTES))
def test_eager_matches_cpu(name, bs, workspace, launch):
    if launch == "two_kernels" and not workspace:
        pytest.skip("the two-kernel launch does not use tickets; one workspace case is enough")
    backend, _, n, _ = ROUTES[name]
    cpu, gpu = backends(V, bs, n=n, name=backend, enable_output_logprobs=True)
    if not workspace:
        gpu._workspace = None
    sps, prompts = _params(name, bs), _prompts(bs)
    for b in (cpu, gpu):
        b.prepare_step([f"r{i}" for i in range(bs)], list(range(1, bs + 1)), sps,
                       num_tokens_per_req=n, prompt_token_ids=prompts)
    assert gpu.route == ROUTES[name][3].removeprefix("verify_")
    g = torch.Generator().manual_seed(bs * 1000 + n)
    for step in range(3):
        logits = _logits(g, bs, n, prompts)
        candidates = torch.randint(0, V, (bs, n), dtype=torch.int32, generator=g)
        if n > 1:  # chains the CPU accepts, some to the end, some cut at each depth
            candidates = accepted_drafts(cpu, logits, bs, 30 + step, n, candidates)
        t_cpu, lp_cpu = run(cpu, logits, bs, 30 + step, "cpu", n, candidates)
        t_gpu, lp_gpu = run(gpu, logits, bs, 30 + step, "cuda", n, candidates)
        assert torch.equal(t_cpu, t_gpu), (step, t_cpu, t_gpu)
        assert n == 1 or (t_cpu.view(bs, n)[:, -1] >= 0).any()
        assert torch.equal(gpu.invalid_rows[:bs * n].cpu(), cpu.invalid_rows[:bs * n])
        if n == 1:
            torch.testing.assert_close(lp_gpu, lp_cpu, atol=1e-4, rtol=0)
        if backend == "gumbel_full":
            assert torch.equal(gpu.slots.table.cpu(), cpu.slots.table)
    if workspace:
        assert tickets_are_zero(gpu._workspace)


@pytest.mark.parametrize("workspace", [True, False])
@pytest.mark.parametrize("bs", [1, 2, 8])
@pytest.mark.parametrize("name", list(ROUTES))
def test_graph_replays_match_cpu(name, bs, workspace, launch):
    """Captured once, replayed 4 times with new logits and positions: the same tokens as the CPU
    kernels each time (a ticket left non-zero by one replay would break the next)."""
    if launch == "two_kernels" and not workspace:
        pytest.skip("the two-kernel launch does not use tickets; one workspace case is enough")
    backend, _, n, variant = ROUTES[name]
    cpu, gpu = backends(V, bs, n=n, name=backend)
    if not workspace:
        gpu._workspace = None
    slots = torch.arange(1, bs + 1, dtype=torch.int32, device="cuda")
    lengths = torch.full((bs + 1,), 3, dtype=torch.int32, device="cuda")
    info = ts.SamplingBatchInfo(slots, lengths, V, "cuda")
    logits_d = torch.randn(bs * n, V, device="cuda")
    drafts_d = torch.zeros(bs, n, dtype=torch.int32, device="cuda")
    out = ts.LogitsProcessorOutput(logits_d)

    def step():
        return gpu.sample(out, info) if n == 1 else gpu.verify(out, info, drafts_d)

    gpu.prepare_capture_variant(bs=bs, num_tokens_per_req=n, variant=variant)
    graph, (tokens, accepted) = capture_graph(step)
    gpu.reset_capture_state()

    sps, prompts = _params(name, bs), _prompts(bs)
    for b in (cpu, gpu):
        b.prepare_step([f"g{i}" for i in range(bs)], list(range(1, bs + 1)), sps,
                       num_tokens_per_req=n, prompt_token_ids=prompts)
    assert gpu.cuda_graph_replay_variant(n) == variant
    g = torch.Generator().manual_seed(bs * 77 + n)
    for t in range(4):
        logits = _logits(g, bs, n, prompts)
        candidates = torch.randint(0, V, (bs, n), dtype=torch.int32, generator=g)
        if n > 1:
            candidates = accepted_drafts(cpu, logits, bs, 40 + t, n, candidates)
        logits_d.copy_(logits)
        drafts_d.copy_(candidates)
        lengths.fill_(40 + t)
        graph.replay()
        t_cpu, _ = run(cpu, logits, bs, 40 + t, "cpu", n, candidates)
        assert torch.equal(tokens[:bs * n].cpu(), t_cpu), (t, tokens, t_cpu)
        if backend == "gumbel_full":  # histories recorded by the graph and by the CPU backend
            assert torch.equal(gpu.slots.table[1:bs + 1].cpu(), cpu.slots.table[1:bs + 1])
    if workspace:
        assert tickets_are_zero(gpu._workspace)


@pytest.mark.parametrize("route", ["no_filter", "top_k_top_p"])
def test_invalid_slot_row_is_flagged(route, launch):
    """A pool index outside the pool (the device tensor is the engine's): the row gets token 0
    and its invalid flag from the single launch too (no block of it takes the ticket), and the
    other rows are unaffected, step after step."""
    bs = 3
    cpu, gpu = backends(V, bs)
    sps = [ts.SamplingParams(seed=9 + i, **ROUTES[route][1]) for i in range(bs)]
    for b in (cpu, gpu):
        b.prepare_step([f"r{i}" for i in range(bs)], list(range(1, bs + 1)), sps)
    g = torch.Generator().manual_seed(3)
    for t in range(3):
        logits = torch.randn(bs, V, generator=g)
        res = []
        for b, device in ((cpu, "cpu"), (gpu, "cuda")):
            info = ts.SamplingBatchInfo(torch.tensor([1, 999, 3], dtype=torch.int32, device=device),
                                        torch.full((bs + 1,), 5 + t, dtype=torch.int32, device=device),
                                        V, device)
            tokens, _ = b.sample(ts.LogitsProcessorOutput(logits.to(device)), info)
            res.append((tokens.cpu().clone(), b.invalid_rows[:bs].cpu().clone()))
        assert torch.equal(res[0][0], res[1][0])
        assert res[1][1].tolist() == [False, True, False]
    assert tickets_are_zero(gpu._workspace)


@pytest.mark.parametrize("pdl", ["0", "1"])
def test_programmatic_launch_switch_keeps_tokens(pdl, monkeypatch):
    """TOKENSAMPLER_PDL=0 launches without programmatic dependent launch: same tokens."""
    monkeypatch.setenv("TOKENSAMPLER_PDL", pdl)
    bs, n = 2, 1
    cpu, gpu = backends(V, bs)
    sps = [ts.SamplingParams(seed=1 + i, temperature=0.7, top_k=50) for i in range(bs)]
    for b in (cpu, gpu):
        b.prepare_step(["a", "b"], [1, 2], sps)
    logits = torch.randn(bs, V, generator=torch.Generator().manual_seed(5))
    assert torch.equal(run(cpu, logits, bs, 9, "cpu")[0], run(gpu, logits, bs, 9, "cuda")[0])


# ---- small no-filter steps: no_filter_small_kernel (a group of four tokens a thread)
def _edge_logits(g, rows, vocab, dtype):
    """Random rows with a NaN each, then row 1 with two +inf entries, row 2 with nothing finite
    but a NaN, row 3 tied at its maximum."""
    logits = torch.randn(rows, vocab, generator=g) * 2
    logits[:, vocab // 3] = float("nan")
    if rows > 1:
        logits[1, [5, vocab - 2]] = float("inf")
    if rows > 2:
        logits[2] = float("-inf")
        logits[2, 0] = float("nan")
    if rows > 3:
        logits[3, 100:104] = logits[3].max() + 1.0
    return logits.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [37, 1023, 1025, V])
@pytest.mark.parametrize("bs", [1, 2, 4])
def test_small_no_filter_edge_rows_match_cpu(bs, vocab, dtype):
    """Vocabularies ending inside a block or a group; at bs 4 a greedy row whose maximum ties."""
    cpu, gpu = backends(vocab, bs)
    sps = [ts.SamplingParams(seed=300 + i, temperature=0.6 + 0.2 * i) for i in range(bs)]
    if bs == 4:
        sps[3] = ts.SamplingParams(temperature=0.0)
    for b in (cpu, gpu):
        b.prepare_step([f"r{i}" for i in range(bs)], list(range(1, bs + 1)), sps)
    g = torch.Generator().manual_seed(bs * vocab)
    for step in range(3):
        logits = _edge_logits(g, bs, vocab, dtype)
        t_cpu, _ = run(cpu, logits, bs, 10 + step, "cpu")
        t_gpu, _ = run(gpu, logits, bs, 10 + step, "cuda")
        assert torch.equal(t_cpu, t_gpu), (step, t_cpu, t_gpu)
        assert torch.equal(gpu.invalid_rows[:bs].cpu(), cpu.invalid_rows[:bs])
    assert tickets_are_zero(gpu._workspace)


def test_small_no_filter_z_past_fp32_range_ties_to_the_lowest_id():
    """DESIGN §5: 3e38 / 0.5 is +inf, so tokens 900 and 70000 tie at z = +inf: token 900."""
    cpu, gpu = backends(V, 1)
    for b in (cpu, gpu):
        b.prepare_step(["a"], [1], [ts.SamplingParams(seed=4, temperature=0.5)])
    logits = torch.randn(1, V)
    logits[0, [70000, 900]] = 3e38
    assert run(gpu, logits, 1, 3, "cuda")[0].tolist() == [900] == run(cpu, logits, 1, 3, "cpu")[0].tolist()


@pytest.mark.parametrize("logprobs, expected", [(False, True), (True, False)])
def test_small_no_filter_kernel_runs_where_it_should(logprobs, expected):
    """bs 1 without logprobs takes the small kernel; with them, the chunk kernel (raw partials)."""
    cpu, gpu = backends(V, 1, enable_output_logprobs=logprobs)
    gpu.prepare_step(["a"], [1], [ts.SamplingParams(seed=1, temperature=0.7)])
    logits = torch.randn(1, V)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run(gpu, logits, 1, 3, "cuda")
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert any("no_filter_small_kernel" in name for name in names) == expected, names
