#!/usr/bin/env bash
# Session 56's short br/br2 call (what the device time left allows: timing only): carry as s56c.
# main, br and br2, g128/fp8 and mx32/bf16 fused, T = 2048 and 8192, alternating rounds, then
# timelines of main and br2 at the same T. Logs into $OUT/all.tgz after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64 \
  MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt; save
tar xJf .device/clis.tar.xz -C .device
declare -A M=([main]=.device/main8b/megamoe [br]=.device/br/megamoe [br2]=.gpu-bundle/bin/megamoe)
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes ${ROUTES:-g128/fp8,mx32/bf16} --tokens 2048,8192 --path fused"
el warm
for v in main br br2; do MEGAMOE_CACHE=/tmp/cache.$v timeout 120 ${M[$v]} $B --reps 1 > $L/warm.$v.log 2>&1 & done; wait; save
for r in ${ROUNDS:-1 2 3}; do for v in main br br2; do
  el bench $v $r
  MEGAMOE_CACHE=/tmp/cache.$v timeout 60 ${M[$v]} $B --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
done; python3 .device/bench_table.py $(for v in main br br2; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) > $L/table.txt 2>&1; save; done
cat $L/table.txt
for v in main br2; do
  el timeline $v
  MEGAMOE_CACHE=/tmp/cache.$v timeout 30 ${M[$v]} $B --reps 1 --timeline $L/tl.$v > $L/tl.$v.log 2>&1
  python3 .device/tl_stats.py $L/tl.$v/*.json > $L/tl_stats.$v.txt 2>&1; grep -E "json|top-k" $L/tl_stats.$v.txt | cut -c1-160; save
done
el done; save
