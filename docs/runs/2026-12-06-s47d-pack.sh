#!/usr/bin/env bash
# Builds session 47's prepared call: .device/s47d.tgz with `cargo xtask gpu-bundle` of main
# (938fb17's kernels), lsw2 (main + runs/2026-12-06-s46-layer-switch-lsw.patch + runs/2026-12-06-
# s47-layer-switch-lsw2.patch: the layer switch, the epilogue's tile-or-end wait asleep on the box,
# the meeting by every thread) and sd (lsw2 +
# runs/2026-12-06-s47-pair-first-tile-at-once-sd.patch), each in its own worktree and target
# directory (xtask finds the workspace by the path it was built in, so a shared target directory
# builds the first worktree's sources for all), each checked by a mark of its sources. Then
# `bash .device/s47d.sh` (carry ".device"): ≈ 8 minutes of an H100 or H200. About 25 minutes here.
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
for v in main lsw2 sd; do
  git worktree add --detach "$wt/$v" 938fb17 >/dev/null
  ln -s "$root/.cuda" "$wt/$v/.cuda"
done
for p in s46-layer-switch-lsw s47-layer-switch-lsw2; do
  git -C "$wt/lsw2" apply "$root/docs/runs/2026-12-06-$p.patch"
done
for p in s46-layer-switch-lsw s47-layer-switch-lsw2 s47-pair-first-tile-at-once-sd; do
  git -C "$wt/sd" apply "$root/docs/runs/2026-12-06-$p.patch"
done
for v in main lsw2 sd; do
  (cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/s47-$v" cargo xtask gpu-bundle >/dev/null)
  cp -r "$wt/$v/.gpu-bundle" "$pack/$v"; rm -rf "$pack/$v/bench"
done
has() { grep -q -a -F "$2" "$pack/$1/bin/megamoe"; }
has lsw2 kTileOrEndWaitNs && ! has lsw2 kFirstAtOnce || { echo "lsw2: not its sources" >&2; exit 1; }
has sd kTileOrEndWaitNs && has sd kFirstAtOnce || { echo "sd: not its sources" >&2; exit 1; }
! has main kLayerSwitchAt || { echo "main: not its sources" >&2; exit 1; }
mkdir -p .device
rm -f .device/s47d.tgz
tar czf .device/s47d.tgz -C "$pack" .
cp docs/runs/2026-12-06-s47d.sh .device/s47d.sh
cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
cp docs/runs/2026-12-06-s42-tl_stats.py .device/tl_stats.py
du -sh .device/*.tgz
