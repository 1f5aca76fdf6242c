import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


_PROBE = """
import torch, tokensampler
bad = torch.zeros(4, dtype=torch.int32)
try:
    torch.ops.tokensampler.verify_chain(bad, bad, bad, bad)
except ValueError:
    print("raised")
"""


@pytest.fixture(scope="session")
def cpp_exceptions_reach_python():
    """Whether a C++ exception thrown by the extension reaches Python on this machine. Probed in
    a child process: on the lent H200's image (torch 2.11 cu130, Ubuntu g++ 13.3) any exception
    thrown by a locally built extension kills the process with SIGSEGV, even one built by
    torch.utils.cpp_extension.load_inline (bench/RESULTS.md, fourth session). Tests that assert a
    ValueError from inside an op skip there instead of taking the whole run down."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env)
    return child.returncode == 0 and "raised" in child.stdout
