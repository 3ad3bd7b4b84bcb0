#!/usr/bin/env bash
# The bar's table on an H200 (prepared in session 50 for the next call that gets one): main's
# bundle (`cargo xtask gpu-bundle`, carried as .gpu-bundle, with .device/bench_table.py =
# runs/2026-12-05-s38-bench_table.py), V4-Pro per rank, both routes, T = 8 ... 8192, fused and
# unfused side by side (the fused/unfused ratio), burst clock in ROUNDS rounds
# of five (default three), then one sustained round (2 s of forwards back to back first), then
# gpu_fused as the gate (carry [".gpu-bundle", ".device"]). Logs into $OUT/all.tgz after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
M=.gpu-bundle/bin/megamoe
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt; save
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --tokens 8,128,512,2048,8192"
el warm; timeout 200 $M $B --path fused,unfused --reps 1 > $L/warm.log 2>&1; save
for r in ${ROUNDS:-1 2 3}; do
  el bench $r; timeout 120 $M $B --path fused,unfused --reps 5 > $L/bench.main.$r.log 2>&1 || echo "bench $r rc $?"
  python3 .device/bench_table.py main=$(ls $L/bench.main.*.log | paste -sd,) > $L/table.txt 2>&1; save
done
cat $L/table.txt
el sustained; timeout 150 $M $B --path fused,unfused --reps 5 --warm-up-ms 2000 > $L/sustained.log 2>&1; save
grep -E "fused  1" $L/sustained.log | cut -c1-120
el gpu_fused; TEST_TIMEOUT=150 timeout 200 .gpu-bundle/run.sh gpu_fused > $L/gates.gpu_fused.main.log 2>&1
grep -E "^FAIL|passed" $L/gates.gpu_fused.main.log; el done; save
