#!/usr/bin/env bash
# Builds a release wheel of tokensampler against the torch installed for $PYTHON:
#   scripts/build_wheel.sh [DEST_DIR]          (default: dist/)
# CUDA kernels for sm_80 (A100), 86 (A10, RTX 30), 89 (L40S, RTX 40), 90 (H100, H200),
# 100 (B200), 120 (RTX 50) and PTX of 12.0 for newer GPUs, unless overridden:
#   TORCH_CUDA_ARCH_LIST="9.0" scripts/build_wheel.sh     one architecture (quick)
#   TOKENSAMPLER_CUDA=0 scripts/build_wheel.sh             CPU-only wheel
#   MAX_JOBS=N (default: nproc)  PYTHON=... (default: python3)
#   NVCC_THREADS=N (default: 4 with MAX_JOBS >= 8, else 1): nvcc compiles the architectures of
#     one .cu file in N threads (--threads), so the 8 CUDA files keep more than 8 cores busy
#   PLATFORM_TAG=... (default: manylinux_2_28_<arch>, raised if the build needs a newer glibc)
# The wheel requires torch==X.Y.* of the torch it was built with (scripts/release_wheel.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DEST=${1:-dist}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-8.0;8.6;8.9;9.0;10.0;12.0+PTX}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
NVCC_THREADS=${NVCC_THREADS:-$(( MAX_JOBS >= 8 ? 4 : 1 ))}
export NVCC_APPEND_FLAGS="${NVCC_APPEND_FLAGS:+$NVCC_APPEND_FLAGS }--threads $NVCC_THREADS"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "tokensampler wheel: TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST MAX_JOBS=$MAX_JOBS" \
     "NVCC_THREADS=$NVCC_THREADS" \
     "TOKENSAMPLER_CUDA=${TOKENSAMPLER_CUDA:-auto}" >&2
start=$(date +%s)
"$PYTHON" -m pip wheel --no-build-isolation --no-deps --wheel-dir "$work" . >&2
built=$(ls "$work"/tokensampler-*.whl)
"$PYTHON" scripts/release_wheel.py "$built" --dest-dir "$DEST" ${PLATFORM_TAG:+--platform-tag "$PLATFORM_TAG"}
echo "built in $(( $(date +%s) - start )) s" >&2
