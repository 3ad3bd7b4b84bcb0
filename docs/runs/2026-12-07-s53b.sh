#!/usr/bin/env bash
# Session 53's second call: main / dcl (the BF16 clusters draw their items), V4-Pro per rank,
# mx32/bf16 (the route whose one-CTA tiles run in clusters), T = 512 ... 8192, fused, burst,
# alternating rounds (ROUNDS, default four; the first also unfused); then, as BUDGET lasts, dcl's
# timelines at T = 2048 and 8192, its gpu_gemm and gpu_fused, the sanitizer on the drawn GEMMs,
# gpu_unfused and gpu_engine (TEST_TIMEOUT 200: a cold JIT cache). Logs into $OUT/all.tgz after
# each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s53b; rm -rf $D; mkdir -p $D; tar xzf .device/s53b.tgz -C $D
V="main dcl"
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-570} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt; save
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes ${ROUTES:-mx32/bf16}"
T=${TOKENS:-512,1000,2048,4096,8192}
el warm
for v in $V; do ( timeout 150 $D/$v/bin/megamoe $B --path fused,unfused --tokens $T --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait; save; grep -iE "error|panick" $L/warm.dcl.log | head -5
for r in ${ROUNDS:-1 2 3 4}; do for v in $V; do
  el bench $v $r; P=fused; [ $r = 1 ] && P=fused,unfused
  timeout 90 $D/$v/bin/megamoe $B --path $P --tokens $T --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
done; python3 .device/bench_table.py $(for v in $V; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) > $L/table.txt 2>&1; save; done
cat $L/table.txt; grep -hE "unfused +1 +(2048|8192)" $L/bench.*.1.log | cut -c1-80
(( $(left) > 30 )) && for v in main dcl; do
  el timeline $v
  timeout 30 $D/$v/bin/megamoe $B --path fused --tokens 2048,8192 --reps 1 --timeline $L/tl.$v > $L/tl.$v.log 2>&1
  python3 .device/tl_stats.py $L/tl.$v/*.json > $L/tl_stats.$v.txt 2>&1; grep -E "json|glue|L2 end" $L/tl_stats.$v.txt | cut -c1-160
done; save
gate() {  # variant, test filter
  (( $(left) > 40 )) || { echo "no time for $1 $2"; return; }
  el $2 $1; TEST_TIMEOUT=200 timeout $(( $(left) - 5 )) $D/$1/run.sh $2 > $L/gates.$2.$1.log 2>&1
  grep -E "^FAIL|passed" $L/gates.$2.$1.log | cut -c1-150; save
}
gate dcl gpu_gemm
gate dcl gpu_fused
(( $(left) > 60 )) && { el sanitize dcl; for t in memcheck racecheck; do
  SANITIZE_LOGS=$L/sanitize.dcl.$t SANITIZE_TIMEOUT=100 timeout 110 $D/dcl/sanitize.sh $t gpu_gemm::dynamic_schedule_matches_the_reference > $L/sanitize.$t.dcl.log 2>&1 &
done; wait; grep -hE "CLEAN|KNOWN|SKIP|FAIL" $L/sanitize.*.dcl.log | cut -c1-160; save; }
gate dcl gpu_unfused
gate dcl gpu_engine
el done; save
