"""Small builders shared by the tests."""

from __future__ import annotations

import torch

import tokensampler as ts
from tokensampler import _C

VOCAB = 1024
POOL = 8


def make_config(**overrides) -> ts.SamplingBackendConfig:
    fields = dict(max_bs=4, max_draft_tokens_per_req=4, max_req_pool_size=POOL,
                  vocab_size=VOCAB, device="cpu")
    fields.update(overrides)
    return ts.SamplingBackendConfig(**fields)


def batch_info(pool_indices, cache_lengths=None, pool_rows=POOL + 1, vocab=VOCAB, device="cpu",
               draft_probs=None) -> ts.SamplingBatchInfo:
    lengths = torch.zeros(pool_rows, dtype=torch.int32)
    if cache_lengths is not None:
        for slot, t in zip(pool_indices, cache_lengths):
            lengths[slot] = t
    return ts.SamplingBatchInfo(
        req_pool_indices=torch.tensor(pool_indices, dtype=torch.int32, device=device),
        valid_cache_lengths=lengths.to(device), vocab_size=vocab, device=device,
        draft_probs=draft_probs)


def sample_once(backend, logits, pool_indices, cache_lengths=None, pool_rows=POOL + 1):
    out = ts.LogitsProcessorOutput(next_token_logits=logits)
    tokens, lengths = backend.sample(out, batch_info(pool_indices, cache_lengths, pool_rows,
                                                     logits.size(1), str(logits.device)))
    return tokens.clone(), lengths.clone(), out


# ---- the GPU tests: one backend per device, fed the same steps
def backends(V, bs, n=1, name="gumbel", **cfg):
    out = []
    for device in ("cpu", "cuda"):
        out.append(ts.create_backend(name, ts.SamplingBackendConfig(
            max_bs=bs, max_draft_tokens_per_req=n, max_req_pool_size=bs, vocab_size=V,
            device=device, **cfg)))
    return out


def run(backend, logits, bs, t0, device, n=1, candidates=None):
    info = ts.SamplingBatchInfo(torch.arange(1, bs + 1, dtype=torch.int32, device=device),
                                torch.full((bs + 1,), t0, dtype=torch.int32, device=device),
                                logits.size(1), device)
    out = ts.LogitsProcessorOutput(logits.to(device))
    if n == 1:
        tokens, _ = backend.sample(out, info)
    else:
        tokens, _ = backend.verify(out, info, candidates.to(device))
    lp = None if out.next_token_logprobs is None else out.next_token_logprobs.cpu().clone()
    return tokens.cpu().clone(), lp


def accepted_drafts(cpu_backend, logits, bs, t0, n, candidates, reject_every=3):
    """candidates [bs, n] with drafts 1..n-1 replaced by the chain the CPU backend accepts (each
    draft the target token of the row before it, as `run` samples them at positions t0 + j),
    except that every `reject_every`-th request gets one wrong draft (at varying j), so verify
    compares accepted rows past the first and rejections at every depth. Drafts are chosen one
    at a time (a target reads the drafts before it through penalties) with the sample_rows op,
    which changes no backend state."""
    b = cpu_backend
    cand = candidates.clone()
    V = logits.size(1)
    rows = bs * n
    slots = torch.arange(1, bs + 1, dtype=torch.int32)
    lengths = torch.full((bs + 1,), t0, dtype=torch.int32)
    out = torch.empty(rows, dtype=torch.int32)
    invalid = torch.empty(rows, dtype=torch.bool)
    for j in range(1, n):
        torch.ops.tokensampler.sample_rows(
            logits, slots, lengths, b.slots.table, b.slots.history_capacity,
            b.slots.bias_capacity, n, cand, b._FULL, 0, 0, 0, out, invalid, None, None, None,
            None, None)
        cand[:, j] = out.view(bs, n)[:, j - 1]
    for r in range(1, bs, reject_every):
        j = 1 + (r // reject_every) % (n - 1)
        cand[r, j] = (cand[r, j] + 1) % V
    return cand


def capture_graph(step):
    """A CUDA graph of step() after one warm-up call on a side stream, as engines capture: the
    graph and what the captured call returned (its output tensors, which each replay refills)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = step()
    return graph, result


def tickets_are_zero(workspace: torch.Tensor) -> bool:
    """The ticket area of csrc/cuda/workspace.h (after the tail of the sections, 4 bytes a row)
    is all zero: every single-launch kernel left the tickets it took as it found them."""
    base = _C.sample_rows_workspace_bytes(0)
    per_row = _C.sample_rows_workspace_bytes(1) - base
    served = (workspace.numel() - base) // per_row
    start = served * (per_row - 4) + base
    return bool((workspace[start:start + 4 * served] == 0).all())

