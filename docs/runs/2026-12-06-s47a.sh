#!/usr/bin/env bash
# Session 47, call 1. Bundles: runs/2026-12-06-s46f-pack.sh -> .device/s46f.tgz (main, lsw);
# .device/s47sd.tgz, a `cargo xtask gpu-bundle` of lsw + sd's first form packed as sd/ (the pair's
# first tile stored at once, its spill read back only where the second tile raises the group's
# exponent; runs/2026-12-06-s47-pair-first-tile-at-once-sd.patch is its later form, on lsw2).
# Smoke tests of lsw and sd (tiny preset, three routes; a hang shows as a timeout); main / lsw / sd,
# fused forwards, burst clock, two alternating rounds, T = 8 ... 8192; the timelines' L1 -> L2 gap
# at T = 2048 (main and lsw); sd's landing gates (s47b.sh), then lsw's gpu_fused as long as BUDGET
# lasts. Logs into $OUT/all.tgz after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s47a; rm -rf $D; mkdir -p $D; tar xzf .device/s46f.tgz -C $D; tar xzf .device/s47sd.tgz -C $D
mkdir -p $D/bin; for v in main lsw sd; do cp $D/$v/bin/megamoe $D/bin/megamoe.$v; done
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-450} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt; save
for v in lsw sd; do
  el smoke $v
  timeout 45 $D/bin/megamoe.$v bench --preset tiny --ranks 1 --routes g128/fp8,mx32/bf16,g128/bf16-fp8 --path fused \
    --tokens 24,256 --reps 1 > $L/smoke.$v.log 2>&1; echo "smoke $v rc $?"; grep -E "fused  1" $L/smoke.$v.log | cut -c1-100
done; save
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused"
T=8,128,512,1000,2048,8192
el warm
for v in main lsw sd; do ( timeout 150 $D/bin/megamoe.$v $B --tokens $T --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait; save
for r in 1 2; do for v in main lsw sd; do
  el bench $v $r
  timeout 70 $D/bin/megamoe.$v $B --tokens $T --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
done; python3 .device/bench_table.py main=$(ls $L/bench.main.*.log | paste -sd,) lsw=$(ls $L/bench.lsw.*.log | paste -sd,) \
  sd=$(ls $L/bench.sd.*.log | paste -sd,) > $L/table.txt 2>&1; save; done
cat $L/table.txt
for v in main lsw; do
  el timeline $v
  timeout 40 $D/bin/megamoe.$v bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused \
    --tokens 2048 --reps 1 --timeline $L/tl.$v > $L/tl.$v.log 2>&1 || echo "timeline $v rc $?"
  python3 .device/tl_stats.py $L/tl.$v/*.json > $L/tl_stats.$v.txt 2>&1; grep -E "json|gap|L2 end" $L/tl_stats.$v.txt | cut -c1-150
done; save
# sd holds all of lsw: its gates first (gpu_fused, the others, the sanitizer: runs/2026-12-06-s47b.sh),
# then lsw's gpu_fused as long as BUDGET lasts.
V=sd D0=$D BUDGET=$(( $(left) - 5 )) bash .device/s47b.sh
if (( $(left) > 30 )); then
  el gpu_fused lsw; TEST_TIMEOUT=100 timeout $(left) $D/lsw/run.sh gpu_fused > $L/gates.gpu_fused.lsw.log 2>&1
  grep -E "^FAIL|passed" $L/gates.gpu_fused.lsw.log | cut -c1-150
fi
el done; save
