#!/usr/bin/env bash
# Builds tokensampler here, on the CPU machine, for the lent device's Python 3.12 and torch
# 2.11.0+cu130 (sm_90), so a device call spends no device time compiling (60-100 s a cold call,
# RESULTS.md). Writes .devbuild/<name>.tar.gz (the `pip --target` folder) and .devbuild/<name>.stamp
# (bench/tree_builds.sh) for the tree ("base") and for each --variant spec, named as
# bench/device_run.sh names them. Carry `.devbuild` with the device call: device_run.sh uses a
# build whose stamp equals the one it computes there and builds any other itself.
#   bench/prebuild_device.sh [--variant file.patch[+file2.patch...]]...
# The arch list is TORCH_CUDA_ARCH_LIST's, default 9.0a: the device images (H100 and H200) export
# 9.0a, which device_run.sh keeps, and a stamp with another list is built there again (run
# 100 spent 204 s building the base and four variants that were prebuilt for 9.0).
# The build environment (.devvenv: Python 3.12 from pyenv, torch 2.11.0 without its runtime
# dependencies, CUDA headers from the project's .venv) is made on first use. Builds are
# incremental: the base and then each variant in one copy of the tree (.devvenv/src/tree),
# refreshed by content (sync_by_content), so only the files that differ from the last build there
# recompile (forty-first session, 2 cores: the base and a variant 551 s, each further variant
# 156-238 s). A build whose stamp .devbuild already holds is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/tree_builds.sh
VARIANTS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --variant) VARIANTS+=("$2"); shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a} CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
VENV=$PWD/.devvenv/venv
PY=$VENV/bin/python
if [ ! -x "$PY" ]; then
  py312=$(pyenv root 2> /dev/null)/versions/3.12.1/bin/python3.12
  [ -x "$py312" ] || py312=$(command -v python3.12) || { echo "no Python 3.12 here" >&2; exit 1; }
  "$py312" -m venv "$VENV"
  "$PY" -m pip install -q --no-deps torch==2.11.0
  "$PY" -m pip install -q "setuptools>=77,<82" wheel "cmake>=3.24" ninja "pybind11>=2.12,<4" \
    numpy typing-extensions filelock sympy networkx jinja2 fsspec
  # torch imports (and the build finds the CUDA headers) through nvidia/: the project's own.
  nvidia=$(ls -d .venv/lib/python3*/site-packages/nvidia | head -1)
  ln -s "$PWD/$nvidia" "$VENV/lib/python3.12/site-packages/nvidia"
fi
mkdir -p .devbuild

build_into() {  # name: builds the tree in the current folder, packs it as .devbuild/<name>
  local name=$1 target stamp
  stamp=$(build_stamp "$BUILD_ENV")
  if [ -f "$DEST/$name.stamp" ] && [ "$stamp" = "$(cat "$DEST/$name.stamp")" ]; then
    echo "$name: prebuilt already (stamp $(head -1 "$DEST/$name.stamp"))"
    return 0
  fi
  target=$(mktemp -d)
  "$PY" -m pip install -q --no-build-isolation --no-deps --target "$target" . > "$OUT_LOG" 2>&1 \
    || { tail -40 "$OUT_LOG"; rm -rf "$target"; return 1; }
  tar -czf "$DEST/$name.tar.gz" -C "$target" .
  echo "$stamp" > "$DEST/$name.stamp"
  rm -rf "$target"
  echo "$name: $(du -h "$DEST/$name.tar.gz" | cut -f1), stamp $(head -1 "$DEST/$name.stamp")"
}
# Makes folder $2 (its build/ aside) hold what $1 holds, rewriting only the files whose content
# differs, so ninja's timestamps see only real changes.
sync_by_content() {  # from to
  (cd "$2" && find . -path ./build -prune -o -type f -print) | while read -r f; do
    [ -e "$1/$f" ] || rm -f "$2/$f"
  done
  (cd "$1" && find . -type f -print) | while read -r f; do
    cmp -s "$1/$f" "$2/$f" || { mkdir -p "$(dirname "$2/$f")"; cp "$1/$f" "$2/$f"; }
  done
}
DEST=$PWD/.devbuild
BUILD_ENV=$(build_env "$PY")
OUT_LOG=$PWD/.devvenv/build.log
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
start=$(date +%s)
# Every build runs in one copy of the tree (.devvenv/src/tree), base first: a variant then
# recompiles only the files its patches change.
build_in_copy() {  # name [spec]
  local stage=$PWD/.devvenv/stage src=$PWD/.devvenv/src/tree
  rm -rf "$stage"
  mkdir -p "$stage" "$src"
  copy_tree "$stage"
  [ -z "${2:-}" ] || apply_patches "$stage" "$2"
  sync_by_content "$stage" "$src"
  (cd "$src" && build_into "$1")
}
build_in_copy base
for spec in "${VARIANTS[@]}"; do
  build_in_copy "$(variant_name "$spec")" "$spec"
done
echo "prebuilt in $(( $(date +%s) - start )) s; carry .devbuild"
