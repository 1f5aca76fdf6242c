#!/usr/bin/env bash
# One call on the lent H200: build tokensampler, run the GPU tests, run the benchmark (and, on a
# machine with two or more GPUs, the vocab-parallel benchmark over NCCL).
# Logs and JSON go to $OUT (the device tool brings back at most 8 files: this script writes 6,
# 7 with several GPUs or with --bitmask-bench; bench/profile.sh appends to one more).
#   bench/device_run.sh [--no-bench] [--bench-args "..."] [--tests "pytest args"]
#                       [--bitmask-bench "args"] [--profile "route:bs[:dtype] ..."]
#                       [--variant file.patch[+file2.patch...]]... [--variant-tests "pytest args"]
# Each --variant (a `patch -p1` file, or several joined by '+' and stacked in that order; carry
# the folder they are in) is an A/B candidate: applied to its own copy of the tree and built
# there (into its own folder) while the base builds, so a call's builds take about one build's
# time; after the base run it is benchmarked with the same --bench-args (tokensampler alone: the
# base run times the others) from its copy, with its build first on PYTHONPATH, every variant
# back to back and then the base again (the call's noise); then it is tested (--variant-tests,
# default the --tests). Logs and JSON come back in variants.tar.gz; bench/compare_runs.py prints
# the figures beside the base's.
# Carry .fi (from ../shared/tools/flashinfer_bundle.sh .fi) to benchmark FlashInfer beside us,
# and .xg (scripts/xgrammar_bundle.sh .xg) for the grammar-mask benchmark's xgrammar kernel.
# Carry .devbuild (bench/prebuild_device.sh, same --variant specs) to skip the builds: a
# prebuilt extension is used where its stamp (bench/tree_builds.sh) equals this tree's here.
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/tree_builds.sh
PREBUILT=$PWD/.devbuild
# Unpacks the prebuilt $1 into folder $2 where its stamp equals the tree's in the current folder.
use_prebuilt() {  # name dir
  [ -f "$PREBUILT/$1.stamp" ] || return 1
  local here
  here=$(build_stamp "$BUILD_ENV")
  if [ "$here" != "$(cat "$PREBUILT/$1.stamp")" ]; then
    echo "prebuilt $1: stamp differs, building (here: $(tr '\n' ' ' <<< "$here"); prebuilt: $(tr '\n' ' ' < "$PREBUILT/$1.stamp"))" | tee -a "$OUT/gpu.txt"
    return 1
  fi
  rm -rf "$2" && mkdir -p "$2" && tar -xzf "$PREBUILT/$1.tar.gz" -C "$2"
}
OUT=${OUT:-$PWD/bench/out}
mkdir -p "$OUT"
RUN_BENCH=1
BENCH_ARGS=""
BITMASK_ARGS=""
RUN_BITMASK=0
PROFILE_SHAPES=""
TEST_ARGS="-m cuda tests"
VARIANTS=()
VARIANT_TEST_ARGS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-bench) RUN_BENCH=0 ;;
    --bench-args) BENCH_ARGS="$2"; shift ;;
    --tests) TEST_ARGS="$2"; shift ;;
    --bitmask-bench) RUN_BITMASK=1; BITMASK_ARGS="$2"; shift ;;
    --profile) PROFILE_SHAPES="$2"; shift ;;
    --variant) VARIANTS+=("$2"); shift ;;
    --variant-tests) VARIANT_TEST_ARGS="$2"; shift ;;
  esac
  shift
done
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16}
# NVLink multicast stays off on the lent machines (their KINDS.md): NCCL, PyTorch, NVSHMEM.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -d "$PREBUILT" ] && BUILD_ENV=$(build_env)  # use_prebuilt's stamps: torch imported once
GPUS=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/gpu.txt"

