"""Conversion of SamplingParams into the native SlotParams the SlotStateManager stores."""

from __future__ import annotations

from .. import _C
from ..params import GREEDY_TEMPERATURE, SamplingParams, derive_seed
from .checks import check_params


def seed_for(sp: SamplingParams, rid: str) -> int:
    """The request's seed, or the one `SamplingParams.resolve_seed` would derive from rid
    (computed without mutating the caller's object)."""
    return int(sp.seed) if sp.seed is not None else derive_seed(rid)


def penalty_field(sp: SamplingParams) -> str | None:
    """The first penalty of `sp` (normalised) that is not neutral, or None: what reads the
    slot's token history."""
    for name, neutral in (("repetition_penalty", 1.0), ("frequency_penalty", 0.0),
                          ("presence_penalty", 0.0)):
        if getattr(sp, name) != neutral:
            return f"{name}={getattr(sp, name)}"
    return None


def bias_field(sp: SamplingParams) -> str | None:
    """`sp`'s logit bias, if it has one, as a refusal names it, or None."""
    return f"logit_bias with {len(sp.logit_bias)} entries" if sp.logit_bias else None


def unsupported_field(sp: SamplingParams) -> str | None:
    """The first field of `sp` (normalised) that asks for more than temperature, top-k, top-p
    and seed, or None: what a backend without penalties, bias and min-p cannot honour."""
    if sp.min_p > 0.0:
        return f"min_p={sp.min_p}"
    return penalty_field(sp) or bias_field(sp)


def to_slot_params(sp: SamplingParams, rid: str, vocab_size: int) -> _C.SlotParams:
    sp = check_params(sp, rid, vocab_size)
    # Positional (the binding's order: temperature, top_k, top_p, min_p, repetition, frequency,
    # presence, seed, logit_bias): pybind11 matches keywords at ~1 us a call.
    return _C.SlotParams(
        # Below GREEDY_TEMPERATURE the slot is greedy: the kernels see temperature 0.
        0.0 if sp.temperature < GREEDY_TEMPERATURE else sp.temperature,
        sp.top_k, sp.top_p, sp.min_p, sp.repetition_penalty, sp.frequency_penalty,
        sp.presence_penalty, seed_for(sp, rid), sorted(sp.logit_bias.items()) if sp.logit_bias else [])
