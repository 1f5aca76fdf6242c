"""GPU benchmark: tokensampler's backends against FlashInfer and a torch reference.

For every route × batch size × dtype it times one sampling step with CUDA-graph replay (median
over many replays; each graph samples K different logits buffers in turn so they are not served
from L2) and prints our time, FlashInfer's fastest call with the same semantics, the same step
through the `flashinfer` / `flashinfer_full` adapter backends (column FI-api), the torch
reference, the HBM floor (logits bytes / measured copy bandwidth) and the ratios. Every
measurement sits in an NVTX range ("tokensampler top_p bs=128 fp32", "flashinfer ... ") so a
trace of the whole run reads by name.

    python bench/benchmark.py [--bs 1 8 32 128 512] [--dtypes fp32 bf16] [--json f] [--plot f.png]
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass, field

import torch

import tokensampler as ts

VOCAB = 151936
TEMPERATURE, TOP_K, TOP_P, MIN_P = 0.7, 50, 0.9, 0.05
L2_BYTES = 60 * 2**20


@dataclass
class Route:
    backend: str
    params: dict
    tokens_per_req: int = 1
    mixed: bool = False                       # alternate rows between two filter sets
    penalties: bool = False
    logprobs: bool = False                    # publish each token's raw logprob ...
    top_logprobs: int = 0                     # ... and the top-N
    draft_probs: bool = False                 # verify by rejection sampling (tokens_per_req > 1)


ROUTES = {
    "greedy": Route("greedy", dict(temperature=0.0)),
    "greedy_logprobs": Route("greedy", dict(temperature=0.0), logprobs=True, top_logprobs=5),
    "no_filter": Route("gumbel", dict(temperature=TEMPERATURE)),
    "top_k": Route("gumbel", dict(temperature=TEMPERATURE, top_k=TOP_K)),
    "top_p": Route("gumbel", dict(temperature=TEMPERATURE, top_p=TOP_P)),
    "top_k_top_p": Route("gumbel", dict(temperature=TEMPERATURE, top_k=TOP_K, top_p=TOP_P)),
    "min_p": Route("gumbel_full", dict(temperature=TEMPERATURE, min_p=MIN_P)),
    "mixed": Route("gumbel", dict(temperature=TEMPERATURE, top_k=TOP_K), mixed=True),
    "full_penalties": Route("gumbel_full", dict(temperature=TEMPERATURE, top_k=TOP_K, top_p=TOP_P,
                                                repetition_penalty=1.1, frequency_penalty=0.2,
                                                presence_penalty=0.1, logit_bias={11: 1.0}),
                            penalties=True),
    "verify_top_k_top_p": Route("gumbel", dict(temperature=TEMPERATURE, top_k=TOP_K, top_p=TOP_P),
                                tokens_per_req=4),
    # what an OpenAI-style server asks for: the token's logprob and the top 5
    "top_k_top_p_logprobs": Route("gumbel", dict(temperature=TEMPERATURE, top_k=TOP_K, top_p=TOP_P),
                                  logprobs=True, top_logprobs=5),
    "verify_rejection": Route("gumbel", dict(temperature=TEMPERATURE, top_k=TOP_K, top_p=TOP_P),
                              tokens_per_req=4, logprobs=True, draft_probs=True),
}


@dataclass
class Row:
    route: str
    bs: int
    dtype: str
    rows: int
    floor_us: float
    ours_us: float | None = None
    flashinfer_us: float | None = None
    flashinfer_call: str | None = None
    torch_us: float | None = None
    adapter_us: float | None = None           # the flashinfer / flashinfer_full backend, same API
    notes: list = field(default_factory=list)


def copy_bandwidth() -> float:
    """Device-to-device copy rate in bytes/s, counting bytes read plus written."""
    src = torch.empty(2 * 2**30 // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * src.numel() * 4 / statistics.median(times)


def graph_time_us(step, buffers, label: str, replays=50) -> float:
    """Median time of `step(buffer)` per buffer, from CUDA-graph replays over all buffers.
    The capture and the replays sit in NVTX ranges named `label` (a graph's replay is one launch
    in a trace, so the range is what names it)."""
    with torch.cuda.nvtx.range(label):
        return _graph_time_us(step, buffers, replays)


def capture_graph(step, buffers) -> torch.cuda.CUDAGraph:
    """A CUDA graph of `step(buffer)` for every buffer in turn (warmed up on a side stream),
    replayed once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for b in buffers[:2]:
            step(b)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for b in buffers:
            step(b)
    graph.replay()
    torch.cuda.synchronize()
    return graph


