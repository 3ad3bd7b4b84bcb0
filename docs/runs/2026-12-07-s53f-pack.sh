#!/usr/bin/env bash
# Builds the call prepared in session 53: .device/s53f.tgz with main's bundle (the checkout's
# commit) and bsb's (+ runs/2026-12-07-s53-dispatch-bulk-stores-bsb.patch: the fused dispatch's
# whole tokens, FP8 and BF16 pools, written by bulk stores from shared memory), s1's
# (+ ...-dispatch-one-slot-stores-s1.patch: each token stored into its first slot only) and l0's
# (+ ...-dispatch-no-loads-l0.patch: no loads, the addresses stored), the last two timing only
# (wrong outputs): what the dispatch's rate a CTA is bound by. Each in its own worktree and target directory, checked by a mark of its sources.
# Then `bash .device/s53f.sh` (carry ".device").
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
declare -A patch=([bsb]=dispatch-bulk-stores-bsb [s1]=dispatch-one-slot-stores-s1 [l0]=dispatch-no-loads-l0)
declare -A dir=([main]=main [bsb]=dcl [s1]=dc [l0]=dcb)  # session 53's target directories, reused
for v in main bsb s1 l0; do
  git worktree add --detach "$wt/$v" HEAD >/dev/null
  ln -s "$root/.cuda" "$wt/$v/.cuda"
  [ $v != main ] && git -C "$wt/$v" apply "$root/docs/runs/2026-12-07-s53-${patch[$v]}.patch"
  (cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/s53-${dir[$v]}" cargo xtask gpu-bundle >/dev/null)
  cp -r "$wt/$v/.gpu-bundle" "$pack/$v"; rm -rf "$pack/$v/bench"
done
has() { grep -q -a -F "$2" "$pack/$1/bin/megamoe"; }
has bsb "dispatch_part_bf16_bulk" && ! has main "dispatch_token_fp8_bulk" || { echo "marks bsb" >&2; exit 1; }
has s1 "j < j0 + 1" && ! has main "j < j0 + 1" || { echo "marks s1" >&2; exit 1; }
has l0 "(u32)(size_t)(block" && ! has main "(u32)(size_t)(block" || { echo "marks l0" >&2; exit 1; }
rm -f .device/*.tgz  # the carry holds 64 MiB: this call's bundles only
tar czf .device/s53f.tgz -C "$pack" .
cp docs/runs/2026-12-07-s53f.sh .device/s53f.sh
cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
cp docs/runs/2026-12-06-s42-tl_stats.py .device/tl_stats.py
du -sh .device/*.tgz
