#!/usr/bin/env bash
# Installs the CUDA compiler that build.rs uses to compile fathom's kernels:
# nvcc 13.0 and its headers from pinned PyPI wheels, into a private folder
# (no root, no system CUDA needed; a machine without a GPU compiles every
# kernel too). Idempotent: a second run with the same pins returns at once.
#
# Where: $FATHOM_CUDA_TOOLCHAIN, else ~/.cache/fathom/cuda-toolchain-13.0.
# build.rs looks there (or at $FATHOM_NVCC) for bin/nvcc.
set -euo pipefail
DIR="${FATHOM_CUDA_TOOLCHAIN:-$HOME/.cache/fathom/cuda-toolchain-13.0}"
PINS=(
  "nvidia-cuda-nvcc==13.0.88"
  "nvidia-nvvm==13.0.88"
  "nvidia-cuda-crt==13.0.88"
  "nvidia-cuda-runtime==13.0.96"
  "nvidia-cuda-cccl==13.0.85"
)
STAMP="$DIR/.fathom-pins"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "${PINS[*]}" && -x "$DIR/nvidia/cu13/bin/nvcc" ]]; then
  exit 0
fi
echo "install-cuda-toolchain: installing ${PINS[*]} into $DIR" >&2
rm -rf "$DIR.tmp"
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
  --no-deps --no-compile --target "$DIR.tmp" "${PINS[@]}"
rm -rf "$DIR"
mv "$DIR.tmp" "$DIR"
printf '%s' "${PINS[*]}" >"$STAMP"
