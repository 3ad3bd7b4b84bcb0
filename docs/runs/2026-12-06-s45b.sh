#!/usr/bin/env bash
# Session 45, call 2: e1 (hb + the SiLU table's loads evicted last from L1) against hb, and ns (no
# table loads, the bound), fused forwards, burst clock, three alternating rounds, T = 8 ... 8192;
# then racecheck of two ranks on one GPU through the CLI, hazards in full (is hb's rank_barrier
# report the binary's, or the run's?).
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s45b; rm -rf $D; mkdir -p $D
for t in s43g s44d s44e s45b; do tar xzf .device/$t.tgz -C $D; done
mv $D/bin/megamoe.new $D/bin/megamoe.main; cp $D/hb/bin/megamoe $D/bin/megamoe.hb; cp $D/e1/bin/megamoe $D/bin/megamoe.e1
L=$OUT/s45b; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused"
T=8,128,256,512,2048,8192
el warm
for v in main hb e1 ns; do ( timeout 150 $D/bin/megamoe.$v $B --tokens $T --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait
for r in 1 2 3; do for v in hb e1 ns; do
  el bench $v $r
  timeout 60 $D/bin/megamoe.$v $B --tokens $T --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
done; done
python3 .device/bench_table.py hb=$L/bench.hb.1.log,$L/bench.hb.2.log,$L/bench.hb.3.log e1=$L/bench.e1.1.log,$L/bench.e1.2.log,$L/bench.e1.3.log | tee $L/table.txt
python3 .device/bench_table.py hb=$L/bench.hb.1.log,$L/bench.hb.2.log,$L/bench.hb.3.log ns=$L/bench.ns.1.log,$L/bench.ns.2.log,$L/bench.ns.3.log | tee $L/table.ns.txt
el racecheck-cli
for v in hb main hb e1 hb; do
  timeout 100 compute-sanitizer --tool racecheck --racecheck-report all --print-limit 20 $D/bin/megamoe.$v bench --preset tiny --ranks 2 \
    --ranks-per-gpu 2 --routes mx32/bf16 --path fused --tokens 256,24 --reps 1 > $L/rc.$v.log 2>&1; echo "racecheck cli $v rc $?"
  grep -E "RACECHECK SUMMARY" $L/rc.$v.log
  grep -B2 -A8 -m1 "rank_barrier" $L/rc.$v.log | cut -c1-220
done
el done
