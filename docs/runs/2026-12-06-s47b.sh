#!/usr/bin/env bash
# Session 47, call 2: the landing gates of one variant's bundle (V = lsw | sd; .device/s46f.tgz,
# .device/s47sd.tgz): gpu_fused (unless SKIP_FUSED), gpu_unfused, gpu_engine, gpu_gemm, gpu_twin,
# then compute-sanitizer on the tiny fused forwards as long as BUDGET lasts. Logs into $OUT/all.tgz.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
V=${V:-lsw}
D=${D0:-/tmp/s47b}; if [ ! -d $D/$V ]; then rm -rf $D; mkdir -p $D; tar xzf .device/s46f.tgz -C $D; tar xzf .device/s47sd.tgz -C $D; fi
L=/tmp/logs; mkdir -p $L
t0=$(date +%s); el() { echo "[b $(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-540} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
gates="gpu_unfused gpu_engine gpu_gemm gpu_twin"; [ -n "${SKIP_FUSED:-}" ] || gates="gpu_fused $gates"
for g in $gates; do
  (( $(left) > 40 )) || { echo "no time for $g"; continue; }
  el $g $V; TEST_TIMEOUT=150 timeout $(( $(left) - 30 )) $D/$V/run.sh $g > $L/gates.$g.$V.log 2>&1
  grep -E "^FAIL|test result|passed" $L/gates.$g.$V.log | cut -c1-150; save
done
if (( $(left) > 40 )); then
  el sanitize $V
  SANITIZE_LOGS=$L/sanitize.$V SANITIZE_TIMEOUT=$(( $(left) - 10 )) timeout $(( $(left) - 5 )) $D/$V/sanitize.sh "" gpu_fused > $L/sanitize.$V.log 2>&1
  grep -hE "CLEAN|KNOWN|SKIP|FAIL|clean," $L/sanitize.$V.log | cut -c1-160
fi
el done; save
