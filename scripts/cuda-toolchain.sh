#!/usr/bin/env bash
# Makes a CUDA 13.0 toolchain (nvcc, ptxas, NVRTC, headers with CCCL) available on any x86-64 Linux box,
# GPU or not, and prints the environment that points at it.
#
#   scripts/cuda-toolchain.sh              ensure a toolchain; print `export ...` lines on stdout
#   eval "$(scripts/cuda-toolchain.sh)"    ... and take them into the current shell
#   scripts/cuda-toolchain.sh --wheels     use the pinned wheels even when a system CUDA exists
#   scripts/cuda-toolchain.sh --force      reinstall the pinned wheels
#
# Which toolkit: $CUDA_PATH when it holds include/cuda.h, else /usr/local/cuda when it has bin/nvcc, else
# the pinned PyPI wheels installed into <checkout>/.cuda/ (idempotent: a stamp file makes a second run a
# no-op). cuda-rt finds the same toolkit by itself (CUDA_PATH, then .cuda/toolkit via .cargo/config.toml,
# then /usr/local/cuda), so `cargo test` needs none of the printed variables; they are for nvcc users.
# Progress goes to stderr, so stdout stays eval-able.
set -euo pipefail

# CUDA 13.0 Update 2 component versions; NVRTC 13.0.88 is what the H200 machine's driver stack ships.
# nvvm and crt are pinned too: nvcc's wheel depends on them unversioned and pip would pull the newest.
PINNED=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-cuda-nvrtc==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-cccl==13.0.85
  nvidia-nvvm==13.0.88
  nvidia-cuda-crt==13.0.88
)
TAG=cu13.0.88

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
wheels=0
force=0
for arg in "$@"; do
  case "$arg" in
    --wheels) wheels=1 ;;
    --force) wheels=1; force=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "cuda-toolchain: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

emit() {
  local cuda="$1" lib="$1/lib"
  [[ -d "$cuda/lib64" ]] && lib="$cuda/lib64"
  echo "export CUDA_PATH='$cuda'"
  echo "export PATH='$cuda/bin':\"\$PATH\""
  echo "export LD_LIBRARY_PATH='$lib'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
}

if (( !wheels )); then
  if [[ -n "${CUDA_PATH:-}" && -f "$CUDA_PATH/include/cuda.h" ]]; then
    echo "cuda-toolchain: using CUDA_PATH=$CUDA_PATH" >&2
    emit "$CUDA_PATH"; exit 0
  fi
  if [[ -x /usr/local/cuda/bin/nvcc ]]; then
    echo "cuda-toolchain: using /usr/local/cuda" >&2
    emit /usr/local/cuda; exit 0
  fi
fi

dest="$root/.cuda/$TAG"
link="$root/.cuda/toolkit"
stamp="$dest/.installed"
want="$(printf '%s\n' "${PINNED[@]}")"
if (( !force )) && [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$dest/nvidia/cu13/bin/nvcc" ]]; then
  echo "cuda-toolchain: pinned wheels already in $dest" >&2
else
  echo "cuda-toolchain: installing ${PINNED[*]} into $dest" >&2
  start=$SECONDS
  tmp="$dest.tmp"
  rm -rf "$tmp"
  # --no-deps: everything is pinned above; install into a temp dir and rename, so an interrupted
  # install never looks complete.
  python3 -m pip install --quiet --no-input --disable-pip-version-check --root-user-action=ignore \
    --no-deps --target "$tmp" "${PINNED[@]}" >&2
  [[ -x "$tmp/nvidia/cu13/bin/nvcc" && -f "$tmp/nvidia/cu13/lib/libnvrtc.so.13" ]] || {
    echo "cuda-toolchain: unexpected wheel layout under $tmp/nvidia (no cu13/bin/nvcc or cu13/lib/libnvrtc.so.13)" >&2
    exit 1
  }
  printf '%s\n' "$want" > "$tmp/.installed"
  rm -rf "$dest"
  mv "$tmp" "$dest"
  echo "cuda-toolchain: installed in $((SECONDS - start)) s, $(du -sh "$dest" | cut -f1)" >&2
fi
ln -sfn "$TAG/nvidia/cu13" "$link"
emit "$link"
