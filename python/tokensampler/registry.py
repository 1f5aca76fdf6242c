"""Backend registry: names -> backend classes."""

from __future__ import annotations

from .backends.base import SamplingBackend
from .backends.greedy import GreedySamplingBackend
from .backends.gumbel import GumbelSamplingBackend
from .backends.gumbel_full import GumbelFullSamplingBackend
from .config import SamplingBackendConfig

__all__ = ["create_backend", "available_backends"]

_BACKENDS: dict[str, type[SamplingBackend]] = {
    "greedy": GreedySamplingBackend,
    "gumbel": GumbelSamplingBackend,
    "gumbel_full": GumbelFullSamplingBackend,
}


def available_backends() -> list[str]:
    return list(_BACKENDS)


def create_backend(name: str, config: SamplingBackendConfig) -> SamplingBackend:
    """Builds the backend `name` for `config`. Unknown names raise ValueError listing the names."""
    if name not in _BACKENDS:
        raise ValueError(f"unknown sampling backend {name!r}; available: {available_backends()}")
    return _BACKENDS[name](config)
