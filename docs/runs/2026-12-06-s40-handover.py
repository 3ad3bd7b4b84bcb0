#!/usr/bin/env python3
"""Session 40's hand-over diagnostic: per CTA of a fused timeline JSON written by the s40-hx build
(zero-length mark events whose expert is 0xffff0000 | id), the steps between its last L1 tile and
its first L2 tile, as percentiles over the CTAs (µs). Usage: handover.py TIMELINE.json..."""
import json, sys, statistics
MARK = 0xffff0000
NAMES = {1: "producer run end", 2: "epilogue warps end", 3: "consumer wg1 end", 4: "consumer wg2 end",
         5: "layer start", 6: "after setup", 7: "first unit found", 8: "first unit rows ready", 9: "after rejoin"}
for path in sys.argv[1:]:
    ev = json.load(open(path))["events"]
    ctas = {}
    for e in ev:
        if e.get("cta") is None or not e.get("tile"):
            continue
        layer = "L1" if "l1" in str(e["kind"]).lower() else "L2"
        c = ctas.setdefault(e["cta"], {"L1": [], "L2": [], "marks": {}})
        x = e["tile"]["expert"]
        if x >= MARK:
            c["marks"][(layer, x - MARK)] = e["start_ns"] / 1e3
        else:
            c[layer].append((e["start_ns"] / 1e3, e["end_ns"] / 1e3))
    rows = {}
    def add(name, v):
        rows.setdefault(name, []).append(v)
    for c in ctas.values():
        if not c["L1"] or not c["L2"]:
            continue
        e1 = max(end for _, end in c["L1"])
        s2 = min(start for start, _ in c["L2"])
        add("gap: last L1 tile end -> first L2 tile start", s2 - e1)
        m = c["marks"]
        for key in sorted(m):
            add(f"{key[0]} mark {key[1]} ({NAMES.get(key[1], '?')}) - last L1 tile end", m[key] - e1)
        add("first L2 tile start - last L1 tile end", s2 - e1)
        add("L1 span of this CTA (first start .. last end)", e1 - min(s for s, _ in c["L1"]))
    print(f"== {path}: {len(ctas)} CTAs")
    for name, v in rows.items():
        v.sort()
        q = lambda f: v[min(len(v) - 1, int(f * len(v)))]
        print(f"  {name:<70} p10 {q(0.1):8.1f}  p50 {q(0.5):8.1f}  p90 {q(0.9):8.1f}  (n {len(v)})")
