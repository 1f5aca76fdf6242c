"""scripts/build_wheel.sh builds a CPU-only release wheel from a copy of the sources; it installs
into a fresh venv (with torch from this environment) and samples tokens there, with no
compiler on PATH, equal to the tokens the tested build samples. Compiles the C++ once (a few
minutes on 2 cores); `-m "not wheel"` leaves it out.

A wheel built elsewhere (the multi-arch CUDA wheel, scripts/device_wheel_check.sh) is checked
the same way when TOKENSAMPLER_WHEEL names it: `-m "wheel and cuda"` installs it into a fresh
venv and samples on the GPU and on the CPU there, which give the same tokens (keyed Gumbel
noise)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import torch

import tokensampler as ts
from tokensampler.build import serves_capability

pytestmark = pytest.mark.wheel

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ["setup.py", "pyproject.toml", "CMakeLists.txt", "README.md", "LICENSE", "cmake", "csrc",
           "python", "scripts"]
V = 100
WHEEL_ENV = "TOKENSAMPLER_WHEEL"

# Run in the fresh venv: sample a batch of four requests (top-k, top-p, both, neither) with the
# installed wheel on each device named on the command line.
CHILD = """
import json, shutil, sys
import torch, tokensampler as ts
compilers = {c: shutil.which(c) for c in ("gcc", "g++", "cc", "c++", "nvcc")}
params = [ts.SamplingParams(temperature=0.8, top_k=20, seed=7),
          ts.SamplingParams(top_p=0.9, seed=8),
          ts.SamplingParams(temperature=1.3, top_k=50, top_p=0.8, seed=9),
          ts.SamplingParams(seed=2**40 + 10)]
tokens = {}
for device in sys.argv[1:]:
    cfg = ts.SamplingBackendConfig(max_bs=4, max_draft_tokens_per_req=1, max_req_pool_size=4,
                                   vocab_size=%(V)d, device=device, enable_output_logprobs=True)
    backend = ts.create_backend("gumbel", cfg)
    backend.prepare_step([f"r{i}" for i in range(4)], [1, 2, 3, 4], params)
    logits = 2 * torch.randn(4, %(V)d, generator=torch.Generator().manual_seed(0))
    info = ts.SamplingBatchInfo(torch.tensor([1, 2, 3, 4], dtype=torch.int32, device=device),
                                torch.tensor([0, 5, 0, 9, 1], dtype=torch.int32, device=device),
                                %(V)d, device)
    sampled, _ = backend.sample(ts.LogitsProcessorOutput(logits.to(device)), info)
    tokens[device] = sampled.tolist()
print(json.dumps({"tokens": tokens, "module": ts.__file__, "version": ts.__version__,
                  "build_info": ts.build_info(), "compilers": compilers}))