if [ -d .fi/fi ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .fi/whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD/.fi/fi FLASHINFER_WORKSPACE_BASE=/tmp/fiws
  # FlashInfer JIT-compiles its sampling module (~90 s); overlap it with our build.
  (python3 -c "import flashinfer.sampling as s; s.get_sampling_module(); print('flashinfer', __import__('flashinfer').__version__, 'ready')" > /tmp/flashinfer_jit.log 2>&1) &
  FI_PID=$!
fi

# Variants: each in a copy of the tree with its patches applied (bench/tree_builds.sh), built in
# the background into its own folder. Their builds and the base's share the CPUs (each nvcc
# process peaks at ~1.5 GB).
VARIANT_ROOT=/tmp/ts_variants
rm -rf "$VARIANT_ROOT"
VARIANT_NAMES=()
for spec in "${VARIANTS[@]}"; do
  name=$(variant_name "$spec")
  unique=$name
  n=1
  while [ -e "$VARIANT_ROOT/$unique" ]; do n=$((n + 1)); unique="$name.$n"; done  # a variant run twice
  VARIANT_NAMES+=("$unique")
  src="$VARIANT_ROOT/$unique/src"
  mkdir -p "$src" "$OUT/variants/$unique"
  copy_tree "$src"
  if ! apply_patches "$src" "$spec"; then
    echo "variant $unique: does not apply" | tee -a "$OUT/gpu.txt"
    echo 1 > "$VARIANT_ROOT/$unique/build.rc"
    continue
  fi
  if (cd "$src" && use_prebuilt "$name" "$VARIANT_ROOT/$unique/site"); then
    echo "variant $unique: prebuilt" | tee -a "$OUT/gpu.txt"
    echo 0 > "$VARIANT_ROOT/$unique/build.rc"
    continue
  fi
  (cd "$src" && python3 -m pip install --no-build-isolation --no-deps --target "$VARIANT_ROOT/$unique/site" \
     -v . > "$OUT/variants/$unique/build.log" 2>&1; echo $? > "$VARIANT_ROOT/$unique/build.rc") &
done

start=$(date +%s)
if use_prebuilt base /tmp/ts_base_site; then
  export PYTHONPATH=/tmp/ts_base_site${PYTHONPATH:+:$PYTHONPATH}
  echo "build: prebuilt ($(head -1 "$PREBUILT/base.stamp"))" | tee -a "$OUT/gpu.txt"
else
  if ! python3 -m pip install --no-build-isolation --no-deps -v . > "$OUT/build.log" 2>&1; then
    tail -60 "$OUT/build.log"
    exit 1
  fi
  echo "build: $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu.txt"
fi
[ -n "${FI_PID:-}" ] && wait "$FI_PID"; [ -f /tmp/flashinfer_jit.log ] && tail -2 /tmp/flashinfer_jit.log | tee -a "$OUT/gpu.txt"

# The installed (or prebuilt) build is what gets imported (the sources live under python/, not on
# sys.path).
python3 -m pytest -q -p no:cacheprovider $TEST_ARGS 2>&1 | tee "$OUT/tests.log" | tail -40
wait  # the variants' builds: nothing compiles while the GPU is timed
if [ "$RUN_BENCH" = 1 ]; then
  python3 bench/benchmark.py --json "$OUT/bench.json" --plot "$OUT/bench.png" $BENCH_ARGS 2>&1 | tee "$OUT/bench.log" | tail -60
  if [ "$GPUS" -ge 2 ]; then  # vocab-parallel vs all-gather-then-sample over NCCL (issue 5)
    python3 -m torch.distributed.run --nproc_per_node "$GPUS" bench/vocab_parallel_bench.py \
      --json "$OUT/tp_bench.json" 2>&1 | tee -a "$OUT/bench.log" | tail -20
  fi
fi
if [ "$RUN_BITMASK" = 1 ]; then  # grammar masks (issue 17): ours+mask vs ours, xgrammar + ours / FI
  python3 bench/bitmask_bench.py --json "$OUT/bitmask.json" $BITMASK_ARGS 2>&1 | tee -a "$OUT/bench.log" | tail -40
fi
if [ -n "$PROFILE_SHAPES" ]; then
  bash bench/profile.sh $PROFILE_SHAPES 2>&1 | tail -60
fi
# Runs a command in variant $name's copy (its tests and bench scripts), its build first on the path.
in_variant() {
  (cd "$VARIANT_ROOT/$name/src" && PYTHONPATH="$VARIANT_ROOT/$name/site${PYTHONPATH:+:$PYTHONPATH}" "$@")
}
# The variants whose builds succeeded (each failure said once, with its log's tail).
BUILT_NAMES=()
for name in "${VARIANT_NAMES[@]}"; do
  if [ "$(cat "$VARIANT_ROOT/$name/build.rc")" = 0 ]; then
    BUILT_NAMES+=("$name")
  else
    echo "variant $name: build failed" | tee -a "$OUT/gpu.txt"
    [ -f "$OUT/variants/$name/build.log" ] && tail -30 "$OUT/variants/$name/build.log"
  fi
done
# Benchmarks first, back to back, then the base again (base_again.json): the spread between the
# base's two runs of identical code is the call's noise (run 115: an unchanged kernel read 1.026).
# The variants' tests run after every timing.
if [ "$RUN_BENCH" = 1 ] && [ ${#BUILT_NAMES[@]} -gt 0 ]; then
  for name in "${BUILT_NAMES[@]}"; do
    echo "== variant $name: bench"
    in_variant python3 bench/benchmark.py --ours-only --json "$OUT/variants/$name/bench.json" $BENCH_ARGS > "$OUT/variants/$name/bench.log" 2>&1
  done
  python3 bench/benchmark.py --ours-only --json "$OUT/variants/base_again.json" $BENCH_ARGS > "$OUT/variants/base_again.log" 2>&1
  runs=("$OUT/variants/base_again.json")
  for name in "${BUILT_NAMES[@]}"; do
    [ -f "$OUT/variants/$name/bench.json" ] && runs+=("$OUT/variants/$name/bench.json")
  done
  python3 bench/compare_runs.py "$OUT/bench.json" "${runs[@]}" | tee -a "$OUT/gpu.txt"
fi
for name in "${BUILT_NAMES[@]}"; do
  dir="$OUT/variants/$name"
  echo "== variant $name"
  in_variant python3 -m pytest -q -p no:cacheprovider ${VARIANT_TEST_ARGS:-$TEST_ARGS} > "$dir/tests.log" 2>&1
  echo "variant $name GPU tests: $(tail -1 "$dir/tests.log")" | tee -a "$OUT/gpu.txt"
  if [ "$RUN_BITMASK" = 1 ]; then
    # The variant's copy holds tracked files only: xgrammar's kernel comes from this checkout.
    in_variant python3 bench/bitmask_bench.py --json "$dir/bitmask.json" \
      --xgrammar-kernel "$PWD/.xg/apply_token_bitmask_inplace_triton.py" $BITMASK_ARGS > "$dir/bitmask.log" 2>&1
    tail -20 "$dir/bitmask.log"
  fi
done
if [ ${#VARIANTS[@]} -gt 0 ]; then
  tar -czf "$OUT/variants.tar.gz" -C "$OUT" variants && rm -rf "$OUT/variants"
fi
# The tests' verdict again, last, so it survives in the tail of a long run's output.
echo "GPU tests: $(tail -1 "$OUT/tests.log")" | tee -a "$OUT/gpu.txt"
