#!/usr/bin/env bash
# Session 54's last call (short: what the device budget left): the whole-token sanitizer case
# under the four tools on the checkout's bundle (store_slots_bulk), then main (.gpu-bundle) against
# bw (.device/bw/megamoe: + runs/2026-12-07-s54-fp8-whole-tokens-from-264-bw.patch), g128/fp8
# fused, T = 384, 512, 1000, alternating rounds of five as BUDGET lasts, and one forward's
# timeline each at T = 512. Carry [".gpu-bundle", ".device"]; logs into $OUT/all.tgz.
set -uo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_CACHE=/tmp/megamoe-cache CUDA_PATH=/usr/local/cuda \
  LD_LIBRARY_PATH=/usr/local/cuda/lib64 MEGAMOE_REQUIRE_GPUS=1 PATH=/usr/local/cuda/bin:$PATH NO_COLOR=1
L=/tmp/logs; rm -rf $L; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $L/steps.txt; }
left() { echo $(( ${BUDGET:-140} - ($(date +%s) - t0) )); }
save() { tar czf $OUT/all.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $L/gpu.txt; save
declare -A bin=([main]=.gpu-bundle/bin/megamoe [bw]=.device/bw/megamoe)
B="bench --preset deepseek-v4-pro --ranks 1 --experts 48 --routes g128/fp8 --path fused"
el warm; for v in main bw; do ( timeout 90 ${bin[$v]} $B --tokens 384,512,1000 --reps 1 > $L/warm.$v.log 2>&1 ) & done
el sanitize; SANITIZE_JOBS=4 SANITIZE_TIMEOUT=80 SANITIZE_LOGS=$L/san timeout 90 .gpu-bundle/sanitize.sh "" \
  fused_tiny_whole_token_dispatch > $L/sanitize.log 2>&1; wait; grep -E "CLEAN|KNOWN|FAIL|clean," $L/sanitize.log; save
for r in 1 2 3 4; do (( $(left) > 12 )) || break; for v in main bw; do
  el bench $v $r; timeout 20 ${bin[$v]} $B --tokens 384,512,1000 --reps 5 > $L/bench.$v.$r.log 2>&1
done; python3 .device/bench_table.py $(for v in main bw; do echo -n "$v=$(ls $L/bench.$v.*.log | paste -sd,) "; done) > $L/table.txt 2>&1; save; done
cat $L/table.txt
for v in main bw; do (( $(left) > 5 )) || break
  timeout 15 ${bin[$v]} $B --tokens 512 --reps 1 --timeline $L/tl.$v > $L/tl.$v.log 2>&1
  python3 .device/tl_stats.py $L/tl.$v/*.json > $L/tl_stats.$v.txt 2>&1; grep -E "glue" $L/tl_stats.$v.txt | cut -c1-150
done
el done; save
