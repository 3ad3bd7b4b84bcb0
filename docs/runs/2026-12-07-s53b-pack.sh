#!/usr/bin/env bash
# Builds session 53's second call: .device/s53b.tgz with main's bundle (the checkout's commit) and
# dcl's (+ runs/2026-12-07-s53-drawn-clusters-dcl.patch: the BF16 route's clusters of two draw their
# items, rank 0 for both through shared memory), each built in its own worktree and target
# directory and checked by a mark of its sources. Then `bash .device/s53b.sh` (carry ".device").
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
for v in main dcl; do
  git worktree add --detach "$wt/$v" HEAD >/dev/null
  ln -s "$root/.cuda" "$wt/$v/.cuda"
  [ $v != main ] && git -C "$wt/$v" apply "$root/docs/runs/2026-12-07-s53-drawn-clusters-dcl.patch"
  (cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/s53-$v" cargo xtask gpu-bundle >/dev/null)
  cp -r "$wt/$v/.gpu-bundle" "$pack/$v"; rm -rf "$pack/$v/bench"
done
has() { grep -q -a -F "$2" "$pack/$1/bin/megamoe"; }
has dcl "cluster_ticket" && ! has main "cluster_ticket" || { echo "marks dcl" >&2; exit 1; }
rm -f .device/*.tgz  # the carry holds 64 MiB: this call's bundles only
tar czf .device/s53b.tgz -C "$pack" .
cp docs/runs/2026-12-07-s53b.sh .device/s53b.sh
cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
cp docs/runs/2026-12-06-s42-tl_stats.py .device/tl_stats.py
du -sh .device/*.tgz
