#!/usr/bin/env bash
# Runs ON THE GPU MACHINE: batched decode of fathom (`generate --parallel N`, greedy on the device, the tensor-core
# few-row kernels on and then off through FATHOM_CUDA_MMA_FEW=0) against `llama-batched-bench` (S_TG) on the same
# files in the same call: the 8B shape in Q4_K_M (llama-quantize of fathom's F16 fixture) and Q8_0 (issue 36).
#
# Usage: bench-batched-cuda.sh FATHOM LLAMA_SRC_DIR WORK_DIR
#   FATHOM         a release `fathom` built elsewhere (scripts/test-gpu.sh stages one)
#   LLAMA_SRC_DIR  llama.cpp's source from /work/shared/gpu/fetch-llamacpp-src.sh; its CUDA tools are built into
#                  WORK_DIR/llama once (~3.5 min on 16 cores; GGML_NATIVE off, AVX-512 named: the lent hosts' AMX
#                  breaks llama.cpp's native CPU build)
# Env: NPS ("1 16 64") sequence counts; FILES ("q4_k_m q8_0").
set -uo pipefail
fathom=${1:?usage: bench-batched-cuda.sh FATHOM LLAMA_SRC_DIR WORK_DIR}
src=${2:?llama.cpp source dir}
work=${3:?work dir}
nps=${NPS:-1 16 64}
files=${FILES:-q4_k_m q8_0}
llama=$work/llama/bin
mkdir -p "$work"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv
if [[ ! -x $llama/llama-batched-bench ]]; then
  cmake -S "$src" -B "$work/llama" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF >/dev/null &&
    ninja -C "$work/llama" llama-quantize llama-batched-bench >/dev/null || { echo "llama.cpp build failed" >&2; exit 1; }
fi
for f in $files; do
  [[ -f $work/$f.gguf ]] && continue
  case $f in
    q4_k_m)
      "$fathom" bench fixture --like llama-3.1-8b --type F16 "$work/f16.gguf" >/dev/null
      "$llama/llama-quantize" "$work/f16.gguf" "$work/q4_k_m.gguf" Q4_K_M 16 >/dev/null 2>&1
      rm -f "$work/f16.gguf" ;;
    q8_0) "$fathom" bench fixture --like llama-3.1-8b --type Q8_0 "$work/q8_0.gguf" >/dev/null ;;
    *) echo "unknown file $f (q4_k_m, q8_0)" >&2; exit 1 ;;
  esac
done
for f in $files; do
  for mma in 1 0; do
    for np in $nps; do
      echo "== fathom $f --parallel $np FATHOM_CUDA_MMA_FEW=$mma"
      FATHOM_CUDA_MMA_FEW=$mma "$fathom" generate "$work/$f.gguf" --device cuda --parallel "$np" --random-prompt 128 \
        -n 128 --ignore-eos --temp 0 -c 256 2>&1 | grep -E "prompt:|decode:|rror"
    done
  done
  echo "== llama-batched-bench $f"
  "$llama/llama-batched-bench" -m "$work/$f.gguf" -ngl 99 -fa 1 -npp 128 -ntg 128 -npl "${nps// /,}" -c 17000 2>&1 |
    grep -E "^\|"
done
