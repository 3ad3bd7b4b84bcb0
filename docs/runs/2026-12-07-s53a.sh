#!/usr/bin/env bash
# The next call (prepared in session 52): main / dc (the counted dispatch, measured once) / dcb
# (its granules' rows through shared memory by bulk copies) / bc1 (the fused forward's BF16
# one-CTA tiles drawn, without clusters: mx32's cells), V4-Pro per rank, both routes, T = 512 ...
# 8192, fused, burst, alternating rounds (ROUNDS, default three); then, as BUDGET lasts, timelines
# at T = 2048 and 8192, dcb's and bc1's gpu_fused, dcb's gpu_engine and gpu_unfused (TEST_TIMEOUT
# 200: a cold JIT cache), the sanitizer on dcb's tiny fused forwards. Logs into $OUT/all.tgz
# after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s53a; rm -rf $D; mkdir -p $D; tar xzf .device/s53a.tgz -C $D
V="main dc dcb bc1"
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-570} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt; save
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes ${ROUTES:-g128/fp8,mx32/bf16}"
T=${TOKENS:-512,1000,2048,4096,8192}
el warm
for v in $V; do ( timeout 150 $D/$v/bin/megamoe $B --path fused --tokens $T --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait; save; for v in dc dcb bc1; do grep -iE "error|panick" $L/warm.$v.log | head -5; done
for r in ${ROUNDS:-1 2 3}; do for v in $V; do
  el bench $v $r
  timeout 90 $D/$v/bin/megamoe $B --path fused --tokens $T --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
done; python3 .device/bench_table.py $(for v in $V; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) > $L/table.txt 2>&1; save; done
cat $L/table.txt
(( $(left) > 30 )) && for v in main dcb bc1; do
  el timeline $v
  timeout 30 $D/$v/bin/megamoe $B --path fused --tokens 2048,8192 --reps 1 --timeline $L/tl.$v > $L/tl.$v.log 2>&1
  python3 .device/tl_stats.py $L/tl.$v/*.json > $L/tl_stats.$v.txt 2>&1; grep -E "json|glue|L2 end" $L/tl_stats.$v.txt | cut -c1-160
done; save
gate() {  # variant, test filter
  (( $(left) > 40 )) || { echo "no time for $1 $2"; return; }
  el $2 $1; TEST_TIMEOUT=200 timeout $(( $(left) - 5 )) $D/$1/run.sh $2 > $L/gates.$2.$1.log 2>&1
  grep -E "^FAIL|passed" $L/gates.$2.$1.log | cut -c1-150; save
}
gate dcb gpu_fused
gate bc1 gpu_fused
gate dcb gpu_engine
gate dcb gpu_unfused
(( $(left) > 60 )) && for t in memcheck racecheck; do
  el sanitize $t dcb
  SANITIZE_LOGS=$L/sanitize.dcb SANITIZE_TIMEOUT=60 timeout 70 $D/dcb/sanitize.sh $t gpu_fused::fused_tiny_one_forward > $L/sanitize.$t.dcb.log 2>&1
  grep -hE "CLEAN|KNOWN|SKIP|FAIL" $L/sanitize.$t.dcb.log | cut -c1-160; save
done
el done; save
