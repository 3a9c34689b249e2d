#!/usr/bin/env bash
# Builds scripts/reference/llama_logits.cpp (our small client of the llama.cpp
# library: greedy ids, per-step top-k logits, full logits, intermediate tensor
# dumps) against the peer built by scripts/build-llama-cpp.sh.
# Output: $LLAMA_CPP_DIR/build/bin/fathom-llama-logits (outside the repository).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
LLAMA_CPP_DIR=${LLAMA_CPP_DIR:-/work/peer/llama.cpp}
"$HERE/../build-llama-cpp.sh" >/dev/null
B=$LLAMA_CPP_DIR/build
OUT=$B/bin/fathom-llama-logits
if [[ -x $OUT && $OUT -nt $HERE/llama_logits.cpp ]]; then
    echo "$OUT"
    exit 0
fi
${CXX:-c++} -O2 -std=c++17 -I"$LLAMA_CPP_DIR/include" -I"$LLAMA_CPP_DIR/ggml/include" \
    "$HERE/llama_logits.cpp" -o "$OUT" \
    "$B/src/libllama.a" "$B/ggml/src/libggml.a" "$B/ggml/src/libggml-cpu.a" "$B/ggml/src/libggml-base.a" \
    -fopenmp -lpthread
echo "$OUT"
