#!/usr/bin/env bash
# Builds fathom and runs the main job on the default model (fetched when
# missing): today that is `fathom inspect`, the memory plan from headers.
# Extra arguments go to `fathom inspect`, e.g. `scripts/run.sh --json`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh
cargo build --release --locked -p fathom-cli
exec target/release/fathom inspect models/SmolLM2-135M-Instruct.Q4_1.gguf "$@"
