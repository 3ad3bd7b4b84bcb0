#!/usr/bin/env bash
# Session 42's second call (bundle by runs/2026-12-06-s42b-pack.sh): the glue's first-weights
# prefetch at 32 (tf), 8 (tf8) and 16 MiB (tf16), three alternating rounds, the bar's two routes,
# T = 8 … 8192 (on an H200, tf's column is the bar's table). Logs into $OUT/all.tgz.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s42b; rm -rf $D; mkdir -p $D; tar xzf .device/s42b.tgz -C $D
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused"
V="tf tf8 tf16"
el warm
for v in $V; do ( timeout 150 $D/bin/megamoe.$v $B --tokens 8,128,512,2048,8192 --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait; save
table() { python3 .device/bench_table.py $(for v in $V; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) | tee $L/table.txt; }
for r in 1 2 3; do
  for v in $V; do
    el bench $v $r
    timeout 60 $D/bin/megamoe.$v $B --tokens 8,128,512,2048,8192 --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
  done
  [[ $r == 3 ]] && table || table > /dev/null; save
done
el done; save
