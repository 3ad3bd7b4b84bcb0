#!/usr/bin/env bash
# Session 52's last call: main (3884e15) against dc (the counted dispatch: one rank's pool rows by
# 16-row granules in pool order, each block counted once stored, the L1 starting without a grid
# barrier; g128 only — mx32's BF16 pool keeps the token dispatch), fused, burst, ROUNDS
# alternating rounds of five (default two), then dc's gpu_fused and timeline as BUDGET lasts.
# .device/s52c.tgz holds both bundles (`runs/2026-12-07-s52c-pack.sh`); carry ".device".
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s52c; rm -rf $D; mkdir -p $D; tar xzf .device/s52c.tgz -C $D
V="main dc"
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-200} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt; save
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes ${ROUTES:-g128/fp8}"
T=${TOKENS:-512,1000,2048,4096,8192}
el warm
for v in $V; do ( timeout 100 $D/$v/bin/megamoe $B --path fused --tokens $T --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait; save; grep -iE "error|panick" $L/warm.dc.log | head -5
for r in ${ROUNDS:-1 2}; do for v in $V; do
  el bench $v $r
  timeout 60 $D/$v/bin/megamoe $B --path fused --tokens $T --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
done; python3 .device/bench_table.py $(for v in $V; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) > $L/table.txt 2>&1; save; done
cat $L/table.txt
(( $(left) > 30 )) && { el gpu_fused dc; TEST_TIMEOUT=100 timeout $(( $(left) - 5 )) $D/dc/run.sh gpu_fused > $L/gates.gpu_fused.dc.log 2>&1
  grep -E "^FAIL|passed|panicked" $L/gates.gpu_fused.dc.log | cut -c1-200; save; }
(( $(left) > 12 )) && for v in main dc; do
  timeout 15 $D/$v/bin/megamoe $B --path fused --tokens 2048 --reps 1 --timeline $L/tl.$v > $L/tl.$v.log 2>&1
  python3 .device/tl_stats.py $L/tl.$v/*.json > $L/tl_stats.$v.txt 2>&1; grep -E "glue|gap|L2 end" $L/tl_stats.$v.txt | cut -c1-160
done; el done; save
