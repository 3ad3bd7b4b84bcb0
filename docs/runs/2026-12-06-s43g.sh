#!/usr/bin/env bash
# Session 43's last call: 52bfe28 (old: session 42's main) against the landed code (new: the BF16
# twins and the whole-token dispatch, a120cb0's kernels) in two alternating rounds, the bar's two
# routes, T = 8 … 8192 — on an H200 the bar's table. Bundle .device/s43g.tgz: in call 10,
# bin/megamoe.old = target/s42-tf's CLI (runs/2026-12-06-s43a-pack.sh's main), bin/megamoe.new =
# s43f's wd; for the next call, runs/2026-12-06-s43g-pack.sh builds old (52bfe28) and new (HEAD).
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s43g; rm -rf $D; mkdir -p $D; tar xzf .device/s43g.tgz -C $D
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16 --path fused"
V="old new"
el warm
for v in $V; do ( timeout 150 $D/bin/megamoe.$v $B --tokens 8,128,512,2048,8192 --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait; save
for r in 1 2; do for v in $V; do
  el bench $v $r
  timeout 60 $D/bin/megamoe.$v $B --tokens 8,128,512,2048,8192 --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"; done
done
python3 .device/bench_table.py old=$(ls $L/bench.old.*.log | paste -sd,) new=$(ls $L/bench.new.*.log | paste -sd,) | tee $L/table.txt
el done; save
