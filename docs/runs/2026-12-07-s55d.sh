#!/usr/bin/env bash
# Session 55's second fs call (carry .gpu-bundle = fs's bundle with the sanitizer's new known pair,
# .device with main's `megamoe`): gpu_cuda in the background (ranks sharing the GPU, every route);
# two more alternating rounds of main and fs (g128, T = 512, 2048, 8192, fused); compute-sanitizer's
# four tools on the fused forwards and on the GEMM tests of the token scales' paths (one-CTA loads,
# two-CTA chunks, overhangs), as BUDGET lasts. Logs into $OUT/all.tgz after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64 \
  MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-240} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt; save
declare -A M=([main]=.device/main/megamoe [fs]=.gpu-bundle/bin/megamoe)
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8 --tokens 512,2048,8192"
el warm
for v in main fs; do MEGAMOE_CACHE=/tmp/cache.$v timeout 100 ${M[$v]} $B --path fused --reps 1 > $L/warm.$v.log 2>&1 & done; wait
for r in 3 4; do for v in main fs; do
  el bench $v $r
  MEGAMOE_CACHE=/tmp/cache.$v timeout 60 ${M[$v]} $B --path fused --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
done; done
python3 .device/bench_table.py main=$(ls $L/bench.main.*.log | paste -sd,) fs=$(ls $L/bench.fs.*.log | paste -sd,) > $L/table.txt 2>&1; cat $L/table.txt; save
el gpu_cuda
MEGAMOE_CACHE=/tmp/cache.cuda TEST_TIMEOUT=300 timeout $(( $(left) - 5 )) .gpu-bundle/run.sh gpu_cuda > $L/gates.gpu_cuda.fs.log 2>&1 &
cuda=$!
for name in gpu_fused::fused_tiny token_scales_in_several every_specialization overhang_units; do (( $(left) > 30 )) || break
  el sanitize $name; SANITIZE_LOGS=$L/sanitize.$name SANITIZE_TIMEOUT=$(( $(left) - 10 )) timeout $(( $(left) - 5 )) \
    .gpu-bundle/sanitize.sh "" $name > $L/sanitize.$name.log 2>&1; grep -hE "CLEAN|KNOWN|SKIP|FAIL" $L/sanitize.$name.log | cut -c1-150; save
done
wait $cuda; grep -E "^FAIL|passed" $L/gates.gpu_cuda.fs.log | cut -c1-150
el done; save
