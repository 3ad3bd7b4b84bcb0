#!/usr/bin/env bash
# Session 58's call (s58a-pack.sh's carry: .gpu-bundle = main with br, .device with this script and
# the `megamoe` of p8 and p16, the first weights' prefetch at 8 and 16 MiB, timed at T ≤ 512).
# br's gates (s58b.sh: gpu_fused, gpu_engine, gpu_unfused, then compute-sanitizer on the tiny
# fused forwards) beside the warm-ups, then ROUNDS alternating rounds (default three; the bar's
# table: g128/fp8 and mx32/bf16, fused and unfused, T = 8 ... 8192, burst clock), main's sustained
# round, and main's timelines.
# Logs into $OUT/all.tgz after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64 \
  MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt; save
tar xJf .device/clis.tar.xz -C .device
declare -A M=([main]=.gpu-bundle/bin/megamoe [p8]=.device/p8/megamoe [p16]=.device/p16/megamoe)
declare -A T=([main]=8,128,512,2048,8192 [p8]=8,128,512 [p16]=8,128,512)
V=${V:-"main p8 p16"}
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16"
el warm+gates
for v in $V; do
  MEGAMOE_CACHE=/tmp/cache.$v timeout 240 ${M[$v]} $B --tokens ${T[$v]} --path fused,unfused --reps 1 > $L/warm.$v.log 2>&1 &
done
LOGS=$L/gates bash .device/s58b.sh > $L/gates.txt 2>&1 &
wait; save; grep -iE "error|panick" $L/warm.*.log | head -5; cat $L/gates.txt
for r in ${ROUNDS:-1 2 3}; do for v in $V; do
  el bench $v $r
  MEGAMOE_CACHE=/tmp/cache.$v timeout 120 ${M[$v]} $B --tokens ${T[$v]} --path fused,unfused --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
done; python3 .device/bench_table.py $(for v in $V; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) > $L/table.txt 2>&1; save; done
cat $L/table.txt
el sustained main
MEGAMOE_CACHE=/tmp/cache.main timeout 150 ${M[main]} $B --tokens ${T[main]} --path fused,unfused --reps 5 --warm-up-ms 2000 > $L/sustained.main.log 2>&1; save
el timeline main
MEGAMOE_CACHE=/tmp/cache.main timeout 60 ${M[main]} $B --path fused --tokens ${T[main]} --reps 1 --timeline $L/tl.main > $L/tl.main.log 2>&1
python3 .device/tl_stats.py $L/tl.main/*.json > $L/tl_stats.main.txt 2>&1; grep -E "json|glue|L2 end|MHz" $L/tl_stats.main.txt | cut -c1-160
el done; save
