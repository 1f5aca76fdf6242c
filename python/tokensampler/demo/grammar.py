"""JSON-schema-constrained requests with xgrammar (optional: `pip install tokensampler[grammar]`).

Each constrained request has a `GrammarMatcher`; every step the engine asks `StepMasks` for one
bitmask row per logits row and hands it to the backend as `SamplingBatchInfo.token_bitmask`.
In speculative decoding, verify row j of a request needs the mask after drafts 1..j: the matcher
is advanced through the drafts (filling a row after each) and rolled back, so it only ever holds
the tokens the request has output. Unconstrained rows are all ones (-1).
"""

from __future__ import annotations

import importlib.util
import json

import torch

from ..bitmask import bitmask_words

__all__ = ["xgrammar_available", "PERSON_SCHEMA", "compile_json_schema", "new_matcher",
           "StepMasks"]

PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 24},
                   "age": {"type": "integer", "minimum": 0, "maximum": 150}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def xgrammar_available() -> bool:
    return importlib.util.find_spec("xgrammar") is not None


def compile_json_schema(tokenizer, vocab_size: int, schema: dict):
    """xgrammar's compiled grammar for `schema` over the model's (padded) vocabulary."""
    import xgrammar

    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    compiler = xgrammar.GrammarCompiler(info, max_threads=1)
    return compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)


def new_matcher(compiled_grammar):
    import xgrammar

    return xgrammar.GrammarMatcher(compiled_grammar)


class StepMasks:
    """A host bitmask buffer filled by the matchers and its persistent copy on the device."""

    def __init__(self, rows: int, vocab_size: int, device: torch.device) -> None:
        words = bitmask_words(vocab_size)
        self.host = torch.full((rows, words), -1, dtype=torch.int32)
        self.device_buffer = (self.host if device.type == "cpu" else
                              torch.full((rows, words), -1, dtype=torch.int32, device=device))

    def fill(self, matchers, candidates: list[list[int]]) -> torch.Tensor:
        """Rows [B * n, words] for requests with `matchers[b]` (None: unconstrained) whose verify
        rows are candidates[b] (n = 1: plain decoding)."""
        n = len(candidates[0])
        for b, (matcher, cand) in enumerate(zip(matchers, candidates)):
            base = b * n
            self.host[base:base + n].fill_(-1)
            if matcher is None:
                continue
            matcher.fill_next_token_bitmask(self.host, base)
            advanced = 0
            for j in range(1, n):
                # A draft the grammar refuses is never accepted (row j-1 bans it): rows past it
                # stay all ones, and verify does not use them.
                if matcher.is_terminated() or not matcher.accept_token(cand[j]):
                    break
                advanced += 1
                matcher.fill_next_token_bitmask(self.host, base + j)
            if advanced:
                matcher.rollback(advanced)
        rows = len(candidates) * n
        if self.device_buffer is not self.host:
            self.device_buffer[:rows].copy_(self.host[:rows], non_blocking=False)
        return self.device_buffer[:rows]
