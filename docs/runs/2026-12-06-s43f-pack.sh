#!/usr/bin/env bash
# Builds session 43's last call: .device/s43f.tgz with the `megamoe` CLI of main (642018b, the BF16
# twins landed) and wd (main + s43-bf16-whole-token-dispatch-wd.patch: the fused kernel's BF16
# pools dispatch whole tokens once they fill half the grid's warps), each in a target folder of
# its own, wd's `cargo xtask gpu-bundle`, and .device/s43f.sh, bench_table.py. Then: `bash
# .device/s43f.sh` (carry ".device").
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
eval "$(cargo xtask setup-cuda | grep '^export')"
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
declare -A tgt=([main]=s43-pw2 [wd]=s43-bt)
mkdir -p "$pack/bin"
for v in main wd; do
  git worktree add --detach "$wt/$v" 642018b >/dev/null
  [[ $v == main ]] || git -C "$wt/$v" apply "$root/docs/runs/2026-12-06-s43-bf16-whole-token-dispatch-wd.patch"
  ln -s "$root/.cuda" "$wt/$v/.cuda"
  (cd "$wt/$v" && CARGO_TARGET_DIR="$root/target/${tgt[$v]}" cargo build --release -q -p megamoe-cli)
  strip -o "$pack/bin/megamoe.$v" "$root/target/${tgt[$v]}/release/megamoe"
  if [[ $v == wd ]]; then want=+; else want=-; fi
  if grep -q -a -F "(kRowParts > 1 ? 2 * kRowParts : 1)" "$pack/bin/megamoe.$v"; then has=+; else has=-; fi
  [[ $has == "$want" ]] || { echo "$v: not its sources" >&2; exit 1; }
  grep -q -a -F "static constexpr bool kTwin = kCtas == 1 && BN <= 96;" "$pack/bin/megamoe.$v" || { echo "$v: no BF16 twins" >&2; exit 1; }
  echo "$v: ok"
done
(cd "$wt/wd" && CARGO_TARGET_DIR="$root/target/s43-bt" cargo xtask gpu-bundle >/dev/null)
cp -r "$wt/wd/.gpu-bundle" "$pack/wd"; rm -rf "$pack/wd/bench"
mkdir -p .device
rm -f .device/*.tgz
tar czf .device/s43f.tgz -C "$pack" .
cp docs/runs/2026-12-06-s43f.sh .device/s43f.sh; cp docs/runs/2026-12-05-s38-bench_table.py .device/bench_table.py
du -sh .device/s43f.tgz
