#!/usr/bin/env bash
# Creates .venv (if needed), installs the build and test dependencies, and builds tokensampler
# against the installed torch. CUDA kernels are compiled when nvcc is found (TOKENSAMPLER_CUDA=0
# turns them off). Used by scripts/test.sh, scripts/demo.sh and .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch first: everything below builds against it (no build isolation).
python -m pip install -q "torch==${TORCH_VERSION:-2.14.1}"
python -m pip install -q "setuptools>=77" wheel "cmake>=3.24" ninja "pybind11>=2.12,<4" \
  "numpy>=1.24" "pytest>=8,<10" "scipy>=1.10" "hypothesis==6.170.27"
if [ "${WITH_DEMO:-1}" = 1 ]; then
  python -m pip install -q -r requirements-demo.txt
  python -m pip install -q --no-deps "$(sed -n 's/^# no-deps: //p' requirements-demo.txt)"
fi
# The grammar extra (xgrammar) after the demo's pins, so it reuses their transformers.
python -m pip install -q "xgrammar==0.2.9"
start=$(date +%s)
MAX_JOBS=${MAX_JOBS:-$(nproc)} python -m pip install -q --no-build-isolation --no-deps .
echo "tokensampler built in $(( $(date +%s) - start )) s"
