"""Small builders shared by the CPU tests."""

from __future__ import annotations

import torch

import tokensampler as ts

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
