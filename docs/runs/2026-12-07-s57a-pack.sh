#!/usr/bin/env bash
# Builds session 57's first H200 call (runs/2026-12-07-s57a.sh): s56c-pack.sh's carry (.gpu-bundle
# from br2, .device/clis.tar.xz with main's and br's `megamoe`), plus main with the fused forward's
# first-weights prefetch at 8 and 16 MiB instead of 32 (p8, p16: one constant, perf.md v100/v105:
# 32 MiB was worth 4.6 % at g128 T = 128 on an H200 against none, 8 MiB 32 MiB's equal or faster on
# H100s), and dp (+ runs/2026-12-07-s57-fp8-dispatch-pairs-below-two-rounds-dp.patch: the one-CTA
# FP8 pools' dispatch by pairs until the tokens fill two rounds of the grid's warps), each checked by
# a mark of its sources, and k32 (+ runs/2026-12-04-s31-fp8-promotion-per-k32.patch, timing only:
# every FP8 main loop promoted once a k32 step, the issue's "mx32 through FP8 WGMMA", perf.md v128);
# the CLIs repacked as main/, br/, p8/, p16/, dp/, k32/.
# Then `bash .device/s57a.sh` (carry ".gpu-bundle", ".device"), and on the same carry s57b.sh
# (gpu_cuda and the sanitizers s55d left unrun).
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
bash docs/runs/2026-12-07-s56c-pack.sh
eval "$(cargo xtask setup-cuda | grep '^export')"
pack=$(mktemp -d); wt=$(mktemp -d)
trap 'rm -rf "$pack" "$wt"; git worktree prune' EXIT
tar xJf .device/clis.tar.xz -C "$pack" && mv "$pack/main8b" "$pack/main"
git worktree add --detach "$wt/p" HEAD >/dev/null; ln -s "$root/.cuda" "$wt/p/.cuda"
gemm=crates/megamoe-kernel/cuda/sm90_moe_gemm.cuh
for mib in 8 16; do
  git -C "$wt/p" checkout -q -- $gemm
  sed -i "s/kFirstWeightsPrefetchBytes = 32u << 20;/kFirstWeightsPrefetchBytes = ${mib}u << 20;/" "$wt/p/$gemm"
  grep -q "kFirstWeightsPrefetchBytes = ${mib}u << 20;" "$wt/p/$gemm" || { echo "p$mib: no edit" >&2; exit 1; }
  (cd "$wt/p" && CARGO_TARGET_DIR="$root/target/s57-p" cargo build -q --release -p megamoe-cli --bin megamoe)
  mkdir -p "$pack/p$mib"; cp "$root/target/s57-p/release/megamoe" "$pack/p$mib/megamoe"; strip "$pack/p$mib/megamoe"
  grep -q -a -F "kFirstWeightsPrefetchBytes = ${mib}u << 20;" "$pack/p$mib/megamoe" || { echo "p$mib: mark" >&2; exit 1; }
done
declare -A patch=([dp]=2026-12-07-s57-fp8-dispatch-pairs-below-two-rounds-dp
  [k32]=2026-12-04-s31-fp8-promotion-per-k32)
declare -A mark=([dp]="kRowParts > 1 || kUnroll < 8 ? 1 : 2" [k32]="static constexpr int kPromotions = 4;")
for v in dp k32; do
  git -C "$wt/p" checkout -q -- crates && git -C "$wt/p" apply "$root/docs/runs/${patch[$v]}.patch"
  (cd "$wt/p" && CARGO_TARGET_DIR="$root/target/s57-p" cargo build -q --release -p megamoe-cli --bin megamoe)
  mkdir -p "$pack/$v"; cp "$root/target/s57-p/release/megamoe" "$pack/$v/megamoe"; strip "$pack/$v/megamoe"
  grep -q -a -F "${mark[$v]}" "$pack/$v/megamoe" || { echo "$v: mark" >&2; exit 1; }
done
tar cJf .device/clis.tar.xz -C "$pack" main br p8 p16 dp k32
cp docs/runs/2026-12-07-s57a.sh .device/s57a.sh; cp docs/runs/2026-12-07-s57b.sh .device/s57b.sh
du -sh .gpu-bundle .device
