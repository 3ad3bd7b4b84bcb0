#!/usr/bin/env bash
# Session 41's second call: the epilogue's lanes a token by tile, after s40c (ep: 8 lanes for every
# two-CTA tile: g128 T = 8 -1.4 %, T = 128 +3.3 %, where ptxas serialized the FP8 32-token kernel's
# wgmmas). tb (= main), ep, e16 (8 lanes for 16-token tiles only), eb (8 lanes for 16-token tiles
# and BF16 32-token ones) in three alternating rounds, then eb's gates (gpu_fused, gpu_gemm), eb
# under compute-sanitizer, gpu_unfused, gpu_engine, each step only when the call's time allows.
# Every log goes into $OUT/all.tgz, re-made after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s41; rm -rf $D; mkdir -p $D; tar xzf .device/s41.tgz -C $D
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-570} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused"
V="tb ep e16 eb"
el warm
for v in $V; do ( timeout 150 $D/bin/megamoe.$v $B --tokens 8,128,512,2048,8192 --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait; save
table() { python3 .device/bench_table.py $(for v in $V; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) | tee $L/table.txt; }
for r in 1 2 3; do
  for v in $V; do
    (( $(left) > 60 )) || { el "skip bench $v $r"; continue; }
    el bench $v $r
    timeout $(( $(left) - 20 )) $D/bin/megamoe.$v $B --tokens 8,128,512,2048,8192 --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
  done
  [[ $r == 3 ]] && table || table > /dev/null; save
done
for g in gpu_fused gpu_gemm; do
  (( $(left) > 70 )) || { el "skip gates $g"; continue; }
  el gates eb $g
  TEST_TIMEOUT=$(( $(left) - 15 )) $D/eb/run.sh $g > $L/gates.eb.$g.log 2>&1; grep -E "^FAIL|passed" $L/gates.eb.$g.log
  save
done
if (( $(left) > 80 )); then
  el sanitize eb
  SANITIZE_LOGS=$L/sanitize SANITIZE_TIMEOUT=$(( $(left) - 20 )) timeout $(( $(left) - 10 )) $D/eb/sanitize.sh "" gpu_fused > $L/sanitize.eb.log 2>&1
  grep -E "CLEAN|KNOWN|SKIP|FAIL" $L/sanitize.eb.log | cut -c1-160
fi
for g in gpu_unfused gpu_engine; do
  (( $(left) > 40 )) || { el "skip gates $g"; continue; }
  el gates eb $g
  TEST_TIMEOUT=$(( $(left) - 10 )) $D/eb/run.sh $g > $L/gates.eb.$g.log 2>&1; grep -E "^FAIL|passed" $L/gates.eb.$g.log
  save
done
el done; save
