#!/usr/bin/env bash
# Profiles one shape's sampling kernels on the device: ncu hardware counters where ncu works
# (Firecracker machines), else a torch.profiler (Kineto) trace. NVTX ranges name each step.
#   bench/profile.sh [route] [bs] [dtype]     (defaults: top_k_top_p 128 fp32)
# Output: appended to $OUT/profiles.txt (one file however many shapes; the device tool brings
# back at most 8 files).
#   PROFILE_DETAIL=1: ncu sections (occupancy, warp stalls, instruction counts, hot source lines)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench/out}
mkdir -p "$OUT"
ROUTE=${1:-top_k_top_p}; BS=${2:-128}; DTYPE=${3:-fp32}
cat > /tmp/ts_profile_step.py <<PY
import sys, torch
sys.path.insert(0, "bench")
import benchmark as b
route = b.ROUTES["$ROUTE"]
dtype = dict(fp32=torch.float32, bf16=torch.bfloat16)["$DTYPE"]
step = b.ours_step(route, $BS)
x = b.logits_buffers($BS * route.tokens_per_req, dtype)[0]
for _ in range(3):
    step(x)
torch.cuda.synchronize()
mode = sys.argv[1] if len(sys.argv) > 1 else "ncu"
if mode == "kineto":
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            torch.cuda.nvtx.range_push("sample $ROUTE bs=$BS")
            step(x)
            torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
    prof.export_chrome_trace("/tmp/trace_${ROUTE}_${BS}.json")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
else:
    torch.cuda.nvtx.range_push("sample $ROUTE bs=$BS")
    step(x)
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
PY
METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem
# PROFILE_DETAIL=1: ncu's speed-of-light, occupancy, launch and warp-stall sections instead.
WHAT=(--metrics "$METRICS")
[ "${PROFILE_DETAIL:-0}" = 1 ] && WHAT=(--section SpeedOfLight --section Occupancy --section LaunchStats
                                     --section WarpStateStats --section InstructionStats
                                     --section SourceCounters --import-source yes)
if timeout 300 ncu --clock-control none --nvtx --nvtx-include "sample $ROUTE bs=$BS/" "${WHAT[@]}" \
     python3 /tmp/ts_profile_step.py ncu > /tmp/ncu_profile.txt 2>&1; then
  { echo "=== ncu: $ROUTE bs=$BS $DTYPE"; cat /tmp/ncu_profile.txt; } >> "$OUT/profiles.txt"
  grep -E "^\s+[a-z_]+.*\(|gpu__time|dram__|sm__|launch__|Duration|Throughput|Registers|Occupancy|Warp Cycles|Executed Instructions|Block Limit" \
    /tmp/ncu_profile.txt
else
  echo "ncu unavailable here; Kineto trace instead"
  { echo "=== kineto: $ROUTE bs=$BS $DTYPE"; python3 /tmp/ts_profile_step.py kineto; } |
    tee -a "$OUT/profiles.txt"
fi
