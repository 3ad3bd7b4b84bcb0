#!/usr/bin/env bash
# Builds session 42's first timing call: .device/s42a.tgz with the `megamoe` CLI of
#   main = 7c8af19 (session 41's main),
#   tf   = s42's first commit (one rank skips the meeting before the top-k sums; a drawn
#          schedule's first ticket is the CTA's own),
#   tf8  = tf + runs/2026-12-06-s41-first-weights-8mib-p8.patch (the glue's first-weights
#          prefetch 8 MiB instead of 32),
#   pd   = tf + runs/2026-12-06-s42-l2-first-weights-in-the-l1-tail-pd.patch (the L2's first
#          weights into L2 while a CTA's last L1 tiles finish; not landed),
# each in a target folder of its own and checked by its sources' marks in the binary, pd's full
# `cargo xtask gpu-bundle` (gates, compute-sanitizer), and .device/s42a.sh, bench_table.py,
# tl_stats.py. Then: `bash .device/s42a.sh` (carry ".device").
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
runs=docs/runs/2026-12-06
tf=$(git log --format=%H -1 --grep='a drawn schedule.s first ticket is the CTA.s own')
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
declare -A commits=([main]=7c8af19 [tf]=$tf [tf8]=$tf [pd]=$tf)
declare -A patches=([main]="" [tf]="" [tf8]=$runs-s41-first-weights-8mib-p8.patch
                    [pd]=$runs-s42-l2-first-weights-in-the-l1-tail-pd.patch)
# Strings each binary must hold (+) or must not (-), a line each.
declare -A want=([main]=$'-(int)fresh_ctaid_x() : (int)gridDim.x\n+= 32u << 20;'
                 [tf]=$'+(int)fresh_ctaid_x() : (int)gridDim.x\n+= 32u << 20;\n+if (p.num_ranks > 1 && !meet_ranks(p)) return;'
                 [tf8]=$'+(int)fresh_ctaid_x() : (int)gridDim.x\n+= 8u << 20;\n-L2::prefetch_first_weights(p.l2)'
                 [pd]=$'+(int)fresh_ctaid_x() : (int)gridDim.x\n+= 32u << 20;\n+L2::prefetch_first_weights(p.l2)')
mkdir -p "$pack/bin"
for v in main tf tf8 pd; do
  git worktree add --detach "$wt/$v" "${commits[$v]}" >/dev/null
  ln -s "$root/.cuda" "$wt/$v/.cuda"
  [[ -z ${patches[$v]} ]] || git -C "$wt/$v" apply "$root/${patches[$v]}"
  (cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/s42-$v" cargo build --release -q -p megamoe-cli)
  strip -o "$pack/bin/megamoe.$v" "$root/target/s42-$v/release/megamoe"
  while IFS= read -r w; do
    if grep -q -a -F "${w:1}" "$pack/bin/megamoe.$v"; then has=+; else has=-; fi
    [[ $has == "${w:0:1}" ]] || { echo "$v: binary ${w:0:1}'${w:1}' fails" >&2; exit 1; }
  done <<< "${want[$v]}"
  echo "$v: ok"
done
(cd "$wt/pd" && CARGO_TARGET_DIR="$root/target/s42-tf-bundle" cargo xtask gpu-bundle >/dev/null)
cp -r "$wt/pd/.gpu-bundle" "$pack/pd"; rm -rf "$pack/pd/bench"
mkdir -p .device
tar czf .device/s42a.tgz -C "$pack" .
cp $runs-s42a.sh .device/s42a.sh; cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
cp $runs-s42-tl_stats.py .device/tl_stats.py
du -sh .device/s42a.tgz
