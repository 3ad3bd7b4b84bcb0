#!/usr/bin/env bash
# Session 55's probe call (timing only; carry ".device"): main (57df870's `megamoe`, main's kernels,
# from .gpu-bundle/bin) against c0 (runs/2026-12-07-s55-no-converter-c0.patch: one-CTA FP8 tiles without
# the converter warp, the consumers not waiting for its floats), c3 (…-three-epilogue-warps-c3.patch:
# c0, and warp 1 a third SwiGLU epilogue warp) and ne (…-no-epilogue-work-ne.patch: the epilogue
# warps compute and store nothing), each a stripped `megamoe` in .device/<v>/. V4-Pro per rank,
# g128/fp8, fused, burst, alternating rounds (ROUNDS, default three); timelines at T = 2048 and 8192.
# Logs into $OUT/all.tgz after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s55b; rm -rf $D
for v in main c0 c3 ne; do mkdir -p $D/$v; cp .device/$v/megamoe $D/$v/; done
V="main c0 c3 ne"
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt; save
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes ${ROUTES:-g128/fp8}"
T=${TOKENS:-512,1024,2048,4096,8192}
el warm
for v in $V; do ( MEGAMOE_CACHE=/tmp/cache.$v timeout 200 $D/$v/megamoe $B --path fused --tokens $T --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait; save; grep -iE "error|panick" $L/warm.*.log | head -5
for r in ${ROUNDS:-1 2 3}; do for v in $V; do
  el bench $v $r
  MEGAMOE_CACHE=/tmp/cache.$v timeout 90 $D/$v/megamoe $B --path fused --tokens $T --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
done; python3 .device/bench_table.py $(for v in $V; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) > $L/table.txt 2>&1; save; done
cat $L/table.txt
for v in $V; do
  el timeline $v
  MEGAMOE_CACHE=/tmp/cache.$v timeout 40 $D/$v/megamoe $B --path fused --tokens 2048,8192 --reps 1 --timeline $L/tl.$v > $L/tl.$v.log 2>&1
  python3 .device/tl_stats.py $L/tl.$v/*.json > $L/tl_stats.$v.txt 2>&1; grep -E "json|L1 -> L2|a tile" $L/tl_stats.$v.txt | cut -c1-150
done; save
el done; save
