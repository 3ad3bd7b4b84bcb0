#!/usr/bin/env python3
"""Best-of-rounds table of `megamoe bench` logs: bench_table.py VARIANT=log[,log...] ... (first is the baseline)."""
import re, sys
BARS = {("g128/fp8", 8): 300, ("g128/fp8", 128): 470, ("g128/fp8", 512): 700, ("g128/fp8", 2048): 1800,
        ("g128/fp8", 8192): 6600, ("mx32/bf16", 8): 335, ("mx32/bf16", 128): 560, ("mx32/bf16", 512): 900,
        ("mx32/bf16", 2048): 2600, ("mx32/bf16", 8192): 9000}
variants = []
for arg in sys.argv[1:]:
    name, logs = arg.split("=", 1)
    best = {}
    for log in logs.split(","):
        try:
            text = open(log).read()
        except OSError:
            continue
        for line in text.splitlines():
            m = re.match(r"(\S+/\S+)\s+fused\s+(\d+)\s+(\d+)\s+\d+\s+\|[^|]*\|\s*[\d.]+\s+[\d.]+\s+\|\s*([\d.]+)", line)
            if m:
                key = (m.group(1), int(m.group(3)))
                best[key] = min(best.get(key, 1e30), float(m.group(4)))
    variants.append((name, best))
keys = sorted({k for _, b in variants for k in b})
print(f"{'route':<11}{'T':>6}" + "".join(f"{n:>16}" for n, _ in variants) + f"{'bar':>7}{'best/bar':>10}")
for k in keys:
    base = variants[0][1].get(k)
    row = f"{k[0]:<11}{k[1]:>6}"
    best = 1e30
    for i, (_, b) in enumerate(variants):
        v = b.get(k)
        if v is None:
            row += f"{'-':>16}"
            continue
        best = min(best, v)
        row += f"{v:>16.1f}" if i == 0 or base is None else f"{v:>10.1f} {v / base:5.3f}"
    bar = BARS.get(k)
    row += f"{bar:>7}{best / bar:>10.3f}" if bar else ""
    print(row)
