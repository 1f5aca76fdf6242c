"""Backend registry: names -> backend classes."""

from __future__ import annotations

import torch

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


# Listed only where FlashInfer imports and a CUDA device is present.
_FLASHINFER_BACKENDS = ("flashinfer", "flashinfer_full")


def _flashinfer_backend(name: str) -> type[SamplingBackend]:
    from .backends.flashinfer import FlashInferFullSamplingBackend, FlashInferSamplingBackend

    return FlashInferSamplingBackend if name == "flashinfer" else FlashInferFullSamplingBackend


def available_backends(config: SamplingBackendConfig | None = None) -> list[str]:
    """Backend names usable here (for `config`'s device when given, else the current CUDA device)."""
    from .backends.flashinfer import flashinfer_config_refusal, flashinfer_unavailable_reason

    device = config.torch_device if config is not None else torch.device("cuda")
    names = list(_BACKENDS)
    refused = config is not None and flashinfer_config_refusal(config) is not None
    if not refused and flashinfer_unavailable_reason(device) is None:
        names += list(_FLASHINFER_BACKENDS)
    return names


def create_backend(name: str, config: SamplingBackendConfig) -> SamplingBackend:
    """Builds the backend `name` for `config`. Unknown names raise ValueError listing the names;
    the FlashInfer backends raise ValueError saying why they cannot run here."""
    if name in _FLASHINFER_BACKENDS:
        return _flashinfer_backend(name)(config)
    if name not in _BACKENDS:
        raise ValueError(f"unknown sampling backend {name!r}; known: "
                         f"{list(_BACKENDS) + list(_FLASHINFER_BACKENDS)}")
    return _BACKENDS[name](config)
