#!/usr/bin/env bash
# Session 50, call 2: main / ow (the glue stages' workers numbered CTA first, so that a last round
# of fewer tokens than warps spreads over every SM), fused forwards, burst clock, alternating
# rounds (ROUNDS, default three), T = 8 ... 8192; timelines at T = 2048, 8192 (the dispatch and
# the top-k sums' stage times); ow's gates: gpu_fused, gpu_engine, the sanitizer's memcheck and
# racecheck on the fused forwards, gpu_unfused, as long as BUDGET lasts. Logs into $OUT/all.tgz
# after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s50b; rm -rf $D; mkdir -p $D; tar xzf .device/s50b.tgz -C $D
V="main ow"
mkdir -p $D/bin; for v in $V; do cp $D/$v/bin/megamoe $D/bin/megamoe.$v; done
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-540} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt; save
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused"
T=8,128,512,1000,2048,8192
el warm
for v in $V; do ( timeout 150 $D/bin/megamoe.$v $B --tokens $T --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait; save; grep -iE "error|panick" $L/warm.ow.log | head -5
for r in ${ROUNDS:-1 2 3}; do for v in $V; do
  el bench $v $r
  timeout 70 $D/bin/megamoe.$v $B --tokens $T --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
done; python3 .device/bench_table.py $(for v in $V; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) > $L/table.txt 2>&1; save; done
cat $L/table.txt
gate() {  # variant, test filter
  (( $(left) > 40 )) || { echo "no time for $1 $2"; return; }
  el $2 $1; TEST_TIMEOUT=100 timeout $(( $(left) - 5 )) $D/$1/run.sh $2 > $L/gates.$2.$1.log 2>&1
  grep -E "^FAIL|passed" $L/gates.$2.$1.log | cut -c1-150; save
}
gate ow gpu_fused
(( $(left) > 30 )) && for v in $V; do
  el timeline $v
  timeout 60 $D/bin/megamoe.$v $B --tokens 2048,8192 --reps 1 --timeline $L/tl.$v > $L/tl.$v.log 2>&1 || echo "timeline $v rc $?"
  python3 .device/tl_stats.py $L/tl.$v/*.json > $L/tl_stats.$v.txt 2>&1
  grep -E "json|glue" $L/tl_stats.$v.txt | cut -c1-200
done; save
gate ow gpu_engine
for tool in memcheck racecheck; do
  (( $(left) > 60 )) || { echo "no time for $tool"; continue; }
  el sanitize $tool ow
  SANITIZE_LOGS=$L/sanitize.ow SANITIZE_TIMEOUT=$(( $(left) - 40 )) timeout $(( $(left) - 35 )) $D/ow/sanitize.sh $tool gpu_fused > $L/sanitize.$tool.ow.log 2>&1
  grep -hE "CLEAN|KNOWN|SKIP|FAIL|clean," $L/sanitize.$tool.ow.log | cut -c1-160; save
done
gate ow gpu_unfused
el done; save
