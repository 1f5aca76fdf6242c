"""CPU baseline: one sampling step per route through the public API (the CPU kernels are the
readable reference, not a fast path). Prints a table and optionally writes JSON.

    python bench/cpu_baseline.py [--bs 64] [--vocab 151936] [--routes top_p ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import tokensampler as ts

ROUTES = {
    "greedy": ("greedy", dict(temperature=0.0)),
    "no_filter": ("gumbel", dict(temperature=0.7)),
    "top_k": ("gumbel", dict(temperature=0.7, top_k=50)),
    "top_p": ("gumbel", dict(temperature=0.7, top_p=0.9)),
    "top_k_top_p": ("gumbel", dict(temperature=0.7, top_k=50, top_p=0.9)),
    "min_p": ("gumbel_full", dict(temperature=0.7, min_p=0.05)),
    "full_penalties": ("gumbel_full", dict(temperature=0.7, top_k=50, top_p=0.9,
                                           repetition_penalty=1.1, frequency_penalty=0.2,
                                           presence_penalty=0.1, logit_bias={5: 1.0})),
}


def time_route(route: str, bs: int, vocab: int, repeats: int) -> float:
    name, params = ROUTES[route]
    cfg = ts.SamplingBackendConfig(max_bs=bs, max_req_pool_size=bs, vocab_size=vocab, device="cpu")
    backend = ts.create_backend(name, cfg)
    slots = list(range(1, bs + 1))
    backend.prepare_step([f"r{s}" for s in slots], slots,
                         [ts.SamplingParams(seed=s, **params) for s in slots],
                         prompt_token_ids=[list(range(64))] * bs)
    logits = torch.randn(bs, vocab)
    info = ts.SamplingBatchInfo(torch.tensor(slots, dtype=torch.int32),
                                torch.zeros(bs + 1, dtype=torch.int32), vocab, "cpu")
    out = ts.LogitsProcessorOutput(logits)
    backend.sample(out, info)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        backend.sample(out, info)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bs", type=int, default=64)
    ap.add_argument("--routes", nargs="+", choices=list(ROUTES), default=list(ROUTES))
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = {route: time_route(route, args.bs, args.vocab, args.repeats) for route in args.routes}
    print(f"CPU, {torch.get_num_threads()} threads, bs={args.bs}, V={args.vocab}, fp32 logits")
    print(f"{'route':<16}{'ms/step':>10}")
    for route, ms in rows.items():
        print(f"{route:<16}{ms:>10.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(bs=args.bs, vocab=args.vocab, threads=torch.get_num_threads(),
                           ms_per_step=rows), f, indent=1)


if __name__ == "__main__":
    main()
