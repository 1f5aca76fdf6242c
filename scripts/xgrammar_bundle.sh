#!/usr/bin/env bash
# Puts xgrammar's CUDA masking kernel (a Triton kernel; xgrammar's apply_token_bitmask_inplace
# uses it for CUDA tensors) and its license into DEST, for bench/bitmask_bench.py on a machine
# without network or xgrammar's dependencies (the lent GPU): carry DEST with the device call.
#   scripts/xgrammar_bundle.sh .xg
set -euo pipefail
DEST=${1:-.xg}
PYTHON=${PYTHON:-python3}
VERSION=${XGRAMMAR_VERSION:-0.2.9}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m pip download -q "xgrammar==$VERSION" --no-deps --only-binary=:all: \
  --python-version 3.12 --platform manylinux_2_28_x86_64 -d "$work"
mkdir -p "$DEST"
"$PYTHON" - "$work"/xgrammar-*.whl "$DEST" <<'PY'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as zf:
    names = zf.namelist()
    kernel = "xgrammar/kernels/apply_token_bitmask_inplace_triton.py"
    open(f"{dest}/apply_token_bitmask_inplace_triton.py", "wb").write(zf.read(kernel))
    lic = next(n for n in names if n.endswith(".dist-info/licenses/LICENSE") or n.endswith("/LICENSE"))
    open(f"{dest}/LICENSE", "wb").write(zf.read(lic))
print(f"{dest}: xgrammar {wheel.split('-')[1]} masking kernel (Triton) and LICENSE")
PY
