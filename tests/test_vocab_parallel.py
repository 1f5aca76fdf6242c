"""Vocab-parallel sampling: sharded tokens equal unsharded ones, token for token, across routes,
seeds, positions, odd shard sizes and a rank with an all -inf shard; top-p rows from candidates
where that is exact (peaked rows) and from full rows elsewhere. gloo with 2–3 CPU processes (CI),
and NCCL with one process per GPU where a machine has two."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

V = 1001
BS = 6

CASES = {
    "no_filter": ("gumbel", dict(temperature=0.9)),
    "min_p": ("gumbel_full", dict(temperature=1.1, min_p=0.05)),
    "top_k": ("gumbel", dict(temperature=0.8, top_k=40)),
    "top_k_top_p": ("gumbel", dict(temperature=0.8, top_k=60, top_p=0.8)),
    "top_k_top_p_min_p": ("gumbel_full", dict(temperature=1.0, top_k=50, top_p=0.9, min_p=0.02)),
    "top_p_fallback": ("gumbel", dict(temperature=1.0, top_p=0.7)),
    "top_p_peaked": ("gumbel", dict(temperature=0.5, top_p=0.9)),
    "top_p_all_listed": ("gumbel", dict(temperature=1.0, top_p=0.8)),
    "top_k_ties": ("gumbel", dict(temperature=1.0, top_k=40)),
    "penalties": ("gumbel_full", dict(temperature=0.7, top_k=30, repetition_penalty=1.4,
                                      frequency_penalty=0.5, presence_penalty=0.3,
                                      logit_bias={7: 3.0, 900: 2.0})),
    # DESIGN §5: z = l / T past fp32's range (row 5, steps 1 and 2)
    "overflow": ("gumbel", dict(temperature=0.5)),
    "overflow_min_p": ("gumbel_full", dict(temperature=0.5, min_p=0.1)),
    # row 0: token 900's z sits within an ulp of the min-p threshold, which portable_log decides
    "min_p_log_edge": ("gumbel_full", dict(temperature=1.0, min_p=0.9611896872520447)),
}


# logits spread: top_p_peaked's 33rd best on a rank is > 32 nats down; top_k_ties rounds to
# {-2, ..., 2}, so each rank's k-th token and the row's are deep inside a tie at 1
SCALE = {"top_p_peaked": 12.0, "top_k_ties": 0.5}
CANDIDATES = {"top_p_fallback": 32, "top_p_peaked": 32}  # else 1024: wider than every shard
TIES = {"top_k_ties"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shards(world):
    # deliberately uneven: the last rank gets the remainder
    base = V // world + 7
    bounds = [min(i * base, V) for i in range(world)] + [V]
    return [(bounds[i], bounds[i + 1] - bounds[i]) for i in range(world)]


def _logprob_error(full, shard) -> float:
    """Largest difference of the finite logprobs; inf unless the non-finite ones (±inf rows)
    are equal, a NaN anywhere included."""
    a, b = torch.stack(full), torch.stack(shard)
    finite = a.isfinite()
    if not torch.equal(finite, b.isfinite()) or not torch.equal(a[~finite], b[~finite]):
        return float("inf")
    return float((a - b)[finite].abs().max())


def _worker(rank, world, port, results, dist_backend):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dev = "cpu"
    if dist_backend == "nccl":
        torch.cuda.set_device(rank)
        dev = "cuda"
    dist.init_process_group(dist_backend, rank=rank, world_size=world)
    import tokensampler as ts
    from tokensampler.vocab_parallel import VocabParallelSampler

    offset, size = _shards(world)[rank]
    out = {}
    for case, (name, params) in CASES.items():
        def make():
            cfg = ts.SamplingBackendConfig(max_bs=BS, max_req_pool_size=BS, vocab_size=V,
                                           device=dev, enable_output_logprobs=True)
            b = ts.create_backend(name, cfg)
            sps = [ts.SamplingParams(seed=100 + i, **params) for i in range(BS)]
            sps[1] = ts.SamplingParams(temperature=0.0, seed=1)  # a greedy row too
            b.prepare_step([f"r{i}" for i in range(BS)], list(range(1, BS + 1)), sps,
                           prompt_token_ids=[[1, 2, 7, 500]] * BS)
            return b
        full, shard_backend = make(), make()
        sampler = VocabParallelSampler(shard_backend, offset, size,
                                       max_candidates=CANDIDATES.get(case, 1024))
        gathered = 0
        gen = torch.Generator().manual_seed(0)
        tokens_full, tokens_shard, lp_full, lp_shard = [], [], [], []
        for step in range(6):
            logits = torch.randn(BS, V, generator=gen) * SCALE.get(case, 3.0)
            logits = (logits.round() if case in TIES else logits).to(dev)
            logits[2, 200:] = float("-inf")       # ranks past token 200 see an all -inf row
            if step == 3:
                logits[4, [5, 800]] = float("inf")  # +inf entries on two different ranks
            if step == 4:
                logits[3] = float("-inf")  # no finite logit: token 0, logprob -inf (§3.1)
            if case.startswith("overflow") and step == 1:  # every finite z is -inf: token 10
                logits[5] = float("-inf")
                logits[5, [10, 600]] = -3e38
            if case.startswith("overflow") and step == 2:  # z past +FLT_MAX on two ranks: 3
                logits[5, [3, 700]] = 3e38
            if case == "min_p_log_edge":
                logits[0] = float("-inf")
                logits[0, [0, 900]] = torch.tensor([0.0, -0.03958350419998169], device=dev)
            info = ts.SamplingBatchInfo(torch.arange(1, BS + 1, dtype=torch.int32, device=dev),
                                        torch.full((BS + 1,), 10 + step, dtype=torch.int32,
                                                   device=dev), V, dev)
            o1 = ts.LogitsProcessorOutput(logits.clone())
            t1, _ = full.sample(o1, info)
            o2 = ts.LogitsProcessorOutput(logits[:, offset:offset + size].contiguous())
            t2, _ = sampler.sample(o2, info)
            gathered += sampler.last_gathered_rows
            tokens_full.append(t1.tolist())
            tokens_shard.append(t2.tolist())
            lp_full.append(o1.next_token_logprobs.clone())
            lp_shard.append(o2.next_token_logprobs.clone())
        out[case] = (tokens_full, tokens_shard, _logprob_error(lp_full, lp_shard),
                     full.penalty_history(3) if name == "gumbel_full" else None,
                     shard_backend.penalty_history(3) if name == "gumbel_full" else None, gathered)
    # verify with penalties: drafts taken from an unsharded probe's targets, so some are
    # accepted and some not; the sharded verify must give the same predictions and lengths.
    n = 3

    def verifier():
        b = ts.create_backend("gumbel_full", ts.SamplingBackendConfig(
            max_bs=BS, max_draft_tokens_per_req=n, max_req_pool_size=BS, vocab_size=V, device=dev,
            enable_output_logprobs=True))
        b.prepare_step([f"v{i}" for i in range(BS)], list(range(1, BS + 1)),
                       [ts.SamplingParams(seed=i, temperature=0.8, top_k=20, frequency_penalty=0.7)
                        for i in range(BS)], num_tokens_per_req=n, prompt_token_ids=[[1]] * BS)
        return b
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(BS * n, V, generator=gen) * 3).to(dev)
    info = ts.SamplingBatchInfo(torch.arange(1, BS + 1, dtype=torch.int32, device=dev),
                                torch.full((BS + 1,), 4, dtype=torch.int32, device=dev), V, dev)
    candidates = torch.randint(0, V, (BS, n), dtype=torch.int32, generator=gen).to(dev)
    probe, _ = verifier().verify(ts.LogitsProcessorOutput(logits.clone()), info, candidates)
    candidates[::2, 1] = probe.view(BS, n)[::2, 0]  # even requests: first draft accepted
    full, sampler = verifier(), VocabParallelSampler(verifier(), offset, size)
    o_full = ts.LogitsProcessorOutput(logits.clone())
    p_full, a_full = full.verify(o_full, info, candidates)
    o_shard = ts.LogitsProcessorOutput(logits[:, offset:offset + size].contiguous())
    p_shard, a_shard = sampler.verify(o_shard, info, candidates)
    assert a_full.max() > 1, "no draft was accepted: the verify check is too weak"
    out["verify"] = ([p_full.tolist(), a_full.tolist()], [p_shard.tolist(), a_shard.tolist()],
                     _logprob_error([o_full.next_token_logprobs], [o_shard.next_token_logprobs]),
                     full.penalty_history(1), sampler.backend.penalty_history(1), 0)
    results[rank] = out
    dist.destroy_process_group()


def _check_equals_unsharded(world, dist_backend):
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_worker, args=(world, _free_port(), results, dist_backend), nprocs=world, join=True)
    for rank in range(world):
        for case, (full, shard, lp_err, h_full, h_shard, gathered) in results[rank].items():
            assert shard == full, f"rank {rank}, {case}"
            assert lp_err < 1e-4, f"rank {rank}, {case}: logprob error {lp_err}"
            assert h_full == h_shard, f"rank {rank}, {case}: penalty history differs"
        # peaked rows come from candidates (the +inf row of step 3 from its full row); flat
        # rows need their full rows
        assert 0 < results[rank]["top_p_peaked"][5] < BS * 6 // 2
        assert results[rank]["top_p_fallback"][5] >= BS * 6 // 2
        assert results[rank]["top_p_all_listed"][5] == 0  # every token listed: nothing gathered


@pytest.mark.parametrize("world", [2, 3])
def test_vocab_parallel_equals_unsharded(world):
    _check_equals_unsharded(world, "gloo")


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_vocab_parallel_equals_unsharded_over_nccl():
    _check_equals_unsharded(2, "nccl")


def test_vocab_parallel_benchmark_runs_on_gloo(tmp_path):
    """bench/vocab_parallel_bench.py (run on GPUs with NCCL) also runs on gloo: it must finish
    and find the same tokens both ways."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "bench" / "vocab_parallel_bench.py"
    out = tmp_path / "tp.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_port", str(_free_port()), str(script), "--device", "cpu", "--vocab", "2048",
         "--bs", "1", "3", "--iters", "2", "--json", str(out)],
        capture_output=True, text=True, env=env, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 8 and all(r["same_tokens"] for r in rows)


