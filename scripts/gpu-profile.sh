#!/usr/bin/env bash
# Where the grouped GEMM's time goes, on a GPU machine, from a bundle made by `cargo xtask gpu-bundle`:
# Nsight Compute's warp-state sampling per SASS instruction for a few (route, T) cases. Writes under
# $OUT, per case, <route>.<T>.src.csv.gz (read it with scripts/ncu_stalls.py) and <route>.<T>.details.txt.
#
#   OUT=dir scripts/gpu-profile.sh ["route T [bench args]" ...]   default: "g128/fp8 8" "g128/fp8 128" "mx32/bf16 8"
#   e.g. "mx32/bf16 8192 --cluster 1"; BENCH=path profiles another build of the benchmark (a
#   throw-away variant).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:-$root/gpu-out}"
mkdir -p "$out"
export MEGAMOE_CACHE="${MEGAMOE_CACHE:-/tmp/megamoe-cache}"
export CUDA_PATH="${CUDA_PATH:-/usr/local/cuda}"
export LD_LIBRARY_PATH="$CUDA_PATH/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bench="${BENCH:-$root/.gpu-bundle/bench/megamoe-kernel.gemm}"  # BENCH: another build of the benchmark
ncu="$(command -v ncu || echo "$CUDA_PATH/bin/ncu")"
cases=("$@")
(( ${#cases[@]} )) || cases=("g128/fp8 8" "g128/fp8 128" "mx32/bf16 8")

for c in "${cases[@]}"; do
  read -r route tokens extra <<<"$c"
  tag="$(echo "$route" | tr / -).$tokens$(echo "$extra" | tr -d ' -')"
  # Skip the warm-up launches; one L1 launch is sampled.
  timeout 150 "$ncu" --kernel-name mm_moe_gemm --launch-skip 8 --launch-count 1 --section WarpStateStats \
    --section SchedulerStats --section SourceCounters -o "/tmp/$tag" "$bench" --tokens "$tokens" --routes "$route" $extra \
    >"/tmp/$tag.ncu.log" 2>&1
  "$ncu" --import "/tmp/$tag.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip >"$out/$tag.src.csv.gz"
  "$ncu" --import "/tmp/$tag.ncu-rep" --page details 2>&1 | tail -60 >"$out/$tag.details.txt"
done
ls -la "$out"
