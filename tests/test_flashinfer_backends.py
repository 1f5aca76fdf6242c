"""FlashInfer adapter backends: refusal without CUDA/FlashInfer (CPU, in CI) and, on a GPU with
FlashInfer, the same contract and distributions as the gumbel backends."""

import importlib.util

import numpy as np
import pytest
import torch

import tokensampler as ts

from helpers import capture_graph
from reference import chi_square_pvalue, filtered_probs, penalized


def cfg(device, **kw):
    fields = dict(max_bs=4, max_draft_tokens_per_req=4, max_req_pool_size=8, vocab_size=64,
                  device=device)
    fields.update(kw)
    return ts.SamplingBackendConfig(**fields)


@pytest.mark.parametrize("name", ["flashinfer", "flashinfer_full"])
def test_cpu_config_is_refused_with_a_reason(name):
    with pytest.raises(ValueError, match="CUDA only"):
        ts.create_backend(name, cfg("cpu"))
    assert name not in ts.available_backends(cfg("cpu"))


@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is not None, reason="flashinfer installed")
def test_missing_flashinfer_says_what_to_install(monkeypatch):
    from tokensampler.backends import flashinfer as adapter

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    reason = adapter.flashinfer_unavailable_reason(torch.device("cuda", 0))
    assert "pip install tokensampler[flashinfer]" in reason


needs_fi = pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None,
                              reason="flashinfer not installed")
V, ROWS = 64, 256


def draw(name, params, row, calls=16, prompt=None, history_steps=()):
    backend = ts.create_backend(name, cfg("cuda", max_bs=ROWS, max_req_pool_size=ROWS))
    slots = list(range(1, ROWS + 1))
    backend.prepare_step([f"r{s}" for s in slots], slots,
                         [ts.SamplingParams(seed=s, **params) for s in slots],
                         prompt_token_ids=None if prompt is None else [prompt] * ROWS)
    info = ts.SamplingBatchInfo(torch.tensor(slots, dtype=torch.int32, device="cuda"),
                                torch.zeros(ROWS + 1, dtype=torch.int32, device="cuda"), V, "cuda")
    for forced in history_steps:
        forcing = torch.full((ROWS, V), -1e4, device="cuda")
        forcing[:, forced] = 1e4
        backend.sample(ts.LogitsProcessorOutput(forcing), info)
    snapshot = backend.slots.table.clone()
    out = []
    for call in range(calls):
        backend.slots.table.copy_(snapshot)
        info.valid_cache_lengths.fill_(call)
        tokens, _ = backend.sample(ts.LogitsProcessorOutput(row.cuda().expand(ROWS, V).contiguous()), info)
        out.append(tokens.cpu().numpy().copy())
    return np.concatenate(out), backend


ROUTES = [
    ("flashinfer", dict(temperature=1.0)),
    ("flashinfer", dict(temperature=0.8, top_k=10)),
    ("flashinfer", dict(temperature=1.1, top_p=0.8)),
    # top-k and top-p both bind on the test's row (dropping either changes the kept set)
    ("flashinfer", dict(temperature=0.9, top_k=6, top_p=0.95)),
    ("flashinfer_full", dict(temperature=1.2, min_p=0.1)),
    ("flashinfer_full", dict(temperature=1.0, top_k=6, top_p=0.9, min_p=0.01)),
]


@pytest.mark.cuda
@needs_fi
@pytest.mark.parametrize("name,params", ROUTES)
def test_adapter_distribution_matches_reference(name, params):
    row = torch.randn(V, generator=torch.Generator().manual_seed(3)) * 2
    samples, _ = draw(name, params, row)
    probs = filtered_probs(row.double().numpy(), **params)
    assert probs[samples].min() > 0
    assert chi_square_pvalue(samples, probs) > 1e-3


