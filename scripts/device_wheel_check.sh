#!/usr/bin/env bash
# The release wheel on the GPU machine, in one command from the repository root:
#   scripts/device_wheel_check.sh [--archs "9.0"] [--wheel PATH] [--deadline SECONDS]
# 1. builds the release wheel with scripts/build_wheel.sh (default: its multi-arch
#    TORCH_CUDA_ARCH_LIST, MAX_JOBS=$(nproc)) and records the wall time and the wheel's size;
#    --archs narrows TORCH_CUDA_ARCH_LIST, --wheel skips the build and checks that wheel;
# 2. lists the architectures in the wheel's _C*.so (cuobjdump --list-elf / --list-ptx when the
#    CUDA toolkit has it) beside what build_info() recorded;
# 3. tests/test_wheel.py -m "wheel and cuda" with TOKENSAMPLER_WHEEL: the wheel in a fresh venv
#    (torch through a .pth, pip --no-index --no-deps, PATH with no compiler) samples on CUDA the
#    tokens it samples on the CPU; prints build_info();
# 4. tests/test_compile.py and tests/test_opcheck.py, their CUDA cases, against the installed
#    wheel (pip --target, first on PYTHONPATH): torch.compile(fullgraph=True) gives the eager
#    tokens, every op passes torch.library.opcheck.
# Without a GPU, steps 3 and 4 run their CPU cases instead and say so (a dry run: e.g.
# TOKENSAMPLER_CUDA=0 PYTHON=.venv/bin/python scripts/device_wheel_check.sh).
# The steps share a deadline (default 510 s from the start; the device tool stops a command at
# 600 s): the build gets what the tests after it leave. Logs go to $OUT (default bench/out):
# wheel_check.log (everything) and wheel_check_summary.txt (the lines printed at the end).
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
OUT=${OUT:-$PWD/bench/out}
PYTHON=${PYTHON:-python3}
DEADLINE=510
WHEEL=""
while [ $# -gt 0 ]; do
  case "$1" in
    --archs) export TORCH_CUDA_ARCH_LIST="$2"; shift ;;
    --wheel) WHEEL=$(realpath "$2"); shift ;;
    --deadline) DEADLINE="$2"; shift ;;
    *) echo "usage: $0 [--archs LIST] [--wheel PATH] [--deadline SECONDS]" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT"
LOG="$OUT/wheel_check.log"
SUMMARY="$OUT/wheel_check_summary.txt"
: > "$LOG"
: > "$SUMMARY"
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-$(nproc)}
# Left as they are on the lent machines (their KINDS.md), also for anything started here.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
FAILED=0

log() { echo "$*" | tee -a "$LOG"; }
note() { echo "$*" >> "$SUMMARY"; log "== $*"; }
fail() { FAILED=1; note "FAIL $*"; }
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
# The last line of a pytest run: "N passed, M skipped in T s" (or what killed it).
verdict() { grep -E "(passed|failed|error|skipped|deselected|no tests ran)" "$1" | tail -1; }

GPU=0
"$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>>"$LOG" && GPU=1
{
  echo "host: $(nproc) cores, $(nvidia-smi -L 2>/dev/null | head -1 | grep . || echo "no nvidia-smi")"
  "$PYTHON" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.get_device_name() if torch.cuda.is_available() else None)"
} 2>&1 | tee -a "$LOG" "$SUMMARY"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
# cuobjdump: the CUDA toolkit's, else the copy Triton bundles.
CUOBJDUMP=$(command -v cuobjdump || ls "$CUDA_HOME/bin/cuobjdump" 2>/dev/null ||
            "$PYTHON" -c "import os, triton; print(os.path.join(os.path.dirname(triton.__file__), 'backends/nvidia/bin/cuobjdump'))" 2>/dev/null || true)
[ -x "$CUOBJDUMP" ] || CUOBJDUMP=""

# ---- 1. build
if [ -z "$WHEEL" ]; then
  budget=$(( $(left) - 150 ))  # what steps 2-4 need on the H200 (venvs, torch.compile, opcheck)
  log "== build: TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-(build_wheel.sh default)} MAX_JOBS=$MAX_JOBS, at most ${budget} s"
  start=$(date +%s)
  PYTHON="$PYTHON" timeout "$budget" bash scripts/build_wheel.sh "$work/dist" > "$work/built" 2>> "$LOG"
  rc=$?
  took=$(( $(date +%s) - start ))
  WHEEL=$(tail -1 "$work/built")
  if [ $rc -ne 0 ] || [ ! -f "$WHEEL" ]; then
    tail -40 "$LOG"
    [ $rc -eq 124 ] && fail "build: stopped at the deadline after ${took} s (try --archs 9.0)" \
                    || fail "build: exit $rc after ${took} s (tail of $LOG above)"
    echo; cat "$SUMMARY"
    exit 1
  fi
  note "build: ${took} s wall on $(nproc) cores ($(grep "^tokensampler wheel:" "$LOG" | tail -1 | cut -d' ' -f3-))"
