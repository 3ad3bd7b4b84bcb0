#!/usr/bin/env python3
# A fused forward's timeline JSON (`megamoe bench --timeline`) in a few lines: the glue's stages,
# the first L1 tile, each CTA's L1 -> L2 gap, the L2's end over the CTAs against the top-k sums'
# start (the tail), tiles a CTA and their times (µs; p10 / p50 / p90 over the CTAs), and the L1
# tiles' times by their place in the CTA (0, 1, 2, 3 or more; "last"), with their mean, and (JSONs
# whose tiles carry sm_cycles) the L1 and L2 tiles' SM clocks (MHz) by the same places.
import collections, json, statistics, sys

def q(a):
    a = sorted(a)
    return f"{a[len(a) // 10]:.1f} / {statistics.median(a):.1f} / {a[9 * len(a) // 10]:.1f}"

for f in sys.argv[1:]:
    ev = json.load(open(f))["events"]
    ctas = collections.defaultdict(lambda: collections.defaultdict(list))
    for e in ev:
        if e["kind"] in ("l1_tile", "l2_tile"):
            cycles = e["tile"].get("sm_cycles")
            ctas[e["cta"]][e["kind"]].append((e["start_ns"] / 1e3, e["end_ns"] / 1e3, cycles))
    glue = {e["kind"]: (e["start_ns"] / 1e3, e["end_ns"] / 1e3) for e in ev if e["kind"] not in ("l1_tile", "l2_tile")}
    l1_end = {c: max(t[1] for t in d["l1_tile"]) for c, d in ctas.items() if d["l1_tile"]}
    l2_start = {c: min(t[0] for t in d["l2_tile"]) for c, d in ctas.items() if d["l2_tile"]}
    l2_end = [max(t[1] for t in d["l2_tile"]) for d in ctas.values() if d["l2_tile"]]
    first_l1 = min(t[0] for d in ctas.values() for t in d["l1_tile"])
    reduce = glue.get("combine_reduce", (float("nan"),) * 2)
    print(f"{f.split('/')[-2]:8} {f.split('/')[-1]}")
    print("  glue  " + " ".join(f"{k} {a:.1f}-{b:.1f}" for k, (a, b) in glue.items()) + f"  first L1 tile {first_l1:.1f}")
    print(f"  L1 -> L2 gap a CTA {q([l2_start[c] - l1_end[c] for c in l2_start if c in l1_end])}")
    print(f"  L2 end a CTA {q(l2_end)}, last {max(l2_end):.1f}; top-k sums {reduce[0]:.1f}-{reduce[1]:.1f}")
    for k in ("l1_tile", "l2_tile"):
        n = collections.Counter(len(d[k]) for d in ctas.values())
        print(f"  {k}s a CTA {dict(sorted(n.items()))}, a tile {q([b - a for d in ctas.values() for a, b, _ in d[k]])}")
    by_place = collections.defaultdict(list)
    mhz = {k: collections.defaultdict(list) for k in ("l1_tile", "l2_tile")}
    for d in ctas.values():
        for k in mhz:
            t = sorted(d[k], key=lambda x: x[:2])
            for i, (a, b, c) in enumerate(t):
                place = "last" if i == len(t) - 1 else str(min(i, 3))
                if k == "l1_tile":
                    by_place[place].append(b - a)
                if c is not None and b > a:
                    mhz[k][place].append(c / (b - a))
    print("  l1_tile by place " + "; ".join(
        f"{k}: {q(v)} mean {statistics.mean(v):.1f}" for k, v in sorted(by_place.items())))
    for k, places in mhz.items():
        if places:
            print(f"  {k} MHz by place " + "; ".join(f"{p}: {q(v)}" for p, v in sorted(places.items())))
