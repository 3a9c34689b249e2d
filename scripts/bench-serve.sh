#!/usr/bin/env bash
# fathom serve under 1, 4 and 16 concurrent greedy streaming requests on
# the same model: `fathom bench serve` starts the server, runs each level
# ROUNDS times and prints aggregate tok/s (median round), the ratio to the
# single stream, and TTFT and inter-token latency medians and p99.
# Usage: scripts/bench-serve.sh [MODEL]
#   (env: THREADS=2 ROUNDS=3 TOKENS=128 PROMPT=16 LEVELS="1 4 16"; LOAD=1
#    adds the load test; JSON=FILE keeps the results)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
TOKENS=${TOKENS:-128}
PROMPT=${PROMPT:-16}
LEVELS=${LEVELS:-1 4 16}
scripts/fetch-model.sh
cargo build --release --locked -p fathom-cli >&2
args=(--streams "$(echo $LEVELS | tr ' ' ',')" -n "$TOKENS" -p "$PROMPT" --rounds "$ROUNDS")
[[ ${LOAD:-0} == 1 ]] && args+=(--load)
[[ -n ${JSON:-} ]] && args+=(--json "$JSON")
exec "${CARGO_TARGET_DIR:-target}/release/fathom" bench serve "$MODEL" "${args[@]}" -- -t "$THREADS"
