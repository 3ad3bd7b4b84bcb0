#!/usr/bin/env bash
# Builds session 44's fourth call: .device/s44d.tgz with `cargo xtask gpu-bundle` of hb (1ec1330 +
# s44-two-handoff-boxes-hb.patch and the sanitizer's 256-token fused case), checked by its mark;
# main is .device/s43g.tgz's megamoe.new (runs/2026-12-06-s43g-pack.sh). Then `bash .device/s44d.sh`,
# or, with ev and ns (runs/2026-12-06-s44e-pack.sh) in less device time, `bash .device/s44f.sh`
# (carry ".device"). Neither ran in session 44: no machine started after the third call.
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
git worktree add --detach "$wt/hb" 1ec1330 >/dev/null
ln -s "$root/.cuda" "$wt/hb/.cuda"
git -C "$wt/hb" apply "$root/docs/runs/2026-12-06-s44-two-handoff-boxes-hb.patch"
(cd "$wt/hb" && CARGO_TARGET_DIR="$root/target/s44-hb" cargo xtask gpu-bundle >/dev/null)
cp -r "$wt/hb/.gpu-bundle" "$pack/hb"; rm -rf "$pack/hb/bench"
grep -q -a -F "kHandoffBoxes" "$pack/hb/bin/megamoe" || { echo "hb: not its sources" >&2; exit 1; }
mkdir -p .device
rm -f .device/s44d.tgz
tar czf .device/s44d.tgz -C "$pack" .
cp docs/runs/2026-12-06-s44d.sh .device/s44d.sh; cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
du -sh .device/*.tgz
