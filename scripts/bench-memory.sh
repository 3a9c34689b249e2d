#!/usr/bin/env bash
# Measures the memory plan against peak RSS over the recorded grid and
# writes docs/benchmark_results/memory-cpu-<date>.json (resumable: rerun to
# finish an interrupted grid), then prints its tables as Markdown.
#
# Usage: scripts/bench-memory.sh [full|ci]   (default full)
# Env: LLAMA_CPP=0 skips llama.cpp's peaks (otherwise scripts/build-llama-cpp.sh
#      builds the peer first), OUT overrides the results file.
set -euo pipefail
cd "$(dirname "$0")/.."
GRID=${1:-full}
OUT=${OUT:-docs/benchmark_results/memory-cpu-$(date -u +%F).json}
scripts/fetch-model.sh
cargo build --release --locked -p fathom-cli
FATHOM=${CARGO_TARGET_DIR:-target}/release/fathom
PEER=()
if [[ ${LLAMA_CPP:-1} != 0 ]]; then
    scripts/build-llama-cpp.sh >&2
    PEER=(--llama-cpp "${LLAMA_CPP_DIR:-/work/peer/llama.cpp}/build/bin")
fi
mkdir -p "$(dirname "$OUT")"
status=0
"$FATHOM" bench memory --grid "$GRID" --runs 2 --json "$OUT" "${PEER[@]}" || status=$?
python3 scripts/memory_grid_table.py "$OUT"
exit $status
