#!/usr/bin/env bash
# Session 43's third call (bundle by runs/2026-12-06-s43c-pack.sh): main against bt (BF16 twin
# units), three alternating rounds, the bar's two routes at T = 128, 512, 2048 and mx32 at
# T = 256 and 384 too; then bt's gates (gpu_gemm, gpu_fused). Logs into $OUT/all.tgz, re-made
# after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s43c; rm -rf $D; mkdir -p $D; tar xzf .device/s43c.tgz -C $D
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-570} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --path fused"
V="main bt"
el warm
for v in $V; do ( timeout 150 $D/bin/megamoe.$v $B --routes g128/fp8,mx32/bf16 --tokens 128,256,384,512,2048 --reps 1 > $L/warm.$v.log 2>&1 ) & done
( TEST_TIMEOUT=200 $D/bt/run.sh gpu_gemm > $L/gates.bt.gpu_gemm.log 2>&1 ) &
wait; save
grep -E "^FAIL|passed" $L/gates.bt.gpu_gemm.log
table() { python3 .device/bench_table.py $(for v in $V; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) | tee $L/table.txt; }
for r in 1 2 3; do
  for v in $V; do
    (( $(left) > 200 )) || { el "skip bench $v $r"; continue; }
    el bench $v $r
    timeout 60 $D/bin/megamoe.$v $B --routes mx32/bf16 --tokens 256,384,512 --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
  done
  table > /dev/null; save
done
table
el gates bt gpu_fused
TEST_TIMEOUT=$(( $(left) - 15 )) $D/bt/run.sh gpu_fused > $L/gates.bt.gpu_fused.log 2>&1; grep -E "^FAIL|passed" $L/gates.bt.gpu_fused.log
el done; save
