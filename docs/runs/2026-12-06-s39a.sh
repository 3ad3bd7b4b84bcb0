#!/usr/bin/env bash
# Session 39, the first call (run with TV="main hs2 pw"): .device/s39.tgz holds main/, hs2/ and pw/
# (gpu-bundle folders; main/ turned out to hold hs2's binaries, perf.md v103): two alternating timing
# rounds, timelines of TV, then the gates. Everything goes into $OUT/all.tgz, re-made after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s39; rm -rf $D; mkdir -p $D; tar xzf .device/s39.tgz -C $D
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
V="${V:-main hs2 pw}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee $L/gpu.txt
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused"
el warm
for v in $V; do ( $D/$v/bin/megamoe $B --tokens 8,2048 --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait
for r in 1 2; do
  for v in $V; do
    el bench $v $r
    timeout 200 $D/$v/bin/megamoe $B --tokens 8,128,512,2048,8192 --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
  done
done
python3 .device/bench_table.py $(for v in $V; do echo -n "$v=$L/bench.$v.1.log,$L/bench.$v.2.log "; done) | tee $L/table.txt
save
el timelines
for v in ${TV:-$V}; do
  mkdir -p $L/tl/$v
  timeout 120 $D/$v/bin/megamoe $B --tokens 8,2048,8192 --reps 2 --timeline $L/tl/$v > $L/tl/$v/bench.log 2>&1 || echo "timeline $v rc $?"
done
rm -f $L/tl/*/*.svg; save
for g in "hs2 gpu_fused" "pw gpu_fused" "main gpu_fused" "main gpu_unfused" "main gpu_engine" "main gpu_cuda"; do
  set -- $g; el gates $1 $2
  TEST_TIMEOUT=240 $D/$1/run.sh $2 > $L/gates.$1.$2.log 2>&1; grep -E "^FAIL|passed" $L/gates.$1.$2.log
  save
done
el done
