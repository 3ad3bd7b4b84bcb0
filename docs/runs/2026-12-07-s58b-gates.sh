#!/usr/bin/env bash
# br's gates (s58a-pack.sh's carry: .gpu-bundle built with br applied): gpu_fused, gpu_engine and
# gpu_unfused at once (br changes the fused and unfused top-k sums; gpu_fused runs both forwards),
# then compute-sanitizer's four tools on the tiny fused forwards. Alone it is the short call for a
# tight budget (≈ 200 s after the start); s58a.sh runs it beside its warm-ups. Logs under LOGS
# (default $OUT/logs).
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64 \
  MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
L=${LOGS:-$OUT/logs}; mkdir -p $L; t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader | tee $L/gpu.txt
for g in gpu_fused gpu_engine gpu_unfused; do
  MEGAMOE_CACHE=/tmp/cache.$g TEST_TIMEOUT=300 .gpu-bundle/run.sh $g > $L/gates.$g.log 2>&1 &
done
wait; echo "gates $(( $(date +%s) - t0 )) s"
for g in gpu_fused gpu_engine gpu_unfused; do
  echo "$g: $(grep -E 'passed' $L/gates.$g.log)"; grep -E "^FAIL" $L/gates.$g.log | cut -c1-150
done
MEGAMOE_CACHE=/tmp/cache.gpu_fused SANITIZE_LOGS=$L/sanitize SANITIZE_TIMEOUT=100 \
  .gpu-bundle/sanitize.sh "" gpu_fused::fused_tiny > $L/sanitize.log 2>&1
grep -hE "CLEAN|KNOWN|SKIP|FAIL" $L/sanitize.log | cut -c1-150; echo "done $(( $(date +%s) - t0 )) s"
