#!/usr/bin/env bash
# Builds the bar's same-machine call: .device/s43g.tgz with the `megamoe` CLI of 52bfe28 (old:
# session 42's main) and of HEAD (new), each in a target folder of its own, and .device/s43g.sh,
# bench_table.py. Then: `bash .device/s43g.sh` (carry ".device"); on an H200 its table is the
# bar's (old's column against v105's, new's the cells since).
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
declare -A rev=([old]=52bfe28 [new]=HEAD)
mkdir -p "$pack/bin"
for v in old new; do
  git worktree add --detach "$wt/$v" "${rev[$v]}" >/dev/null
  ln -s "$root/.cuda" "$wt/$v/.cuda"
  (cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/s43g-$v" cargo build --release -q -p megamoe-cli)
  strip -o "$pack/bin/megamoe.$v" "$root/target/s43g-$v/release/megamoe"
  if grep -q -a -F "static constexpr bool kTwin = kCtas == 1 && BN <= 96;" "$pack/bin/megamoe.$v"; then has=new; else has=old; fi
  [[ $has == "$v" ]] || { echo "$v: not its sources" >&2; exit 1; }
  echo "$v: ok"
done
mkdir -p .device
rm -f .device/*.tgz
tar czf .device/s43g.tgz -C "$pack" .
cp docs/runs/2026-12-06-s43g.sh .device/s43g.sh; cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
du -sh .device/s43g.tgz
