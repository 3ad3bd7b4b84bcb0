#!/usr/bin/env bash
# Builds .device/s44e.tgz for session 44's last call: the `megamoe` CLI of ev (1ec1330 +
# s44-silu-kept-in-l2-ev.patch, which holds hb's change) and of ns (1ec1330 +
# s44-no-silu-loads-ns.patch, also on hb; TIMING ONLY), each in a target folder of its own and
# checked by its mark. With runs/2026-12-06-s44d-pack.sh (hb's bundle) and s43g-pack.sh (main):
# `bash .device/s44f.sh` (carry ".device").
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
runs=docs/runs/2026-12-06
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
declare -A patches=([ev]=$runs-s44-silu-kept-in-l2-ev.patch [ns]=$runs-s44-no-silu-loads-ns.patch)
declare -A mark=([ev]="L2::evict_last" [ns]="NO SILU LOADS")
mkdir -p "$pack/bin"
for v in ev ns; do
  git worktree add --detach "$wt/$v" 1ec1330 >/dev/null
  ln -s "$root/.cuda" "$wt/$v/.cuda"
  git -C "$wt/$v" apply "$root/${patches[$v]}"
  (cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/s44-$v" cargo build --release -q -p megamoe-cli)
  strip -o "$pack/bin/megamoe.$v" "$root/target/s44-$v/release/megamoe"
  grep -q -a -F "${mark[$v]}" "$pack/bin/megamoe.$v" || { echo "$v: not its sources" >&2; exit 1; }
  echo "$v: ok"
done
mkdir -p .device
rm -f .device/s44e.tgz
tar czf .device/s44e.tgz -C "$pack" .
cp $runs-s44f.sh .device/s44f.sh; cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
du -sh .device/*.tgz
