#!/usr/bin/env bash
# Builds session 43's third call: .device/s43c.tgz with the `megamoe` CLI of main (52bfe28) and bt
# (main + s43-bf16-twin-units-bt.patch: session 35's BF16 twin units on main; its fused mx32
# 96-token kernel spills 12 / 64 B), each in a target folder of its own and checked by its
# sources' marks, bt's `cargo xtask gpu-bundle` (gates), and .device/s43c.sh, bench_table.py.
# Then: `bash .device/s43c.sh` (carry ".device").
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
declare -A tgt=([main]=s42-tf [bt]=s43-bt)
declare -A mark=([main]="static constexpr bool kTwin = kFp8 && kCtas == 1 && BN <= 96;"
                 [bt]="static constexpr bool kTwin = kCtas == 1 && BN <= 96;")
mkdir -p "$pack/bin"
for v in main bt; do
  git worktree add --detach "$wt/$v" 52bfe28 >/dev/null
  [[ $v == main ]] || git -C "$wt/$v" apply "$root/docs/runs/2026-12-06-s43-bf16-twin-units-bt.patch"
  ln -s "$root/.cuda" "$wt/$v/.cuda"
  (cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/${tgt[$v]}" cargo build --release -q -p megamoe-cli)
  strip -o "$pack/bin/megamoe.$v" "$root/target/${tgt[$v]}/release/megamoe"
  grep -q -a -F "${mark[$v]}" "$pack/bin/megamoe.$v" || { echo "$v: not its sources" >&2; exit 1; }
  echo "$v: ok"
done
(cd "$wt/bt" && CARGO_TARGET_DIR="$root/target/s43-bt" cargo xtask gpu-bundle >/dev/null)
cp -r "$wt/bt/.gpu-bundle" "$pack/bt"; rm -rf "$pack/bt/bench"
mkdir -p .device
rm -f .device/*.tgz
tar czf .device/s43c.tgz -C "$pack" .
cp docs/runs/2026-12-06-s43c.sh .device/s43c.sh; cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
du -sh .device/s43c.tgz
