"""One line per profiled kernel from ncu's --csv --print-units base output (bench/profile.sh):
the NVTX range (shape), the kernel, time, DRAM bytes and % of peak, SM and issue-slot %, warps
active, instructions, registers and grid."""

from __future__ import annotations

import csv
import io
import sys
from collections import OrderedDict

COLUMNS = [("gpu__time_duration.sum", "us", 1e-3), ("dram__bytes_read.sum", "MB", 1e-6),
           ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "dram%", 1),
           ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "sm%", 1),
           ("smsp__issue_active.avg.pct_of_peak_sustained_active", "issue%", 1),
           ("sm__warps_active.avg.pct_of_peak_sustained_active", "warps%", 1),
           ("smsp__inst_executed.sum", "Minst", 1e-6),
           ("launch__registers_per_thread", "regs", 1), ("launch__grid_size", "grid", 1)]
# PROFILE_DETAIL=1 collects ncu sections instead, whose rows name their quantities differently
# and give cycles per issued instruction and achieved occupancy where the metrics give issue-slot
# use and warps active.
SECTION_COLUMNS = [("Duration", "us", 1e-3), ("DRAM Throughput", "dram%", 1),
                   ("Compute (SM) Throughput", "sm%", 1),
                   ("Warp Cycles Per Issued Instruction", "cyc/ins", 1),
                   ("Achieved Occupancy", "occ%", 1), ("Issued Instructions", "Minst", 1e-6),
                   ("Registers Per Thread", "regs", 1), ("Grid Size", "grid", 1)]


def main(path: str) -> None:
    text = open(path, errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        print("no ncu CSV in", path)
        return
    # The CSV ends where bench/profile.sh appends its hot-line tables (lines not quoted).
    lines = text[start:].splitlines()
    end = next((i for i, line in enumerate(lines) if not line.startswith('"')), len(lines))
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[:end]))))
    kernels: OrderedDict[tuple, dict] = OrderedDict()
    for r in rows:
        # the push/pop range column reads '1143  "<default domain>:sample top_p:128:none:..."'
        nvtx = next((v for k, v in r.items() if k and "Push/Pop_Range" in k and v), "")
        nvtx = nvtx.split("sample ")[-1].split(":none")[0].strip('" ')
        name = r["Kernel Name"].split("(")[0].removeprefix("void ").replace("split_row::", "")
        key = (r["ID"], nvtx, name.replace("histogram_cut::", "hist::"))
        kernels.setdefault(key, {})[r["Metric Name"]] = (r["Metric Value"] or "").replace(",", "")
    columns = SECTION_COLUMNS if any("Duration" in m for m in kernels.values()) else COLUMNS
    print(f"{'shape':<20} {'kernel':<34} " + " ".join(f"{c[1]:>7}" for c in columns))
    for (_, shape, name), m in kernels.items():
        cells = []
        for metric, _, scale in columns:
            try:
                cells.append(f"{float(m[metric]) * scale:7.1f}")
            except (KeyError, ValueError):
                cells.append(f"{'-':>7}")
        print(f"{shape[-20:]:<20} {name[:34]:<34} " + " ".join(cells))


if __name__ == "__main__":
    main(sys.argv[1])
