#!/usr/bin/env bash
# Rebuilds session 39's second call's bundle on a fresh checkout: .device/s39b.tgz with main/ and pw/
# (each a `cargo xtask gpu-bundle` folder, each built in a target folder of its own; gpu-bundle
# refuses a binary that holds another checkout's sources), and .device/s39b.sh + bench_table.py.
# pw = main + runs/2026-12-06-s39-weights-into-l2-while-rows-wait.patch. Then: run
# `bash .device/s39b.sh` (carry ".device"; ≈ 5 min on the device).
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
runs=docs/runs/2026-12-06
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"' EXIT
CARGO_TARGET_DIR="$root/target/s39-main" cargo xtask gpu-bundle >/dev/null && cp -r .gpu-bundle "$pack/main"
git worktree add --detach "$wt/v" HEAD >/dev/null
ln -s "$root/.cuda" "$wt/v/.cuda"
git -C "$wt/v" apply "$root/$runs-s39-weights-into-l2-while-rows-wait.patch"
(cd "$wt/v" && CARGO_TARGET_DIR="$root/target/s39-pw" cargo xtask gpu-bundle >/dev/null) && cp -r "$wt/v/.gpu-bundle" "$pack/pw"
git worktree remove --force "$wt/v"
rm -rf "$pack"/*/bench
mkdir -p .device
tar czf .device/s39b.tgz -C "$pack" .
cp $runs-s39b.sh .device/s39b.sh; cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
du -sh .device/s39b.tgz
