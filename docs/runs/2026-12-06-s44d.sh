#!/usr/bin/env bash
# Session 44's fourth call: hb (1ec1330 + runs/2026-12-06-s44-two-handoff-boxes-hb.patch: twin
# units hand their two tiles to the SwiGLU epilogue through two boxes) against main (s43g's
# megamoe.new, 1ec1330's kernels), with ev (hb + s44-silu-kept-in-l2-ev.patch: the SiLU table's
# loads under an L2 evict-last policy; its two-CTA 32-token kernels serialize their wgmmas, C7511,
# so only T >= 256 counts) and ns (hb + s44-no-silu-loads-ns.patch, TIMING ONLY: no SiLU table
# loads) beside them, fused forwards, burst clock, two alternating rounds of five,
# T = 8 ... 8192 (twins at T ≈ 150 - 620); then hb's gates: gpu_fused, compute-sanitizer (every
# tool) on the tiny fused forwards, whose case now runs 256 tokens (96-token twins) beside 24,
# then gpu_cuda, gpu_unfused, gpu_engine, gpu_gemm, as long as BUDGET lasts. Bundles .device/s43g.tgz,
# .device/s44d.tgz (hb's `cargo xtask gpu-bundle`), .device/s44e.tgz (ev's and ns's CLIs).
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s44d; rm -rf $D; mkdir -p $D; tar xzf .device/s43g.tgz -C $D; tar xzf .device/s44d.tgz -C $D; tar xzf .device/s44e.tgz -C $D
mv $D/bin/megamoe.new $D/bin/megamoe.main; cp $D/hb/bin/megamoe $D/bin/megamoe.hb
L=$OUT/s44d; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-580} - ($(date +%s) - t0) )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused"
T=8,128,256,512,2048,8192
V="main hb ev ns"
el warm
for v in $V; do ( timeout 150 $D/bin/megamoe.$v $B --tokens $T --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait
for r in 1 2; do for v in $V; do
  el bench $v $r
  timeout 60 $D/bin/megamoe.$v $B --tokens $T --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
done; done
python3 .device/bench_table.py $(for v in $V; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) | tee $L/table.txt
gate() {
  (( $(left) > 50 )) || { el "skip $1"; return; }
  el gates $1
  TEST_TIMEOUT=$(( $(left) - 20 )) $D/hb/run.sh $1 > $L/gates.$1.log 2>&1; grep -E "^FAIL|passed" $L/gates.$1.log
}
gate gpu_fused
if (( $(left) > 60 )); then
  el sanitize
  SANITIZE_LOGS=$L/sanitize SANITIZE_TIMEOUT=$(( $(left) - 20 )) timeout $(( $(left) - 10 )) $D/hb/sanitize.sh "" gpu_fused::fused_tiny_one_forward > $L/sanitize.log 2>&1
  grep -E "CLEAN|KNOWN|SKIP|FAIL" $L/sanitize.log | cut -c1-160
fi
for g in gpu_cuda gpu_unfused gpu_engine gpu_gemm; do gate $g; done
el done
