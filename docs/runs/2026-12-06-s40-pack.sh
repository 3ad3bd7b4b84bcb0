#!/usr/bin/env bash
# Rebuilds session 40's call bundle on a fresh checkout: .device/s40.tgz with the `megamoe` CLI of
# main and of the dispatch variants (each checked by its sources' marks in the binary), the full
# `cargo xtask gpu-bundle` of rs, the tip (gates, compute-sanitizer), and .device/s40.sh +
# bench_table.py.
#   tk  = main + the BF16 pools' dispatch a token at a time (branch s40-tk)
#   tkp = tk + the fused dispatch of whole tokens in three parts a row (s40-tkp)
#   rs  = tkp + the route stores the FP8 pools' scales, coalesced (s40-rs)
#   ns  = tkp + no scale stores into the FP8 table at all (TIMING ONLY, wrong results; s40-ns)
# The CLIs build one after another in one target folder of their own, each copied out at once and
# checked by what its embedded sources hold (a stale binary would fail the check).
# Then: `bash .device/s40.sh` (carry ".device").
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
declare -A rev=([main]=main [tk]=s40-tk [tkp]=s40-tkp [rs]=s40-rs [ns]=s40-ns)
# A string each binary must hold (+) or must not (-).
declare -A want=([main]="-dispatch_slots_bf16" [tk]="+dispatch_slots_bf16;-kRowParts" [tkp]="+kRowParts;-round_tokens;-TIMING ONLY" [rs]="+round_tokens;-TIMING ONLY" [ns]="+TIMING ONLY;-round_tokens")
for v in main tk tkp rs ns; do
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
(cd "$wt/rs" && CARGO_TARGET_DIR="$root/target/s40-rs" cargo xtask gpu-bundle >/dev/null)
rm -rf "$pack/rs"; cp -r "$wt/rs/.gpu-bundle" "$pack/rs"; rm -rf "$pack/rs/bench"
mkdir -p .device
tar czf .device/s40.tgz -C "$pack" .
cp docs/runs/2026-12-06-s40.sh .device/s40.sh; cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
du -sh .device/s40.tgz
