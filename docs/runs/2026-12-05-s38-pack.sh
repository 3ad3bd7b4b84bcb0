#!/usr/bin/env bash
# Rebuilds session 38's device bundle from main on a fresh checkout: .device/s38c.tgz with
# main/, hs/ and hs2/ (each a `cargo xtask gpu-bundle` folder), and .device/s38c.sh + bench_table.py.
# hs = main + the s36 dispatch under the L1 + its head start + the s37 row-wait events + the s38
# fix (the L1 polls its rows); hs2 = hs + the dispatch in steps. ≈ 7 min on 2 cores. Main and the
# variants build in target folders of their own: cargo names a workspace package's outputs by its
# path inside the workspace, so two checkouts that share one overwrite each other's binaries, and
# the one with the older sources takes the other's as fresh (perf.md v103).
#   bash docs/runs/2026-12-05-s38-pack.sh      then: run `bash .device/s38c.sh` (carry ".device")
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
runs=docs/runs/2026-12-05
patches=(s36-dispatch-under-l1-after-sc s36-dispatch-head-start-after-dispatch-under-l1
  s37-row-wait-events-after-head-start s38-l1-polls-its-rows-after-row-wait-events s38-dispatch-steps-after-l1-polls)
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"' EXIT
CARGO_TARGET_DIR="$root/target/s38-main" cargo xtask gpu-bundle >/dev/null && cp -r .gpu-bundle "$pack/main"
git worktree add --detach "$wt/v" HEAD >/dev/null
ln -s "$root/.cuda" "$wt/v/.cuda"
for i in "${!patches[@]}"; do
  git -C "$wt/v" apply "$root/$runs-${patches[$i]}.patch"
  case $i in
    3) (cd "$wt/v" && CARGO_TARGET_DIR="$root/target/s38-variants" cargo xtask gpu-bundle >/dev/null) && cp -r "$wt/v/.gpu-bundle" "$pack/hs" ;;
    4) (cd "$wt/v" && CARGO_TARGET_DIR="$root/target/s38-variants" cargo xtask gpu-bundle >/dev/null) && cp -r "$wt/v/.gpu-bundle" "$pack/hs2" ;;
  esac
done
git worktree remove --force "$wt/v"
mkdir -p .device
tar czf .device/s38c.tgz -C "$pack" .
cp $runs-s38c.sh .device/s38c.sh; cp $runs-s38-bench_table.py .device/bench_table.py
du -sh .device/s38c.tgz