def _graph_time_us(step, buffers, replays) -> float:
    graph = capture_graph(step, buffers)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(buffers))
    return statistics.median(times)


def logits_buffers(rows: int, dtype: torch.dtype) -> list[torch.Tensor]:
    one = rows * VOCAB * torch.tensor([], dtype=dtype).element_size()
    count = max(2, min(64, -(-3 * L2_BYTES // one)))
    g = torch.Generator(device="cuda").manual_seed(0)
    return [torch.randn(rows, VOCAB, device="cuda", generator=g).to(dtype) for _ in range(count)]


def ours_step(route: Route, bs: int, backend_name: str | None = None,
              token_bitmask: torch.Tensor | None = None, vocab: int = VOCAB, device: str = "cuda"):
    """One sampling step through the public API of `backend_name` (default: the route's), with
    the grammar mask `token_bitmask` ([rows, ceil(V/32)] int32) when given."""
    n = route.tokens_per_req
    cfg = ts.SamplingBackendConfig(max_bs=bs, max_draft_tokens_per_req=n, max_req_pool_size=bs,
                                   vocab_size=vocab, device=device,
                                   enable_token_bitmask=token_bitmask is not None,
                                   enable_output_logprobs=route.logprobs,
                                   top_logprobs_num=route.top_logprobs)
    backend = ts.create_backend(backend_name or route.backend, cfg)
    slots = list(range(1, bs + 1))
    params = []
    for i in slots:
        p = dict(route.params)
        if route.mixed and i % 2:
            p = dict(temperature=TEMPERATURE, top_p=TOP_P)
        params.append(ts.SamplingParams(seed=i, **p))
    prompts = [list(range(0, 4000, 7))] * bs if route.penalties else None
    backend.prepare_step([f"r{i}" for i in slots], slots, params, num_tokens_per_req=n,
                         prompt_token_ids=prompts)
    draft_probs = None
    if route.draft_probs:
        g = torch.Generator(device=device).manual_seed(1)
        draft_probs = torch.softmax(torch.randn(bs, n - 1, vocab, device=device, generator=g), -1)
    info = ts.SamplingBatchInfo(torch.tensor(slots, dtype=torch.int32, device=device),
                                torch.full((bs + 1,), 100, dtype=torch.int32, device=device),
                                vocab, device, draft_probs=draft_probs, token_bitmask=token_bitmask)
    candidates = torch.randint(0, vocab, (bs, n), dtype=torch.int32, device=device)
    if n == 1:
        return lambda logits: backend.sample(ts.LogitsProcessorOutput(logits), info)
    return lambda logits: backend.verify(ts.LogitsProcessorOutput(logits), info, candidates)


def torch_reference_step(route: Route, rows: int):
    """Sort-based top-k + top-p in plain torch (what engines fall back to)."""
    def step(logits):
        z = logits.float() / TEMPERATURE
        values, idx = z.sort(dim=-1, descending=True)
        probs = values.softmax(-1)
        cum = probs.cumsum(-1) - probs
        keep = cum < TOP_P
        keep[:, TOP_K:] = False
        probs = probs * keep
        choice = torch.multinomial(probs, 1)
        return idx.gather(1, choice)
    return step


def flashinfer_steps(route: str, rows: int):
    """FlashInfer calls with the route's semantics: {name: step}. Empty if not importable."""
    try:
        import flashinfer.sampling as fs
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return {}
    k_t = torch.full((rows,), TOP_K, dtype=torch.int32, device="cuda")
    p_t = torch.full((rows,), TOP_P, dtype=torch.float32, device="cuda")
    m_t = torch.full((rows,), MIN_P, dtype=torch.float32, device="cuda")

    def probs(logits):
        return torch.softmax(logits.float() / TEMPERATURE, -1)

    steps = {}
    if route == "greedy":  # FlashInfer has no argmax op: torch's, which engines call
        steps["torch.argmax"] = lambda l: l.argmax(-1)
    if route == "greedy_logprobs":  # and log_softmax for the logprobs
        def argmax_logprobs(l):
            lp = torch.log_softmax(l.float(), -1)
            top = lp.topk(5, -1)
            return l.argmax(-1), lp.gather(1, top.indices[:, :1]), top
        steps["torch.argmax+log_softmax+topk"] = argmax_logprobs
    if route == "no_filter":
        steps["sampling_from_logits"] = lambda l: fs.sampling_from_logits(l)
    if route == "top_k_top_p_logprobs":  # FlashInfer samples; the engine adds the logprobs
        def sample_logprobs(l):
            token = fs.top_k_top_p_sampling_from_logits(l, k_t, p_t)
            lp = torch.log_softmax(l.float(), -1)
            return token, lp.gather(1, token.long().view(-1, 1)), lp.topk(5, -1)
        steps["top_k_top_p_from_logits+log_softmax+topk"] = sample_logprobs
    if route in ("top_k", "top_k_top_p", "verify_top_k_top_p", "full_penalties", "mixed"):
        steps["top_k_top_p_from_logits(int k)"] = lambda l: fs.top_k_top_p_sampling_from_logits(
            l, TOP_K, TOP_P if route != "top_k" else 1.0)
        steps["top_k_top_p_from_logits(tensors)"] = lambda l: fs.top_k_top_p_sampling_from_logits(
            l, k_t, p_t if route != "top_k" else torch.ones_like(p_t))
    if route in ("top_p", "mixed"):
        steps["softmax+top_p_from_probs"] = lambda l: fs.top_p_sampling_from_probs(probs(l), p_t)
    if route == "min_p":
        steps["softmax+min_p_from_probs"] = lambda l: fs.min_p_sampling_from_probs(probs(l), m_t)
    return steps


def time_others(row: Row, route_name: str, route, bs: int, buffers, label: str) -> None:
    """FlashInfer's best call, our FlashInfer adapter backend and (top-k + top-p fp32) the torch
    reference on the same buffers, into `row`."""
    best = None
    for name, step in flashinfer_steps(route_name, row.rows).items():
        try:
            t = graph_time_us(step, buffers, f"flashinfer {name} {label}")
        except Exception as exc:  # noqa: BLE001
            row.notes.append(f"flashinfer {name} failed: {exc!r}"[:200])
            continue
        row.notes.append(f"flashinfer {name}: {t:.1f} us")
        if best is None or t < best[0]:
            best = (t, name)
    if best:
        row.flashinfer_us, row.flashinfer_call = best
    adapter = route.backend.replace("gumbel", "flashinfer")
    if adapter != route.backend and adapter in ts.available_backends():
        try:
            row.adapter_us = graph_time_us(ours_step(route, bs, adapter), buffers,
                                           f"{adapter} backend {label}")
        except Exception as exc:  # noqa: BLE001
            row.notes.append(f"{adapter} backend failed: {exc!r}"[:200])
    if route_name in ("top_k_top_p",) and row.dtype == "fp32":
        row.torch_us = graph_time_us(torch_reference_step(route, row.rows), buffers[:4],
                                     f"torch reference {label}")


def run(bs_list, dtypes, routes, bandwidth, ours_only=False) -> list[Row]:
    results = []
    for dtype_name in dtypes:
        dtype = dict(fp32=torch.float32, bf16=torch.bfloat16)[dtype_name]
        for route_name in routes:
            route = ROUTES[route_name]
            for bs in bs_list:
                rows = bs * route.tokens_per_req
                buffers = logits_buffers(rows, dtype)
                floor = buffers[0].numel() * buffers[0].element_size() / bandwidth * 1e6
                row = Row(route_name, bs, dtype_name, rows, floor)
                label = f"{route_name} bs={bs} {dtype_name}"
                try:
                    row.ours_us = graph_time_us(ours_step(route, bs), buffers, f"tokensampler {label}")
                except Exception as exc:  # noqa: BLE001 - record and go on
                    row.notes.append(f"ours failed: {exc!r}"[:200])
                if not ours_only:  # an A/B of our kernels: the base run has the others' figures
                    time_others(row, route_name, route, bs, buffers, label)
                results.append(row)
                print(format_row(row), flush=True)
                del buffers
                torch.cuda.empty_cache()
    return results


HEADER = (f"{'route':<20}{'dtype':<6}{'bs':>5}{'rows':>6}{'floor':>8}{'ours':>9}{'x floor':>8}"
          f"{'FI':>9}{'ours/FI':>8}{'FI-api':>9}{'torch':>9}")


def format_row(r: Row) -> str:
    def f(v, w=9, p=1):
        return f"{v:>{w}.{p}f}" if v is not None else f"{'-':>{w}}"
    ratio_floor = r.ours_us / r.floor_us if r.ours_us else None
    ratio_fi = r.ours_us / r.flashinfer_us if r.ours_us and r.flashinfer_us else None
    return (f"{r.route:<20}{r.dtype:<6}{r.bs:>5}{r.rows:>6}{f(r.floor_us, 8)}{f(r.ours_us)}"
            f"{f(ratio_floor, 8, 2)}{f(r.flashinfer_us)}{f(ratio_fi, 8, 2)}{f(r.adapter_us)}"
            f"{f(r.torch_us)}")


def plot(results: list[Row], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    routes = sorted({r.route for r in results})
    fig, axes = plt.subplots(1, len(routes), figsize=(4 * len(routes), 3.6), squeeze=False)
    for ax, route in zip(axes[0], routes):
        for dtype, style in (("fp32", "-"), ("bf16", "--")):
            rs = [r for r in results if r.route == route and r.dtype == dtype]
            if not rs:
                continue
            bs = [r.bs for r in rs]
            ax.plot(bs, [r.ours_us for r in rs], "o" + style, label=f"tokensampler {dtype}")
            ax.plot(bs, [r.floor_us for r in rs], "k" + style, alpha=0.4, label=f"floor {dtype}")
            if any(r.flashinfer_us for r in rs):
                ax.plot(bs, [r.flashinfer_us for r in rs], "s" + style, label=f"FlashInfer {dtype}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(route)
        ax.set_xlabel("batch size")
        ax.set_ylabel("µs / step")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 8, 32, 128, 512])
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--routes", nargs="+", default=list(ROUTES))
    ap.add_argument("--json")
    ap.add_argument("--plot")
    ap.add_argument("--ours-only", action="store_true",
                    help="time tokensampler alone (no FlashInfer, adapter or torch figures)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("the GPU benchmark needs CUDA; on CPU run bench/cpu_baseline.py")
    bandwidth = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"copy bandwidth {bandwidth / 1e9:.0f} GB/s, V={VOCAB}")
    print(HEADER)
    results = run(args.bs, args.dtypes, args.routes, bandwidth, args.ours_only)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                           copy_bandwidth_gbs=bandwidth / 1e9,
                           rows=[vars(r) for r in results]), f, indent=1)
    if args.plot:
        plot(results, args.plot)
    print("\n" + HEADER)
    for r in results:
        print(format_row(r))


if __name__ == "__main__":
    main()
