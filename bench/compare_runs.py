"""Prints ours_us of benchmark.py JSON files side by side, the first one the base:
each shape's µs per file and its ratio to the base (what an A/B of kernel variants reads).

    python bench/compare_runs.py base.json variant_a.json [variant_b.json ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load(path: str) -> dict[tuple, float]:
    rows = json.loads(Path(path).read_text())["rows"]
    return {(r["route"], r["dtype"], r["bs"]): r["ours_us"] for r in rows}


def main(paths: list[str]) -> None:
    if len(paths) < 2:
        raise SystemExit(__doc__)
    runs = [load(p) for p in paths]
    names = [f"{Path(p).parent.name}/{Path(p).stem}" for p in paths]  # variants/<name>/bench.json
    print("| route | dtype | bs | " + " | ".join(names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for key in runs[0]:
        base = runs[0][key]
        cells = [f"{base:.1f}"]
        for run in runs[1:]:
            us = run.get(key)
            cells.append("—" if us is None else f"{us:.1f} ({us / base:.3f})")
        print(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
