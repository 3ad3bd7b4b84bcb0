#!/usr/bin/env bash
# Builds session 43's second call: .device/s43b.tgz with the `megamoe` CLI of main (52bfe28), pw2
# (main + s43-two-cta-weights-a-ring-ahead-pw2.patch: two-CTA tiles prefetch each unit's weights a
# ring ahead into L2) and pw2d (pw2 two rings ahead), each in a target folder of its own and
# checked by its sources' marks, and .device/s43b.sh, bench_table.py, tl_stats.py. Then: `bash
# .device/s43b.sh` (carry ".device").
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
declare -A tgt=([main]=s42-tf [pw2]=s43-pw2 [pw2d]=s43-pw2d)
declare -A mark=([main]="kWeightPrefetch = kCtas == 1 && BN >= 128 ? kStages : 0;"
                 [pw2]="kWeightPrefetch = kCtas == 2 || BN >= 128 ? kStages : 0;"
                 [pw2d]="kWeightPrefetch = kCtas == 2 ? 2 * kStages : BN >= 128 ? kStages : 0;")
mkdir -p "$pack/bin"
for v in main pw2 pw2d; do
  git worktree add --detach "$wt/$v" 52bfe28 >/dev/null
  [[ $v == main ]] || git -C "$wt/$v" apply "$root/docs/runs/2026-12-06-s43-two-cta-weights-a-ring-ahead-pw2.patch"
  [[ $v != pw2d ]] || sed -i 's/kWeightPrefetch = kCtas == 2 || BN >= 128 ? kStages : 0;/kWeightPrefetch = kCtas == 2 ? 2 * kStages : BN >= 128 ? kStages : 0;/' \
    "$wt/$v/crates/megamoe-kernel/cuda/sm90_moe_gemm.cuh"
  ln -s "$root/.cuda" "$wt/$v/.cuda"
  (cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/${tgt[$v]}" cargo build --release -q -p megamoe-cli)
  strip -o "$pack/bin/megamoe.$v" "$root/target/${tgt[$v]}/release/megamoe"
  grep -q -a -F "${mark[$v]}" "$pack/bin/megamoe.$v" || { echo "$v: not its sources" >&2; exit 1; }
  echo "$v: ok"
done
mkdir -p .device
rm -f .device/*.tgz
tar czf .device/s43b.tgz -C "$pack" .
cp docs/runs/2026-12-06-s43b.sh .device/s43b.sh; cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
cp docs/runs/2026-12-06-s42-tl_stats.py .device/tl_stats.py
du -sh .device/s43b.tgz