@pytest.mark.cuda
@needs_fi
@pytest.mark.parametrize("name", ["flashinfer", "flashinfer_full"])
def test_adapter_rows_with_a_pos_inf_z_take_their_argmax(name):
    """FlashInfer's softmax makes a row with a +inf z NaN, and its draw there differed between
    identical calls (run 55): the adapters give the row's argmax, here its one +inf z (a +inf
    logit; a finite logit past fp32's range over T), every call, in sample and in rejection
    verify."""
    backend = ts.create_backend(name, cfg("cuda"))
    slots = [1, 2, 3, 4]
    params = [ts.SamplingParams(seed=s, temperature=0.5, top_k=10, top_p=0.9) for s in slots]
    req = torch.tensor(slots, dtype=torch.int32, device="cuda")
    lengths = torch.zeros(9, dtype=torch.int32, device="cuda")
    gen = torch.Generator().manual_seed(5)

    def with_pos_inf_rows(rows):
        logits = torch.randn(rows, V, generator=gen)
        logits[0, 7] = float("inf")
        logits[1, 11] = 3e38  # z = x / 0.5 overflows to +inf
        return logits.cuda()

    backend.prepare_step([f"r{s}" for s in slots], slots, params)
    for _ in range(3):
        tokens, _ = backend.sample(ts.LogitsProcessorOutput(with_pos_inf_rows(4)),
                                   ts.SamplingBatchInfo(req, lengths, V, "cuda"))
        assert tokens[:2].tolist() == [7, 11]
    backend.prepare_step([f"r{s}" for s in slots], slots, params, num_tokens_per_req=4)
    candidates = torch.randint(12, V, (4, 4), generator=gen, dtype=torch.int32).cuda()
    draft_probs = torch.softmax(torch.randn(4, 3, V, generator=gen), -1).cuda()
    for _ in range(3):
        predict, _ = backend.verify(
            ts.LogitsProcessorOutput(with_pos_inf_rows(16)),
            ts.SamplingBatchInfo(req, lengths, V, "cuda", draft_probs=draft_probs), candidates)
        # row 0 (request 0's first): the draft (never 7) is rejected for the one-hot at 7
        assert predict[0].item() == 7


@pytest.mark.cuda
@needs_fi
def test_full_adapter_penalties_and_bias_distribution():
    params = dict(temperature=1.0, top_k=25, repetition_penalty=1.5, frequency_penalty=0.4,
                  presence_penalty=0.3, logit_bias={3: 2.5, 4: -1.0})
    row = torch.randn(V, generator=torch.Generator().manual_seed(4)) * 2
    samples, _ = draw("flashinfer_full", params, row, prompt=[1, 2, 3, 5], history_steps=(2, 7, 7))
    l = penalized(row.double().numpy(), {2: 1, 7: 2}, [1, 2, 3, 5], 1.5, 0.4, 0.3, {3: 2.5, 4: -1.0})
    probs = filtered_probs(l, temperature=1.0, top_k=25)
    assert probs[samples].min() > 0
    assert chi_square_pvalue(samples, probs) > 1e-3


@pytest.mark.cuda
@needs_fi
def test_full_adapter_processed_logits_equal_gumbel_full():
    params = ts.SamplingParams(seed=1, repetition_penalty=1.3, frequency_penalty=0.5,
                               presence_penalty=0.2, logit_bias={5: 1.0, 9: -2.0})
    fi = ts.create_backend("flashinfer_full", cfg("cuda"))
    ref = ts.create_backend("gumbel_full", cfg("cpu"))
    for b, dev in ((fi, "cuda"), (ref, "cpu")):
        b.prepare_step(["a"], [1], [params], num_tokens_per_req=4, prompt_token_ids=[[1, 5, 7]])
    logits = torch.randn(4, V)
    logits[0, 3] = float("nan")
    candidates = torch.tensor([[0, 7, 8, 7]], dtype=torch.int32)
    outs = []
    for b, dev in ((fi, "cuda"), (ref, "cpu")):
        out = torch.empty(4, V, device=dev)
        torch.ops.tokensampler.penalize_logits(
            logits.to(dev), torch.tensor([1], dtype=torch.int32, device=dev), b.slots.table,
            b.slots.history_capacity, b.slots.bias_capacity, 4, candidates.to(dev), 0, out)
        outs.append(out.cpu())
    assert torch.equal(outs[0], outs[1])


