#!/usr/bin/env python3
"""Warp-stall summary of one kernel from Nsight Compute's per-instruction source page.

    python3 scripts/ncu_stalls.py REPORT.src.csv.gz [TOP]

REPORT.src.csv.gz is `ncu --import R.ncu-rep --page source --csv --print-source sass | gzip`
(scripts/gpu-profile.sh writes them). Prints the share of every stall reason over all warp-state
samples and the TOP (default 30) SASS instructions with the most samples and their main reasons.
Samples the CSV gives no reason column for (the `gmma` stall among them) count in the totals only.
"""
import collections
import csv
import gzip
import sys


def main() -> None:
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    rows = list(csv.reader(gzip.open(path, "rt")))
    header, data = rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    totals: collections.Counter = collections.Counter()
    samples = 0
    per_instruction = []
    for row in data:
        if len(row) < len(header):
            continue
        count = int(row[col["Warp Stall Sampling (All Samples)"]] or 0)
        samples += count
        by_reason = {r: int(row[col[r]] or 0) for r in reasons}
        totals.update(by_reason)
        per_instruction.append((count, row[col["Address"]][-5:], row[col["Source"]].strip(), by_reason))
    print(f"{path}: {samples} samples")
    for reason, count in totals.most_common(12):
        print(f"{reason:28s} {count:8d} {100 * count / samples:5.1f}%")
    print(f"{'(no reason column, e.g. gmma)':28s} {samples - sum(totals.values()):8d}")
    print("--- instructions with the most samples")
    for count, address, source, by_reason in sorted(per_instruction, key=lambda x: -x[0])[:top]:
        main_reasons = ", ".join(
            f"{r[6:]}={n}" for r, n in sorted(by_reason.items(), key=lambda x: -x[1])[:3] if n
        )
        print(f"{count:7d} {100 * count / samples:5.1f}% {address} {source[:60]:60s} {main_reasons}")


if __name__ == "__main__":
    main()
