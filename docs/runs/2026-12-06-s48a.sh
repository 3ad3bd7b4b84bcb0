#!/usr/bin/env bash
# Session 48, call 2: main / lsw2 / lsw3 (lsw with main's epilogue wait: the consumers' end mark
# waits for the box's last tile taken, a barrier of its own), fused forwards, burst clock, two
# alternating rounds, T = 8 ... 8192; timelines at T = 8, 512, 2048 of all three (the L1 tiles by
# place in the CTA, the L1 -> L2 gap); lsw3's gates: gpu_fused, the sanitizer, gpu_unfused,
# gpu_gemm, as long as BUDGET lasts. Logs into $OUT/all.tgz after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s48a; rm -rf $D; mkdir -p $D; tar xzf .device/s48a.tgz -C $D
V="main lsw2 lsw3"
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
wait; save
for r in 1 2; do for v in $V; do
  el bench $v $r
  timeout 70 $D/bin/megamoe.$v $B --tokens $T --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
done; python3 .device/bench_table.py $(for v in $V; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) > $L/table.txt 2>&1; save; done
cat $L/table.txt
for v in $V; do
  el timeline $v
  timeout 60 $D/bin/megamoe.$v $B --tokens 8,512,2048 --reps 1 --timeline $L/tl.$v > $L/tl.$v.log 2>&1 || echo "timeline $v rc $?"
  python3 .device/tl_stats.py $L/tl.$v/*.json > $L/tl_stats.$v.txt 2>&1
  grep -E "json|gap|a tile|by place" $L/tl_stats.$v.txt | cut -c1-200
done; save
gate() {  # variant, test filter
  (( $(left) > 40 )) || { echo "no time for $1 $2"; return; }
  el $2 $1; TEST_TIMEOUT=100 timeout $(( $(left) - 5 )) $D/$1/run.sh $2 > $L/gates.$2.$1.log 2>&1
  grep -E "^FAIL|passed" $L/gates.$2.$1.log | cut -c1-150; save
}
gate lsw3 gpu_fused
if (( $(left) > 50 )); then
  el sanitize lsw3
  SANITIZE_LOGS=$L/sanitize.lsw3 SANITIZE_TIMEOUT=$(( $(left) - 40 )) timeout $(( $(left) - 35 )) $D/lsw3/sanitize.sh "" gpu_fused > $L/sanitize.lsw3.log 2>&1
  grep -hE "CLEAN|KNOWN|SKIP|FAIL|clean," $L/sanitize.lsw3.log | cut -c1-160; save
fi
gate lsw3 gpu_unfused; gate lsw3 gpu_gemm
el done; save
