"""Prompt-lookup drafting: propose the tokens that followed the latest earlier occurrence of the
context's last n-gram (no draft model; works well when the answer copies from the prompt)."""

from __future__ import annotations

from typing import Sequence

__all__ = ["prompt_lookup_drafts"]


def prompt_lookup_drafts(context: Sequence[int], num_draft: int, max_ngram: int = 3,
                         min_ngram: int = 1) -> list[int]:
    """Up to `num_draft` draft tokens for `context` (prompt + output so far).

    Tries the longest n-gram first (max_ngram down to min_ngram): finds the most recent earlier
    occurrence of the context's last n tokens and returns what followed it. [] when nothing
    matches or num_draft <= 0."""
    if num_draft <= 0:
        return []
    ctx = list(context)
    size = len(ctx)
    for n in range(min(max_ngram, size - 1), min_ngram - 1, -1):
        pattern = ctx[size - n:]
        # Latest start first; the occurrence must end before the suffix itself does.
        for start in range(size - n - 1, -1, -1):
            if ctx[start:start + n] == pattern:
                follow = ctx[start + n:start + n + num_draft]
                if follow:
                    return follow
    return []
