#!/usr/bin/env bash
# Builds session 58's call (runs/2026-12-07-s58a.sh): .gpu-bundle from the working tree with br (the
# top-k sums in even shares a warp, runs/2026-12-07-s56-balanced-top-k-sums-br.patch) applied when
# HEAD lacks it — the tree keeps it, to commit once its gates pass — and .device/clis.tar.xz with
# HEAD + br's `megamoe` rebuilt with the fused forward's first-weights prefetch at 8 and 16 MiB
# instead of 32 (p8, p16: one constant, the H200 question of perf.md v100/v105), each checked by a
# mark of its sources.
# Then `bash .device/s58a.sh` with carry ".gpu-bundle", ".device" (or, short of device time,
# `bash .device/s58b.sh` = runs/2026-12-07-s58b-gates.sh: the gates alone).
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
br=docs/runs/2026-12-07-s56-balanced-top-k-sums-br.patch
grep -q "constexpr int kReduceUnit" crates/megamoe-kernel/cuda/sm90_mega_moe.cuh || git apply $br
cargo xtask gpu-bundle
eval "$(cargo xtask setup-cuda | grep '^export')"
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
git worktree add --detach "$wt/p" HEAD >/dev/null; ln -s "$root/.cuda" "$wt/p/.cuda"
git -C "$wt/p" apply "$root/$br"
gemm=crates/megamoe-kernel/cuda/sm90_moe_gemm.cuh
for mib in 8 16; do
  git -C "$wt/p" checkout -q -- $gemm
  sed -i "s/kFirstWeightsPrefetchBytes = 32u << 20;/kFirstWeightsPrefetchBytes = ${mib}u << 20;/" "$wt/p/$gemm"
  grep -q "kFirstWeightsPrefetchBytes = ${mib}u << 20;" "$wt/p/$gemm" || { echo "p$mib: no edit" >&2; exit 1; }
  (cd "$wt/p" && CARGO_TARGET_DIR="$root/target/s57-p" cargo build -q --release -p megamoe-cli --bin megamoe)
  mkdir -p "$pack/p$mib"; cp "$root/target/s57-p/release/megamoe" "$pack/p$mib/megamoe"; strip "$pack/p$mib/megamoe"
  grep -q -a -F "kFirstWeightsPrefetchBytes = ${mib}u << 20;" "$pack/p$mib/megamoe" || { echo "p$mib: mark" >&2; exit 1; }
done
grep -q -a -F "constexpr int kReduceUnit" .gpu-bundle/bin/megamoe || { echo "bundle: no br" >&2; exit 1; }
rm -rf .device && mkdir -p .device
tar cJf .device/clis.tar.xz -C "$pack" p8 p16
cp docs/runs/2026-12-07-s58a.sh .device/s58a.sh; cp docs/runs/2026-12-07-s58b-gates.sh .device/s58b.sh; cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
cp docs/runs/2026-12-06-s42-tl_stats.py .device/tl_stats.py
du -sh .gpu-bundle .device
