#!/usr/bin/env bash
# Session 42's third call (bundle by runs/2026-12-06-s42c-pack.sh): the standalone GEMMs' 64-token
# twins, main against tw (two parities, the decode under the wgmmas), g128/fp8 at T = 384 and 512
# (`--tiles 64`), two alternating rounds; then tw's gpu_gemm (every specialization against the
# reference). Logs into $OUT/all.tgz.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s42c; rm -rf $D; mkdir -p $D; tar xzf .device/s42c.tgz -C $D
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt
for r in 1 2; do
  for v in main tw; do
    el gemm $v $r
    (cd $D/$v && timeout 120 bench/megamoe-kernel.gemm --tokens 384,512 --tiles 64 --routes g128/fp8) > $L/gemm.$v.$r.log 2>&1 || echo "gemm $v $r rc $?"
    grep -E '^ *(g128|T|route)' $L/gemm.$v.$r.log | head -12
  done
  save
done
el gates tw gpu_gemm
TEST_TIMEOUT=120 $D/tw/run.sh gpu_gemm > $L/gates.tw.gpu_gemm.log 2>&1; grep -E "^FAIL|passed" $L/gates.tw.gpu_gemm.log
el done; save
