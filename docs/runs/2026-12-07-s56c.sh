#!/usr/bin/env bash
# Session 56's balanced top-k sums call (carry .gpu-bundle = br2's `cargo xtask gpu-bundle`, .device
# with main's (8b9a9f7) `megamoe` in .device/main8b/ and br's in .device/br/): br (the fused
# forward's sums in even shares of the tokens' channels a warp) and br2 (br, each lane's loads of
# two runs of channels at once on one-CTA kernels). br2's gates gpu_fused (fused == unfused
# bitwise, R = 1, 2, 4, 8) and gpu_engine, then main, br and br2 in alternating rounds (g128/fp8
# and mx32/bf16, fused and unfused, T = 8 ... 8192), then timelines at T = 2048 and 8192. Logs into
# $OUT/all.tgz after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 CUDA_PATH=/usr/local/cuda LD_LIBRARY_PATH=/usr/local/cuda/lib64 \
  MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt; save
tar xJf .device/clis.tar.xz -C .device  # main's and br's CLIs, carried compressed
declare -A M=([main]=.device/main8b/megamoe [br]=.device/br/megamoe [br2]=.gpu-bundle/bin/megamoe)
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8,mx32/bf16"; T="--tokens 8,512,2048,8192"
el warm+gates
jobs_=()
for v in main br br2; do
  MEGAMOE_CACHE=/tmp/cache.$v timeout 200 ${M[$v]} $B $T --path fused,unfused --reps 1 > $L/warm.$v.log 2>&1 &
  jobs_+=($!)
done
for g in gpu_fused; do
  MEGAMOE_CACHE=/tmp/cache.$g TEST_TIMEOUT=300 timeout 330 .gpu-bundle/run.sh $g > $L/gates.$g.br2.log 2>&1 &
  jobs_+=($!)
done
wait "${jobs_[@]}"; save; grep -iE "error|panick" $L/warm.*.log | head -5
for g in gpu_fused; do echo "$g: $(grep -E 'passed' $L/gates.$g.br2.log)"; grep -E "^FAIL" $L/gates.$g.br2.log | cut -c1-150; done
for r in ${ROUNDS:-1 2 3}; do for v in main br br2; do
  el bench $v $r
  MEGAMOE_CACHE=/tmp/cache.$v timeout 120 ${M[$v]} $B $T --path fused,unfused --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
done; python3 .device/bench_table.py $(for v in main br br2; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) > $L/table.txt 2>&1; save; done
cat $L/table.txt
for v in main br br2; do
  el timeline $v
  MEGAMOE_CACHE=/tmp/cache.$v timeout 60 ${M[$v]} $B --path fused --tokens 2048,8192 --reps 1 --timeline $L/tl.$v > $L/tl.$v.log 2>&1
  python3 .device/tl_stats.py $L/tl.$v/*.json > $L/tl_stats.$v.txt 2>&1; grep -E "json|glue|L2 end" $L/tl_stats.$v.txt | cut -c1-160; save
done
el done; save
