#!/usr/bin/env bash
# Session 52's call: main / lpt (the drawn overhang plans' small blocks last) / ed (the SwiGLU
# epilogue's paired E4M3 codes), V4-Pro per rank, both routes, T = 8 ... 8192 (+ 4096), fused and
# unfused side by side (on an H200, main's columns are the bar's table with sf), burst clock,
# alternating rounds (ROUNDS, default three); timelines at T = 2048, 4096; gates: lpt's and ed's
# gpu_fused, ed's gpu_twin (the paired codes against the host on every kind of value), lpt's
# gpu_gemm, as long as BUDGET lasts. Logs into $OUT/all.tgz after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s52a; rm -rf $D; mkdir -p $D; tar xzf .device/s52a.tgz -C $D
V="main lpt ed"
mkdir -p $D/bin; for v in $V; do cp $D/$v/bin/megamoe $D/bin/megamoe.$v; done
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-570} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt; save
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes ${ROUTES:-g128/fp8,mx32/bf16}"
T=${TOKENS:-8,128,512,2048,4096,8192}
el warm
for v in $V; do ( timeout 150 $D/bin/megamoe.$v $B --path fused,unfused --tokens $T --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait; save; for v in lpt ed; do grep -iE "error|panick" $L/warm.$v.log | head -5; done
for r in ${ROUNDS:-1 2 3}; do for v in $V; do
  el bench $v $r
  timeout 100 $D/bin/megamoe.$v $B --path fused,unfused --tokens $T --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
done; python3 .device/bench_table.py $(for v in $V; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) > $L/table.txt 2>&1; save; done
cat $L/table.txt
gate() {  # variant, test filter
  (( $(left) > 40 )) || { echo "no time for $1 $2"; return; }
  el $2 $1; TEST_TIMEOUT=100 timeout $(( $(left) - 5 )) $D/$1/run.sh $2 > $L/gates.$2.$1.log 2>&1
  grep -E "^FAIL|passed" $L/gates.$2.$1.log | cut -c1-150; save
}
gate ed gpu_twin
gate lpt gpu_fused
gate ed gpu_fused
(( $(left) > 30 )) && for v in main lpt; do
  el timeline $v
  timeout 60 $D/bin/megamoe.$v $B --path fused --tokens 2048,4096 --reps 1 --timeline $L/tl.$v > $L/tl.$v.log 2>&1 || echo "timeline $v rc $?"
  python3 .device/tl_stats.py $L/tl.$v/*.json > $L/tl_stats.$v.txt 2>&1
  grep -E "json|gap" $L/tl_stats.$v.txt | cut -c1-200
done; save
gate lpt gpu_gemm
el done; save
