#!/usr/bin/env bash
# Builds session 48's call 2: .device/s48a.tgz with the main and lsw2 bundles of session 47's pack
# (runs/2026-12-06-s47d-pack.sh, run first where .device/s47d.tgz is missing) and lsw3 = lsw2 +
# runs/2026-12-06-s48-layer-switch-taken-lsw3.patch (main's epilogue wait on the box; the consumers'
# end mark waits for the box's last tile taken, not done), built in its own worktree and target
# directory, each checked by a mark of its sources. Then `bash .device/s48a.sh` (carry ".device").
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
[ -f .device/s47d.tgz ] || bash docs/runs/2026-12-06-s47d-pack.sh
tar xzf .device/s47d.tgz -C "$pack" ./main ./lsw2
git worktree add --detach "$wt/lsw3" 938fb17 >/dev/null
ln -s "$root/.cuda" "$wt/lsw3/.cuda"
for p in s46-layer-switch-lsw s47-layer-switch-lsw2 s48-layer-switch-taken-lsw3; do
  git -C "$wt/lsw3" apply "$root/docs/runs/2026-12-06-$p.patch"
done
(cd "$wt/lsw3" && CARGO_TARGET_DIR="$root/target/s48-lsw3" cargo xtask gpu-bundle >/dev/null)
cp -r "$wt/lsw3/.gpu-bundle" "$pack/lsw3"; rm -rf "$pack/lsw3/bench"
has() { grep -q -a -F "$2" "$pack/$1/bin/megamoe"; }
has lsw3 kHandoffTakenAt && ! has lsw2 kHandoffTakenAt && has lsw2 kTileOrEndWaitNs || { echo "marks" >&2; exit 1; }
tar czf .device/s48a.tgz -C "$pack" .
cp docs/runs/2026-12-06-s48a.sh .device/s48a.sh
cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
cp docs/runs/2026-12-06-s42-tl_stats.py .device/tl_stats.py
du -sh .device/*.tgz
