#!/usr/bin/env bash
# Session 55's last fs call (carry .gpu-bundle: fs's bundle with the two-rank case at T = 2048):
# racecheck on the tiny two-rank fused forward (the new known pair), then gpu_fused's two ranks on
# one GPU, whose T = 2048 case stages the rows from the peer (fs's float scales through uf_unstage
# and the fused dispatch's staged path). Logs into $OUT/all.tgz after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64 \
  MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1 MEGAMOE_CACHE=/tmp/megamoe-cache
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $L/gpu.txt
el racecheck
SANITIZE_LOGS=$L/sanitize SANITIZE_TIMEOUT=60 timeout 70 .gpu-bundle/sanitize.sh racecheck fused_tiny_one_forward_two_ranks \
  > $L/sanitize.log 2>&1; grep -hE "CLEAN|KNOWN|SKIP|FAIL" $L/sanitize.log | cut -c1-150; save
el two ranks
TEST_TIMEOUT=${TEST_TIMEOUT:-100} .gpu-bundle/run.sh fused_two_ranks_sharing_one_gpu > $L/gates.log 2>&1
grep -E "^(PASS|FAIL)|passed" $L/gates.log | cut -c1-150; el done; save
