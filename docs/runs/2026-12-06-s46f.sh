#!/usr/bin/env bash
# Session 46, prepared (runs/2026-12-06-s46f-pack.sh builds .device/s46f.tgz): lsw, the layer
# switch with the consumers' end mark given at once — a smoke test (tiny preset, three routes; a
# hang shows as a timeout); lsw against main (938fb17), fused forwards, burst clock, two
# alternating rounds, T = 8 ... 8192 with 1000; the timeline's L1 -> L2 gap at T = 2048; lsw's
# gpu_fused and the sanitizer on its tiny fused forwards, as long as BUDGET lasts. Logs into
# $OUT/all.tgz, saved after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s46f; rm -rf $D; mkdir -p $D; tar xzf .device/s46f.tgz -C $D
mkdir -p $D/bin; cp $D/main/bin/megamoe $D/bin/megamoe.main; cp $D/lsw/bin/megamoe $D/bin/megamoe.lsw
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-420} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt; save
el smoke
timeout 45 $D/bin/megamoe.lsw bench --preset tiny --ranks 1 --routes g128/fp8,mx32/bf16,g128/bf16-fp8 --path fused \
  --tokens 24,256 --reps 1 > $L/smoke.log 2>&1; echo "smoke rc $?"; grep -E "fused  1" $L/smoke.log | cut -c1-100; save
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused"
T=8,128,512,1000,2048,8192
el warm
for v in main lsw; do ( timeout 150 $D/bin/megamoe.$v $B --tokens $T --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait; save
for r in 1 2; do for v in main lsw; do
  el bench $v $r
  timeout 70 $D/bin/megamoe.$v $B --tokens $T --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
done; done
python3 .device/bench_table.py main=$(ls $L/bench.main.*.log | paste -sd,) lsw=$(ls $L/bench.lsw.*.log | paste -sd,) | tee $L/table.txt; save
el timeline lsw
timeout 40 $D/bin/megamoe.lsw bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused \
  --tokens 2048 --reps 1 --timeline $L/tl.lsw > $L/tl.lsw.log 2>&1 || echo "timeline rc $?"
python3 .device/tl_stats.py $L/tl.lsw/*.json > $L/tl_stats.txt 2>&1; grep -E "json|gap|L2 end" $L/tl_stats.txt | cut -c1-150; save
el gpu_fused; TEST_TIMEOUT=100 timeout $(( $(left) - 60 )) $D/lsw/run.sh gpu_fused > $L/gates.gpu_fused.log 2>&1
grep -E "^FAIL|passed" $L/gates.gpu_fused.log | cut -c1-150; save
if (( $(left) > 30 )); then
  el sanitize
  SANITIZE_LOGS=$L/sanitize SANITIZE_TIMEOUT=$(( $(left) - 10 )) timeout $(( $(left) - 5 )) $D/lsw/sanitize.sh "" gpu_fused > $L/sanitize.log 2>&1
  grep -hE "CLEAN|KNOWN|SKIP|FAIL|clean," $L/sanitize.log | cut -c1-160
fi
el done; save
