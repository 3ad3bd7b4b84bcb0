#!/usr/bin/env bash
# Builds session 41's prepared call (not run) on any checkout of main from c0422e5 on:
# .device/s41d.tgz with the `megamoe` CLI of
#   main = this checkout,
#   np   = main + runs/2026-12-06-s41-no-first-weights-prefetch-np.patch (no first-weights
#          prefetch during the glue),
#   p8   = main + runs/2026-12-06-s41-first-weights-8mib-p8.patch (a quarter of it, 8 MiB),
# each in a target folder of its own and checked by its sources' marks in the binary, and
# .device/s41d.sh, bench_table.py. Then: `bash .device/s41d.sh` (carry ".device"), on an H200.
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
runs=docs/runs/2026-12-06
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
declare -A patches=([main]="" [np]=$runs-s41-no-first-weights-prefetch-np.patch [p8]=$runs-s41-first-weights-8mib-p8.patch)
# Strings each binary must hold (+) or must not (-), a line each.
declare -A want=([main]=$'+L1::prefetch_first_weights(p.l1);\n+= 32u << 20;'
                 [np]=$'-L1::prefetch_first_weights(p.l1);\n+np: no first-weights'
                 [p8]=$'+L1::prefetch_first_weights(p.l1);\n+= 8u << 20;')
mkdir -p "$pack/bin"
for v in main np p8; do
  git worktree add --detach "$wt/$v" HEAD >/dev/null
  ln -s "$root/.cuda" "$wt/$v/.cuda"
  [[ -z ${patches[$v]} ]] || git -C "$wt/$v" apply "$root/${patches[$v]}"
  (cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/s41d-$v" cargo build --release -q -p megamoe-cli)
  strip -o "$pack/bin/megamoe.$v" "$root/target/s41d-$v/release/megamoe"
  while IFS= read -r w; do
    if grep -q -a -F "${w:1}" "$pack/bin/megamoe.$v"; then has=+; else has=-; fi
    [[ $has == "${w:0:1}" ]] || { echo "$v: binary ${w:0:1}'${w:1}' fails" >&2; exit 1; }
  done <<< "${want[$v]}"
  echo "$v: ok"
done
mkdir -p .device
tar czf .device/s41d.tgz -C "$pack" .
cp $runs-s41d.sh .device/s41d.sh; cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
du -sh .device/s41d.tgz
