#!/usr/bin/env bash
# Builds session 44's first call: .device/s44a.tgz with the grouped-GEMM benchmark of 1ec1330
# (head) and of co (1ec1330 + s44-compute-only-co.patch, TIMING ONLY), each in a target folder of
# its own and checked by its sources' marks, and ../shared/bench/wgmma_ceiling.cu with
# s44-wgmma-ceiling-f.patch; keeps .device/s43g.tgz (the bar's table, run on an H200 only).
# Then: `bash .device/s44a.sh` (carry ".device").
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
runs=docs/runs/2026-12-06
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
declare -A patches=([head]="" [co]=$runs-s44-compute-only-co.patch)
declare -A want=([head]="-COMPUTE ONLY" [co]="+COMPUTE ONLY")
mkdir -p "$pack/bin"
for v in head co; do
  git worktree add --detach "$wt/$v" 1ec1330 >/dev/null
  ln -s "$root/.cuda" "$wt/$v/.cuda"
  [[ -z ${patches[$v]} ]] || git -C "$wt/$v" apply "$root/${patches[$v]}"
  exe=$(cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/s44-$v" cargo bench -q -p megamoe-kernel --bench gemm --no-run \
        --message-format=json | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="gemm" and m.get("executable"): print(m["executable"])')
  strip -o "$pack/bin/gemm.$v" "$exe"
  w=${want[$v]}
  if grep -q -a -F "${w:1}" "$pack/bin/gemm.$v"; then has=+; else has=-; fi
  [[ $has == "${w:0:1}" ]] || { echo "$v: bench ${w:0:1}'${w:1}' fails" >&2; exit 1; }
  echo "$v: ok"
done
cp ../shared/bench/wgmma_ceiling.cu "$pack/"
patch -s -d "$pack" -p1 < $runs-s44-wgmma-ceiling-f.patch
mkdir -p .device
rm -f .device/s44a.tgz
tar czf .device/s44a.tgz -C "$pack" .
cp $runs-s44a.sh .device/s44a.sh
du -sh .device/*.tgz
