#!/usr/bin/env bash
# Session 42's last call: main's (tf's) fused forward, three rounds, the bar's two routes, T = 8 …
# 8192 — the bar's table, if an H200 comes. Bundle: .device/s42d.tgz, `bin/megamoe.main` = tf's CLI
# (target/s42-tf of runs/2026-12-06-s42b-pack.sh, stripped; main's CUDA sources are tf's).
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s42d; rm -rf $D; mkdir -p $D; tar xzf .device/s42d.tgz -C $D
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused"
el warm
timeout 150 $D/bin/megamoe.main $B --tokens 8,128,512,2048,8192 --reps 1 > $L/warm.main.log 2>&1
for r in 1 2 3; do
  el bench main $r
  timeout 60 $D/bin/megamoe.main $B --tokens 8,128,512,2048,8192 --reps 5 > $L/bench.main.$r.log 2>&1 || echo "bench $r rc $?"
done
python3 .device/bench_table.py main=$(ls $L/bench.main.*.log | paste -sd,) | tee $L/table.txt
el done; save
