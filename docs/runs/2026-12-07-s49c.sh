#!/usr/bin/env bash
# Session 49, call 3: main / sf (the SwiGLU's SiLU table in shared memory: a fast f32 SiLU, two MUFU
# operations, corrected by 4 bits a gate; no global loads), fused forwards, burst clock, three
# alternating rounds, T = 8 ... 8192; timelines at T = 512, 2048 (the L1 tiles by place); sf's
# gates: gpu_fused, gpu_cuda (the clamp that is no BF16 value), the sanitizer's memcheck on the
# fused forwards, gpu_unfused, racecheck, gpu_gemm, gpu_engine, as long as BUDGET lasts.
# Logs into $OUT/all.tgz after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s49c; rm -rf $D; mkdir -p $D; tar xzf .device/s49c.tgz -C $D
V="main sf"
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
wait; save; grep -iE "error|panick" $L/warm.sf.log | head -5
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
gate sf gpu_fused
(( $(left) > 30 )) && for v in $V; do
  el timeline $v
  timeout 60 $D/bin/megamoe.$v $B --tokens 512,2048 --reps 1 --timeline $L/tl.$v > $L/tl.$v.log 2>&1 || echo "timeline $v rc $?"
  python3 .device/tl_stats.py $L/tl.$v/*.json > $L/tl_stats.$v.txt 2>&1
  grep -E "json|a tile|by place" $L/tl_stats.$v.txt | cut -c1-200
done; save
gate sf gpu_cuda
for tool in memcheck; do
  (( $(left) > 60 )) || { echo "no time for $tool"; continue; }
  el sanitize $tool sf
  SANITIZE_LOGS=$L/sanitize.sf SANITIZE_TIMEOUT=$(( $(left) - 40 )) timeout $(( $(left) - 35 )) $D/sf/sanitize.sh $tool gpu_fused > $L/sanitize.$tool.sf.log 2>&1
  grep -hE "CLEAN|KNOWN|SKIP|FAIL|clean," $L/sanitize.$tool.sf.log | cut -c1-160; save
done
gate sf gpu_unfused
if (( $(left) > 60 )); then
  el sanitize racecheck sf
  SANITIZE_LOGS=$L/sanitize.sf SANITIZE_TIMEOUT=$(( $(left) - 30 )) timeout $(( $(left) - 25 )) $D/sf/sanitize.sh racecheck gpu_fused > $L/sanitize.racecheck.sf.log 2>&1
  grep -hE "CLEAN|KNOWN|SKIP|FAIL|clean," $L/sanitize.racecheck.sf.log | cut -c1-160; save
fi
gate sf gpu_gemm; gate sf gpu_engine
el done; save