""" % {"V": V}


def _run_child(python: str, env: dict, cwd: Path, devices: list[str]) -> dict:
    ran = subprocess.run([python, "-c", CHILD, *devices], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-4000:]
    return json.loads(ran.stdout.strip().splitlines()[-1])


def _sample_here(devices: list[str]) -> dict:
    """The tokens the tokensampler under test (this environment's) samples."""
    return _run_child(sys.executable, dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
                      ROOT, devices)


def _copy_sources(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info", "build")
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)


def _check_release_wheel(wheel: Path) -> None:
    """A release wheel: torch pinned to the minor release it was built with (this
    environment's), a manylinux tag, the native module inside, the license file beside the
    metadata that names it."""
    major, minor = torch.__version__.split(".")[:2]
    assert "-manylinux_2_" in wheel.name and wheel.name.endswith(".whl")
    dist_info = f"tokensampler-{ts.__version__}.dist-info"
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read(f"{dist_info}/METADATA").decode()
        names = zf.namelist()
        license_text = zf.read(f"{dist_info}/licenses/LICENSE").decode()
    assert f"Requires-Dist: torch=={major}.{minor}.*\n" in metadata
    assert "License-Expression: Apache-2.0\n" in metadata and "License-File: LICENSE\n" in metadata
    assert license_text == (ROOT / "LICENSE").read_text()
    assert any(n.startswith("tokensampler/_C.") and n.endswith(".so") for n in names)


def _sample_in_fresh_venv(wheel: Path, tmp_path: Path, devices: list[str]) -> dict:
    """Installs `wheel` into a fresh venv, with torch from this environment (a .pth after the
    venv's own site-packages, so the wheel's tokensampler comes first), and samples there with
    no compiler reachable: PATH holds only the venv's bin (python, pip)."""
    venv = tmp_path / "venv"
    # Without PYTHONPATH: pip would take a tokensampler on it for the wheel's (already installed).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True,
                          text=True, env=env, timeout=300)
    if made.returncode != 0:  # a Python without ensurepip: a venv without pip, outer pip installs
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                       env=env, timeout=300)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # The wheel first: with the .pth in place pip would take a tokensampler installed in this
    # environment for the wheel's.
    install = ([str(python), "-m", "pip", "install"] if made.returncode == 0 else
               [sys.executable, "-m", "pip", "install", "--target", str(site)])
    subprocess.run([*install, "-q", "--no-deps", "--no-index", str(wheel)], check=True, env=env,
                   timeout=300)
    torch_site = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                  str(Path(torch.__file__).parents[1])}
    (site / "zz_torch_from_test_env.pth").write_text("\n".join(sorted(torch_site)) + "\n")

    child_env = {"PATH": str(venv / "bin"), "HOME": str(tmp_path), "PYTHONNOUSERSITE": "1"}
    # where a container finds the GPU driver (libcuda) and which GPUs it may use
    child_env.update({k: os.environ[k] for k in ("LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES")
                      if k in os.environ})
    result = _run_child("python", child_env, tmp_path, devices)
    assert all(path is None for path in result["compilers"].values()), result["compilers"]
    assert Path(result["module"]).resolve().is_relative_to(site.resolve())
    assert result["version"] == ts.__version__
    assert result["build_info"]["torch"] == torch.__version__
    return result


def test_wheel_installs_and_samples_without_a_compiler(tmp_path):
    src, dist = tmp_path / "src", tmp_path / "dist"
    src.mkdir()
    _copy_sources(src)
    env = dict(os.environ, TOKENSAMPLER_CUDA="0", PYTHON=sys.executable,
               MAX_JOBS=os.environ.get("MAX_JOBS", str(os.cpu_count() or 1)),
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    built = subprocess.run(["bash", "scripts/build_wheel.sh", str(dist)], cwd=src, env=env,
                           capture_output=True, text=True, timeout=1800)
    assert built.returncode == 0, built.stderr[-4000:]
    wheel = Path(built.stdout.strip().splitlines()[-1])
    assert wheel.parent == dist and wheel.exists()
    _check_release_wheel(wheel)

    result = _sample_in_fresh_venv(wheel, tmp_path, ["cpu"])
    info = result["build_info"]
    assert info["with_cuda"] is False and info["cuda_archs"] == []
    # the same tokens as the tokensampler under test samples
    assert result["tokens"]["cpu"] == _sample_here(["cpu"])["tokens"]["cpu"]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_given_wheel_installs_and_samples(device, tmp_path):
    """The wheel TOKENSAMPLER_WHEEL names (built by scripts/build_wheel.sh, e.g. on the GPU
    machine) in a fresh venv: on CUDA it samples the tokens it samples on the CPU, and on the CPU
    the tokens the tokensampler under test samples."""
    if not os.environ.get(WHEEL_ENV):
        pytest.skip(f"{WHEEL_ENV} names no wheel (scripts/device_wheel_check.sh sets it)")
    wheel = Path(os.environ[WHEEL_ENV]).resolve()
    _check_release_wheel(wheel)
    devices = ["cuda", "cpu"] if device == "cuda" else ["cpu"]
    result = _sample_in_fresh_venv(wheel, tmp_path, devices)
    info, tokens = result["build_info"], result["tokens"]
    # -s shows these (scripts/device_wheel_check.sh)
    print(f"\nWHEEL-VENV {wheel.name} in a fresh venv, tokens {tokens}")
    print(f"WHEEL-VENV build_info() {json.dumps(info)}")
    if device == "cuda":
        assert info["with_cuda"] is True
        capability = torch.cuda.get_device_capability()
        assert serves_capability(capability, info["cuda_archs"], info["cuda_ptx"]), capability
        assert tokens["cuda"] == tokens["cpu"]
    assert tokens["cpu"] == _sample_here(["cpu"])["tokens"]["cpu"]
