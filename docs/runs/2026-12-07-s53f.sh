#!/usr/bin/env bash
# The call prepared in session 53: main / bsb (bulk stores for the fused dispatch's whole tokens,
# FP8 and BF16 pools) / s1 / l0 (timing only, g128: one slot's stores, no loads), V4-Pro per rank,
# both routes, T = 512, 2048, 8192, fused, burst, alternating rounds (ROUNDS, default three);
# timelines at T = 2048 and 8192 (the dispatch stage's span); then bsb's gpu_fused (fused ==
# unfused bitwise: the unfused dispatch is main's) and gpu_engine as BUDGET lasts. Logs into
# $OUT/all.tgz after each step.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
D=/tmp/s53f; rm -rf $D; mkdir -p $D; tar xzf .device/s53f.tgz -C $D
V="main bsb s1 l0"
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-560} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt; save
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes ${ROUTES:-g128/fp8,mx32/bf16}"
T=${TOKENS:-512,2048,8192}
el warm
for v in $V; do ( timeout 150 $D/$v/bin/megamoe $B --path fused --tokens $T --reps 1 > $L/warm.$v.log 2>&1 ) & done
wait; save; grep -iE "error|panick" $L/warm.bsb.log | head -5
for r in ${ROUNDS:-1 2 3}; do for v in $V; do
  el bench $v $r
  timeout 60 $D/$v/bin/megamoe $B --path fused --tokens $T --reps 5 > $L/bench.$v.$r.log 2>&1 || echo "bench $v $r rc $?"
done; python3 .device/bench_table.py $(for v in $V; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) > $L/table.txt 2>&1; save; done
cat $L/table.txt
for v in $V; do
  el timeline $v
  timeout 30 $D/$v/bin/megamoe $B --path fused --tokens 2048,8192 --reps 1 --timeline $L/tl.$v > $L/tl.$v.log 2>&1
  python3 .device/tl_stats.py $L/tl.$v/*.json > $L/tl_stats.$v.txt 2>&1; grep -E "json|glue|L2 end" $L/tl_stats.$v.txt | cut -c1-160
done; save
for g in gpu_fused gpu_engine; do (( $(left) > 40 )) || break
  el $g bsb; TEST_TIMEOUT=200 timeout $(( $(left) - 5 )) $D/bsb/run.sh $g > $L/gates.$g.bsb.log 2>&1
  grep -E "^(PASS|FAIL)|passed" $L/gates.$g.bsb.log | cut -c1-150; save
done
el done; save
