#!/usr/bin/env bash
# Session 44's second call: s44a's head and co (compute only, TIMING ONLY) at the burst clock —
# every sample one launch after 100 ms idle — at T = 512, 2048, 8192 on both routes, so that the
# main loop's rate with and without memory traffic is compared at the clock the bar is measured
# at; then main's fused forwards (s43g's CLI, a120cb0's kernels = 1ec1330's) at those T, burst.
# Bundles .device/s44a.tgz, .device/s43g.tgz.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s44a; rm -rf $D; mkdir -p $D; tar xzf .device/s44a.tgz -C $D; tar xzf .device/s43g.tgz -C $D
L=$OUT/s44b; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt
for v in head co head co; do
  el gemm $v
  timeout 150 $D/bin/gemm.$v --tokens 512,2048,8192 --routes g128/fp8,mx32/bf16 --idle-ms 100 >> $L/burst.$v.log 2>&1 || echo "gemm $v rc $?"
done
el fused
timeout 150 $D/bin/megamoe.new bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 \
  --path fused --tokens 512,2048,8192 --reps 5 > $L/fused.log 2>&1 || echo "fused rc $?"
for f in $L/*.log; do echo "== $f"; grep -v "^#" $f | grep -v "^route"; done
el done
