#!/usr/bin/env bash
# Builds session 44's third call: .device/s44c.tgz with the `megamoe` CLI of ne (1ec1330 +
# s44-no-epilogue-work-ne.patch, TIMING ONLY), checked by its mark; head is .device/s43g.tgz's
# megamoe.new (runs/2026-12-06-s43g-pack.sh). Then: `bash .device/s44c.sh` (carry ".device").
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
git worktree add --detach "$wt/ne" 1ec1330 >/dev/null
ln -s "$root/.cuda" "$wt/ne/.cuda"
git -C "$wt/ne" apply "$root/docs/runs/2026-12-06-s44-no-epilogue-work-ne.patch"
(cd "$wt/ne" && CARGO_TARGET_DIR="$root/target/s44-ne" cargo build --release -q -p megamoe-cli)
mkdir -p "$pack/bin"
strip -o "$pack/bin/megamoe.ne" "$root/target/s44-ne/release/megamoe"
grep -q -a -F "NO EPILOGUE WORK" "$pack/bin/megamoe.ne" || { echo "ne: not its sources" >&2; exit 1; }
tar czf .device/s44c.tgz -C "$pack" .
cp docs/runs/2026-12-06-s44c.sh .device/s44c.sh; cp docs/runs/2026-12-06-s42-tl_stats.py .device/tl_stats.py
cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
du -sh .device/*.tgz
