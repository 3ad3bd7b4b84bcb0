#!/usr/bin/env bash
# Session 46, call 3: lsw (the layer switch; s46b's build with the FP8 L2's converter taken by warp 1
# whatever it was in the L1: a BF16 L1's epilogue warp) — a smoke test of its fused forwards on
# the tiny preset (three routes, a hang shows as a timeout); lsw against main (938fb17's kernels
# = s45c's landed bundle), fused forwards, burst clock, two alternating rounds, T = 8 ... 8192
# with 1000 (the FP8 128-token tile); timelines at g128 T = 2048; then lsw's gpu_fused while time
# is left. Logs into $OUT/all.tgz, saved after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s46c; rm -rf $D; mkdir -p $D; for t in s45c s46b; do tar xzf .device/$t.tgz -C $D; done
mkdir -p $D/bin; cp $D/land/bin/megamoe $D/bin/megamoe.main; cp $D/lsw/bin/megamoe $D/bin/megamoe.lsw
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-540} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt; save
for r in g128/fp8 mx32/bf16 g128/bf16-fp8; do
  el smoke $r
  timeout 45 $D/bin/megamoe.lsw bench --preset tiny --ranks 1 --routes $r --path fused --tokens 24,256 --reps 1 \
    > $L/smoke.${r//\//_}.log 2>&1; echo "smoke $r rc $?"; tail -3 $L/smoke.${r//\//_}.log | cut -c1-150; save
done
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused"
T=8,128,512,1000,2048,8192
el warm
for v in main lsw; do ( timeout 150 $D/bin/megamoe.$v $B --tokens $T --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait; save
for r in 1 2; do for v in main lsw; do
  el bench $v $r
  timeout 70 $D/bin/megamoe.$v $B --tokens $T --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
  save
done; done
python3 .device/bench_table.py main=$(ls $L/bench.main.*.log | paste -sd,) lsw=$(ls $L/bench.lsw.*.log | paste -sd,) | tee $L/table.txt; save
for v in main lsw; do
  el timeline $v
  timeout 40 $D/bin/megamoe.$v bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8 --path fused --tokens 2048 --reps 1 --timeline $L/tl.$v > $L/tl.$v.log 2>&1 || echo "timeline $v rc $?"
done
python3 .device/tl_stats.py $L/tl.*/*.json > $L/tl_stats.txt 2>&1; head -30 $L/tl_stats.txt | cut -c1-160; save
if (( $(left) > 60 )); then
  el gpu_fused; TEST_TIMEOUT=$(( $(left) - 20 )) timeout $(( $(left) - 10 )) $D/lsw/run.sh gpu_fused > $L/gates.gpu_fused.log 2>&1
  grep -E "^FAIL|^PASS|^SKIP|passed" $L/gates.gpu_fused.log | cut -c1-150
fi
el done; save
