#!/usr/bin/env bash
# Runs ON THE GPU MACHINE: the new families (Qwen3.5 dense and MoE, gpt-oss, Gemma 4) on CUDA against llama.cpp's
# CUDA build, same files, one call (issues 37 and 38): mean KLD and same-top of fathom against llama.cpp at 512 tokens
# (2 chunks of GPL-3) and 4096 (GPL-3 then GPL-2, past every sliding window), on the cut fixtures docs/models.md uses
# on the CPU; then memory cells (`fathom generate`: the device plan against the process's NVML peak, the host plan
# against its peak RSS) at 4096 and 32768 tokens, 1 and 16 sequences, on larger files.
#
# Usage: families-cuda.sh FATHOM LLAMA_SRC_DIR WORK_DIR VOCAB_DIR TEXT_DIR
#   FATHOM         a release `fathom` built elsewhere (scripts/test-gpu.sh stages one)
#   LLAMA_SRC_DIR  llama.cpp's source (/work/shared/gpu/fetch-llamacpp-src.sh); its CUDA llama-perplexity is built
#                  into WORK_DIR/llama once (GGML_NATIVE off, AVX-512 named: the lent hosts' AMX breaks a native
#                  CPU build)
#   VOCAB_DIR      holds ggml-vocab-llama-bpe.gguf, ggml-vocab-qwen35.gguf and ggml-vocab-gemma-4.gguf
#                  (scripts/fetch-vocab.sh writes the last two into models/)
#   TEXT_DIR       holds GPL-3 and GPL-2 (/usr/share/common-licenses here)
# Env: PARTS ("kld cells") what to run; FAMILIES ("go q35 g4 q35moe"); CONTEXTS ("4096 32768"); BATCHES ("1 16").
set -uo pipefail
fathom=${1:?usage: families-cuda.sh FATHOM LLAMA_SRC_DIR WORK_DIR VOCAB_DIR TEXT_DIR}
src=${2:?llama.cpp source dir}
work=${3:?work dir}
vocabs=${4:?vocab dir}
texts=${5:?text dir}
parts=${PARTS:-kld cells}
families=${FAMILIES:-go q35 g4 q35moe}
llama=$work/llama/bin
mkdir -p "$work"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv
cat "$texts/GPL-3" "$texts/GPL-2" >"$work/gpl32.txt"
# The KLD fixture of a family: (--like, --layers, vocabulary), Q8_0 (MXFP4 experts for gpt-oss).
kld_file() {
  case $1 in
    go) echo "gpt-oss-20b 4 ggml-vocab-llama-bpe.gguf" ;;
    q35) echo "qwen3.5-4b 4 ggml-vocab-qwen35.gguf" ;;
    g4) echo "gemma-4-31b 6 ggml-vocab-gemma-4.gguf" ;;
    q35moe) echo "qwen3.5-35b-a3b 4 ggml-vocab-qwen35.gguf" ;;
    *) echo "unknown family $1 (go q35 g4 q35moe)" >&2; return 1 ;;
  esac
}
# The memory-cell file of a family: (--like, --layers or all, --type).
cell_file() {
  case $1 in
    go) echo "gpt-oss-20b all Q8_0" ;;
    q35) echo "qwen3.5-4b all Q8_0" ;;
    g4) echo "gemma-4-31b 12 Q4_K" ;;
    q35moe) echo "qwen3.5-35b-a3b 10 Q4_K" ;;
  esac
}
fixture() { # NAME LIKE LAYERS TYPE [VOCAB]
  local out=$work/$1.gguf layers=()
  [[ -f $out ]] && return 0
  [[ $3 != all ]] && layers=(--layers "$3")
  "$fathom" bench fixture --like "$2" "${layers[@]}" --type "$4" ${5:+--vocab "$5"} "$out" >/dev/null
}
if [[ " $parts " == *" kld "* ]]; then
  if [[ ! -x $llama/llama-perplexity ]]; then
    cmake -S "$src" -B "$work/llama" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON \
      -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF >/dev/null &&
      ninja -C "$work/llama" llama-perplexity >/dev/null || { echo "llama.cpp build failed" >&2; exit 1; }
  fi
  for f in $families; do
    read -r like layers vocab <<<"$(kld_file "$f")" || exit 1
    fixture "k-$f" "$like" "$layers" Q8_0 "$vocabs/$vocab" || { echo "fixture k-$f failed" >&2; continue; }
    for ctx in 512 4096; do
      if [[ $ctx == 512 ]]; then text=$texts/GPL-3 flags=(-c 512 --chunks 2 -b 512); else
        text=$work/gpl32.txt flags=(-c 4096 --chunks 1 -b 4096 -ub 512); fi
      base=$work/k-$f-$ctx.kld
      echo "== $f at $ctx tokens: llama.cpp base, then fathom against it"
      "$llama/llama-perplexity" -m "$work/k-$f.gguf" -f "$text" "${flags[@]}" -ngl 99 --kl-divergence-base "$base" \
        >"$work/k-$f-$ctx.log" 2>&1 || { echo "llama-perplexity failed:"; tail -5 "$work/k-$f-$ctx.log"; continue; }
      "$fathom" perplexity "$work/k-$f.gguf" --device cuda --kl-divergence-base "$base" --kl-divergence 2>&1 |
        grep -E "Mean    KLD|99.0% KLD|Median  KLD|Same top" || echo "fathom perplexity failed"
    done
  done
fi
if [[ " $parts " == *" cells "* ]]; then
  for f in $families; do
    read -r like layers ty <<<"$(cell_file "$f")"
    fixture "c-$f" "$like" "$layers" "$ty" || { echo "fixture c-$f failed" >&2; continue; }
    for ctx in ${CONTEXTS:-4096 32768}; do
      for np in ${BATCHES:-1 16}; do
        echo "== cell $f ($like, $layers layers, $ty) -c $ctx --parallel $np"
        "$fathom" inspect "$work/c-$f.gguf" -c "$ctx" -b "$np" --kv-dtype f16 --device cuda --json |
          python3 -c 'import json,sys; d=json.load(sys.stdin); print("plan: device", d["total_bytes"], "host", d["host"]["total_bytes"])'
        "$fathom" generate "$work/c-$f.gguf" --device cuda -c "$ctx" --parallel "$np" --kv-dtype f16 \
          --random-prompt $((ctx > 4096 ? 4000 : ctx - 100)) -n 32 --temp 0 --ignore-eos 2>&1 >/dev/null |
          grep -E "prompt:|decode:|memory:|device:|error" || true
      done
    done
  done
fi
