"""What this build of tokensampler is (version, torch, CUDA, GPU architectures) and whether its
CUDA kernels can run on a given GPU."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import torch

from . import _C

__all__ = ["build_info", "package_version", "serves_capability", "unsupported_gpu_reason",
           "check_device_supported"]


def build_info() -> dict:
    """The facts recorded when the native module was built:

    - ``version``: tokensampler's version (pyproject.toml)
    - ``torch``: the torch version it was compiled against (``torch==X.Y.*`` is ABI-compatible)
    - ``torch_cuda``: that torch's CUDA version (None for a CPU torch)
    - ``with_cuda``: whether the CUDA kernels were compiled
    - ``cuda``: the CUDA toolkit (nvcc) version that compiled them (None without CUDA)
    - ``cuda_archs``: GPU architectures with machine code, e.g. ``["sm_80", "sm_90"]``
      (empty without CUDA)
    - ``cuda_ptx``: architectures whose PTX is embedded, e.g. ``["compute_120"]``; a GPU of that
      compute capability or newer JIT-compiles it on first use
    """
    return dict(_C.build_info())


def package_version() -> str:
    """The installed distribution's version when it is this very package, else the version the
    native module recorded at build time (both come from pyproject.toml)."""
    try:
        dist = importlib.metadata.distribution("tokensampler")
        installed = Path(dist.locate_file("tokensampler/__init__.py")).resolve()
        if installed == Path(__file__).with_name("__init__.py").resolve():
            return dist.version
    except (importlib.metadata.PackageNotFoundError, OSError, TypeError):
        pass
    return _C.build_info()["version"]


_ARCH = re.compile(r"^(?:sm|compute)_(\d+)([af]?)$")


def _parse(arch: str) -> tuple[int, int, str]:
    match = _ARCH.match(arch)
    if match is None:
        raise ValueError(f"not a CUDA architecture name: {arch!r}")
    number, suffix = int(match.group(1)), match.group(2)
    return number // 10, number % 10, suffix


def serves_capability(capability: tuple[int, int], archs, ptx) -> bool:
    """Whether a fat binary with machine code for `archs` (sm_XY) and PTX of `ptx`
    (compute_XY) runs on a GPU of compute capability `capability` = (major, minor).

    Machine code for X.y runs on X.z with z >= y (arch-specific ``a`` code only on X.y itself);
    PTX of X.y is JIT-compiled for any capability >= X.y (``a``/``f`` PTX does not move across
    majors)."""
    major, minor = capability
    for arch in archs:
        a_major, a_minor, suffix = _parse(arch)
        if a_major == major and (a_minor == minor if suffix == "a" else a_minor <= minor):
            return True
    for arch in ptx:
        p_major, p_minor, suffix = _parse(arch)
        if suffix == "a":
            if (p_major, p_minor) == (major, minor):
                return True
        elif suffix == "f":
            if p_major == major and p_minor <= minor:
                return True
        elif (p_major, p_minor) <= (major, minor):
            return True
    return False


def unsupported_gpu_reason(name: str, capability: tuple[int, int], info: dict | None = None
                           ) -> str | None:
    """Why a build (`info`, default this one's) cannot run its CUDA kernels on the GPU `name` of
    compute capability `capability`, or None when it can."""
    info = build_info() if info is None else info
    major, minor = capability
    sm = f"sm_{major}{minor}"
    if not info["with_cuda"]:
        return (f"this tokensampler build has no CUDA kernels (built with TOKENSAMPLER_CUDA=0 or "
                f"without nvcc), so it cannot run on {name} ({sm}); rebuild it with CUDA and "
                f"TORCH_CUDA_ARCH_LIST=\"{major}.{minor}\"")
    if serves_capability(capability, info["cuda_archs"], info["cuda_ptx"]):
        return None
    present = ", ".join(info["cuda_archs"] + [f"{p} (PTX)" for p in info["cuda_ptx"]]) or "none"
    return (f"this tokensampler build has no CUDA kernels for {name} ({sm}): it was compiled "
            f"for {present}; rebuild it with TORCH_CUDA_ARCH_LIST=\"{major}.{minor}\" "
            f"(README, Install)")


def check_device_supported(device: torch.device) -> None:
    """Raises ValueError naming `device` when it is a GPU that is not there or that this build's
    CUDA kernels cannot run on. `device` has an index (a backend resolves bare "cuda")."""
    if device.type != "cuda":
        return
    count = torch.cuda.device_count()
    if not 0 <= device.index < count:
        raise ValueError(f"device={str(device)!r}: there are {count} CUDA devices")
    reason = unsupported_gpu_reason(torch.cuda.get_device_name(device),
                                    torch.cuda.get_device_capability(device))
    if reason is not None:
        raise ValueError(f"device={str(device)!r}: {reason}")
