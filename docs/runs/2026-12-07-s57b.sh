#!/usr/bin/env bash
# Session 57's second call (the same carry as s57a: .gpu-bundle = br2's bundle): what s55d left
# unrun — gpu_cuda in the background (ranks sharing the GPU, every route), and compute-sanitizer's
# four tools on the tiny fused forwards and on the GEMM tests of the token scales' paths (one-CTA
# loads, two-CTA chunks, overhangs), as BUDGET (s, default 300) lasts. Logs into $OUT/all.tgz
# after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64 \
  MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-300} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $L/gpu.txt; save
el gpu_cuda
MEGAMOE_CACHE=/tmp/cache.cuda TEST_TIMEOUT=300 timeout $(( $(left) - 5 )) .gpu-bundle/run.sh gpu_cuda > $L/gates.gpu_cuda.log 2>&1 &
cuda=$!
for name in gpu_fused::fused_tiny token_scales_in_several every_specialization overhang_units; do (( $(left) > 30 )) || break
  el sanitize $name; SANITIZE_LOGS=$L/sanitize.$name SANITIZE_TIMEOUT=$(( $(left) - 10 )) timeout $(( $(left) - 5 )) \
    .gpu-bundle/sanitize.sh "" $name > $L/sanitize.$name.log 2>&1; grep -hE "CLEAN|KNOWN|SKIP|FAIL" $L/sanitize.$name.log | cut -c1-150; save
done
wait $cuda; grep -E "^FAIL|passed" $L/gates.gpu_cuda.log | cut -c1-150
el done; save
