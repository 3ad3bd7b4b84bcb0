#!/usr/bin/env bash
# Session 45, call 1: cx (hb + the SiLU computed, no table) -- its device twin over every BF16 gate,
# gpu_fused; hb / cx / ns fused forwards, burst clock, two alternating rounds, T = 8 ... 8192;
# racecheck of two ranks on one GPU through the CLI (main, hb, cx: is the rank_barrier report hb's?).
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s45; rm -rf $D; mkdir -p $D
for t in s43g s44d s44e s45a; do tar xzf .device/$t.tgz -C $D; done
mv $D/bin/megamoe.new $D/bin/megamoe.main; cp $D/hb/bin/megamoe $D/bin/megamoe.hb; cp $D/cx/bin/megamoe $D/bin/megamoe.cx
L=$OUT/s45a; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-500} - ($(date +%s) - t0) )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt
el twin
$D/cx/run.sh gpu_twin > $L/gates.twin.log 2>&1; grep -E "^FAIL|passed" $L/gates.twin.log
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused"
T=8,128,256,512,2048,8192
el warm
for v in main hb cx ns; do ( timeout 150 $D/bin/megamoe.$v $B --tokens $T --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait
for r in 1 2; do for v in hb cx ns; do
  el bench $v $r
  timeout 60 $D/bin/megamoe.$v $B --tokens $T --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
done; done
python3 .device/bench_table.py hb=$L/bench.hb.1.log,$L/bench.hb.2.log cx=$L/bench.cx.1.log,$L/bench.cx.2.log | tee $L/table.txt
python3 .device/bench_table.py hb=$L/bench.hb.1.log,$L/bench.hb.2.log ns=$L/bench.ns.1.log,$L/bench.ns.2.log | tee $L/table.ns.txt
el racecheck-cli
for v in main hb cx; do
  timeout 120 compute-sanitizer --tool racecheck --print-limit 20 $D/bin/megamoe.$v bench --preset tiny --ranks 2 --ranks-per-gpu 2 \
    --routes mx32/bf16 --path fused --tokens 256,24 --reps 1 > $L/rc.cli.$v.log 2>&1; echo "racecheck cli $v rc $?"
  grep -E "RACECHECK SUMMARY|Race reported" $L/rc.cli.$v.log | sort | uniq -c | cut -c1-200
done
el gates gpu_fused
TEST_TIMEOUT=$(( $(left) - 10 )) $D/cx/run.sh gpu_fused > $L/gates.gpu_fused.log 2>&1; grep -E "^FAIL|passed" $L/gates.gpu_fused.log
el done
