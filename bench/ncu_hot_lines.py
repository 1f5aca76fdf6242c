"""Each profiled kernel's hottest source lines (or SASS instructions) by warp-stall samples, from
`ncu -i report --csv --page source --print-source cuda|sass` (bench/profile.sh, PROFILE_DETAIL=1).

The source page prints one table per kernel (a header row naming the columns, then a row per
source line), each after a line naming the kernel; the columns differ between ncu versions, so
they are found by name: the source text, and the first "Warp Stall Sampling (All ...)" column
(else any sampling column)."""

from __future__ import annotations

import csv
import sys

TOP = 12


def sample_column(header: list[str]) -> int | None:
    for want in ("Warp Stall Sampling (All", "Warp Stall Sampling", "# Samples", "Sampling"):
        for i, name in enumerate(header):
            if want in name:
                return i
    return None


def number(cell: str) -> float:
    try:
        return float(cell.replace(",", ""))
    except ValueError:
        return 0.0


def tables(lines: list[str]):
    """(kernel line, header, rows) for every table in the page."""
    context, header, rows = "", None, []
    for line in lines:
        row = next(csv.reader([line]), [])
        if header is not None and len(row) == len(header):
            rows.append(row)
            continue
        if header is not None:
            yield context, header, rows
            header, rows = None, []
        if sample_column(row) is not None and any(c.strip() in ("Source", "Address") for c in row):
            header = row
        elif line.strip():
            context = line.strip()
    if header is not None:
        yield context, header, rows


def main(path: str) -> None:
    lines = open(path, errors="replace").read().splitlines()
    found = False
    seen = set()
    for context, header, rows in tables(lines):
        found = True
        key = (context, tuple(map(tuple, rows)))
        if key in seen:  # the page can repeat a kernel's table
            continue
        seen.add(key)
        col = sample_column(header)
        src = next((i for i, h in enumerate(header) if h.strip() == "Source"), None)
        line_no = next((i for i, h in enumerate(header) if h.strip() in ("#", "Line", "# Line")), None)
        total = sum(number(r[col]) for r in rows) or 1.0
        print(f"--- {context[:150]}")
        print(f"    {header[col]}: {total:.0f} samples")
        for r in sorted(rows, key=lambda r: -number(r[col]))[:TOP]:
            if number(r[col]) == 0:
                break
            where = r[line_no] if line_no is not None else ""
            text = " ".join(r[src].split()) if src is not None else ""
            print(f"    {100 * number(r[col]) / total:5.1f} %  {where:>5}  {text[:110]}")
    if not found and any(next(csv.reader([l]), []) == ["Line No", "Source"] for l in lines):
        # ncu 2025's CSV source page gives CUDA lines without metric columns (run 82).
        print("no per-line metrics in", path, "(source text only): see the SASS table")
    elif not found:  # show the page's shape, so the parser can be fixed from this output alone
        print("no source table in", path, f"({len(lines)} lines); its first and last lines:")
        print("\n".join(line[:300] for line in lines[:40]))
        print("...")
        print("\n".join(line[:300] for line in lines[-5:]))


if __name__ == "__main__":
    main(sys.argv[1])
