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


def main(path: str) -> None:
    text = open(path, errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        print("no ncu CSV in", path)
        return
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    kernels: OrderedDict[tuple, dict] = OrderedDict()
    for r in rows:
        nvtx = next((v for k, v in r.items() if k and ("nvtx" in k.lower() or "range" in k.lower())
                     and v), "")
        key = (r["ID"], nvtx, "::".join(r["Kernel Name"].split("(")[0].split("<")[0].split("::")[-2:]))
        kernels.setdefault(key, {})[r["Metric Name"]] = r["Metric Value"].replace(",", "")
    print(f"{'shape':<30} {'kernel':<28} " + " ".join(f"{c[1]:>8}" for c in COLUMNS))
    for (_, shape, name), m in kernels.items():
        cells = []
        for metric, _, scale in COLUMNS:
            try:
                cells.append(f"{float(m[metric]) * scale:8.1f}")
            except (KeyError, ValueError):
                cells.append(f"{'-':>8}")
        print(f"{shape[-30:]:<30} {name:<28} " + " ".join(cells))


if __name__ == "__main__":
    main(sys.argv[1])
