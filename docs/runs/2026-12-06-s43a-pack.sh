#!/usr/bin/env bash
# Builds session 43's first call: .device/s43a.tgz with the `megamoe` CLI of main (52bfe28), p8
# (main with the glue's first-weights prefetch at 8 MiB), xp (main + s43-dispatch-inputs-into-l2-xp.patch)
# and st (main + s43-split-tail-16-token-tiles-st.patch), each in a target folder of its own and
# checked by its sources' marks, and .device/s43a.sh, bench_table.py, tl_stats.py.
# Then: `bash .device/s43a.sh` (carry ".device").
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
declare -A patch=([main]= [p8]= [xp]=s43-dispatch-inputs-into-l2-xp [st]=s43-split-tail-16-token-tiles-st)
declare -A tgt=([main]=s42-tf [p8]=s42-tf8 [xp]=s43-xp [st]=s43-st)
mkdir -p "$pack/bin"
for v in main p8 xp st; do
  git worktree add --detach "$wt/$v" 52bfe28 >/dev/null
  [[ -z ${patch[$v]} ]] || git -C "$wt/$v" apply "$root/docs/runs/2026-12-06-${patch[$v]}.patch"
  ln -s "$root/.cuda" "$wt/$v/.cuda"
  [[ $v == p8 ]] && sed -i "s/kFirstWeightsPrefetchBytes = 32u << 20;/kFirstWeightsPrefetchBytes = 8u << 20;/" \
    "$wt/$v/crates/megamoe-kernel/cuda/sm90_moe_gemm.cuh"
  (cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/${tgt[$v]}" cargo build --release -q -p megamoe-cli)
  strip -o "$pack/bin/megamoe.$v" "$root/target/${tgt[$v]}/release/megamoe"
  bin="$pack/bin/megamoe.$v"
  want=32; [[ $v == p8 ]] && want=8
  grep -q -a -F "kFirstWeightsPrefetchBytes = ${want}u << 20;" "$bin" || { echo "$v: no $want MiB" >&2; exit 1; }
  if [[ $v == xp ]]; then grep -q -a -F "prefetch_inputs(p.dispatch.x" "$bin" || { echo "xp: no input prefetch" >&2; exit 1; }
  else ! grep -q -a -F "prefetch_inputs(" "$bin" || { echo "$v: has xp" >&2; exit 1; }; fi
  echo "$v: ok"
done
mkdir -p .device
rm -f .device/*.tgz
tar czf .device/s43a.tgz -C "$pack" .
cp docs/runs/2026-12-06-s43a.sh .device/s43a.sh; cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
cp docs/runs/2026-12-06-s42-tl_stats.py .device/tl_stats.py
du -sh .device/s43a.tgz
