#!/usr/bin/env bash
# Puts llama.cpp's Gemma 4 test vocabulary (models/ggml-vocab-gemma-4.gguf, 262,144 tokens, no weights)
# and its tokenizer test cases (.inp texts, .out llama.cpp's ids) into models/ when missing, with the
# Qwen3.5 (ggml-vocab-qwen35.gguf, 151,936 tokens) and Llama 3 (ggml-vocab-llama-bpe.gguf, 128,256
# tokens) vocabularies the runtime term's heap test reads (crates/fathom-engine/tests/tokenizer_heap.rs),
# and the real chat templates of gpt-oss, Qwen3, Qwen3.5 and Gemma 4 (models/templates/*.jinja) that
# crates/fathom-server/tests/real_templates.rs renders. They ship in the PyPI sdist llama-cpp-python
# 0.3.36 (vendor/llama.cpp/models/); the sdist's and each file's sha256 are checked so a different
# download is never used. Keep them out of git, as the models: they are other projects' content.
set -euo pipefail
cd "$(dirname "$0")/.."

VOCAB=models/ggml-vocab-gemma-4.gguf
SDIST=llama_cpp_python-0.3.36.tar.gz
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
# Each file the script puts in models/, with its sha256.
SUMS="58b1ba0b57f3b4d7c468ba4ffd91ad85190346a3d7ad7e71d1cabaae8a14bb65  models/ggml-vocab-gemma-4.gguf
63ed952ff338996cf0bdf24a7b10015124273f75c6dc9bb427356aa3f67ec62c  models/ggml-vocab-qwen35.gguf
97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e  models/ggml-vocab-llama-bpe.gguf
a4c9919cbbd4acdd51ccffe22da049264b1b73e59055fa58811a99efbd7c8146  models/templates/openai-gpt-oss-120b.jinja
a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715  models/templates/Qwen3.5-4B.jinja
87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5  models/templates/Qwen-Qwen3-0.6B.jinja
85a08664d16d8f3be4416c92427b3ac10df1024ac566cc0b4bc3bab409393f98  models/templates/google-gemma-4-31B-it.jinja
65f93a25708c952457106a30e185ba7beffddd726121c8d7e3f3e08b23c16c67  models/templates/google-gemma-4-31B-it-interleaved.jinja"

if [ -f "$VOCAB.inp" ] && [ -f "$VOCAB.out" ] && echo "$SUMS" | sha256sum --check --status 2>/dev/null; then
    exit 0
fi
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
url=$(curl -fsSL https://pypi.org/simple/llama-cpp-python/ | grep -o "https://[^\"#]*/$SDIST" | head -1)
[ -n "$url" ] || { echo "error: $SDIST is not on PyPI's index" >&2; exit 1; }
echo "fetching the vocabularies and chat templates from $SDIST ..." >&2
curl -fsSL -o "$tmp/$SDIST" "$url"
echo "$SDIST_SHA256  $tmp/$SDIST" | sha256sum --check --status ||
    { echo "error: $SDIST does not have sha256 $SDIST_SHA256" >&2; exit 1; }
inner=llama_cpp_python-0.3.36/vendor/llama.cpp/models
tar xzf "$tmp/$SDIST" -C "$tmp" "$inner/ggml-vocab-gemma-4.gguf" "$inner/ggml-vocab-gemma-4.gguf.inp" \
    "$inner/ggml-vocab-gemma-4.gguf.out" "$inner/ggml-vocab-qwen35.gguf" "$inner/ggml-vocab-llama-bpe.gguf" \
    $(echo "$SUMS" | awk '$2 ~ /^models\/templates\// {print "'"$inner"'/" substr($2, 8)}')
(cd "$tmp/$inner/.." && echo "$SUMS" | sha256sum --check --status) ||
    { echo "error: a file does not have the sha256 this script expects" >&2; exit 1; }
mkdir -p models/templates
cp "$tmp/$inner"/ggml-vocab-gemma-4.gguf* "$tmp/$inner"/ggml-vocab-qwen35.gguf \
    "$tmp/$inner"/ggml-vocab-llama-bpe.gguf models/
cp "$tmp/$inner"/templates/*.jinja models/templates/
echo "fetched $(echo "$SUMS" | awk '{print $2}' | tr '\n' ' ')" >&2
