#!/usr/bin/env bash
# A model split between the GPU and the host, measured: for each placement
# (all layers on the GPU, then fewer, then the plan's `auto` choice under a
# device cap), `fathom generate --device cuda` prints prefill and decode
# tok/s and its device plan against the NVML peak of the process, and its
# host plan against the peak RSS.
#
#   scripts/bench-placement.sh FATHOM MODEL.gguf [CAP] [N ...]
#
# FATHOM is the fathom binary, MODEL a GGUF (e.g. `fathom bench fixture
# --like llama-3.1-8b --type Q4_K`), CAP the `--memory` of the auto row
# (default 3G), N the GPU layer counts to run (default: all 24 16 8 0).
# Each row: 512 prompt tokens, 64 generated, greedy, --ignore-eos.
set -euo pipefail
fathom=$1 model=$2 cap=${3:-3G}
shift $(($# < 3 ? $# : 3))
counts=("${@:-all 24 16 8 0}")
read -r -a counts <<<"${counts[*]}"
run() {
  echo "== $*"
  "$fathom" generate "$model" --device cuda --random-prompt 512 -n 64 --temp 0 --ignore-eos "$@" \
    2>&1 >/dev/null | grep -E "placement|prompt:|decode:|memory:|device|error" || true
}
for n in "${counts[@]}"; do
  run --gpu-layers "$n"
done
run --memory "$cap"
