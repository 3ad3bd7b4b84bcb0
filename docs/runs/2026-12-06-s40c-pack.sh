#!/usr/bin/env bash
# Rebuilds session 40's third call's bundle: .device/s40c.tgz with the `megamoe` CLI of main, of tb
# (branch s40-land: the BF16 pools' dispatch a token at a time, its rows in three parts), of ep
# (s40-ep: tb + the SwiGLU epilogue's 8 lanes a token for small tiles) and of hxe (s40-hxe:
# DIAGNOSTIC, ep + hx's marks of each CTA's layer hand-over), each checked by its sources' marks
# in the binary, ep's full `cargo xtask gpu-bundle` (gates, compute-sanitizer), and
# .device/s40c.sh, bench_table.py, handover.py. Then: `bash .device/s40c.sh` (carry ".device").
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
declare -A rev=([main]=main [tb]=s40-land [ep]=s40-ep [hxe]=s40-hxe)
declare -A want=([main]="-dispatch_slots_bf16;-timeline::mark" [tb]="+dispatch_slots_bf16;-kLanes == 1 || kRound;-timeline::mark" [ep]="+kLanes == 1 || kRound;-timeline::mark" [hxe]="+timeline::mark;+kLanes == 1 || kRound")
for v in main tb ep hxe; do
  git worktree add --detach "$wt/$v" "${rev[$v]}" >/dev/null
  ln -s "$root/.cuda" "$wt/$v/.cuda"
  (cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/s40-cli" cargo build --release -q -p megamoe-cli)
  mkdir -p "$pack/$v/bin"; cp "$root/target/s40-cli/release/megamoe" "$pack/$v/bin/"
  IFS=';' read -ra marks <<< "${want[$v]}"
  for w in "${marks[@]}"; do
    s=${w:1}
    if grep -q -a -F "$s" "$pack/$v/bin/megamoe"; then has=+; else has=-; fi
    [[ $has == "${w:0:1}" ]] || { echo "$v: binary ${w:0:1}'$s' fails" >&2; exit 1; }
  done
  echo "$v: $(git -C "$wt/$v" rev-parse --short HEAD) ok"
done
(cd "$wt/ep" && CARGO_TARGET_DIR="$root/target/s40-ep" cargo xtask gpu-bundle >/dev/null)
rm -rf "$pack/ep"; cp -r "$wt/ep/.gpu-bundle" "$pack/ep"; rm -rf "$pack/ep/bench"
mkdir -p .device
tar czf .device/s40c.tgz -C "$pack" .
cp docs/runs/2026-12-06-s40c.sh .device/s40c.sh; cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
cp docs/runs/2026-12-06-s40-handover.py .device/handover.py
du -sh .device/s40c.tgz
