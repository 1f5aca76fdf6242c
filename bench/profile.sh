#!/usr/bin/env bash
# Profiles the sampling kernels of several shapes on the device in one process: ncu hardware
# counters where ncu works, else a torch.profiler (Kineto) trace. An NVTX range names each step.
#   bench/profile.sh [route:bs[:dtype[:mask]] ...]      (default: top_k_top_p:128:fp32)
# e.g. bench/profile.sh no_filter:1 no_filter:128 top_p:128:bf16 top_k_top_p:128:fp32:half
# (mask: a grammar bitmask of bitmask_bench.py's densities, half or json, given to the step)
# Output: appended to $OUT/profiles.txt (one file however many shapes; the device tool brings
# back at most 8 files) and a per-kernel summary table on stdout.
#   PROFILE_DETAIL=1: ncu sections (occupancy, warp stalls, instruction counts) and each kernel's
#     hottest SASS instructions by warp-stall samples (bench/ncu_hot_lines.py, from the report's
#     source page; its CUDA view carries no per-line metrics in CSV, run 82; the whole SASS page
#     also goes to $OUT/ncu_sass.csv.gz), appended to
#     profiles.txt too.
#   PROFILE_CACHE=none: ncu keeps caches between its replay passes (default: flushes them), so
#     a bs-1 kernel runs with the warm instruction cache a graph replay has, and a kernel finds
#     what the one before it left in L2 (the default flush hides that reuse).
#   PROFILE_TIMELINE=1: no ncu; a Kineto trace of CUDA-graph replays as the benchmark times them
#     (four steps a graph, rotating logits buffers): every kernel of one replay with its start,
#     duration and the gap before it, so a small step's time splits into kernels and the launch
#     gaps between them (what ncu's serialized kernel times cannot show).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench/out}
mkdir -p "$OUT"
SHAPES=("$@")
[ ${#SHAPES[@]} -eq 0 ] && SHAPES=(top_k_top_p:128:fp32)
cat > /tmp/ts_profile_steps.py <<'PY'
import sys, torch
sys.path.insert(0, "bench")
import benchmark as b
import bitmask_bench as bm
mode, shapes = sys.argv[1], sys.argv[2:]
steps = []
for shape in shapes:
    route_name, bs, *rest = shape.split(":")
    route, bs = b.ROUTES[route_name], int(bs)
    dtype = dict(fp32=torch.float32, bf16=torch.bfloat16)[rest[0] if rest else "fp32"]
    mask = (bm.random_bitmask(bs * route.tokens_per_req, b.VOCAB, bm.DENSITIES[rest[1]], "cuda")
            if len(rest) > 1 else None)
    step = b.ours_step(route, bs, token_bitmask=mask)
    buffers = b.logits_buffers(bs * route.tokens_per_req, dtype)  # the benchmark's rotation
    for _ in range(3):  # warm-up outside the ranges ncu profiles
        step(buffers[0])
    steps.append((f"sample {shape}", step, buffers))
torch.cuda.synchronize()
if mode == "timeline":
    import json, os, tempfile
    from torch.profiler import profile, ProfilerActivity
    for name, step, buffers in steps:
        graph = b.capture_graph(step, buffers)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                graph.replay()
                torch.cuda.synchronize()
        trace = os.path.join(tempfile.mkdtemp(), "trace.json")
        prof.export_chrome_trace(trace)
        kernels = sorted((e for e in json.load(open(trace))["traceEvents"]
                          if e.get("cat") == "kernel"), key=lambda e: e["ts"])
        replay = kernels[len(kernels) * 2 // 3:]  # the last of three replays
        per_step = len(replay) // len(buffers)
        t0, end = replay[0]["ts"], replay[0]["ts"]
        span = replay[-1]["ts"] + replay[-1]["dur"] - t0
        print(f"--- timeline {name}: one replay of {len(buffers)} steps, {per_step} kernels a "
              f"step, {span:.1f} us ({span / len(buffers):.2f} a step); its first two steps:")
        print(f"{'start us':>9} {'gap us':>7} {'dur us':>7}  kernel")
        for e in replay[:2 * per_step]:
            print(f"{e['ts'] - t0:9.1f} {e['ts'] - end:7.1f} {e['dur']:7.1f}  {e['name'][:110]}")
            end = e["ts"] + e["dur"]
elif mode == "kineto":
    from torch.profiler import profile, ProfilerActivity
    for name, step, buffers in steps:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step(buffers[0])
            torch.cuda.synchronize()
        print(f"--- {name}")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8))
else:
    for name, step, buffers in steps:
        torch.cuda.nvtx.range_push(name)
        step(buffers[0])
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
PY
# Time, bytes, the DRAM and SM roofs, issue-slot use (an arithmetic-bound kernel issues nearly
# every cycle), warps resident, instructions (per token: divide by rows x V), launch limits.
METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,launch__registers_per_thread,launch__grid_size,launch__occupancy_limit_registers
WHAT=(--metrics "$METRICS")
[ "${PROFILE_DETAIL:-0}" = 1 ] && WHAT=(--section SpeedOfLight --section Occupancy --section LaunchStats
                                     --section WarpStateStats --section InstructionStats
                                     --section SourceCounters --import-source yes)
if [ "${PROFILE_TIMELINE:-0}" = 1 ]; then
  { echo "=== timeline: ${SHAPES[*]}"; python3 /tmp/ts_profile_steps.py timeline "${SHAPES[@]}"; } |
    tee -a "$OUT/profiles.txt"
  exit 0
fi
INCLUDE=()
for shape in "${SHAPES[@]}"; do INCLUDE+=(--nvtx-include "sample $shape/"); done
REPORT=/tmp/ts_ncu_report
rm -f "$REPORT.ncu-rep"
if timeout "${PROFILE_TIMEOUT:-420}" ncu --clock-control none --cache-control "${PROFILE_CACHE:-all}" \
     --nvtx "${INCLUDE[@]}" "${WHAT[@]}" -o "$REPORT" \
     python3 /tmp/ts_profile_steps.py ncu "${SHAPES[@]}" > /tmp/ncu_run.txt 2>&1 &&
   ncu -i "$REPORT.ncu-rep" --csv --print-units base --page details > /tmp/ncu_profile.txt 2>&1; then
  { echo "=== ncu: ${SHAPES[*]}"; cat /tmp/ncu_profile.txt; } >> "$OUT/profiles.txt"
  { echo "=== ncu summary: ${SHAPES[*]}"; python3 bench/ncu_summary.py /tmp/ncu_profile.txt; } > /tmp/ncu_summary.txt
  cat /tmp/ncu_summary.txt >> "$OUT/profiles.txt"
  if [ "${PROFILE_DETAIL:-0}" = 1 ]; then
    for view in cuda sass; do  # CUDA lines (-lineinfo; where ncu's CSV has them), then SASS
      ncu -i "$REPORT.ncu-rep" --csv --page source --print-source "$view" > "/tmp/ncu_source_$view.txt" 2>&1
      { echo "=== ncu hot $view lines: ${SHAPES[*]}"; python3 bench/ncu_hot_lines.py "/tmp/ncu_source_$view.txt"; } |
        tee -a "$OUT/profiles.txt" | tail -60
    done
    # Every SASS instruction's counters (executions, samples), for bench/ncu_sass_blocks.py here.
    gzip -c /tmp/ncu_source_sass.txt > "$OUT/ncu_sass.csv.gz"
  fi
  cat /tmp/ncu_summary.txt  # last, so the call's output tail keeps the per-kernel table
else
  tail -5 /tmp/ncu_run.txt /tmp/ncu_profile.txt 2>/dev/null
  echo "ncu unavailable here; Kineto trace instead"
  { echo "=== kineto: ${SHAPES[*]}"; python3 /tmp/ts_profile_steps.py kineto "${SHAPES[@]}"; } |
    tee -a "$OUT/profiles.txt"
fi
