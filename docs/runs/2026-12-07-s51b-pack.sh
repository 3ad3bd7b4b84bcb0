#!/usr/bin/env bash
# Builds session 51's calls: .device/s51b.tgz with main's bundle (the checkout's commit) and lpt's
# (the same commit + runs/2026-12-07-s51-small-blocks-last-lpt.patch: the drawn overhang plans'
# walker takes every expert's small last block after all the large ones; call 1 ran
# runs/2026-12-07-s51-small-blocks-last-lpt1.patch, its first form), each built in its own worktree
# and target directory and checked by a mark of its sources. Then `bash .device/s51b.sh` (carry
# ".device").
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
for v in main lpt; do
  git worktree add --detach "$wt/$v" HEAD >/dev/null
  ln -s "$root/.cuda" "$wt/$v/.cuda"
  [ $v = lpt ] && git -C "$wt/$v" apply "$root/docs/runs/2026-12-07-s51-small-blocks-last-lpt.patch"
  (cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/s51-$v" cargo xtask gpu-bundle >/dev/null)
  cp -r "$wt/$v/.gpu-bundle" "$pack/$v"; rm -rf "$pack/$v/bench"
done
has() { grep -q -a -F "$2" "$pack/$1/bin/megamoe"; }
has lpt "kSmallLast" && ! has main "kSmallLast" || { echo "marks" >&2; exit 1; }
tar czf .device/s51b.tgz -C "$pack" .
cp docs/runs/2026-12-07-s51b.sh .device/s51b.sh
cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
cp docs/runs/2026-12-06-s42-tl_stats.py .device/tl_stats.py
du -sh .device/*.tgz
