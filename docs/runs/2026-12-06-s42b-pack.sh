#!/usr/bin/env bash
# Builds session 42's second call: .device/s42b.tgz with the `megamoe` CLI of tf (e353bb9), tf8
# (tf + runs/2026-12-06-s41-first-weights-8mib-p8.patch) and tf16 (tf with the glue's
# first-weights prefetch at 16 MiB), each in a target folder of its own and checked by its
# sources' marks, and .device/s42b.sh, bench_table.py. Then: `bash .device/s42b.sh` (carry
# ".device").
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
runs=docs/runs/2026-12-06
tf=$(git log --format=%H -1 --grep='a drawn schedule.s first ticket is the CTA.s own')
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
declare -A bytes=([tf]=32 [tf8]=8 [tf16]=16)
mkdir -p "$pack/bin"
for v in tf tf8 tf16; do
  git worktree add --detach "$wt/$v" "$tf" >/dev/null
  ln -s "$root/.cuda" "$wt/$v/.cuda"
  sed -i "s/kFirstWeightsPrefetchBytes = 32u << 20;/kFirstWeightsPrefetchBytes = ${bytes[$v]}u << 20;/" \
    "$wt/$v/crates/megamoe-kernel/cuda/sm90_moe_gemm.cuh"
  (cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/s42-$v" cargo build --release -q -p megamoe-cli)
  strip -o "$pack/bin/megamoe.$v" "$root/target/s42-$v/release/megamoe"
  grep -q -a -F "kFirstWeightsPrefetchBytes = ${bytes[$v]}u << 20;" "$pack/bin/megamoe.$v" || { echo "$v: no ${bytes[$v]} MiB" >&2; exit 1; }
  grep -q -a -F "(int)fresh_ctaid_x() : (int)gridDim.x" "$pack/bin/megamoe.$v" || { echo "$v: not tf" >&2; exit 1; }
  echo "$v: ok"
done
mkdir -p .device
tar czf .device/s42b.tgz -C "$pack" .
cp $runs-s42b.sh .device/s42b.sh; cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
du -sh .device/s42b.tgz
