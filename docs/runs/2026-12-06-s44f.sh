#!/usr/bin/env bash
# Session 44's last call (what s44d.sh would do, in the device time left after failed starts):
# hb against main, fused forwards, burst clock, two alternating rounds of five, T = 8 ... 8192;
# hb's gpu_fused; compute-sanitizer racecheck and synccheck on the tiny fused forward (R = 1: 24
# tokens and 256, the 96-token twins); then, as long as BUDGET lasts, ev and ns for a round, and
# memcheck. Bundles .device/s43g.tgz (main), .device/s44d.tgz (hb), .device/s44e.tgz (ev, ns).
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s44f; rm -rf $D; mkdir -p $D; tar xzf .device/s43g.tgz -C $D; tar xzf .device/s44d.tgz -C $D; tar xzf .device/s44e.tgz -C $D
mv $D/bin/megamoe.new $D/bin/megamoe.main; cp $D/hb/bin/megamoe $D/bin/megamoe.hb
L=$OUT/s44f; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-300} - ($(date +%s) - t0) )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused"
T=8,128,256,512,2048,8192
el warm
for v in main hb ev ns; do ( timeout 120 $D/bin/megamoe.$v $B --tokens $T --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait
for r in 1 2; do for v in main hb; do
  el bench $v $r
  timeout 60 $D/bin/megamoe.$v $B --tokens $T --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
done; done
python3 .device/bench_table.py main=$L/bench.main.1.log,$L/bench.main.2.log hb=$L/bench.hb.1.log,$L/bench.hb.2.log | tee $L/table.txt
el gates gpu_fused
TEST_TIMEOUT=$(( $(left) - 10 )) $D/hb/run.sh gpu_fused > $L/gates.gpu_fused.log 2>&1; grep -E "^FAIL|passed" $L/gates.gpu_fused.log
for tool in racecheck synccheck memcheck ev; do
  (( $(left) > 45 )) || { el "skip $tool"; continue; }
  el $tool
  if [[ $tool == ev ]]; then
    for v in ev ns; do timeout 40 $D/bin/megamoe.$v $B --tokens 256,512,2048,8192 --reps 5 > $L/bench.$v.1.log 2>&1; done
    python3 .device/bench_table.py ev=$L/bench.ev.1.log ns=$L/bench.ns.1.log | tee $L/table.ev.txt
    continue
  fi
  SANITIZE_LOGS=$L/sanitize SANITIZE_TIMEOUT=$(( $(left) - 10 )) timeout $(( $(left) - 5 )) $D/hb/sanitize.sh $tool "gpu_fused::fused_tiny_one_forward" > $L/sanitize.$tool.log 2>&1
  grep -E "CLEAN|KNOWN|SKIP|FAIL" $L/sanitize.$tool.log | cut -c1-160
done
el done
