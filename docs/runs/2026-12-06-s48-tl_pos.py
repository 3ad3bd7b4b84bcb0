#!/usr/bin/env python3
# A fused forward's timeline JSON (`megamoe bench --timeline`): each CTA's L1 tiles by their place
# in the CTA (0, 1, 2, 3 or more; 9 = the last), µs p10 / p50 / p90 and mean over the CTAs; the
# L1's span a CTA and the time between a tile's end and the next one's hand-out.
import collections, json, statistics, sys

def q(a):
    a = sorted(a)
    return f"{a[len(a) // 10]:.1f}/{statistics.median(a):.1f}/{a[9 * len(a) // 10]:.1f} mean {statistics.mean(a):.2f}"

for f in sys.argv[1:]:
    ev = json.load(open(f))["events"]
    ctas = collections.defaultdict(list)
    for e in ev:
        if e["kind"] == "l1_tile":
            ctas[e["cta"]].append((e["start_ns"] / 1e3, e["end_ns"] / 1e3))
    span, gaps, by_place = [], [], collections.defaultdict(list)
    for t in ctas.values():
        t.sort()
        span.append(t[-1][1] - t[0][0])
        gaps += [t[i][0] - t[i - 1][1] for i in range(1, len(t))]
        for i, (a, b) in enumerate(t):
            by_place[9 if i == len(t) - 1 else min(i, 3)].append(b - a)
    print(f"{f.split('/')[-2]:8} {f.split('/')[-1]}")
    print(f"  L1 span a CTA {q(span)}")
    print(f"  hand-out after the tile before {q(gaps)}")
    for k in sorted(by_place):
        print(f"  L1 tile at place {k}: {q(by_place[k])}")
