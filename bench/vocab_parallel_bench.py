"""Vocab-parallel sampling against all-gather-then-sample, one process per GPU (NCCL).

Each rank holds its vocabulary shard of the logits, `[bs, V / world]`. For every route and batch
size it times one step two ways, through the public API:
  vocab-parallel   `VocabParallelSampler.sample` on the shard (a few small collectives);
  all-gather       `all_gather_into_tensor` of the shards, the transpose into `[bs, V]` rows,
                   then the unsharded backend's `sample` (what an engine does without it).
Both must return the same tokens every step (checked, not assumed). Eager timing with CUDA events,
median over many steps; the vocab-parallel top-p path syncs with the host when it decides which
rows to gather, so neither side is graph-captured here.

    torchrun --nproc_per_node 2 bench/vocab_parallel_bench.py [--bs 1 32 128 512] [--json f]
    torchrun --nproc_per_node 2 bench/vocab_parallel_bench.py --device cpu --vocab 4096   # gloo
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

import tokensampler as ts
from tokensampler.vocab_parallel import VocabParallelSampler

ROUTES = {
    "no_filter": ("gumbel", dict(temperature=0.7)),
    "top_k_top_p": ("gumbel", dict(temperature=0.7, top_k=50, top_p=0.9)),
    "top_p": ("gumbel", dict(temperature=0.7, top_p=0.9)),
    "min_p": ("gumbel_full", dict(temperature=0.7, min_p=0.05)),
}


def make_backend(name, params, bs, vocab, device):
    cfg = ts.SamplingBackendConfig(max_bs=bs, max_req_pool_size=bs, vocab_size=vocab, device=device)
    backend = ts.create_backend(name, cfg)
    slots = list(range(1, bs + 1))
    backend.prepare_step([f"r{i}" for i in slots], slots,
                         [ts.SamplingParams(seed=i, **params) for i in slots])
    return backend


def timed(step, iters, device):
    """Median milliseconds of `step()` and its last result."""
    for _ in range(3):
        out = step()
    times = []
    for _ in range(iters):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            out = step()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), out


def run_case(route, bs, vocab, rank, world, device, iters):
    name, params = ROUTES[route]
    shard = vocab // world
    offset = rank * shard
    sampler = VocabParallelSampler(make_backend(name, params, bs, vocab, device), offset, shard)
    unsharded = make_backend(name, params, bs, vocab, device)
    info = ts.SamplingBatchInfo(torch.arange(1, bs + 1, dtype=torch.int32, device=device),
                                torch.full((bs + 1,), 100, dtype=torch.int32, device=device),
                                vocab, device)
    g = torch.Generator().manual_seed(1234)               # same full logits on every rank
    mine = (torch.randn(bs, vocab, generator=g) * 2)[:, offset:offset + shard].contiguous().to(device)
    gathered = torch.empty(world * bs, shard, device=device)

    def vocab_parallel():
        return sampler.sample(ts.LogitsProcessorOutput(mine), info)[0].clone()

    def all_gather_then_sample():
        dist.all_gather_into_tensor(gathered, mine)
        logits = gathered.view(world, bs, shard).transpose(0, 1).reshape(bs, vocab)
        return unsharded.sample(ts.LogitsProcessorOutput(logits), info)[0].clone()

    vp_ms, vp_tokens = timed(vocab_parallel, iters, device)
    ag_ms, ag_tokens = timed(all_gather_then_sample, iters, device)
    # positions are fixed, so every step draws the same noise: the last tokens stand for all
    same = bool(torch.equal(vp_tokens, ag_tokens))
    return dict(route=route, bs=bs, world=world, vocab=vocab, vocab_parallel_us=vp_ms * 1e3,
                all_gather_us=ag_ms * 1e3, speedup=ag_ms / vp_ms, same_tokens=same,
                gathered_rows=sampler.last_gathered_rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 32, 128, 512])
    ap.add_argument("--routes", nargs="+", default=list(ROUTES))
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json")
    args = ap.parse_args()
    rank = int(os.environ["RANK"])
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    world = dist.get_world_size()
    if args.vocab % world:
        raise SystemExit(f"--vocab {args.vocab} does not split evenly over {world} ranks")
    results = [run_case(route, bs, args.vocab, rank, world, args.device, args.iters)
               for route in args.routes for bs in args.bs]
    if rank == 0:
        where = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
        print(f"vocab-parallel sampling, {world} ranks ({where}), V={args.vocab}, median of {args.iters}")
        print(f"{'route':<13}{'bs':>5}{'vocab-par µs':>14}{'all-gather µs':>15}{'speed-up':>10}"
              f"{'same':>6}{'gathered':>10}")
        for r in results:
            print(f"{r['route']:<13}{r['bs']:>5}{r['vocab_parallel_us']:>14.1f}{r['all_gather_us']:>15.1f}"
                  f"{r['speedup']:>10.2f}{'yes' if r['same_tokens'] else 'NO':>6}{r['gathered_rows']:>10}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(device=where, torch=torch.__version__, rows=results), f, indent=1)
    dist.destroy_process_group()
    if not all(r["same_tokens"] for r in results):
        raise SystemExit("vocab-parallel tokens differ from all-gather-then-sample")


if __name__ == "__main__":
    main()
