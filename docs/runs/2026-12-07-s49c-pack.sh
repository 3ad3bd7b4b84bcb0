#!/usr/bin/env bash
# Builds session 49's call 3: .device/s49c.tgz with main's bundle (the checkout's commit) and sf's
# (the same commit + runs/2026-12-07-s49-silu-in-shared-memory-sf.patch: the SwiGLU's SiLU table in
# shared memory, a fast f32 SiLU corrected by 4 bits a gate), each built in its own worktree and
# target directory and checked by a mark of its sources. Then `bash .device/s49c.sh` (carry ".device").
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
for v in main sf; do
  git worktree add --detach "$wt/$v" HEAD >/dev/null
  ln -s "$root/.cuda" "$wt/$v/.cuda"
  [ $v = sf ] && git -C "$wt/$v" apply "$root/docs/runs/2026-12-07-s49-silu-in-shared-memory-sf.patch"
  (cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/s49-$v" cargo xtask gpu-bundle >/dev/null)
  cp -r "$wt/$v/.gpu-bundle" "$pack/$v"; rm -rf "$pack/$v/bench"
done
has() { grep -q -a -F "$2" "$pack/$1/bin/megamoe"; }
has sf kSiluFixFirst && ! has main kSiluFixFirst || { echo "marks" >&2; exit 1; }
tar czf .device/s49c.tgz -C "$pack" .
cp docs/runs/2026-12-07-s49c.sh .device/s49c.sh
cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
cp docs/runs/2026-12-06-s42-tl_stats.py .device/tl_stats.py
du -sh .device/*.tgz
