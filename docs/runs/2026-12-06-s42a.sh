#!/usr/bin/env bash
# Session 42's first timing call (bundle by runs/2026-12-06-s42a-pack.sh): main against tf (one
# rank skips the meeting before the top-k sums; a drawn schedule's first ticket is the CTA's own),
# tf8 (tf + the glue's first-weights prefetch at 8 MiB) and pd (tf + the L2's first weights into
# L2 during a CTA's last L1 tiles), three alternating rounds, the bar's two routes, T = 8 … 8192;
# first each one's timelines at T = 8 and 128; then pd's gates (gpu_fused, gpu_gemm, the lost
# split part's timeout), pd under compute-sanitizer, gpu_engine, gpu_unfused, each step only when
# the call's time allows. Logs into $OUT/all.tgz, re-made after
# each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s42a; rm -rf $D; mkdir -p $D; tar xzf .device/s42a.tgz -C $D
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-570} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused"
V="main tf tf8 pd"
el warm
for v in $V; do ( timeout 150 $D/bin/megamoe.$v $B --tokens 8,128,512,2048,8192 --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait; save
for v in $V; do
  el timeline $v
  timeout 60 $D/bin/megamoe.$v $B --tokens 8,128 --reps 1 --timeline $L/tl.$v > $L/tl.$v.log 2>&1 || echo "timeline $v rc $?"
done
python3 .device/tl_stats.py $L/tl.*/*.json > $L/tl_stats.txt; cat $L/tl_stats.txt; save
table() { python3 .device/bench_table.py $(for v in $V; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) | tee $L/table.txt; }
for r in 1 2 3; do
  for v in $V; do
    (( $(left) > 280 )) || { el "skip bench $v $r"; continue; }
    el bench $v $r
    timeout 60 $D/bin/megamoe.$v $B --tokens 8,128,512,2048,8192 --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
  done
  [[ $r == 3 ]] && table || table > /dev/null; save
done
gate() {  # name, filter
  (( $(left) > 40 )) || { el "skip gates $1"; return; }
  el gates pd $1
  TEST_TIMEOUT=$(( $(left) - 15 )) $D/pd/run.sh $2 > $L/gates.pd.$1.log 2>&1; grep -E "^FAIL|passed" $L/gates.pd.$1.log
  save
}
gate gpu_fused gpu_fused
gate gpu_gemm gpu_gemm
gate lost_split_part a_lost_split_part
if (( $(left) > 80 )); then
  el sanitize pd
  SANITIZE_LOGS=$L/sanitize SANITIZE_TIMEOUT=$(( $(left) - 20 )) timeout $(( $(left) - 10 )) $D/pd/sanitize.sh "" gpu_fused > $L/sanitize.pd.log 2>&1
  grep -E "CLEAN|KNOWN|SKIP|FAIL" $L/sanitize.pd.log | cut -c1-160
  save
fi
gate gpu_engine gpu_engine
gate gpu_unfused gpu_unfused
el done; save