def _one_rank_sampler(tmp_path, max_bs=2, n=3):
    """A VocabParallelSampler of one rank holding the whole vocabulary (a gloo group of one)."""
    import tokensampler as ts
    from tokensampler.vocab_parallel import VocabParallelSampler

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    b = ts.create_backend("gumbel", ts.SamplingBackendConfig(
        max_bs=max_bs, max_draft_tokens_per_req=n, max_req_pool_size=max_bs, vocab_size=V,
        device="cpu"))
    b.prepare_step(["a", "b"][:max_bs], list(range(1, max_bs + 1)),
                   [ts.SamplingParams(seed=3, temperature=0.8)] * max_bs, num_tokens_per_req=n)
    info = ts.SamplingBatchInfo(torch.arange(1, max_bs + 1, dtype=torch.int32),
                                torch.zeros(max_bs + 1, dtype=torch.int32), V, "cpu")
    return b, VocabParallelSampler(b, 0, V), info


def test_bad_inputs_are_refused_as_the_backend_refuses_them(tmp_path):
    """The sampler runs the backend's checks (one validation): batch and draft sizes, the shard
    width, int64 ids outside int32 (saturated, so rejected like any id outside [0, V), not
    wrapped into the vocabulary), and draft_probs / token_bitmask (refused, not ignored); a
    backend whose processed or top-N logprobs it cannot give is refused at construction."""
    import tokensampler as ts
    from tokensampler.vocab_parallel import VocabParallelSampler

    b, sampler, info = _one_rank_sampler(tmp_path)
    try:
        out = lambda rows, width=V: ts.LogitsProcessorOutput(torch.randn(rows, width))  # noqa: E731
        with pytest.raises(ValueError, match="max_bs=2"):
            sampler.sample(out(3), info)
        with pytest.raises(ValueError, match="max_bs=2"):
            sampler.sample_rows(torch.randn(3, V), info)
        with pytest.raises(ValueError, match="shard_size=1001"):
            sampler.sample(out(2, V - 1), info)
        with pytest.raises(ValueError, match="max_draft_tokens_per_req=3"):
            sampler.verify(out(8), info, torch.zeros(2, 4, dtype=torch.int32))
        with pytest.raises(ValueError, match="candidates shape"):
            sampler.verify(out(3), info, torch.zeros(2, 3, dtype=torch.int32))
        probs = ts.SamplingBatchInfo(info.req_pool_indices, info.valid_cache_lengths, V, "cpu",
                                     draft_probs=torch.full((2, 2, V), 1.0 / V))
        with pytest.raises(ValueError, match="draft_probs"):
            sampler.verify(out(6), probs, torch.zeros(2, 3, dtype=torch.int32))
        for bad in (dict(enable_output_logprobs=True, logprobs_mode="processed"),
                    dict(top_logprobs_num=2)):
            other = ts.create_backend("gumbel", ts.SamplingBackendConfig(vocab_size=V, **bad))
            with pytest.raises(ValueError, match="logprobs_mode|top_logprobs_num"):
                VocabParallelSampler(other, 0, V)
        logits = torch.randn(6, V)
        first = b.verify(ts.LogitsProcessorOutput(logits.clone()), info,
                         torch.zeros(2, 3, dtype=torch.int32))[0].view(2, 3)[:, 0].clone()
        # request 0's first draft is its target token plus 2^32: an id no vocabulary holds
        wide = torch.tensor([[0, int(first[0]) + 2**32, 0], [0, int(first[1]), 0]])
        want = b.verify(ts.LogitsProcessorOutput(logits.clone()), info, wide)[1].tolist()
        got = sampler.verify(ts.LogitsProcessorOutput(logits.clone()), info, wide)[1].tolist()
        assert got == want and want[0] == 1 and want[1] >= 2
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", ["gumbel", "gumbel_full"])
def test_engine_slot_indices_outside_the_pool_and_padding(tmp_path, name):
    """req_pool_indices is the engine's tensor: longer than the batch (padding) or holding a
    slot outside the pool, the sampler gives what the backend's kernels give (DESIGN §5: token
    0, flagged, logprob -inf) and never gathers past the pool (an index error on the CPU, a
    device assert on CUDA), in sample and verify, every path."""
    import tokensampler as ts
    from tokensampler.vocab_parallel import VocabParallelSampler

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        for params in (dict(), dict(min_p=0.1), dict(top_k=20), dict(top_p=0.8)):
            def make():
                b = ts.create_backend(name, ts.SamplingBackendConfig(
                    max_bs=3, max_draft_tokens_per_req=2, max_req_pool_size=3, vocab_size=V,
                    device="cpu", enable_output_logprobs=True))
                b.prepare_step(["a", "b"], [1, 2],
                               [ts.SamplingParams(seed=s, **params) for s in (4, 5)],
                               num_tokens_per_req=2)
                return b
            if "min_p" in params and name == "gumbel":
                continue
            ref, sharded = make(), make()
            sampler = VocabParallelSampler(sharded, 0, V)
            for slots in ([1, 2, 3], [1, 9], [-3, 2, 3]):
                info = ts.SamplingBatchInfo(torch.tensor(slots, dtype=torch.int32),
                                            torch.zeros(4, dtype=torch.int32), V, "cpu")
                logits = torch.randn(2, V)
                o1, o2 = (ts.LogitsProcessorOutput(logits.clone()) for _ in range(2))
                want, got = ref.sample(o1, info)[0].tolist(), sampler.sample(o2, info)[0].tolist()
                assert got == want, (params, slots)
                assert torch.equal(sharded.invalid_rows[:2], ref.invalid_rows[:2])
                assert torch.equal(o1.next_token_logprobs.isinf(), o2.next_token_logprobs.isinf())
                cands = torch.tensor([[0, want[0]], [0, 7]], dtype=torch.int32)
                logits = torch.randn(4, V)
                o1, o2 = (ts.LogitsProcessorOutput(logits.clone()) for _ in range(2))
                want = [t.tolist() for t in ref.verify(o1, info, cands)]
                assert [t.tolist() for t in sampler.verify(o2, info, cands)] == want, (params, slots)
                assert torch.equal(o1.next_token_logprobs.isinf(), o2.next_token_logprobs.isinf())
    finally:
        dist.destroy_process_group()
