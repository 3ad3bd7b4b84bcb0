#!/usr/bin/env bash
# Builds session 56's br call (runs/2026-12-07-s56c.sh) from the checkout: .gpu-bundle from br2
# (+ runs/2026-12-07-s56-balanced-top-k-sums-two-runs-br2.patch), and in .device/clis.tar.xz the
# stripped `megamoe` of main (the checkout's commit, as .device/main8b/) and of br
# (+ runs/2026-12-07-s56-balanced-top-k-sums-br.patch, as .device/br/), each built in its own
# worktree and checked by a mark of its sources. Then `ROUNDS="1 2" bash .device/s56c.sh` (carry
# ".gpu-bundle", ".device"; s56d.sh is its timing-only short form).
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
declare -A patch=([br]=balanced-top-k-sums-br [br2]=balanced-top-k-sums-two-runs-br2)
for v in main br br2; do
  git worktree add --detach "$wt/$v" HEAD >/dev/null
  ln -s "$root/.cuda" "$wt/$v/.cuda"
  [ $v != main ] && git -C "$wt/$v" apply "$root/docs/runs/2026-12-07-s56-${patch[$v]}.patch"
  if [ $v = br2 ]; then
    (cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/s56-$v" cargo xtask gpu-bundle >/dev/null)
  else
    (cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/s56-$v" cargo build -q --release -p megamoe-cli --bin megamoe)
    dir=$([ $v = main ] && echo main8b || echo br)
    mkdir -p "$pack/$dir"; cp "$root/target/s56-$v/release/megamoe" "$pack/$dir/megamoe"; strip "$pack/$dir/megamoe"
  fi
done
has() { grep -q -a -F "$2" "$1"; }
has "$pack/br/megamoe" "kReduceUnit" && ! has "$pack/main8b/megamoe" "kReduceUnit" &&
  has "$wt/br2/.gpu-bundle/bin/megamoe" "kReduceSteps" || { echo "marks br, br2" >&2; exit 1; }
rm -rf .gpu-bundle && cp -r "$wt/br2/.gpu-bundle" .gpu-bundle
rm -rf .device && mkdir -p .device  # the carry holds 64 MiB: this call's CLIs only, compressed
tar cJf .device/clis.tar.xz -C "$pack" main8b br
cp docs/runs/2026-12-07-s56c.sh .device/s56c.sh
cp docs/runs/2026-12-07-s56d.sh .device/s56d.sh
cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
cp docs/runs/2026-12-06-s42-tl_stats.py .device/tl_stats.py
du -sh .gpu-bundle .device
