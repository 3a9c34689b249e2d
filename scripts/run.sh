#!/usr/bin/env bash
# Builds fathom and runs the main job on the default model (fetched when
# missing): a chat with SmolLM2-135M-Instruct, after printing its memory plan.
# Arguments go to `fathom run`, e.g. `scripts/run.sh -p "Why is the sky blue?"`
# for one answer.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh
# nvcc for the CUDA kernels build.rs compiles (pinned PyPI wheels; fast when present).
scripts/install-cuda-toolchain.sh
cargo build --release --locked -p fathom-cli
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
target/release/fathom inspect "$MODEL" --max-tokens 4096 >&2
exec target/release/fathom run "$MODEL" --ctx-size 4096 "$@"
