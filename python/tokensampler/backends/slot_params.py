"""Conversion of SamplingParams into the native SlotParams the SlotStateManager stores."""

from __future__ import annotations

from .. import _C
from ..params import SamplingParams, derive_seed


def seed_for(sp: SamplingParams, rid: str) -> int:
    """The request's seed, or the one `SamplingParams.resolve_seed` would derive from rid
    (computed without mutating the caller's object)."""
    return int(sp.seed) if sp.seed is not None else derive_seed(rid)


def to_slot_params(sp: SamplingParams, rid: str, vocab_size: int) -> _C.SlotParams:
    if not isinstance(sp, SamplingParams):
        raise TypeError(f"sampling_params_list entry for rid={rid!r} is a {type(sp).__name__}, "
                        f"not SamplingParams")
    sp.normalize(vocab_size)
    return _C.SlotParams(
        temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p, min_p=sp.min_p,
        repetition_penalty=sp.repetition_penalty, frequency_penalty=sp.frequency_penalty,
        presence_penalty=sp.presence_penalty, seed=seed_for(sp, rid),
        logit_bias=sorted((sp.logit_bias or {}).items()))
