#!/usr/bin/env bash
# Session 41's prepared call (not run; bundle by runs/2026-12-06-s41d-pack.sh), for an H200: main
# against np (no first-weights prefetch during the glue) and p8 (8 MiB of it instead of 32), three
# alternating rounds, the bar's two routes, T = 8 … 8192 (main's column is the bar's table); first
# each one's timelines at T = 8 and 128 (the glue's stages). Logs into $OUT/all.tgz, re-made after
# each round.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s41d; rm -rf $D; mkdir -p $D; tar xzf .device/s41d.tgz -C $D
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-400} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused"
V="main np p8"
el warm
for v in $V; do ( timeout 150 $D/bin/megamoe.$v $B --tokens 8,128,512,2048,8192 --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait; save
for v in $V; do
  el timeline $v
  timeout 60 $D/bin/megamoe.$v $B --tokens 8,128 --reps 1 --timeline $L/tl.$v > $L/tl.$v.log 2>&1 || echo "timeline $v rc $?"
done
python3 - $L <<'PY' | tee $L/glue.txt
import json, sys, glob, os
for f in sorted(glob.glob(sys.argv[1] + "/tl.*/*.json")):
    ev = json.load(open(f))["events"]
    st = {e["kind"]: (e["start_ns"] / 1e3, e["end_ns"] / 1e3) for e in ev if e["kind"] not in ("l1_tile", "l2_tile")}
    l1 = [e["start_ns"] / 1e3 for e in ev if e["kind"] == "l1_tile"]
    print(f"{os.path.basename(os.path.dirname(f)):8} {os.path.basename(f):28}", " ".join(f"{k} {a:.1f}-{b:.1f}" for k, (a, b) in st.items()), f"first L1 {min(l1):.1f}")
PY
save
table() { python3 .device/bench_table.py $(for v in $V; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) | tee $L/table.txt; }
for r in 1 2 3; do
  for v in $V; do
    (( $(left) > 30 )) || { el "skip bench $v $r"; continue; }
    el bench $v $r
    timeout $(( $(left) - 10 )) $D/bin/megamoe.$v $B --tokens 8,128,512,2048,8192 --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
  done
  [[ $r == 3 ]] && table || table > /dev/null; save
done
el done; save
