#!/usr/bin/env bash
# Puts llama.cpp's Gemma 4 test vocabulary (models/ggml-vocab-gemma-4.gguf, 262,144 tokens, no weights)
# and its tokenizer test cases (.inp texts, .out llama.cpp's ids) into models/ when missing. They ship in
# the PyPI sdist llama-cpp-python 0.3.36 (vendor/llama.cpp/models/); the sdist's and the vocabulary's
# sha256 are checked so a different download is never used. Keep them out of git, as the models.
set -euo pipefail
cd "$(dirname "$0")/.."

VOCAB=models/ggml-vocab-gemma-4.gguf
SHA256=58b1ba0b57f3b4d7c468ba4ffd91ad85190346a3d7ad7e71d1cabaae8a14bb65
SDIST=llama_cpp_python-0.3.36.tar.gz
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

if [ -f "$VOCAB" ] && [ -f "$VOCAB.inp" ] && [ -f "$VOCAB.out" ] &&
    echo "$SHA256  $VOCAB" | sha256sum --check --status; then
    exit 0
fi
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
url=$(curl -fsSL https://pypi.org/simple/llama-cpp-python/ | grep -o "https://[^\"#]*/$SDIST" | head -1)
[ -n "$url" ] || { echo "error: $SDIST is not on PyPI's index" >&2; exit 1; }
echo "fetching $VOCAB from $SDIST ..." >&2
curl -fsSL -o "$tmp/$SDIST" "$url"
echo "$SDIST_SHA256  $tmp/$SDIST" | sha256sum --check --status ||
    { echo "error: $SDIST does not have sha256 $SDIST_SHA256" >&2; exit 1; }
inner=llama_cpp_python-0.3.36/vendor/llama.cpp/models
tar xzf "$tmp/$SDIST" -C "$tmp" "$inner/ggml-vocab-gemma-4.gguf" "$inner/ggml-vocab-gemma-4.gguf.inp" \
    "$inner/ggml-vocab-gemma-4.gguf.out"
echo "$SHA256  $tmp/$inner/ggml-vocab-gemma-4.gguf" | sha256sum --check --status ||
    { echo "error: the vocabulary does not have sha256 $SHA256" >&2; exit 1; }
cp "$tmp/$inner"/ggml-vocab-gemma-4.gguf* models/
echo "fetched $VOCAB" >&2
