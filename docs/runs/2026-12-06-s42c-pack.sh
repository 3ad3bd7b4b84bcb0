#!/usr/bin/env bash
# Builds session 42's third call: .device/s42c.tgz with `cargo xtask gpu-bundle` of main (ef1bdea:
# its GEMM benchmark only) and of tw (runs/2026-12-06-s42-twin-parities-tw-prototype.patch: twin
# units in two parities, lag 0, the next stages decoded under the current stage's wgmmas; TIMING
# ONLY where the 64-token twins compile clean — the 96-token twins spill), each in a target folder
# of its own and checked by its sources' marks, and .device/s42c.sh. Then: `bash .device/s42c.sh`
# (carry ".device").
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
runs=docs/runs/2026-12-06
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
declare -A patches=([main]="" [tw]=$runs-s42-twin-parities-tw-prototype.patch)
declare -A want=([main]="-kTwin && kDecodeNext" [tw]="+kTwin && kDecodeNext")
for v in main tw; do
  git worktree add --detach "$wt/$v" ef1bdea >/dev/null
  ln -s "$root/.cuda" "$wt/$v/.cuda"
  [[ -z ${patches[$v]} ]] || git -C "$wt/$v" apply "$root/${patches[$v]}"
  (cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/s42c-$v" cargo xtask gpu-bundle >/dev/null)
  cp -r "$wt/$v/.gpu-bundle" "$pack/$v"
  w=${want[$v]}
  if grep -q -a -F "${w:1}" "$pack/$v/bench/megamoe-kernel.gemm"; then has=+; else has=-; fi
  [[ $has == "${w:0:1}" ]] || { echo "$v: bench ${w:0:1}'${w:1}' fails" >&2; exit 1; }
  echo "$v: ok"
done
rm -rf "$pack/main/tests"
mkdir -p .device
tar czf .device/s42c.tgz -C "$pack" .
cp $runs-s42c.sh .device/s42c.sh
du -sh .device/s42c.tgz
