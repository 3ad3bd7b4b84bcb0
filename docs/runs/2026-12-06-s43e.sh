#!/usr/bin/env bash
# Session 43's last call (s43c's bundle): bt (main with the BF16 twin units, as landed) on the
# bar's two routes at T = 8 … 8192, unfused and fused side by side, burst clock (each forward after
# its host I/O) and sustained (300 ms of forwards back to back first). Logs into $OUT/all.tgz.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s43c; [[ -d $D/bt ]] || { rm -rf $D; mkdir -p $D; tar xzf .device/s43c.tgz -C $D; }
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --tokens 8,128,512,2048,8192"
el warm
timeout 200 $D/bin/megamoe.bt $B --path unfused,fused --reps 1 > $L/warm.log 2>&1; save
el burst
timeout 120 $D/bin/megamoe.bt $B --path unfused,fused --reps 5 > $L/burst.log 2>&1; save
el sustained
timeout 120 $D/bin/megamoe.bt $B --path unfused,fused --reps 5 --warm-up-ms 300 > $L/sustained.log 2>&1
el done; save
cat $L/burst.log $L/sustained.log | grep -E 'fused|route' | cut -c1-150
