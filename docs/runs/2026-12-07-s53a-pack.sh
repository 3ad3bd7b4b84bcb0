#!/usr/bin/env bash
# Builds the next call (session 52's prepared one): .device/s53a.tgz with main's bundle (the
# checkout's commit), dc's (+ runs/2026-12-07-s52-counted-dispatch-dc.patch: one rank's dispatch
# by 16-row granules in pool order, each block counted once stored, the L1 without a grid barrier
# before it; measured in session 52) and dcb's (+ runs/2026-12-07-s52-counted-dispatch-bulk-dcb.patch:
# the same with each granule's rows brought into shared memory by bulk copies, all 16 in flight)
# and bc1's (+ runs/2026-12-07-s52-fused-tiles-drawn-without-clusters-bc1.patch: the fused
# forward's BF16 one-CTA tiles drawn, without clusters), each built in its own worktree and target
# directory and checked by a mark of its sources (bc1: a binary unlike main's). Then
# `bash .device/s53a.sh` (carry ".device"). ≈ 30 minutes from empty target directories (three
# variants: 22 minutes, 39 MB, in session 52).
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
declare -A patch=([dc]=counted-dispatch-dc [dcb]=counted-dispatch-bulk-dcb [bc1]=fused-tiles-drawn-without-clusters-bc1)
for v in main dc dcb bc1; do
  git worktree add --detach "$wt/$v" HEAD >/dev/null
  ln -s "$root/.cuda" "$wt/$v/.cuda"
  [ $v != main ] && git -C "$wt/$v" apply "$root/docs/runs/2026-12-07-s52-${patch[$v]}.patch"
  (cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/s53-$v" cargo xtask gpu-bundle >/dev/null)
  cp -r "$wt/$v/.gpu-bundle" "$pack/$v"; rm -rf "$pack/$v/bench"
done
has() { grep -q -a -F "$2" "$pack/$1/bin/megamoe"; }
has dc "dispatch_granules" && ! has main "dispatch_granules" || { echo "marks dc" >&2; exit 1; }
has dcb "row_landed" && ! has dc "row_landed" && ! has main "row_landed" || { echo "marks dcb" >&2; exit 1; }
! has bc1 "dispatch_granules" && ! cmp -s "$pack/main/bin/megamoe" "$pack/bc1/bin/megamoe" || { echo "marks bc1" >&2; exit 1; }
rm -f .device/*.tgz  # the carry holds 64 MiB: this call's bundles only
tar czf .device/s53a.tgz -C "$pack" .
cp docs/runs/2026-12-07-s53a.sh .device/s53a.sh
cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
cp docs/runs/2026-12-06-s42-tl_stats.py .device/tl_stats.py
du -sh .device/*.tgz
