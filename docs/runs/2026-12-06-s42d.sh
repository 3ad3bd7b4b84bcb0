#!/usr/bin/env bash
# Session 42's last calls, on an H200: 7c8af19 (old) against main (tf's kernels) in two alternating
# rounds, the bar's two routes, T = 8 … 8192 (call 7; call 6 ran main alone, three rounds, with
# the same bench lines). Bundle: .device/s42d.tgz with `bin/megamoe.main` = tf's CLI (target/s42-tf
# of runs/2026-12-06-s42b-pack.sh, stripped; main's CUDA sources are tf's) and `bin/megamoe.old` =
# 7c8af19's (target/s42-main of runs/2026-12-06-s42a-pack.sh, stripped).
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
for v in old main; do timeout 150 $D/bin/megamoe.$v $B --tokens 8,128,512,2048,8192 --reps 1 > $L/warm.$v.log 2>&1; done
for r in 1 2; do for v in old main; do
  el bench $v $r
  timeout 60 $D/bin/megamoe.$v $B --tokens 8,128,512,2048,8192 --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"; done
done
python3 .device/bench_table.py old=$(ls $L/bench.old.*.log | paste -sd,) main=$(ls $L/bench.main.*.log | paste -sd,) | tee $L/table.txt
el done; save
