#!/usr/bin/env bash
# Session 43's fourth call (s43c's bundle): main against bt (BF16 twin units) on the bar's two
# routes at T = 8 … 8192, three alternating rounds; then bt's remaining gates: gpu_unfused,
# gpu_engine, compute-sanitizer on the tiny fused forwards, gpu_cuda. Logs into $OUT/all.tgz.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s43c; [[ -d $D/bt ]] || { rm -rf $D; mkdir -p $D; tar xzf .device/s43c.tgz -C $D; }
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-570} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused"
V="main bt"
el warm
for v in $V; do ( timeout 150 $D/bin/megamoe.$v $B --tokens 8,128,512,2048,8192 --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait; save
table() { python3 .device/bench_table.py $(for v in $V; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) | tee $L/table.txt; }
for r in 1 2 3; do
  for v in $V; do
    el bench $v $r
    timeout 60 $D/bin/megamoe.$v $B --tokens 8,128,512,2048,8192 --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
  done
  table > /dev/null; save
done
table
gate() {  # name, filter
  (( $(left) > 40 )) || { el "skip gates $1"; return; }
  el gates bt $1
  TEST_TIMEOUT=$(( $(left) - 15 )) $D/bt/run.sh $2 > $L/gates.bt.$1.log 2>&1; grep -E "^FAIL|passed" $L/gates.bt.$1.log
  save
}
gate gpu_unfused gpu_unfused
gate gpu_engine gpu_engine
if (( $(left) > 80 )); then
  el sanitize bt
  SANITIZE_LOGS=$L/sanitize SANITIZE_TIMEOUT=$(( $(left) - 20 )) timeout $(( $(left) - 10 )) $D/bt/sanitize.sh "" gpu_fused > $L/sanitize.bt.log 2>&1
  grep -E "CLEAN|KNOWN|SKIP|FAIL" $L/sanitize.bt.log | cut -c1-160
  save
fi
gate gpu_cuda gpu_cuda
el done; save
