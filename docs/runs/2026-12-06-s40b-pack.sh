#!/usr/bin/env bash
# Rebuilds session 40's second call's bundle: .device/s40b.tgz with the `megamoe` CLI of main, of tb
# (branch s40-tb: the BF16 pools' dispatch a token at a time, its rows in three parts) and of hx
# (s40-hx: DIAGNOSTIC, main + marks of each CTA's layer hand-over in the timeline), each checked by
# its sources' marks in the binary, tb's full `cargo xtask gpu-bundle` (gates, compute-sanitizer),
# and .device/s40b.sh, bench_table.py, handover.py. Then: `bash .device/s40b.sh` (carry ".device").
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
declare -A rev=([main]=main [tb]=s40-tb [hx]=s40-hx)
declare -A want=([main]="-dispatch_slots_bf16;-timeline::mark" [tb]="+dispatch_slots_bf16;+kL1Fp8Pool && kUnroll;-timeline::mark" [hx]="+timeline::mark;-dispatch_slots_bf16")
for v in main tb hx; do
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
(cd "$wt/tb" && CARGO_TARGET_DIR="$root/target/s40-tb" cargo xtask gpu-bundle >/dev/null)
rm -rf "$pack/tb"; cp -r "$wt/tb/.gpu-bundle" "$pack/tb"; rm -rf "$pack/tb/bench"
mkdir -p .device
tar czf .device/s40b.tgz -C "$pack" .
cp docs/runs/2026-12-06-s40b.sh .device/s40b.sh; cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
cp docs/runs/2026-12-06-s40-handover.py .device/handover.py
du -sh .device/s40b.tgz
