"""Where a kernel's instructions go, from the SASS source page that bench/profile.sh keeps
(PROFILE_DETAIL=1: $OUT/ncu_sass.csv.gz, `ncu -i report --csv --page source --print-source sass`).

Consecutive instructions executed the same number of times form a basic block (or a run of
them); each block's share of the kernel's executed warp instructions and of its stall samples
is printed, largest first, with its first instructions, so a reader sees which loop and which
part of it costs the kernel's issue slots.

  python3 bench/ncu_sass_blocks.py ncu_sass.csv.gz [--kernel SUBSTRING] [--top 25]
"""

from __future__ import annotations

import argparse
import gzip

from ncu_hot_lines import number, sample_column, tables


def column(header: list[str], *names: str) -> int | None:
    for want in names:
        for i, name in enumerate(header):
            if name.strip() == want:
                return i
    for want in names:
        for i, name in enumerate(header):
            if want in name:
                return i
    return None


def blocks(rows, executed: int, samples: int | None):
    """Runs of consecutive rows with equal execution counts: (first index, rows, count, samples)."""
    out, start = [], 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or number(rows[i][executed]) != number(rows[start][executed]):
            run = rows[start:i]
            s = sum(number(r[samples]) for r in run) if samples is not None else 0.0
            out.append((start, run, number(rows[start][executed]), s))
            start = i
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--kernel", default="", help="only kernels whose name line contains this")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    opener = gzip.open if args.path.endswith(".gz") else open
    with opener(args.path, "rt", errors="replace") as f:
        lines = f.read().splitlines()
    seen = set()
    for context, header, rows in tables(lines):
        if args.kernel not in context or context in seen:
            continue
        seen.add(context)
        executed = column(header, "Instructions Executed", "Warp Instructions Executed")
        address = column(header, "Address")
        source = column(header, "Source")
        samples = sample_column(header)
        if executed is None:
            print(f"--- {context[:150]}: no 'Instructions Executed' column in {header}")
            continue
        total = sum(number(r[executed]) for r in rows) or 1.0
        total_samples = sum(number(r[samples]) for r in rows) if samples is not None else 0.0
        print(f"--- {context[:150]}")
        print(f"    {total / 1e6:.2f} M warp instructions, {len(rows)} SASS lines, "
              f"{total_samples:.0f} stall samples")
        ranked = sorted(blocks(rows, executed, samples), key=lambda b: -b[2] * len(b[1]))
        print("    share  samples  lines   executions  first address / instructions")
        for start, run, count, s in ranked[: args.top]:
            if count == 0:
                break
            where = run[0][address] if address is not None else str(start)
            text = " | ".join(" ".join(r[source].split())[:40] for r in run[:3]) if source is not None else ""
            print(f"    {100 * count * len(run) / total:5.1f} %  {100 * s / (total_samples or 1):5.1f} %"
                  f"  {len(run):5d}  {count:11.0f}  {where} {text}")


if __name__ == "__main__":
    main()