@pytest.mark.cuda
@needs_fi
@pytest.mark.parametrize("name", ["flashinfer", "flashinfer_full"])
def test_adapter_graph_capture_every_variant(name):
    backend = ts.create_backend(name, cfg("cuda"))
    info = ts.SamplingBatchInfo(torch.arange(1, 5, dtype=torch.int32, device="cuda"),
                                torch.zeros(9, dtype=torch.int32, device="cuda"), V, "cuda")
    logits = torch.randn(4, V, device="cuda")
    for variant in backend.cuda_graph_capture_variants(1):
        backend.prepare_capture_variant(bs=4, num_tokens_per_req=1, variant=variant)
        out = ts.LogitsProcessorOutput(logits)
        graph, (tokens, _) = capture_graph(lambda: backend.sample(out, info))
        graph.replay()
        torch.cuda.synchronize()
        assert ((tokens >= 0) & (tokens < V)).all()
    backend.reset_capture_state()


@pytest.mark.cuda
@needs_fi
def test_full_adapter_rejection_sampling_is_lossless():
    """chain_speculative_sampling behind the contract: emitted first tokens follow the target."""
    Vs, n, bs = 12, 2, 200
    g = torch.Generator().manual_seed(8)
    target_logits = torch.randn(Vs, generator=g) * 1.5
    q = torch.softmax(torch.randn(Vs, generator=g) * 1.5, -1)
    backend = ts.create_backend("flashinfer_full", ts.SamplingBackendConfig(
        max_bs=bs, max_draft_tokens_per_req=n, max_req_pool_size=bs, vocab_size=Vs, device="cuda"))
    slots = list(range(1, bs + 1))
    backend.prepare_step([f"r{s}" for s in slots], slots, [ts.SamplingParams(seed=s) for s in slots],
                         num_tokens_per_req=n)
    first, accepted = [], 0
    for call in range(20):
        drafts = torch.multinomial(q, bs, replacement=True, generator=g).to(torch.int32)
        candidates = torch.stack([torch.zeros(bs, dtype=torch.int32), drafts], 1).cuda()
        info = ts.SamplingBatchInfo(torch.tensor(slots, dtype=torch.int32, device="cuda"),
                                    torch.full((bs + 1,), call * 3, dtype=torch.int32, device="cuda"),
                                    Vs, "cuda", draft_probs=q.expand(bs, n - 1, Vs).contiguous().cuda())
        predict, accept = backend.verify(
            ts.LogitsProcessorOutput(target_logits.expand(bs * n, Vs).contiguous().cuda()), info,
            candidates)
        first.extend(predict.view(bs, n)[:, 0].tolist())
        accepted += int((accept == 2).sum())
    assert 0 < accepted < 20 * bs
    assert chi_square_pvalue(np.array(first), filtered_probs(target_logits.double().numpy())) > 1e-3


