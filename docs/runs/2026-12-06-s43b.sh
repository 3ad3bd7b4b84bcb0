#!/usr/bin/env bash
# Session 43's second call (bundle by runs/2026-12-06-s43b-pack.sh): main against pw2 (two-CTA
# tiles prefetch each unit's weights a ring ahead into L2) and pw2d (two rings ahead), three
# alternating rounds, the bar's two routes, T = 8 … 8192; first each one's timelines at T = 8 and
# 128. Logs into $OUT/all.tgz, re-made after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s43b; rm -rf $D; mkdir -p $D; tar xzf .device/s43b.tgz -C $D
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-570} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused"
V="${V:-main pw2 pw2d}"
el warm
for v in $V; do ( timeout 150 $D/bin/megamoe.$v $B --tokens 8,128,512,2048,8192 --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait; save
for v in $V; do
  el timeline $v
  timeout 60 $D/bin/megamoe.$v $B --tokens 8,128 --reps 1 --timeline $L/tl.$v > $L/tl.$v.log 2>&1 || echo "timeline $v rc $?"
done
python3 .device/tl_stats.py $L/tl.*/*.json > $L/tl_stats.txt; cat $L/tl_stats.txt; save
table() { python3 .device/bench_table.py $(for v in $V; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) | tee $L/table.txt; }
for r in 1 2 3; do
  for v in $V; do
    (( $(left) > 60 )) || { el "skip bench $v $r"; continue; }
    el bench $v $r
    timeout 60 $D/bin/megamoe.$v $B --tokens 8,128,512,2048,8192 --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
  done
  table > /dev/null; save
done
table; el done; save
