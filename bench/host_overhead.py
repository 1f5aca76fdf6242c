"""Host time of the per-step calls an engine's Python loop makes, no GPU needed (the slot table
and logits live on the CPU; what is timed is the host side):

- `prepare_step`: a steady step (the same requests in the same slots, the same SamplingParams
  objects) and a step where every slot flips (new requests: parameters converted and written,
  histories reset), for `gumbel_full` also with a repetition penalty and a 512-token prompt
  each (the slot's prompt mask written);
- one eager `sample` and `verify` call (bs 1, 4 rows for verify) at a vocabulary of 32, where
  the CPU kernel costs next to nothing: the Python checks, views and op dispatch an eager GPU
  step pays before its kernel launches (CUDA-graph replay pays none of it).

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


def measure(name: str, bs: int, repeats: int, prompt: int = 0) -> tuple[float, float]:
    """(steady, all-flip) median ms of prepare_step for `bs` requests on backend `name`; with
    `prompt`, each request has a repetition penalty and brings a prompt of that many tokens
    (read at its flip into the slot's V-bit prompt mask)."""
    cfg = ts.SamplingBackendConfig(max_bs=bs, max_req_pool_size=2 * bs, vocab_size=VOCAB)
    backend = ts.create_backend(name, cfg)
    extra = dict(repetition_penalty=1.1) if prompt else {}
    params = [ts.SamplingParams(seed=i, temperature=0.7, top_k=50, top_p=0.9, **extra)
              for i in range(bs)]
    prompts = [list(range(i, i + 7 * prompt, 7)) for i in range(bs)] if prompt else None
    halves = [list(range(1, bs + 1)), list(range(bs + 1, 2 * bs + 1))]
    generation = [0]

    def flip():  # new request ids in the other half of the pool: every slot flips
        generation[0] += 1
        rids = [f"g{generation[0]}r{i}" for i in range(bs)]
        backend.prepare_step(rids, halves[generation[0] % 2], params, prompt_token_ids=prompts)
        return rids

    rids = flip()
    slots = halves[generation[0] % 2]
    steady = median_ms(lambda: backend.prepare_step(rids, slots, params), repeats)
    flips = median_ms(flip, max(3, repeats // 10))
    return steady, flips


def eager_call_us(name: str, logprobs: bool, n: int, repeats: int) -> float:
    """Median us of one eager sample (n = 1) or verify (n rows) of one request at V = 32, with
    raw logprobs and top-2 when `logprobs`; the best of five medians (the machine is shared)."""
    import torch

    vocab = 32
    cfg = ts.SamplingBackendConfig(max_bs=8, max_req_pool_size=16, vocab_size=vocab,
                                   max_draft_tokens_per_req=4, enable_output_logprobs=logprobs,
                                   top_logprobs_num=2 if logprobs else 0)
    backend = ts.create_backend(name, cfg)
    params = ts.SamplingParams(seed=1, temperature=0.0 if name == "greedy" else 0.7, top_k=20)
    backend.prepare_step(["a"], [1], [params], n)
    logits = torch.randn(n, vocab)
    info = ts.SamplingBatchInfo(torch.tensor([1], dtype=torch.int32),
                                torch.zeros(17, dtype=torch.int32), vocab, "cpu")
    candidates = torch.zeros(1, n, dtype=torch.int32)

    def call():
        out = ts.LogitsProcessorOutput(logits)
        if n == 1:
            return backend.sample(out, info)
        return backend.verify(out, info, candidates)

    for _ in range(repeats):
        call()
    return min(median_ms(call, 20 * repeats) for _ in range(5)) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 32, 128, 512])
    ap.add_argument("--backends", nargs="+", default=["greedy", "gumbel", "gumbel_full"])
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    print(f"{'backend':<13}{'bs':>5}{'steady ms':>11}{'all flip ms':>13}"
          f"{'flip, 512-token prompts ms':>28}")
    for name in args.backends:
        for bs in args.bs:
            steady, flips = measure(name, bs, args.repeats)
            # the prompt mask is written only by backends that keep a penalty history
            prompted = (f"{measure(name, bs, args.repeats, prompt=512)[1]:>28.3f}"
                        if name == "gumbel_full" else f"{'-':>28}")
            print(f"{name:<13}{bs:>5}{steady:>11.3f}{flips:>13.3f}{prompted}", flush=True)
    print(f"\n{'backend':<13}{'logprobs':>9}{'sample us':>11}{'verify(4) us':>14}")
    for name in args.backends:
        for logprobs in (False, True):
            sample, verify = (eager_call_us(name, logprobs, n, args.repeats) for n in (1, 4))
            print(f"{name:<13}{str(logprobs):>9}{sample:>11.1f}{verify:>14.1f}", flush=True)


if __name__ == "__main__":
    main()
