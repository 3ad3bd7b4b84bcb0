#!/usr/bin/env bash
# Session 55's fs call (carry .gpu-bundle = fs's `cargo xtask gpu-bundle`, and .device with main's
# `megamoe` in .device/main/): fs's gates in the background — gpu_fused (fused == unfused bitwise,
# both against the CPU reference), gpu_gemm (every specialization against the reference: the one-
# and two-CTA scale paths), gpu_unfused, gpu_engine, each with its own JIT cache — while main and fs
# run the bar's benchmark in alternating rounds (ROUNDS, default two; fused and unfused, g128 and
# mx32, T = 8 … 8192); then memcheck and racecheck on the tiny fused forward as BUDGET lasts. Logs
# into $OUT/all.tgz after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64 \
  MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-540} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt; save
declare -A M=([main]=.device/main/megamoe [fs]=.gpu-bundle/bin/megamoe)
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --tokens 8,128,512,2048,8192"
el warm
warm=()
for v in main fs; do
  MEGAMOE_CACHE=/tmp/cache.$v timeout 200 ${M[$v]} $B --path fused,unfused --reps 1 > $L/warm.$v.log 2>&1 &
  warm+=($!)
done
wait "${warm[@]}"; save; grep -iE "error|panick" $L/warm.*.log | head -5
el gates
gates=()
for g in gpu_fused gpu_gemm gpu_unfused gpu_engine; do
  MEGAMOE_CACHE=/tmp/cache.$g TEST_TIMEOUT=400 timeout 430 .gpu-bundle/run.sh $g > $L/gates.$g.fs.log 2>&1 &
  gates+=($!)
done
wait "${gates[@]}"; save
for g in gpu_fused gpu_gemm gpu_unfused gpu_engine; do echo "$g: $(grep -E 'passed' $L/gates.$g.fs.log)"; grep -E "^FAIL" $L/gates.$g.fs.log | cut -c1-150; done
for r in ${ROUNDS:-1 2}; do for v in main fs; do
  el bench $v $r
  MEGAMOE_CACHE=/tmp/cache.$v timeout 120 ${M[$v]} $B --path fused,unfused --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
done; python3 .device/bench_table.py $(for v in main fs; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) > $L/table.txt 2>&1; save; done
cat $L/table.txt
for v in main fs; do grep -hE "fused  1" $L/bench.$v.1.log | awk -v v=$v '{print v, $1, $5, $7}'; done
for tool in memcheck racecheck; do (( $(left) > 60 )) || break
  el sanitize $tool; SANITIZE_LOGS=$L/sanitize.$tool SANITIZE_TIMEOUT=$(( $(left) - 10 )) timeout $(( $(left) - 5 )) \
    .gpu-bundle/sanitize.sh $tool fused_tiny_one_forward > $L/sanitize.$tool.log 2>&1; grep -hE "CLEAN|KNOWN|SKIP|FAIL" $L/sanitize.$tool.log | cut -c1-150; save
done
el done; save
