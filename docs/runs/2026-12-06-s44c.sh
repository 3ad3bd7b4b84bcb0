#!/usr/bin/env bash
# Session 44's third call: what the fused L1's epilogue warps cost the GEMMs at mid and large T.
# head = main's CLI (s43g's megamoe.new, 1ec1330's kernels); ne = 1ec1330 +
# runs/2026-12-06-s44-no-epilogue-work-ne.patch (TIMING ONLY: the epilogue warps take each hand-off
# box and count its rows without computing or storing a token). Timelines at T = 2048 and 8192
# (tl_stats: a tile's time), then two alternating rounds of fused forwards, burst clock, T = 512,
# 2048, 8192. Bundles .device/s43g.tgz (head) and .device/s44c.tgz (ne).
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s44c; rm -rf $D; mkdir -p $D; tar xzf .device/s43g.tgz -C $D; tar xzf .device/s44c.tgz -C $D
mv $D/bin/megamoe.new $D/bin/megamoe.head
L=$OUT/s44c; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused"
V="head ne"
el warm
for v in $V; do ( timeout 150 $D/bin/megamoe.$v $B --tokens 512,2048,8192 --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait
for v in $V; do
  el timeline $v
  timeout 60 $D/bin/megamoe.$v $B --tokens 2048,8192 --reps 1 --timeline /tmp/tl.$v > $L/tl.$v.log 2>&1 || echo "timeline $v rc $?"
done
python3 .device/tl_stats.py /tmp/tl.*/*.json > $L/tl_stats.txt
for r in 1 2; do for v in $V; do
  el bench $v $r
  timeout 60 $D/bin/megamoe.$v $B --tokens 512,2048,8192 --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
done; done
python3 .device/bench_table.py head=$L/bench.head.1.log,$L/bench.head.2.log ne=$L/bench.ne.1.log,$L/bench.ne.2.log | tee $L/table.txt
cat $L/tl_stats.txt
grep -h "fused  1" $L/bench.*.log
el done
