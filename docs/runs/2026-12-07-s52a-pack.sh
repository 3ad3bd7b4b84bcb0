#!/usr/bin/env bash
# Builds session 52's call: .device/s52a.tgz with main's bundle (the checkout's commit), lpt's (+
# runs/2026-12-07-s51-small-blocks-last-lpt.patch: the drawn overhang plans' small blocks last) and
# ed's (+ runs/2026-12-07-s51-paired-codes-ed.patch: the SwiGLU epilogue's E4M3 codes two a
# conversion on one-CTA tiles), each built in its own worktree and target directory and checked
# by a mark of its sources. Then `bash .device/s52a.sh` (carry ".device"). ≈ 20 minutes from
# empty target directories.
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
declare -A patch=([lpt]=small-blocks-last-lpt [ed]=paired-codes-ed)
for v in main lpt ed; do
  git worktree add --detach "$wt/$v" HEAD >/dev/null
  ln -s "$root/.cuda" "$wt/$v/.cuda"
  [ $v != main ] && git -C "$wt/$v" apply "$root/docs/runs/2026-12-07-s51-${patch[$v]}.patch"
  (cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/s52-$v" cargo xtask gpu-bundle >/dev/null)
  cp -r "$wt/$v/.gpu-bundle" "$pack/$v"; rm -rf "$pack/$v/bench"
done
has() { grep -q -a -F "$2" "$pack/$1/bin/megamoe"; }
has lpt "kSmallLast" && ! has main "kSmallLast" && ! has ed "kSmallLast" || { echo "marks lpt" >&2; exit 1; }
has ed "e4m3_encode4" && ! has main "e4m3_encode4" && ! has lpt "e4m3_encode4" || { echo "marks ed" >&2; exit 1; }
rm -f .device/*.tgz  # the carry holds 64 MiB: this call's bundles only
tar czf .device/s52a.tgz -C "$pack" .
cp docs/runs/2026-12-07-s52a.sh .device/s52a.sh
cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
cp docs/runs/2026-12-06-s42-tl_stats.py .device/tl_stats.py
du -sh .device/*.tgz
