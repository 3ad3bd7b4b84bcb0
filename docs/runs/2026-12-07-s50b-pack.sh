#!/usr/bin/env bash
# Builds session 50's call 2: .device/s50b.tgz with main's bundle (the checkout's commit) and ow's
# (the same commit + runs/2026-12-07-s50-glue-workers-cta-first-ow.patch: the glue stages' workers
# numbered CTA first), each built in its own worktree and target directory and checked by a mark
# of its sources. Then `bash .device/s50b.sh` (carry ".device").
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
for v in main ow; do
  git worktree add --detach "$wt/$v" HEAD >/dev/null
  ln -s "$root/.cuda" "$wt/$v/.cuda"
  [ $v = ow ] && git -C "$wt/$v" apply "$root/docs/runs/2026-12-07-s50-glue-workers-cta-first-ow.patch"
  (cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/s50-$v" cargo xtask gpu-bundle >/dev/null)
  cp -r "$wt/$v/.gpu-bundle" "$pack/$v"; rm -rf "$pack/$v/bench"
done
has() { grep -q -a -F "$2" "$pack/$1/bin/megamoe"; }
has ow "warp * gridDim.x + blockIdx.x" && ! has main "warp * gridDim.x + blockIdx.x" || { echo "marks" >&2; exit 1; }
tar czf .device/s50b.tgz -C "$pack" .
cp docs/runs/2026-12-07-s50b.sh .device/s50b.sh
cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
cp docs/runs/2026-12-06-s42-tl_stats.py .device/tl_stats.py
du -sh .device/*.tgz
