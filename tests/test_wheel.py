"""scripts/build_wheel.sh builds a CPU-only release wheel from a copy of the sources; it installs
into a fresh venv (with torch from this environment) and samples a token there, with no
compiler on PATH, equal to the token the tested build samples. Compiles the C++ once (a few
minutes on 2 cores); `-m "not wheel"` leaves it out."""

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

pytestmark = pytest.mark.wheel

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ["setup.py", "pyproject.toml", "CMakeLists.txt", "README.md", "cmake", "csrc", "python",
           "scripts"]
V = 100

# Run in the fresh venv: sample one token with the installed wheel.
CHILD = """
import json, shutil
import torch, tokensampler as ts
compilers = {c: shutil.which(c) for c in ("gcc", "g++", "cc", "c++", "nvcc")}
cfg = ts.SamplingBackendConfig(max_bs=1, max_draft_tokens_per_req=1, max_req_pool_size=2,
                               vocab_size=%(V)d, device="cpu", enable_output_logprobs=True)
backend = ts.create_backend("gumbel", cfg)
backend.prepare_step(["r"], [1], [ts.SamplingParams(temperature=0.8, top_k=20, seed=7)])
logits = torch.linspace(-3, 3, %(V)d).unsqueeze(0)
info = ts.SamplingBatchInfo(torch.tensor([1], dtype=torch.int32),
                            torch.tensor([0, 5, 0], dtype=torch.int32), %(V)d, "cpu")
tokens, _ = backend.sample(ts.LogitsProcessorOutput(logits), info)
print(json.dumps({"token": int(tokens[0]), "module": ts.__file__, "version": ts.__version__,
                  "build_info": ts.build_info(), "compilers": compilers}))
""" % {"V": V}


def _run_child(python: str, env: dict, cwd: Path) -> dict:
    ran = subprocess.run([python, "-c", CHILD], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=300)
    assert ran.returncode == 0, ran.stderr[-4000:]
    return json.loads(ran.stdout.strip().splitlines()[-1])


def _copy_sources(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info", "build")
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)


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

    # A release wheel: torch pinned to the minor release it was built with, manylinux tag.
    major, minor = torch.__version__.split(".")[:2]
    assert "-manylinux_2_" in wheel.name and wheel.name.endswith(".whl")
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read(f"tokensampler-{ts.__version__}.dist-info/METADATA").decode()
        names = zf.namelist()
    assert f"Requires-Dist: torch=={major}.{minor}.*\n" in metadata
    assert any(n.startswith("tokensampler/_C.") and n.endswith(".so") for n in names)

    # A fresh venv: the wheel, and torch from this environment (a .pth after its own
    # site-packages, so the wheel's tokensampler comes first).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # The wheel first: with the .pth in place pip would take a tokensampler installed in this
    # environment for the wheel's.
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, timeout=300)
    torch_site = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                  str(Path(torch.__file__).parents[1])}
    (site / "zz_torch_from_test_env.pth").write_text("\n".join(sorted(torch_site)) + "\n")

    # No compiler reachable: PATH holds only the venv's bin (python, pip).
    child_env = {"PATH": str(venv / "bin"), "HOME": str(tmp_path), "PYTHONNOUSERSITE": "1"}
    result = _run_child("python", child_env, tmp_path)
    assert all(path is None for path in result["compilers"].values()), result["compilers"]
    assert Path(result["module"]).resolve().is_relative_to(site.resolve())
    assert result["version"] == ts.__version__
    info = result["build_info"]
    assert info["with_cuda"] is False and info["cuda_archs"] == [] and info["torch"] == torch.__version__
    # the same token as the tokensampler under test samples
    here = _run_child(sys.executable, dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)), ROOT)
    assert result["token"] == here["token"]
