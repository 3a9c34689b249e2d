#!/usr/bin/env bash
# Builds fathom and runs every test: formatting, lints, and the test suite
# (which reads the default model, fetched first when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
