#!/usr/bin/env bash
# Session 40's third call: hxe's timelines (g128/fp8 and mx32/bf16 at T = 8 and 128) through
# handover.py (the hand-over with the epilogue's 8 lanes a token), then base and ep in
# alternating rounds, ep's gates (gpu_fused, gpu_gemm: every specialization's SwiGLU), ep under
# compute-sanitizer, then gpu_unfused and gpu_engine, each step only when the call's time allows. Every
# log goes into $OUT/all.tgz, re-made after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s40c; rm -rf $D; mkdir -p $D; tar xzf .device/s40c.tgz -C $D
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-570} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused"
el warm
for v in base ep; do ( timeout 150 $D/$v/bin/megamoe $B --tokens 8,128,512,2048,8192 --reps 1 > $L/warm.$v.log 2>&1 ) & done
( timeout 150 $D/hxe/bin/megamoe $B --tokens 8,128 --reps 1 --timeline $L/tl > $L/hxe.log 2>&1 ) &
wait
python3 .device/handover.py $L/tl/*.json | tee $L/handover.txt | grep -E "==|gap|mark 2|mark 3|mark 9"; save
V="base ep"
table() { python3 .device/bench_table.py $(for v in $V; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) | tee $L/table.txt; }
for r in 1 2; do
  for v in $V; do
    (( $(left) > 60 )) || { el "skip bench $v $r"; continue; }
    el bench $v $r
    timeout $(( $(left) - 20 )) $D/$v/bin/megamoe $B --tokens 8,128,512,2048,8192 --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
  done
  [[ $r == 2 ]] && table || table > /dev/null; save
done
for g in gpu_fused gpu_gemm; do
  (( $(left) > 70 )) || { el "skip gates $g"; continue; }
  el gates ep $g
  TEST_TIMEOUT=$(( $(left) - 15 )) $D/ep/run.sh $g > $L/gates.ep.$g.log 2>&1; grep -E "^FAIL|passed" $L/gates.ep.$g.log
  save
done
if (( $(left) > 80 )); then
  el sanitize ep
  SANITIZE_LOGS=$L/sanitize SANITIZE_TIMEOUT=$(( $(left) - 20 )) timeout $(( $(left) - 10 )) $D/ep/sanitize.sh "" gpu_fused > $L/sanitize.ep.log 2>&1
  grep -E "CLEAN|KNOWN|SKIP|FAIL" $L/sanitize.ep.log | cut -c1-160
fi
for g in gpu_unfused gpu_engine; do
  (( $(left) > 40 )) || { el "skip gates $g"; continue; }
  el gates ep $g
  TEST_TIMEOUT=$(( $(left) - 10 )) $D/ep/run.sh $g > $L/gates.ep.$g.log 2>&1; grep -E "^FAIL|passed" $L/gates.ep.$g.log
  save
done
el done; save
