#!/usr/bin/env bash
# Session 44's first call: what the main loops can do with no memory traffic at all, against what
# they do. (1) The grouped-GEMM benchmark of main (head) and of co (main +
# runs/2026-12-06-s44-compute-only-co.patch: TIMING ONLY, once every ring stage was filled the
# producer completes stages without copies) at T = 512, 2048, 8192 on both routes, and the
# mx32 T = 8192 tiles 128 against 256; two alternating rounds. (2) The compute-only WGMMA ceiling
# (../shared/bench/wgmma_ceiling.cu with the (f) variants: FP4 -> E4M3 decode of A in registers
# and one promotion per k128, runs/2026-12-06-s44-wgmma-ceiling-f.patch). (3) On an H200 also the
# bar's table (.device/s43g.sh). Bundle .device/s44a.tgz by runs/2026-12-06-s44a-pack.sh.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s44a; rm -rf $D; mkdir -p $D; tar xzf .device/s44a.tgz -C $D
L=$OUT/s44a; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt
el ceiling build
( cd $D && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -o wgmma_ceiling wgmma_ceiling.cu \
    > $L/ceiling.build.log 2>&1; echo "rc $?" >> $L/ceiling.build.log ) &
V="head co"
for r in 1 2; do for v in $V; do
  el gemm $v $r
  timeout 200 $D/bin/gemm.$v --tokens 512,2048,8192 --routes g128/fp8,mx32/bf16 > $L/gemm.$v.$r.log 2>&1 || echo "gemm $v $r rc $?"
  timeout 100 $D/bin/gemm.$v --tokens 8192 --routes mx32/bf16 --tiles 128,256 > $L/tiles.$v.$r.log 2>&1 || echo "tiles $v $r rc $?"
done; done
wait
el ceiling run
( cd $D && timeout 150 ./wgmma_ceiling 30 > $L/ceiling.log 2>&1; echo "rc $?" >> $L/ceiling.log )
tail -60 $L/ceiling.log
for f in $L/gemm.*.log $L/tiles.*.log; do echo "== $f"; cat $f; done
if grep -q H200 $L/gpu.txt; then el bar table; bash .device/s43g.sh; cp /tmp/logs/table.txt $L/bar-table.txt; fi
el done
