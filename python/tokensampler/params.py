"""Per-request sampling parameters (DESIGN §1)."""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass, field
from typing import Mapping

__all__ = ["SamplingParams", "derive_seed", "GREEDY_TEMPERATURE"]

# Temperatures below this sample greedily (vLLM's _SAMPLING_EPS): l / T would overflow fp32 for
# T near FLT_MIN, and no fp32 logit gap would let such a T sample anything but the argmax.
GREEDY_TEMPERATURE = 1e-5

_FIELD_RANGES = {
    # field: (low, high, low_inclusive, high_inclusive)
    "temperature": (0.0, math.inf, True, False),
    "top_p": (0.0, 1.0, False, True),
    "min_p": (0.0, 1.0, True, True),
    "frequency_penalty": (-2.0, 2.0, True, True),
    "presence_penalty": (-2.0, 2.0, True, True),
    "repetition_penalty": (0.0, math.inf, False, False),
}


def _fast_range(low, high, low_inc, high_inc) -> tuple[float, float]:
    """A closed interval inside the field's range whose floats float32 keeps inside it: a
    float there needs none of _check_number's other tests. An excluded 0 or inf is kept clear
    of (float32 rounds nothing in [1e-30, 3e38] to either); another excluded bound, which
    float32 could round onto, gets no fast interval."""
    fast_low = low if low_inc else 1e-30 if low == 0.0 else math.inf
    fast_high = high if high_inc else 3e38 if high == math.inf else -math.inf
    return fast_low, fast_high


def _check_number(name: str, value, low, high, low_inc, high_inc) -> float:
    fast_low, fast_high = _FAST_RANGES[name]
    if type(value) is float and fast_low <= value <= fast_high:  # the common case, ~0.2 us
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    try:
        value = float(value)
    except OverflowError:
        raise ValueError(f"{name}={value} is outside [{low}, {high}]") from None
    if math.isnan(value):
        raise ValueError(f"{name}=nan is not a number")
    lb, hb = "[" if low_inc else "(", "]" if high_inc else ")"
    if not _within(value, low, high, low_inc, high_inc):
        raise ValueError(f"{name}={value} is outside {lb}{low}, {high}{hb}")
    # Slots hold float32: a value that float32 rounds out of the range (to inf, or to 0 where 0
    # is excluded) would change meaning there.
    stored = _as_float32(value)
    if not _within(stored, low, high, low_inc, high_inc):
        raise ValueError(f"{name}={value} is stored as float32 {stored}, outside "
                         f"{lb}{low}, {high}{hb}")
    return value


_FAST_RANGES = {name: _fast_range(*bounds) for name, bounds in _FIELD_RANGES.items()}


def _within(value: float, low, high, low_inc: bool, high_inc: bool) -> bool:
    return (value >= low if low_inc else value > low) and (value <= high if high_inc else value < high)


def _as_float32(value: float) -> float:
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:  # beyond float32's largest finite value after rounding
        return math.copysign(math.inf, value)


def derive_seed(rid: str) -> int:
    """The deterministic 63-bit seed of a request that gave none, derived from its id."""
    digest = hashlib.blake2b(str(rid).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


@dataclass
class SamplingParams:
    """What one request asks of the sampler.

    temperature 0 (below GREEDY_TEMPERATURE) or top_k 1 is greedy; top_k -1 and top_p 1 disable those filters;
    seed None is replaced by a value derived from the request id (`resolve_seed`);
    logit_bias maps token ids (int or decimal str) to an additive bias.
    """

    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    logit_bias: Mapping[int | str, float] | None = field(default=None)

    def resolve_seed(self, rid: str) -> int:
        """Fills a missing seed with a deterministic 63-bit value derived from `rid`."""
        if self.seed is None:
            self.seed = derive_seed(rid)
        return self.seed

    def normalize(self, vocab_size: int | None = None) -> "SamplingParams":
        """Validates every field (ValueError/TypeError naming field and value) and converts
        them to canonical types. Idempotent."""
        for name, bounds in _FIELD_RANGES.items():
            setattr(self, name, _check_number(name, getattr(self, name), *bounds))
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise TypeError(f"top_k must be an int, got {type(self.top_k).__name__} {self.top_k!r}")
        if self.top_k < -1 or self.top_k == 0:
            raise ValueError(f"top_k={self.top_k} must be -1 (disabled) or >= 1")
        if self.top_k >= 2**31:
            raise ValueError(f"top_k={self.top_k} must be < 2^31")
        if self.seed is not None:
            if isinstance(self.seed, bool) or not isinstance(self.seed, int):
                raise TypeError(f"seed must be an int or None, got {type(self.seed).__name__} {self.seed!r}")
            if not 0 <= self.seed < 2**64:
                raise ValueError(f"seed={self.seed} is outside [0, 2^64)")
        if self.logit_bias is not None:
            self.logit_bias = self._normalized_bias(vocab_size)
        return self

    def _normalized_bias(self, vocab_size: int | None) -> dict[int, float]:
        if not isinstance(self.logit_bias, Mapping):
            raise TypeError(f"logit_bias must be a mapping, got {type(self.logit_bias).__name__}")
        out: dict[int, float] = {}
        for key, value in self.logit_bias.items():
            # An int, or a string of decimal digits (OpenAI's JSON keys): int() alone would
            # also take " 5", "+5" and "5_0".
            if isinstance(key, str) and key.isascii() and key.isdigit():
                if len(key) > 20:  # past 2^64, and past what int() converts without a limit
                    raise ValueError(f"logit_bias key {key[:20]!r}... ({len(key)} digits) is "
                                     f"outside [0, {vocab_size})")
                token = int(key)
            elif isinstance(key, int) and not isinstance(key, bool):
                token = key
            else:
                raise TypeError(f"logit_bias key {key!r} is not a token id (an int or a "
                                f"string of decimal digits)")
            if token < 0 or (vocab_size is not None and token >= vocab_size):
                raise ValueError(f"logit_bias token {token} is outside [0, {vocab_size})")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"logit_bias[{token}] must be a number, got {value!r}")
            try:
                value = float(value)
            except OverflowError:  # an int beyond fp64: as large a bias as +-inf
                value = math.inf if value > 0 else -math.inf
            if math.isnan(value):
                raise ValueError(f"logit_bias[{token}]=nan is not a number")
            out[token] = value
        return out
