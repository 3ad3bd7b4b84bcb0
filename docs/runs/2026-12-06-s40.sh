#!/usr/bin/env bash
# Session 40's call: the dispatch variants (see 2026-12-06-s40-pack.sh) timed against main in
# alternating rounds (round 1 every T, round 2 the large T where the dispatch counts), then the
# tip's (rs) gates (the poisoned pools; both paths' dispatch and route changed) and rs under
# compute-sanitizer,
# each step only when the call's time allows. Every log goes into $OUT/all.tgz, re-made after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s40; rm -rf $D; mkdir -p $D; tar xzf .device/s40.tgz -C $D
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-570} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
V="main tk tkp rs ns"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused"
el warm
for v in $V; do ( timeout 150 $D/$v/bin/megamoe $B --tokens 8,128,512,2048,8192 --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait; save
table() { python3 .device/bench_table.py $(for v in $V; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) | tee $L/table.txt; }
for r in 1 2; do
  [[ $r == 1 ]] && T=8,128,512,2048,8192 || T=8,2048,8192
  for v in $V; do
    (( $(left) > 60 )) || { el "skip bench $v $r"; continue; }
    el bench $v $r
    timeout $(( $(left) - 20 )) $D/$v/bin/megamoe $B --tokens $T --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
  done
  table; save
done
for g in gpu_fused gpu_unfused gpu_engine gpu_cuda; do
  (( $(left) > 70 )) || { el "skip gates $g"; continue; }
  el gates rs $g
  TEST_TIMEOUT=$(( $(left) - 15 )) $D/rs/run.sh $g > $L/gates.rs.$g.log 2>&1; grep -E "^FAIL|passed" $L/gates.rs.$g.log
  save
done
if (( $(left) > 80 )); then
  el sanitize rs
  SANITIZE_LOGS=$L/sanitize SANITIZE_TIMEOUT=$(( $(left) - 20 )) timeout $(( $(left) - 10 )) $D/rs/sanitize.sh "" gpu_fused > $L/sanitize.rs.log 2>&1
  grep -E "CLEAN|KNOWN|SKIP|FAIL" $L/sanitize.rs.log | cut -c1-160
fi
el done; save
