#!/usr/bin/env bash
# Rebuilds session 40's third call's bundle on any checkout of main (from 7707046 on):
# .device/s40c.tgz with the `megamoe` CLI of
#   base = this checkout (the BF16 pools' dispatch a token at a time, landed),
#   ep   = base + runs/2026-12-06-s40-epilogue-lanes-ep.patch (the SwiGLU epilogue's 8 lanes a
#          token for small tiles),
#   hxe  = ep + runs/2026-12-06-s40-handover-marks-hx.patch (DIAGNOSTIC: timeline marks at each
#          step of a CTA's layer switch; never lands),
# each checked by its sources' marks in the binary, ep's full `cargo xtask gpu-bundle` (gates,
# compute-sanitizer), and .device/s40c.sh, bench_table.py, handover.py.
# Then: `bash .device/s40c.sh` (carry ".device").
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
runs=docs/runs/2026-12-06
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
declare -A patches=([base]="" [ep]="ep" [hxe]="ep hx")
declare -A files=([ep]=$runs-s40-epilogue-lanes-ep.patch [hx]=$runs-s40-handover-marks-hx.patch)
# A string each binary must hold (+) or must not (-).
declare -A want=([base]="+dispatch_slots_bf16;-kLanes == 1 || kRound;-timeline::mark" [ep]="+kLanes == 1 || kRound;-timeline::mark" [hxe]="+timeline::mark;+kLanes == 1 || kRound")
for v in base ep hxe; do
  git worktree add --detach "$wt/$v" HEAD >/dev/null
  ln -s "$root/.cuda" "$wt/$v/.cuda"
  for p in ${patches[$v]}; do git -C "$wt/$v" apply "$root/${files[$p]}"; done
  (cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/s40-cli" cargo build --release -q -p megamoe-cli)
  mkdir -p "$pack/$v/bin"; cp "$root/target/s40-cli/release/megamoe" "$pack/$v/bin/"
  IFS=';' read -ra marks <<< "${want[$v]}"
  for w in "${marks[@]}"; do
    s=${w:1}
    if grep -q -a -F "$s" "$pack/$v/bin/megamoe"; then has=+; else has=-; fi
    [[ $has == "${w:0:1}" ]] || { echo "$v: binary ${w:0:1}'$s' fails" >&2; exit 1; }
  done
  echo "$v: ok"
done
(cd "$wt/ep" && CARGO_TARGET_DIR="$root/target/s40-ep" cargo xtask gpu-bundle >/dev/null)
rm -rf "$pack/ep"; cp -r "$wt/ep/.gpu-bundle" "$pack/ep"; rm -rf "$pack/ep/bench"
mkdir -p .device
tar czf .device/s40c.tgz -C "$pack" .
cp $runs-s40c.sh .device/s40c.sh; cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
cp $runs-s40-handover.py .device/handover.py
du -sh .device/s40c.tgz
