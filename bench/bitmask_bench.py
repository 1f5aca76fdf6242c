"""Grammar bitmasks (issue 17): what a masked step costs.

For every route × batch size × dtype × mask density it times, with CUDA-graph replay as
bench/benchmark.py does (V = 151936, per-request parameters):
  ours          tokensampler, no mask
  ours+mask     tokensampler with `token_bitmask` (applied inside the kernels' read)
  xg+ours       xgrammar's `apply_token_bitmask_inplace` on the logits, then tokensampler
  xg+FI         xgrammar's masking, then FlashInfer with the route's semantics
and the ratio ours+mask / ours (the issue's target: <= 1.05 at bs >= 32). Before timing a shape
it checks that ours+mask and xg+ours return the same tokens (`torch.equal`: the keyed noise
makes masking inside the kernel and masking first the same draw); a mismatch exits non-zero.

xgrammar: `import xgrammar` where installed, else its Triton kernel file (xgrammar masks CUDA
tensors with it) loaded by path from the bundle of scripts/xgrammar_bundle.sh (`--xgrammar-kernel`,
default .xg/apply_token_bitmask_inplace_triton.py), so the device needs neither xgrammar's
dependencies nor a network.

    python bench/bitmask_bench.py [--bs 1 32 128 512] [--dtypes fp32 bf16] [--json f]
    python bench/bitmask_bench.py --check-only --device cpu --vocab 1000   (CI smoke)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchmark as b  # noqa: E402
from tokensampler.bitmask import pack_token_bitmask  # noqa: E402

DENSITIES = {"half": 0.5, "json": 0.01}  # allowed fraction: free text-ish, a JSON-grammar state
ROUTES = ["top_k_top_p", "no_filter", "top_p"]


def xgrammar_masker(kernel_path: str):
    """xgrammar's in-place masking: (logits, bitmask) -> None."""
    try:
        import xgrammar
        return xgrammar.apply_token_bitmask_inplace
    except ImportError:
        pass
    spec = importlib.util.spec_from_file_location("xgrammar_triton_mask", kernel_path)
    if spec is None or not os.path.exists(kernel_path):
        raise SystemExit(f"xgrammar is not installed and {kernel_path} is missing "
                         f"(bash scripts/xgrammar_bundle.sh .xg)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.apply_token_bitmask_inplace_triton


def random_bitmask(rows: int, vocab: int, density: float, device: str) -> torch.Tensor:
    """int32 [rows, ceil(V/32)] in xgrammar's layout, each token allowed with `density`."""
    words = (vocab + 31) // 32
    g = torch.Generator().manual_seed(rows * 7 + int(density * 1000))
    allowed = torch.rand(rows, words * 32, generator=g) < density
    return pack_token_bitmask(allowed).to(device)


def check_equal(route_name: str, bs: int, dtype: torch.dtype, density: float, mask_fn,
                vocab: int, device: str) -> None:
    """ours+mask == xg+ours, token for token (raises AssertionError otherwise)."""
    route = b.ROUTES[route_name]
    rows = bs * route.tokens_per_req
    mask = random_bitmask(rows, vocab, density, device)
    g = torch.Generator(device=device).manual_seed(bs)
    logits = (torch.randn(rows, vocab, device=device, generator=g) * 2).to(dtype)
    fused = b.ours_step(route, bs, token_bitmask=mask, vocab=vocab, device=device)(logits)[0].clone()
    masked = logits.clone()
    mask_fn(masked, mask)
    plain = b.ours_step(route, bs, vocab=vocab, device=device)(masked)[0].clone()
    if not torch.equal(fused, plain):
        raise AssertionError(f"{route_name} bs={bs} {dtype} density={density}: masked in the "
                             f"kernel != masked by xgrammar first "
                             f"({int((fused != plain).sum())} of {rows} rows differ)")


def run(args, mask_fn) -> list[dict]:
    results = []
    print(f"{'route':<13}{'dtype':<6}{'mask':<6}{'bs':>5}{'ours':>9}{'ours+mask':>11}"
          f"{'ratio':>7}{'xg+ours':>9}{'xg+FI':>9}")
    for dtype_name in args.dtypes:
        dtype = dict(fp32=torch.float32, bf16=torch.bfloat16)[dtype_name]
        for route_name in args.routes:
            route = b.ROUTES[route_name]
            for bs in args.bs:
                rows = bs * route.tokens_per_req
                for mask_name in args.masks:
                    # fresh buffers per mask: the xg variants mask them in place
                    buffers = b.logits_buffers(rows, dtype)
                    density = DENSITIES[mask_name]
                    check_equal(route_name, bs, dtype, density, mask_fn, b.VOCAB, "cuda")
                    mask = random_bitmask(rows, b.VOCAB, density, "cuda")
                    label = f"{route_name} bs={bs} {dtype_name} mask={mask_name}"
                    ours = b.ours_step(route, bs)
                    fused = b.ours_step(route, bs, token_bitmask=mask)
                    r = dict(route=route_name, dtype=dtype_name, mask=mask_name, bs=bs)
                    r["ours_us"] = b.graph_time_us(ours, buffers, f"tokensampler {label}")
                    r["ours_mask_us"] = b.graph_time_us(fused, buffers, f"tokensampler+mask {label}")

                    def xg_ours(x, ours=ours, mask=mask):
                        mask_fn(x, mask)
                        return ours(x)
                    r["xg_ours_us"] = b.graph_time_us(xg_ours, buffers, f"xgrammar+tokensampler {label}")
                    fi = b.flashinfer_steps(route_name, rows)
                    fi_call = next((fi[k] for k in fi if "tensors" in k), next(iter(fi.values()), None))
                    if fi_call is not None:
                        def xg_fi(x, fi_call=fi_call, mask=mask):
                            mask_fn(x, mask)
                            return fi_call(x)
                        r["xg_fi_us"] = b.graph_time_us(xg_fi, buffers, f"xgrammar+flashinfer {label}")
                    r["ratio"] = r["ours_mask_us"] / r["ours_us"]
                    results.append(r)

                    def f(v):
                        return f"{v:9.1f}" if v is not None else f"{'-':>9}"
                    print(f"{route_name:<13}{dtype_name:<6}{mask_name:<6}{bs:>5}{f(r['ours_us'])}"
                          f"{r['ours_mask_us']:11.1f}{r['ratio']:7.3f}{f(r['xg_ours_us'])}"
                          f"{f(r.get('xg_fi_us'))}", flush=True)
                    del buffers
                    torch.cuda.empty_cache()
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 32, 128, 512])
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--routes", nargs="+", default=ROUTES)
    ap.add_argument("--masks", nargs="+", default=list(DENSITIES))
    ap.add_argument("--xgrammar-kernel", default=".xg/apply_token_bitmask_inplace_triton.py")
    ap.add_argument("--check-only", action="store_true",
                    help="only the ours+mask == xg+ours equality, on --device at --vocab")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--vocab", type=int, default=b.VOCAB)
    ap.add_argument("--json")
    args = ap.parse_args()
    mask_fn = xgrammar_masker(args.xgrammar_kernel)
    if args.check_only:
        for dtype_name in args.dtypes:
            dtype = dict(fp32=torch.float32, bf16=torch.bfloat16)[dtype_name]
            for route_name in args.routes:
                for bs in args.bs:
                    for mask_name in args.masks:
                        check_equal(route_name, bs, dtype, DENSITIES[mask_name], mask_fn,
                                    args.vocab, args.device)
        print("ours+mask == xg+ours: all equal")
        return
    results = run(args, mask_fn)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(device=torch.cuda.get_device_name(), vocab=b.VOCAB, results=results),
                      fh, indent=1)


if __name__ == "__main__":
    main()