fi
size=$(stat -c %s "$WHEEL")
note "wheel: $(basename "$WHEEL"), $(( size / 1000 )) kB ($(awk "BEGIN{printf \"%.1f\", $size/1e6}") MB)"

# Installed for the tests of steps 2 and 4: first on PYTHONPATH, before any other tokensampler.
if ! "$PYTHON" -m pip install -q --no-index --no-deps --target "$work/site" "$WHEEL" >> "$LOG" 2>&1; then
  fail "install: pip install --target of the wheel failed"
  echo; cat "$SUMMARY"
  exit 1
fi
export PYTHONPATH="$work/site"

# ---- 2. architectures: what cuobjdump finds in the .so against what build_info() recorded
so=$(ls "$work"/site/tokensampler/_C*.so)
# Architectures as "SASS list | PTX list", each sorted, '-' for none. build_info() is asked from
# the repository root, where the installed wheel is what imports (the sources live in python/).
archs() { grep -oE "sm_[0-9]+[af]?" | sed "s/^sm_/$1/" | sort -uV | paste -sd' ' | grep . || echo -; }
info="$("$PYTHON" -c "import tokensampler as ts; print(*ts.build_info()['cuda_archs'])" | archs sm_)"
info="$info | $("$PYTHON" -c "import tokensampler as ts; print(*ts.build_info()['cuda_ptx'])" | sed 's/compute_/sm_/g' | archs compute_)"
"$PYTHON" -c "import tokensampler as ts; print('tests import', ts.__file__)" >> "$LOG" 2>&1
if [ -n "$CUOBJDUMP" ] && "$CUOBJDUMP" --list-elf "$so" > "$work/elf" 2>> "$LOG"; then
  "$CUOBJDUMP" --list-ptx "$so" > "$work/ptx" 2>> "$LOG"
  cat "$work/elf" "$work/ptx" >> "$LOG"
  elf=$(archs sm_ < "$work/elf")
  ptx=$(archs compute_ < "$work/ptx")
  found="$elf | $ptx"
  what="cuobjdump: $(grep -c "ELF file" "$work/elf") cubins, $(grep -c "PTX file" "$work/ptx") PTX files"
  if [ "$found" = "$info" ]; then
    note "archs: SASS $elf; PTX $ptx ($what; build_info() agrees)"
  else
    fail "archs: cuobjdump finds $found, build_info() says $info ($what)"
  fi
else
  note "archs: SASS ${info% |*}; PTX ${info#*| } (build_info(); $([ -n "$CUOBJDUMP" ] && echo "cuobjdump found no device code" || echo "no cuobjdump"))"
fi

# ---- 3. the wheel in a fresh venv, on CUDA and on the CPU (tests/test_wheel.py)
if [ $GPU = 1 ]; then marks="wheel and cuda"; else marks="wheel and not cuda"; fi
t=$(( $(left) - 60 )); [ $t -lt 60 ] && t=60
start=$(date +%s)
TOKENSAMPLER_WHEEL="$WHEEL" timeout "$t" "$PYTHON" -m pytest -q -s -p no:cacheprovider \
  -m "$marks" tests/test_wheel.py::test_given_wheel_installs_and_samples > "$work/venv.log" 2>&1
rc=$?
cat "$work/venv.log" >> "$LOG"
grep "^WHEEL-VENV" "$work/venv.log" | sed 's/^WHEEL-VENV /  /' | tee -a "$SUMMARY"
what="fresh venv, $([ $GPU = 1 ] && echo "CUDA tokens = CPU tokens" || echo "no GPU: CPU only")"
if [ $rc -eq 0 ] && grep -q " passed" "$work/venv.log"; then
  note "venv: $what: $(verdict "$work/venv.log") ($(( $(date +%s) - start )) s)"
else
  tail -30 "$work/venv.log"
  fail "venv: $what: exit $rc, $(verdict "$work/venv.log")"
fi

# ---- 4. torch.compile and opcheck on the installed wheel
if [ $GPU = 1 ]; then marks="cuda"; else marks="not cuda"; fi
t=$(( $(left) )); [ $t -lt 60 ] && t=60
start=$(date +%s)
timeout "$t" "$PYTHON" -m pytest -q -p no:cacheprovider -m "$marks" \
  tests/test_compile.py tests/test_opcheck.py > "$work/ops.log" 2>&1
rc=$?
cat "$work/ops.log" >> "$LOG"
what="compile + opcheck ($([ $GPU = 1 ] && echo "CUDA cases" || echo "no GPU: CPU cases"), installed wheel)"
if [ $rc -eq 0 ] && grep -q " passed" "$work/ops.log"; then
  note "tests: $what: $(verdict "$work/ops.log") ($(( $(date +%s) - start )) s)"
else
  tail -40 "$work/ops.log"
  fail "tests: $what: exit $rc$([ $rc -ge 128 ] && echo " (signal $((rc - 128)))"), $(verdict "$work/ops.log")"
fi

echo
note "total: $(( $(date +%s) - T0 )) s, $([ $FAILED = 0 ] && echo OK || echo FAILED)"
echo "---- summary ($SUMMARY)"
cat "$SUMMARY"
exit $FAILED
