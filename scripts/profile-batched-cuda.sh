#!/usr/bin/env bash
# Runs ON THE GPU MACHINE: where a batched decode step's time goes (issue 36). For each weight type, an 8B-shaped
# fixture of that type decodes at 2..64 sequences (greedy on the device), at 16 sequences also with CUDA graphs off,
# and, when Nsight Systems is installed, under `nsys profile -t cuda` at 16 and 64 sequences, printing the GPU kernel
# summary (time per kernel name) and the CUDA API summary. A 16-row Q4_K step costs 8.7 ms against 2.7 ms for one
# row on the H100 while its matrix products add up to ~4 ms (docs/benchmark_results/batched-quant-cuda-2026-12-06.md):
# this says where the rest goes.
#
# Usage: profile-batched-cuda.sh FATHOM WORK_DIR
#   FATHOM    a release `fathom` built elsewhere (scripts/test-gpu.sh stages one)
#   WORK_DIR  fixtures go here (4.6 GB for Q4_K, 8.5 GB for Q8_0)
# Env: TYPES ("Q4_K Q8_0"), NPS ("2 4 8 16 32 64").
set -uo pipefail
fathom=${1:?usage: profile-batched-cuda.sh FATHOM WORK_DIR}
work=${2:?work dir}
types=${TYPES:-Q4_K Q8_0}
nps=${NPS:-2 4 8 16 32 64}
mkdir -p "$work"
nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "nsys: ${nsys:-none}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv
decode() { # FILE NP [ENV=VALUE ...]: the decode line of a greedy batched run
  local file=$1 np=$2; shift 2
  env "$@" "$fathom" generate "$file" --device cuda --parallel "$np" --random-prompt 16 -n 128 --ignore-eos \
    --temp 0 -c 256 2>&1 | grep -E "decode:|rror"
}
for t in $types; do
  f=$work/${t,,}.gguf
  [[ -f $f ]] || "$fathom" bench fixture --like llama-3.1-8b --type "$t" "$f" >/dev/null
  for np in $nps; do echo "== $t --parallel $np"; decode "$f" "$np"; done
  echo "== $t --parallel 16, FATHOM_CUDA_GRAPHS=0"; decode "$f" 16 FATHOM_CUDA_GRAPHS=0
  [[ -n $nsys ]] || continue
  for np in 16 64; do
    "$nsys" profile -q -o "$work/p_${t}_$np" -t cuda --force-overwrite true "$fathom" generate "$f" --device cuda \
      --parallel "$np" --random-prompt 16 -n 256 --ignore-eos --temp 0 -c 512 >/dev/null 2>&1
    echo "== nsys $t --parallel $np: GPU kernels"
    "$nsys" stats -q -r cuda_gpu_kern_sum -f csv "$work/p_${t}_$np.nsys-rep" 2>/dev/null | head -25 | cut -c1-220
    echo "== nsys $t --parallel $np: CUDA API"
    "$nsys" stats -q -r cuda_api_sum -f csv "$work/p_${t}_$np.nsys-rep" 2>/dev/null | head -8 | cut -c1-200
  done
done