@pytest.mark.parametrize("name", ["flashinfer", "flashinfer_full"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_processed_logprobs_are_refused_first(name, device, monkeypatch):
    """Refused at construction, before FlashInfer's availability is even asked, so no machine
    silently returns raw logprobs for a processed-logprobs config."""
    from tokensampler.backends import flashinfer as adapter

    asked = []
    monkeypatch.setattr(adapter, "flashinfer_unavailable_reason", lambda d: asked.append(d))
    config = cfg(device, enable_output_logprobs=True, logprobs_mode="processed")
    with pytest.raises(ValueError, match=r"logprobs_mode='processed' is not available.*"
                                         r"'gumbel' or 'gumbel_full'"):
        ts.create_backend(name, config)
    assert asked == []
    assert name not in ts.available_backends(config)
    # raw logprobs, or processed mode without logprobs, reach the availability check
    for ok in (cfg(device, enable_output_logprobs=True),
               cfg(device, logprobs_mode="processed")):
        assert adapter.flashinfer_config_refusal(ok) is None


def test_an_invalid_row_ends_the_chain_in_the_post_pass():
    """The FlashInfer adapters' rejection verify ends a chain at its first emitted invalid row
    (DESIGN §4: token 0, accept up to and including it, nothing flagged past it); rows past the
    chain are -1. Four requests of 3 rows: none invalid; row 1 invalid but accepted through by
    FlashInfer; row 2 invalid past the chain; row 0 invalid."""
    from tokensampler.backends.flashinfer import end_chains_at_invalid_rows

    predict = torch.tensor([5, 6, 7, 5, 0, 9, 4, -1, -1, 3, 8, -1], dtype=torch.int32)
    accept = torch.tensor([3, 3, 1, 2], dtype=torch.int32)
    invalid = torch.tensor([0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 1], dtype=torch.bool)
    end_chains_at_invalid_rows(predict, accept, invalid)
    assert accept.tolist() == [3, 2, 1, 1]
    assert predict.tolist() == [5, 6, 7, 5, 0, -1, 4, -1, -1, 0, -1, -1]
    assert invalid.tolist() == [False] * 4 + [True] + [False] * 4 + [True, False, False]


@pytest.mark.cuda
@needs_fi
def test_full_adapter_rejection_verify_ends_at_an_invalid_row():
    """A draft the target surely accepts (one-hot target and draft) at row 0, then an invalid
    row whose draft is token 0, which FlashInfer alone would accept too (the invalid row's
    stand-in distribution is token 0): the chain ends there with token 0, accept 2."""
    Vs, n = 16, 3
    backend = ts.create_backend("flashinfer_full", ts.SamplingBackendConfig(
        max_bs=1, max_draft_tokens_per_req=n, max_req_pool_size=2, vocab_size=Vs, device="cuda"))
    backend.prepare_step(["r"], [1], [ts.SamplingParams(seed=3)], num_tokens_per_req=n)
    logits = torch.full((n, Vs), -1e4)
    logits[0, 5] = 10.0
    logits[1] = float("-inf")
    logits[2, 7] = 10.0
    q = torch.zeros(1, n - 1, Vs)
    q[0, 0, 5] = 1.0
    q[0, 1, 0] = 1.0
    candidates = torch.tensor([[2, 5, 0]], dtype=torch.int32, device="cuda")
    info = ts.SamplingBatchInfo(torch.tensor([1], dtype=torch.int32, device="cuda"),
                                torch.zeros(3, dtype=torch.int32, device="cuda"), Vs, "cuda",
                                draft_probs=q.cuda())
    predict, accept = backend.verify(ts.LogitsProcessorOutput(logits.cuda()), info, candidates)
    assert accept.tolist() == [2]
    assert predict.tolist() == [5, 0, -1]
    assert backend.invalid_rows[:n].tolist() == [False, True, False]


@pytest.mark.cuda
@needs_fi
@pytest.mark.parametrize("name", ["flashinfer", "flashinfer_full"])
def test_adapter_slots_outside_the_pool_and_padded_indices(name):
    """The adapters gather parameters from the pools outside tokensampler's kernels: a slot
    outside the pool must read as the kernels read it (token 0, flagged, logprob -inf, DESIGN
    §5), not as a device-side assert, and req_pool_indices longer than the batch is padding."""
    Vs, n = 64, 2
    backend = ts.create_backend(name, ts.SamplingBackendConfig(
        max_bs=3, max_draft_tokens_per_req=n, max_req_pool_size=3, vocab_size=Vs, device="cuda",
        enable_output_logprobs=True))
    backend.prepare_step(["a", "b"], [1, 2], [ts.SamplingParams(seed=1), ts.SamplingParams(seed=2)],
                         num_tokens_per_req=n)
    info = ts.SamplingBatchInfo(torch.tensor([1, 9, 3], dtype=torch.int32, device="cuda"),
                                torch.zeros(4, dtype=torch.int32, device="cuda"), Vs, "cuda")
    out = ts.LogitsProcessorOutput(torch.randn(2, Vs, device="cuda"))
    tokens, _ = backend.sample(out, info)
    assert tokens[1].item() == 0 and backend.invalid_rows[:2].tolist() == [False, True]
    assert out.next_token_logprobs[1].item() == float("-inf")
    q = torch.full((2, n - 1, Vs), 1.0 / Vs, device="cuda")
    for draft_probs in (None, q):
        info.draft_probs = draft_probs
        cands = torch.tensor([[0, 5], [0, 7]], dtype=torch.int32, device="cuda")
        predict, accept = backend.verify(ts.LogitsProcessorOutput(torch.randn(4, Vs, device="cuda")),
                                         info, cands)
        assert predict.tolist()[2:] == [0, -1] and accept.tolist()[1] == 1
        torch.cuda.synchronize()
