"""Grammar token bitmasks (xgrammar / llguidance layout) applied to logits with torch ops, for
code that samples outside tokensampler's kernels (the FlashInfer adapters, greedy's logprobs);
the kernels take the bitmask themselves (`token_bitmask=` of the ops, DESIGN §3.0).

A bitmask row is int32 [ceil(V / 32)]: bit j of word w allows token 32 w + j (bits past V are
ignored). Applying it gives the logits with every disallowed token at -inf, in fp32, written into
caller-owned buffers: no allocation, no host sync, so a step that applies it can be captured in a
CUDA graph (DESIGN §3.0). Exactly what `xgrammar.apply_token_bitmask_inplace` does to a copy of
the logits, except that the copy is fp32 (bf16 / fp16 values convert exactly).
"""

from __future__ import annotations

import torch

__all__ = ["bitmask_words", "pack_token_bitmask", "TokenBitmaskScratch", "apply_token_bitmask"]


def bitmask_words(vocab_size: int) -> int:
    """int32 words per bitmask row: ceil(V / 32)."""
    return (vocab_size + 31) // 32


def pack_token_bitmask(allowed: torch.Tensor) -> torch.Tensor:
    """bool [rows, 32 * words] (True: allowed) -> int32 [rows, words] in xgrammar's layout: bit j
    of word w allows token 32 w + j."""
    rows = allowed.size(0)
    shifts = torch.arange(32, device=allowed.device)
    words = (allowed.reshape(rows, -1, 32).long() << shifts).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


class TokenBitmaskScratch:
    """Buffers for masking up to `rows` rows of `vocab_size` logits, allocated once:
    fp32 masked logits [rows, V], int32 unpacked bits [rows, words, 32], bool banned [rows, V]."""

    @staticmethod
    def nbytes(rows: int, vocab_size: int) -> int:
        """Bytes the buffers of `rows` rows take."""
        return rows * (4 * vocab_size + 4 * 32 * bitmask_words(vocab_size) + vocab_size)

    def __init__(self, rows: int, vocab_size: int, device: torch.device) -> None:
        words = bitmask_words(vocab_size)
        self.vocab_size = vocab_size
        self.masked = torch.empty((rows, vocab_size), dtype=torch.float32, device=device)
        self.bits = torch.empty((rows, words, 32), dtype=torch.int32, device=device)
        self.banned = torch.empty((rows, vocab_size), dtype=torch.bool, device=device)
        self.shifts = torch.arange(32, dtype=torch.int32, device=device)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor,
                        scratch: TokenBitmaskScratch | None = None) -> torch.Tensor:
    """fp32 [rows, V] view of `scratch.masked` (of fresh buffers without one): `logits` with the
    tokens `bitmask` disallows at -inf (NaN and +inf of allowed tokens kept). The caller has
    checked the shapes."""
    rows, vocab = logits.shape
    if scratch is None:
        scratch = TokenBitmaskScratch(rows, vocab, logits.device)
    bits = scratch.bits[:rows]
    torch.bitwise_right_shift(bitmask.unsqueeze(-1), scratch.shifts, out=bits)
    torch.bitwise_and(bits, 1, out=bits)
    banned = scratch.banned[:rows]
    torch.eq(bits.view(rows, -1)[:, :vocab], 0, out=banned)
    masked = scratch.masked[:rows]
    masked.copy_(logits)
    masked.masked_fill_(banned, float("-inf"))
    return masked
