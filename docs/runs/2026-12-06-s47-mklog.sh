#!/usr/bin/env bash
# mklog.sh LOGDIR TITLE > file: one readable log of a device call's logs directory (the s4x scripts'
# layout: gpu.txt, steps.txt, smoke.*, table.txt, tl_stats.*, gates.*, sanitize*, bench.*).
L=$1; echo "# $2"
cat $L/gpu.txt; echo "== steps"; cat $L/steps.txt
for f in $L/smoke.*.log; do [ -f $f ] || continue; echo "== $(basename $f)"; grep -E "fused  1" $f; done
echo "== table (best of two rounds)"; cat $L/table.txt
echo "== timelines, T = 2048 (tl_stats)"; cat $L/tl_stats.*.txt 2>/dev/null
for f in $L/gates.*.log; do [ -f $f ] || continue; echo "== $(basename $f .log)"; grep -E "^(PASS|FAIL|SKIP)|passed" $f; done
for f in $L/sanitize*.log; do [ -f $f ] || continue; echo "== $(basename $f .log)"; grep -hE "CLEAN|KNOWN|SKIP|FAIL|clean," $f; done
for d in $L/sanitize.*/; do [ -d $d ] || continue; for f in $d/racecheck*.log; do [ -f $f ] || continue
  echo "== racecheck pairs, $(basename $f .log)"; grep -E "Race reported|Read access|Write access" $f | sed -E 's/\+0x[0-9a-f]+//; s/ \[[0-9]+ hazards\]//' | sort | uniq -c | sort -rn | head -30; done; done
for f in $L/bench.*.log; do echo "== $(basename $f)"; grep -E "fused  1" $f; done
