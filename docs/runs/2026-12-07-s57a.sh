#!/usr/bin/env bash
# Session 57's first call, on an H200 (s57a-pack.sh's carry: .gpu-bundle = br2's bundle, .device
# with this script and the `megamoe` of main, br, p8, p16, dp and k32). The variants: br and br2
# (the top-k sums in even shares a warp), p8 and p16 (the first weights' prefetch at 8 and 16 MiB,
# timed at T ≤ 512), dp (the one-CTA FP8 dispatch by pairs below two rounds of tokens, timed at
# T = 2048), k32 (timing only: the FP8 main loops promoted once a k32 step, as an mx32 route through
# FP8 WGMMA would be; g128/fp8 at T ≤ 512).
# br2's gpu_fused gate beside the warm-ups, then alternating rounds (ROUNDS, default three; the
# variants V, default all; session 57's H100 call: ROUNDS="1 2" V="main br br2 dp k32") (the bar's table for
# main, br and br2: g128/fp8 and mx32/bf16, fused and unfused, T = 8 ... 8192, burst clock),
# main's sustained round, and timelines at T = 2048 and 8192 (main's also at 8 and 128).
# Logs into $OUT/all.tgz after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64 \
  MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt; save
tar xJf .device/clis.tar.xz -C .device
declare -A M=([main]=.device/main/megamoe [br]=.device/br/megamoe [br2]=.gpu-bundle/bin/megamoe
  [p8]=.device/p8/megamoe [p16]=.device/p16/megamoe [dp]=.device/dp/megamoe [k32]=.device/k32/megamoe)
declare -A T=([main]=8,128,512,2048,8192 [br]=8,128,512,2048,8192 [br2]=8,128,512,2048,8192
  [p8]=8,128,512 [p16]=8,128,512 [dp]=2048 [k32]=8,128,512)
declare -A R=([main]=g128/fp8,mx32/bf16 [br]=g128/fp8,mx32/bf16 [br2]=g128/fp8,mx32/bf16
  [p8]=g128/fp8,mx32/bf16 [p16]=g128/fp8,mx32/bf16 [dp]=g128/fp8 [k32]=g128/fp8)
V=${V:-"main br br2 p8 p16 dp k32"}  # p8 and p16 are for an H200
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48"
el warm+gates
for v in $V; do
  MEGAMOE_CACHE=/tmp/cache.$v timeout 240 ${M[$v]} $B --routes ${R[$v]} --tokens ${T[$v]} --path fused,unfused --reps 1 > $L/warm.$v.log 2>&1 &
done
MEGAMOE_CACHE=/tmp/cache.gates TEST_TIMEOUT=300 timeout 330 .gpu-bundle/run.sh gpu_fused > $L/gates.gpu_fused.br2.log 2>&1 &
wait; save; grep -iE "error|panick" $L/warm.*.log | head -5
echo "gpu_fused br2: $(grep -E 'passed' $L/gates.gpu_fused.br2.log)"; grep -E "^FAIL" $L/gates.gpu_fused.br2.log | cut -c1-150
for r in ${ROUNDS:-1 2 3}; do for v in $V; do
  el bench $v $r
  MEGAMOE_CACHE=/tmp/cache.$v timeout 120 ${M[$v]} $B --routes ${R[$v]} --tokens ${T[$v]} --path fused,unfused --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
done; python3 .device/bench_table.py $(for v in $V; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) > $L/table.txt 2>&1; save; done
cat $L/table.txt
el sustained main
MEGAMOE_CACHE=/tmp/cache.main timeout 150 ${M[main]} $B --routes ${R[main]} --tokens ${T[main]} --path fused,unfused --reps 5 --warm-up-ms 2000 > $L/sustained.main.log 2>&1; save
for v in main br br2 dp; do
  el timeline $v
  tl=2048,8192; [ $v = main ] && tl=8,128,$tl; [ $v = dp ] && tl=2048
  MEGAMOE_CACHE=/tmp/cache.$v timeout 60 ${M[$v]} $B --routes ${R[$v]} --path fused --tokens $tl --reps 1 --timeline $L/tl.$v > $L/tl.$v.log 2>&1
  python3 .device/tl_stats.py $L/tl.$v/*.json > $L/tl_stats.$v.txt 2>&1; grep -E "json|glue|L2 end" $L/tl_stats.$v.txt | cut -c1-160; save
done
el done; save
