#!/usr/bin/env bash
# Session 43's last call (bundle by runs/2026-12-06-s43f-pack.sh): main (the BF16 twins) against wd
# (BF16 pools' whole-token dispatch from T ≈ 264), three alternating rounds, mx32 at T = 384, 512,
# 1000 and g128 at 512 (the same code: the call's spread); wd's gpu_fused beside the warm-up.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s43f; rm -rf $D; mkdir -p $D; tar xzf .device/s43f.tgz -C $D
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --path fused"
V="main wd"
el warm
for v in $V; do ( timeout 150 $D/bin/megamoe.$v $B --routes g128/fp8,mx32/bf16 --tokens 384,512,1000 --reps 1 > $L/warm.$v.log 2>&1 ) & done
( TEST_TIMEOUT=200 $D/wd/run.sh gpu_fused > $L/gates.wd.gpu_fused.log 2>&1 ) &
wait; save
grep -E "^FAIL|passed" $L/gates.wd.gpu_fused.log
table() { python3 .device/bench_table.py $(for v in $V; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) | tee $L/table.txt; }
for r in 1 2 3; do
  for v in $V; do
    el bench $v $r
    timeout 60 $D/bin/megamoe.$v $B --routes g128/fp8,mx32/bf16 --tokens 384,512,1000 --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
  done
  table > /dev/null; save
done
table; el done; save
