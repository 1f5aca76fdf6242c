"""maybe_broadcast across TP ranks (gloo, 2 CPU processes): rank 0's outputs win, and a
backend's own outputs travel in one collective."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import tokensampler as ts

    cfg = ts.SamplingBackendConfig(max_bs=2, max_draft_tokens_per_req=3, max_req_pool_size=4,
                                   vocab_size=50, device="cpu", tp_group=tuple(range(world)))
    backend = ts.create_backend("gumbel", cfg)
    backend.prepare_step(["a", "b"], [1, 2], [ts.SamplingParams(seed=1), ts.SamplingParams(seed=2)],
                         num_tokens_per_req=3)
    torch.manual_seed(rank)  # every rank sees different logits
    info = ts.SamplingBatchInfo(torch.tensor([1, 2], dtype=torch.int32),
                                torch.zeros(5, dtype=torch.int32), 50, "cpu")
    candidates = torch.randint(0, 50, (2, 3), dtype=torch.int32)
    predict, accept = backend.verify(ts.LogitsProcessorOutput(torch.randn(6, 50)), info, candidates)
    extra = torch.full((3,), float(rank))
    calls = []
    original = dist.broadcast
    dist.broadcast = lambda t, *a, **k: (calls.append(t.numel()), original(t, *a, **k))[1]
    backend.maybe_broadcast(predict, accept, extra)
    dist.broadcast = original
    results[rank] = (predict.tolist(), accept.tolist(), extra.tolist(), len(calls))
    dist.destroy_process_group()


def _dp_worker(rank, world, port, results):
    """Attention-DP: ranks (0, 1) and (2, 3) are two TP groups, each its own broadcast."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import tokensampler as ts

    group = (0, 1) if rank < 2 else (2, 3)
    cfg = ts.SamplingBackendConfig(max_bs=2, max_req_pool_size=4, vocab_size=50, device="cpu",
                                   tp_group=group)
    backend = ts.create_backend("gumbel", cfg)
    extra = torch.full((3,), float(rank))
    backend.maybe_broadcast(extra)
    results[rank] = extra.tolist()
    dist.destroy_process_group()


def test_maybe_broadcast_keeps_to_its_own_tp_group():
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_dp_worker, args=(4, _free_port(), results), nprocs=4, join=True)
    assert [results[r] for r in range(4)] == [[0.0] * 3, [0.0] * 3, [2.0] * 3, [2.0] * 3]


@pytest.mark.parametrize("world", [2, 3])
def test_maybe_broadcast_rank0_wins_with_one_packed_collective(world):
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_worker, args=(world, _free_port(), results), nprocs=world, join=True)
    ref = results[0]
    for rank in range(1, world):
        assert results[rank][:3] == ref[:3]
    assert ref[2] == [0.0, 0.0, 0.0]
    assert all(results[r][3] == 2 for r in range(world))  # packed outputs + the extra tensor
