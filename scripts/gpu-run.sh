#!/usr/bin/env bash
# One full run on a GPU machine without Rust, from a bundle made here by `cargo xtask gpu-bundle`:
# the GPU tests (one line each), the benchmarks (grouped GEMM, barriers, `megamoe bench`), and the SASS instruction mix of every
# GEMM specialization the run compiled. Everything is logged under $OUT (default ./gpu-out).
#
#   scripts/gpu-run.sh [TEST_FILTER] [BENCH_ARGS...]
#
# Everything lands in at most 7 files (the device tool brings back 8). Environment: SKIP_TESTS=1,
# SKIP_BENCH=1, SKIP_DEMO=1; TEST_TIMEOUT per test (default 300 s).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bundle="$root/.gpu-bundle"
out="${OUT:-$root/gpu-out}"
mkdir -p "$out"
export MEGAMOE_CACHE="${MEGAMOE_CACHE:-/tmp/megamoe-cache}"
export CUDA_PATH="${CUDA_PATH:-/usr/local/cuda}"
export TEST_TIMEOUT="${TEST_TIMEOUT:-300}"
filter="${1:-}"
shift || true

{ nvidia-smi; nvidia-smi topo -m; } >"$out/machine.txt" 2>&1
head -12 "$out/machine.txt"
status=0
if [[ -z "${SKIP_TESTS:-}" ]]; then
  VERBOSE=1 "$bundle/run.sh" "$filter" >"$out/tests.log" 2>&1 || status=1
  grep -E '^(PASS|FAIL|SKIP) |passed, ' "$out/tests.log"
  grep -E 'calc_diff' "$out/tests.log" | sed 's/^ *//' | sort | uniq | head -60
fi
if [[ -z "${SKIP_BENCH:-}" ]]; then
  for bench in "$bundle"/bench/*; do
    timeout 420 "$bench" "$@" 2>&1 | tee "$out/bench.$(basename "$bench").log" || status=1
  done
  # The whole pipeline at V4-Pro's per-rank shape (48 experts per GPU, as at EP8) on 1, 2, 4 and 8
  # GPUs as far as present (threads; at the largest world also a process per GPU), and the preset's
  # own 384 experts over the largest world.
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  largest=1
  for ranks in 1 2 4 8; do
    (( ranks <= gpus )) || continue
    largest=$ranks
    timeout 420 "$bundle/bin/megamoe" bench --preset deepseek-v4-pro --ranks "$ranks" --experts $((48 * ranks)) \
      --tokens 8,128,8192 --routes g128/fp8,g128/bf16-fp8,g128/bf16,mx32/bf16 --reps 5 2>&1 | tee -a "$out/pipeline.log" || status=1
  done
  if (( largest > 1 )); then
    timeout 420 "$bundle/bin/megamoe" bench --preset deepseek-v4-pro --ranks "$largest" --experts $((48 * largest)) \
      --tokens 8,128,8192 --routes g128/fp8,mx32/bf16 --reps 5 --world process 2>&1 | tee -a "$out/pipeline.log" || status=1
    timeout 420 "$bundle/bin/megamoe" bench --preset deepseek-v4-pro --ranks "$largest" \
      --tokens 8,128,8192 --routes g128/fp8,mx32/bf16 --reps 5 2>&1 | tee -a "$out/pipeline.log" || status=1
  fi
fi
# `cargo xtask demo`'s GPU branch without cargo: a tiny 2-rank problem on the CPU reference, the
# same problem through the CUDA backend on both tensor-core routes, checked against the CPU's y.
if [[ -z "${SKIP_DEMO:-}" ]] && (( $(nvidia-smi -L 2>/dev/null | wc -l) >= 2 )); then
  {
    cli="$bundle/bin/megamoe"
    demo="$(mktemp -d)"
    for recipe in mx32 g128; do
      dir="$demo/$recipe"
      "$cli" gen "$dir" --preset tiny --ranks 2 --tokens 64 --recipe "$recipe" --mask-fraction 0.1 &&
        "$cli" run "$dir" --backend cpu || status=1
      for mma in bf16 fp8; do
        [[ $recipe == mx32 && $mma == fp8 ]] && continue
        gpu_dir="$demo/$recipe-$mma"
        mkdir -p "$gpu_dir" && cp "$dir"/config.json "$dir"/weights.* "$dir"/inputs.* "$gpu_dir"/
        # The contract's 1e-5 for the exact route; the FP8 route's documented bound (tests/gpu_cuda.rs).
        tol=1e-5; [[ $mma == fp8 ]] && tol=1e-3
        "$cli" run "$gpu_dir" --backend cuda --mma "$mma" && "$cli" check "$dir" "$gpu_dir" --tol "$tol" || status=1
      done
    done
  } >"$out/demo.log" 2>&1
  grep -v ' INFO ' "$out/demo.log"
fi
# The instruction mix of each compiled GEMM: the tensor-core ops must be there, local memory must not.
if command -v cuobjdump >/dev/null || [[ -x "$CUDA_PATH/bin/cuobjdump" ]]; then
  dump="$(command -v cuobjdump || echo "$CUDA_PATH/bin/cuobjdump")"
  for cubin in "$MEGAMOE_CACHE"/jit/*.cubin; do
    [[ -e "$cubin" ]] || continue
    grep -q 'mm_moe_gemm' "$cubin" || continue
    sass="$("$dump" --dump-sass "$cubin" 2>/dev/null)"
    printf '%s %s\n' "$(basename "$cubin" .cubin | cut -c1-12)" \
      "$(printf '%s\n' "$sass" | grep -oE '\b(QGMMA|HGMMA|LDL|STL|PRMT|SYNCS)[A-Z0-9._]*' | cut -d. -f1 | sort | uniq -c | tr '\n' ' ')"
  done | tee "$out/sass-mix.txt"
fi
exit $status
