#!/usr/bin/env bash
# One call on the lent H200: build tokensampler, run the GPU tests, run the benchmark (and, on a
# machine with two or more GPUs, the vocab-parallel benchmark over NCCL).
# Logs and JSON go to $OUT (the device tool brings back at most 8 files: this script writes 6,
# 7 with several GPUs or with --bitmask-bench; bench/profile.sh appends to one more).
#   bench/device_run.sh [--no-bench] [--bench-args "..."] [--tests "pytest args"]
#                       [--bitmask-bench "args"] [--profile "route:bs[:dtype] ..."]
# Carry .fi (from ../shared/tools/flashinfer_bundle.sh .fi) to benchmark FlashInfer beside us,
# and .xg (scripts/xgrammar_bundle.sh .xg) for the grammar-mask benchmark's xgrammar kernel.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench/out}
mkdir -p "$OUT"
RUN_BENCH=1
BENCH_ARGS=""
BITMASK_ARGS=""
RUN_BITMASK=0
PROFILE_SHAPES=""
TEST_ARGS="-m cuda tests"
while [ $# -gt 0 ]; do
  case "$1" in
    --no-bench) RUN_BENCH=0 ;;
    --bench-args) BENCH_ARGS="$2"; shift ;;
    --tests) TEST_ARGS="$2"; shift ;;
    --bitmask-bench) RUN_BITMASK=1; BITMASK_ARGS="$2"; shift ;;
    --profile) PROFILE_SHAPES="$2"; shift ;;
  esac
  shift
done
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16}
# NVLink multicast stays off on the lent machines (their KINDS.md): NCCL, PyTorch, NVSHMEM.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
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

start=$(date +%s)
if ! python3 -m pip install --no-build-isolation --no-deps -v . > "$OUT/build.log" 2>&1; then
  tail -60 "$OUT/build.log"
  exit 1
fi
echo "build: $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu.txt"
[ -n "${FI_PID:-}" ] && wait "$FI_PID"; [ -f /tmp/flashinfer_jit.log ] && tail -2 /tmp/flashinfer_jit.log | tee -a "$OUT/gpu.txt"

# The installed wheel is what gets imported (the sources live under python/, not on sys.path).
python3 -m pytest -q -p no:cacheprovider $TEST_ARGS 2>&1 | tee "$OUT/tests.log" | tail -40
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
# The tests' verdict again, last, so it survives in the tail of a long run's output.
echo "GPU tests: $(tail -1 "$OUT/tests.log")" | tee -a "$OUT/gpu.txt"
