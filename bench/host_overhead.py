"""Host time of `prepare_step`, the per-step call an engine's Python loop makes before sampling:
a steady step (the same requests in the same slots, the same SamplingParams objects) and a step
where every slot flips (new requests: parameters converted and written, histories reset).
No GPU needed: the slot table lives on the CPU here, and what is timed is the host side.

    python bench/host_overhead.py [--bs 1 32 128 512] [--backends greedy gumbel gumbel_full]
"""

from __future__ import annotations

import argparse
import statistics
import time

import tokensampler as ts

VOCAB = 151936


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def measure(name: str, bs: int, repeats: int) -> tuple[float, float]:
    """(steady, all-flip) median ms of prepare_step for `bs` requests on backend `name`."""
    cfg = ts.SamplingBackendConfig(max_bs=bs, max_req_pool_size=2 * bs, vocab_size=VOCAB)
    backend = ts.create_backend(name, cfg)
    params = [ts.SamplingParams(seed=i, temperature=0.7, top_k=50, top_p=0.9) for i in range(bs)]
    halves = [list(range(1, bs + 1)), list(range(bs + 1, 2 * bs + 1))]
    generation = [0]

    def flip():  # new request ids in the other half of the pool: every slot flips
        generation[0] += 1
        rids = [f"g{generation[0]}r{i}" for i in range(bs)]
        backend.prepare_step(rids, halves[generation[0] % 2], params)
        return rids

    rids = flip()
    slots = halves[generation[0] % 2]
    steady = median_ms(lambda: backend.prepare_step(rids, slots, params), repeats)
    flips = median_ms(flip, max(3, repeats // 10))
    return steady, flips


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 32, 128, 512])
    ap.add_argument("--backends", nargs="+", default=["greedy", "gumbel", "gumbel_full"])
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    print(f"{'backend':<13}{'bs':>5}{'steady ms':>11}{'all flip ms':>13}")
    for name in args.backends:
        for bs in args.bs:
            steady, flips = measure(name, bs, args.repeats)
            print(f"{name:<13}{bs:>5}{steady:>11.3f}{flips:>13.3f}", flush=True)


if __name__ == "__main__":
    main()
