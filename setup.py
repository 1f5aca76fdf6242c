"""Build of tokensampler: setuptools drives CMake (Ninja generator) for the native module.

Environment:
  TOKENSAMPLER_CUDA=0|1   force the CUDA kernels off or on (default: on when torch is a CUDA
                          build and nvcc is found through CUDA_HOME or PATH)
  TORCH_CUDA_ARCH_LIST    CUDA architectures (default "9.0", set in CMakeLists.txt)
  MAX_JOBS                parallel compile jobs
Build against the installed torch: pip install --no-build-isolation .
"""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _cuda_home():
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parent.parent))
    for home in candidates:
        if home and (Path(home) / "bin" / "nvcc").exists() and (Path(home) / "include").is_dir():
            return Path(home)
    return None


def _want_cuda(torch):
    flag = os.environ.get("TOKENSAMPLER_CUDA")
    if flag is not None:
        return flag not in ("0", "false", "OFF", "")
    return torch.version.cuda is not None and _cuda_home() is not None


def _pip_cuda_dirs():
    """Headers and libraries of the pip CUDA packages (nvidia/cu13), used where the system
    toolkit is minimal: they ship the runtime headers torch's CUDA build compiles against."""
    site = Path(sysconfig.get_paths()["purelib"]) / "nvidia"
    for name in ("cu13", "cu12", "cuda_runtime"):
        if (site / name / "include").is_dir():
            return site / name / "include", site / name / "lib"
    return None, None


def _build_tool(module: str, attr: str, name: str) -> str:
    """A build tool from its pip package (cmake and ninja are build requirements), so a build
    run without the venv on PATH does not pick up an older system cmake (3.25 cannot give nvcc
    13 the C++20 dialect); PATH otherwise."""
    try:
        path = Path(getattr(__import__(module), attr)) / name
    except (ImportError, AttributeError):
        return name
    return str(path) if path.exists() else name


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        import pybind11
        import torch.utils

        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = Path(self.build_temp).resolve() / ext.name
        build_dir.mkdir(parents=True, exist_ok=True)
        use_cuda = _want_cuda(torch)
        cmake = _build_tool("cmake", "CMAKE_BIN_DIR", "cmake")
        args = [
            "-G", "Ninja",
            f"-DCMAKE_MAKE_PROGRAM={_build_tool('ninja', 'BIN_DIR', 'ninja')}",
            f"-DCMAKE_BUILD_TYPE={'Debug' if self.debug else 'Release'}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path};{pybind11.get_cmake_dir()}",
            f"-DTOKENSAMPLER_CUDA={'ON' if use_cuda else 'OFF'}",
        ]
        cuda_home = _cuda_home()
        if torch.version.cuda is not None and cuda_home is not None:
            # torch's CMake config looks for a toolkit whenever torch is a CUDA build.
            args += [f"-DCUDA_TOOLKIT_ROOT_DIR={cuda_home}",
                     f"-DCMAKE_CUDA_COMPILER={cuda_home / 'bin' / 'nvcc'}"]
            include, lib = _pip_cuda_dirs()
            if include is not None:
                args.append(f"-DTOKENSAMPLER_EXTRA_CUDA_INCLUDE={include}")
                nvrtc = sorted(lib.glob("libnvrtc.so*"))
                if nvrtc:
                    args.append(f"-DCUDA_nvrtc_LIBRARY={nvrtc[0]}")
        env = dict(os.environ)
        if cuda_home is not None:
            env.setdefault("CUDA_HOME", str(cuda_home))
        jobs = env.get("MAX_JOBS", str(os.cpu_count() or 1))
        print(f"tokensampler: building with CUDA={'on' if use_cuda else 'off'}", flush=True)
        subprocess.run([cmake, "-S", str(ROOT), "-B", str(build_dir), *args], check=True, env=env)
        subprocess.run([cmake, "--build", str(build_dir), "-j", jobs], check=True, env=env)


setup(
    ext_modules=[CMakeExtension("tokensampler._C")],
    cmdclass={"build_ext": CMakeBuild},
)
