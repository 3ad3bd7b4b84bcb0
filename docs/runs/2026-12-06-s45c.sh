#!/usr/bin/env bash
# Session 45, call 3: the gates of the landing build (hb + e1 + racecheck's rank_barrier pair known):
# gpu_twin, gpu_fused, gpu_unfused, gpu_engine, compute-sanitizer's four tools on the tiny fused
# forwards, gpu_gemm, gpu_cuda, as long as BUDGET lasts. Logs into $OUT/all.tgz.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s45c; rm -rf $D; mkdir -p $D; tar xzf .device/s45c.tgz -C $D
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-560} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt
gate() {  # filter
  (( $(left) > 40 )) || { el "skip gates $1"; return; }
  el gates $1
  TEST_TIMEOUT=$(( $(left) - 15 )) $D/land/run.sh $1 > $L/gates.$1.log 2>&1; grep -E "^FAIL|passed" $L/gates.$1.log
  save
}
gate gpu_twin
gate gpu_fused
gate gpu_unfused
gate gpu_engine
if (( $(left) > 80 )); then
  el sanitize
  SANITIZE_LOGS=$L/sanitize SANITIZE_TIMEOUT=$(( $(left) - 20 )) timeout $(( $(left) - 10 )) $D/land/sanitize.sh "" gpu_fused > $L/sanitize.log 2>&1
  grep -hE "CLEAN|KNOWN|SKIP|FAIL|clean," $L/sanitize.log | cut -c1-160
  save
fi
gate gpu_gemm
gate gpu_cuda
el done; save
