#!/usr/bin/env bash
# Session 39, the second call: main (3338b64, built in a target folder of its own) against pw (main +
# the unit's weights into L2 while its rows wait, runs/2026-12-06-s39-weights-into-l2-while-rows-wait.patch):
# two alternating timing rounds, then main's gates with the poisoned pools and pw's kernels under
# compute-sanitizer (the tiny fused forwards). Everything goes into $OUT/all.tgz, re-made after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s39b; rm -rf $D; mkdir -p $D; tar xzf .device/s39b.tgz -C $D
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
V="main pw"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee $L/gpu.txt
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused"
el warm
for v in $V; do ( $D/$v/bin/megamoe $B --tokens 8,2048 --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait
for r in 1 2; do
  for v in $V; do
    el bench $v $r
    timeout 200 $D/$v/bin/megamoe $B --tokens 8,128,512,2048,8192 --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
  done
done
python3 .device/bench_table.py $(for v in $V; do echo -n "$v=$L/bench.$v.1.log,$L/bench.$v.2.log "; done) | tee $L/table.txt
save
for g in "main gpu_unfused" "main gpu_engine"; do
  set -- $g; el gates $1 $2
  TEST_TIMEOUT=240 $D/$1/run.sh $2 > $L/gates.$1.$2.log 2>&1; grep -E "^FAIL|passed" $L/gates.$1.$2.log
  save
done
el sanitize pw
SANITIZE_LOGS=$L/sanitize SANITIZE_TIMEOUT=100 timeout 110 $D/pw/sanitize.sh "" gpu_fused > $L/sanitize.pw.log 2>&1
grep -E "CLEAN|KNOWN|SKIP|FAIL" $L/sanitize.pw.log | cut -c1-160; save
el done
