"""tokensampler.__version__, build_info() and the GPU-architecture check (fake GPUs, on CPU)."""

import re
from pathlib import Path

import pytest
import torch

import tokensampler as ts
from tokensampler import build
from tokensampler.backends import base

RELEASE = {"version": "0", "torch": "2.14.1", "torch_cuda": "13.0", "with_cuda": True,
           "cuda": "13.0", "cuda_archs": ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"],
           "cuda_ptx": ["compute_120"]}


def test_version_is_pyproject_version():
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert ts.__version__ == re.search(r'^version = "([^"]+)"$', pyproject, re.M).group(1)


def test_build_info_describes_this_build():
    info = ts.build_info()
    assert info["version"] == ts.__version__
    assert info["torch"] == torch.__version__  # built against the torch it runs with
    assert info["torch_cuda"] == torch.version.cuda
    assert info["with_cuda"] is ts.built_with_cuda
    if info["with_cuda"]:
        assert re.fullmatch(r"\d+\.\d+", info["cuda"])
        assert info["cuda_archs"] or info["cuda_ptx"]
        assert all(re.fullmatch(r"sm_\d+[af]?", a) for a in info["cuda_archs"])
        assert all(re.fullmatch(r"compute_\d+[af]?", a) for a in info["cuda_ptx"])
    else:
        assert info["cuda"] is None and info["cuda_archs"] == [] and info["cuda_ptx"] == []


@pytest.mark.parametrize("capability", [(8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (10, 0),
                                        (10, 3), (12, 0), (12, 1), (13, 0)])
def test_release_build_serves(capability):
    assert build.unsupported_gpu_reason("GPU", capability, RELEASE) is None


@pytest.mark.parametrize("capability", [(7, 0), (7, 5)])
def test_release_build_refuses_older(capability):
    reason = build.unsupported_gpu_reason("Tesla V100", capability, RELEASE)
    assert f"sm_{capability[0]}{capability[1]}" in reason and "Tesla V100" in reason
    assert "sm_80" in reason and "compute_120 (PTX)" in reason


def test_machine_code_rules():
    sm90 = dict(RELEASE, cuda_archs=["sm_90"], cuda_ptx=[])
    assert build.unsupported_gpu_reason("H100", (9, 0), sm90) is None
    # machine code runs on the same major, same or higher minor only; no PTX, no newer major
    for capability in [(8, 0), (8, 9), (10, 0), (12, 0)]:
        assert build.unsupported_gpu_reason("GPU", capability, sm90) is not None
    assert build.serves_capability((8, 9), ["sm_80"], [])
    assert not build.serves_capability((8, 0), ["sm_86"], [])
    # arch-specific code: its exact capability only
    assert build.serves_capability((9, 0), ["sm_90a"], [])
    assert not build.serves_capability((9, 1), ["sm_90a"], [])
    assert build.serves_capability((10, 3), ["sm_100f"], [])


def test_ptx_serves_newer_gpus_only():
    assert build.serves_capability((9, 0), [], ["compute_90"])
    assert build.serves_capability((12, 0), [], ["compute_90"])
    assert not build.serves_capability((8, 9), [], ["compute_90"])
    assert not build.serves_capability((10, 0), [], ["compute_90a"])
    assert not build.serves_capability((12, 0), [], ["compute_100f"])


def test_unsupported_gpu_message_names_gpu_arch_and_build():
    sm90 = dict(RELEASE, cuda_archs=["sm_90"], cuda_ptx=[])
    reason = build.unsupported_gpu_reason("NVIDIA A100-SXM4-80GB", (8, 0), sm90)
    assert "NVIDIA A100-SXM4-80GB" in reason and "(sm_80)" in reason
    assert "compiled for sm_90;" in reason and 'TORCH_CUDA_ARCH_LIST="8.0"' in reason


def test_cpu_build_refuses_every_gpu():
    cpu = dict(RELEASE, with_cuda=False, cuda=None, cuda_archs=[], cuda_ptx=[])
    reason = build.unsupported_gpu_reason("NVIDIA H200", (9, 0), cpu)
    assert "no CUDA kernels" in reason and "NVIDIA H200" in reason and "sm_90" in reason


def test_backend_construction_checks_the_gpu(monkeypatch):
    """A CUDA backend on a GPU the build lacks raises at construction, before any allocation."""
    calls = []

    def fake_check(device):
        calls.append(device)
        if device.type == "cuda":
            raise ValueError(build.unsupported_gpu_reason(
                "NVIDIA B200", (10, 0), dict(RELEASE, cuda_archs=["sm_90"], cuda_ptx=[])))

    monkeypatch.setattr(base, "check_device_supported", fake_check)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = ts.SamplingBackendConfig(max_bs=2, max_draft_tokens_per_req=1, max_req_pool_size=4,
                                   vocab_size=16, device="cuda:0")
    with pytest.raises(ValueError, match=r"NVIDIA B200 \(sm_100\).*compiled for sm_90"):
        ts.create_backend("gumbel", cfg)
    ts.create_backend("gumbel", ts.SamplingBackendConfig(
        max_bs=2, max_draft_tokens_per_req=1, max_req_pool_size=4, vocab_size=16, device="cpu"))
    assert [d.type for d in calls] == ["cuda", "cpu"]


def test_check_device_supported_reads_the_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA GeForce RTX 5090")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (12, 0))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(build, "build_info", lambda: dict(RELEASE, cuda_archs=["sm_90"], cuda_ptx=[]))
    with pytest.raises(ValueError, match=r"^device='cuda:1': .*NVIDIA GeForce RTX 5090 \(sm_120\)"):
        build.check_device_supported(torch.device("cuda", 1))
    with pytest.raises(ValueError, match=r"^device='cuda:2': there are 2 CUDA devices"):
        build.check_device_supported(torch.device("cuda", 2))
    monkeypatch.setattr(build, "build_info", lambda: RELEASE)
    build.check_device_supported(torch.device("cuda", 0))
    build.check_device_supported(torch.device("cpu"))  # never asks about a GPU


@pytest.mark.cuda
def test_this_gpu_is_served_by_this_build():
    capability = torch.cuda.get_device_capability()
    assert build.unsupported_gpu_reason(torch.cuda.get_device_name(), capability) is None
