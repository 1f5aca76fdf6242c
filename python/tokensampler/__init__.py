"""tokensampler: exact, batch-invariant token sampling for LLM inference engines.

    import tokensampler as ts
    backend = ts.create_backend("gumbel_full", ts.SamplingBackendConfig(...))
"""

import torch  # noqa: F401  (loads libtorch before the native module)

from . import _C  # noqa: F401  (registers torch.ops.tokensampler.*)
from .backends.base import SamplingBackend
from .batch import LogitsProcessorOutput, SamplingBatchInfo
from .build import build_info, package_version
from .config import DEFAULT_RANDOM_SEED, SamplingBackendConfig
from .params import SamplingParams
from .registry import available_backends, create_backend

__version__ = package_version()
built_with_cuda = _C.built_with_cuda

__all__ = [
    "SamplingParams", "SamplingBackendConfig", "SamplingBatchInfo", "LogitsProcessorOutput",
    "SamplingBackend", "create_backend", "available_backends", "DEFAULT_RANDOM_SEED",
    "built_with_cuda", "build_info", "__version__",
]
