#!/usr/bin/env bash
# Session 45, call 4: the landing build (hb + e1) against main, fused forwards, burst clock, three
# alternating rounds, T = 8 ... 8192, the bar's two routes.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s45d; rm -rf $D; mkdir -p $D; for t in s43g s45c; do tar xzf .device/$t.tgz -C $D; done
mv $D/bin/megamoe.new $D/bin/megamoe.main; cp $D/land/bin/megamoe $D/bin/megamoe.land
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused"
T=8,128,256,512,2048,8192
el warm
for v in main land; do ( timeout 150 $D/bin/megamoe.$v $B --tokens $T --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait
for r in 1 2 3; do for v in main land; do
  el bench $v $r
  timeout 60 $D/bin/megamoe.$v $B --tokens $T --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
done; done
python3 .device/bench_table.py main=$(ls $L/bench.main.*.log | paste -sd,) land=$(ls $L/bench.land.*.log | paste -sd,) | tee $L/table.txt
el done; tar czf $OUT/all.tgz -C /tmp logs
