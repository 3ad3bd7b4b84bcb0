#!/usr/bin/env bash
# Builds session 46's prepared call: .device/s46f.tgz with `cargo xtask gpu-bundle` of main
# (938fb17) and of lsw (938fb17 + s46-layer-switch-lsw.patch: the L2 starts while the L1's
# epilogue warps finish its last tiles; the consumers' end mark given at once), each checked by a
# mark of its sources. Then `bash .device/s46f.sh` (carry ".device"): lsw's smoke test, lsw
# against main (fused, burst, two rounds), the timelines' L1 -> L2 gap, lsw's gpu_fused and the
# sanitizer — ≈ 7 minutes of an H100 or H200.
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
for v in main lsw; do
  git worktree add --detach "$wt/$v" 938fb17 >/dev/null
  ln -s "$root/.cuda" "$wt/$v/.cuda"
done
git -C "$wt/lsw" apply "$root/docs/runs/2026-12-06-s46-layer-switch-lsw.patch"
for v in main lsw; do
  (cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/s46-$v" cargo xtask gpu-bundle >/dev/null)
  cp -r "$wt/$v/.gpu-bundle" "$pack/$v"; rm -rf "$pack/$v/bench"
done
grep -q -a -F "kLayerSwitchAt" "$pack/lsw/bin/megamoe" || { echo "lsw: not its sources" >&2; exit 1; }
! grep -q -a -F "kLayerSwitchAt" "$pack/main/bin/megamoe" || { echo "main: not its sources" >&2; exit 1; }
mkdir -p .device
rm -f .device/s46f.tgz
tar czf .device/s46f.tgz -C "$pack" .
cp docs/runs/2026-12-06-s46f.sh .device/s46f.sh
cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
cp docs/runs/2026-12-06-s42-tl_stats.py .device/tl_stats.py
du -sh .device/*.tgz
