#!/usr/bin/env bash
# Builds fathom and runs every test: formatting, lints, and the test suite
# (which reads the default model, fetched first when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh
# llama.cpp's test vocabularies, Gemma 4's tokenizer cases and the real chat templates of gpt-oss,
# Qwen3.5 and Gemma 4 (gemma4_vocab, tokenizer_heap, fathom-server's real_templates).
scripts/fetch-vocab.sh
# nvcc for the CUDA kernels build.rs compiles (pinned PyPI wheels; fast when present).
scripts/install-cuda-toolchain.sh
# The independent numpy reference the engine's logits are checked against.
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "numpy>=1.26" "gguf==0.19.0"
# The independent validator structured answers are checked with, and the
# official OpenAI clients the server is tested against (serve_structured).
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    "jsonschema==4.26.0" "openai==3.51.0" "pydantic>=2.10"
npm install --silent --no-audit --no-fund --prefix "$HOME/.cache/fathom/node" "openai@7.55.0"
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The CPU-only build (no `cuda` feature) needs no nvcc: point it nowhere.
FATHOM_NVCC=/nonexistent/nvcc cargo build --workspace --no-default-features --locked
# ... and refuses --device cuda by name (the tests below relink the full binary).
if cpu_only=$("${CARGO_TARGET_DIR:-target}"/debug/fathom generate models/SmolLM2-135M-Instruct.Q4_1.gguf \
    --device cuda --memory 1G -p hi -n 1 2>&1); then
  echo "the CPU-only build ran --device cuda" >&2; exit 1
fi
grep -q "built without CUDA" <<<"$cpu_only" || { echo "$cpu_only" >&2; exit 1; }
cargo test --workspace --locked
