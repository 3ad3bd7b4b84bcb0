#!/usr/bin/env bash
# Session 54's third call (the checkout's bundle, `cargo xtask gpu-bundle`, carried as .gpu-bundle
# with .device/bench_table.py = runs/2026-12-05-s38-bench_table.py): the whole-token sanitizer case
# under the four tools (store_slots_bulk), then on an H200 the bar's table first (V4-Pro
# per rank, both routes, T = 8 ... 8192, fused and unfused, ROUNDS rounds of five, default two,
# and one sustained round) and gpu_fused (or the tests GATE names) after; on another card the
# gate first. As BUDGET lasts.
# Carry [".gpu-bundle", ".device"]; logs into $OUT/all.tgz.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
M=.gpu-bundle/bin/megamoe
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-560} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt; save
el sanitize; SANITIZE_JOBS=4 SANITIZE_TIMEOUT=150 SANITIZE_LOGS=$L/san timeout 170 .gpu-bundle/sanitize.sh "" \
  fused_tiny_whole_token_dispatch > $L/sanitize.log 2>&1; grep -E "CLEAN|KNOWN|FAIL|clean," $L/sanitize.log; save
table() {
  local B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --tokens 8,128,512,2048,8192"
  el warm; timeout 200 $M $B --path fused,unfused --reps 1 > $L/warm.log 2>&1; save
  for r in ${ROUNDS:-1 2}; do (( $(left) > 40 )) || break
    el bench $r; timeout 120 $M $B --path fused,unfused --reps 5 > $L/bench.main.$r.log 2>&1 || echo "bench $r rc $?"
    python3 .device/bench_table.py main=$(ls $L/bench.main.*.log | paste -sd,) > $L/table.txt 2>&1; save
  done
  cat $L/table.txt
  if (( $(left) > 60 )); then
    el sustained; timeout 60 $M $B --path fused,unfused --reps 5 --warm-up-ms 2000 > $L/sustained.log 2>&1
    grep -E "fused  1" $L/sustained.log | cut -c1-120; save
  fi
}
gate() {
  (( $(left) > 60 )) || return
  el gpu_fused ${GATE:-}; TEST_TIMEOUT=200 timeout $(( $(left) - 5 )) .gpu-bundle/run.sh ${GATE:-gpu_fused} > $L/gates.gpu_fused.log 2>&1
  grep -E "^(PASS|FAIL)|passed" $L/gates.gpu_fused.log | cut -c1-150; save
}
if grep -q H200 $L/gpu.txt; then table; gate; else gate; table; fi
el done; save
