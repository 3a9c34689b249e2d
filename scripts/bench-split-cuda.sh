#!/usr/bin/env bash
# Runs ON THE GPU MACHINE: issue 34's split comparisons against llama.cpp CUDA, same call, same files
# (random-weight GGUFs of real shapes written by `fathom bench fixture`).
#
# Usage: bench-split-cuda.sh FATHOM LLAMA_BIN_DIR WORK_DIR [PART ...]
#   FATHOM         a release `fathom` built elsewhere (scripts/test-gpu.sh stages one)
#   LLAMA_BIN_DIR  llama.cpp's CUDA tools: llama-bench, llama-completion, llama-fit-params
#                  (scripts/build-llama-cpp-cuda.sh builds them without a GPU; ../shared/gpu/build-llamacpp-cuda.sh
#                  there, with GGML_NATIVE=OFF and the ISA named on AMX hosts, whose native build crashes)
#   WORK_DIR       fixtures go here (4.2 GB, 5.6 GB; the capped cells 17–40 GB each, one at a time)
# PARTS (default: same moe pin):
#   same   8B-shape Q4_K, whole layers on the host: `fathom bench` vs `llama-bench` at -ngl 16 and 0
#          (each fathom split run also prints where its time went: FATHOM_SPLIT_PROFILE)
#   moe    Qwen3-30B-A3B shape cut to 16 layers, Q4_K: --n-cpu-moe 16 and 8 in both
#   pin    fathom alone: streamed host weights page-locked vs pageable (FATHOM_SPLIT_PIN_WEIGHTS=0), -ngl 0
#   capped fathom's own placement under a device cap (`--memory`) against llama.cpp's `--fit` leaving the same
#          memory usable (`--fit-target` = free − cap), each with its NVML peak (nvidia-smi, 50 ms), and both at
#          fathom's placement; cells from CELLS ("LIKE CAP_GIB CTX [NCMOE,...]" separated by ';', default
#          "qwen3-30b-a3b 12 4096 18,20,22,24,26;qwen3-32b 24 32768;llama-3.1-70b 24 8192"): for a MoE the
#          listed --n-cpu-moe values also run in llama-bench with their NVML peak (llama.cpp's best by hand
#          is the smallest whose peak stays under the cap)
# Env: REPS (3) repetitions of each bench; THREADS (16); VOCAB (a vocabulary GGUF for the capped cells' fixtures,
# so llama-completion has real text to read; default: none).
set -uo pipefail
fathom=${1:?usage: bench-split-cuda.sh FATHOM LLAMA_BIN_DIR WORK_DIR [PART ...]}
llama=${2:?llama bin dir}
work=${3:?work dir}
shift 3
parts=${*:-same moe pin}
reps=${REPS:-3}
threads=${THREADS:-16}
mkdir -p "$work"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,memory.total,memory.free --format=csv
lscpu | grep -E "Model name|^CPU\(s\)"
wants() { [[ " $parts " == *" $1 "* ]]; }
fixture() { # like file [layers]
    [[ -f "$work/$2" ]] || "$fathom" bench fixture --like "$1" --type Q4_K ${3:+--layers "$3"} \
        ${VOCAB:+--vocab "$VOCAB"} "$work/$2" | tail -1
}
fb() { # file args...: fathom's pp512 and tg64 medians, and where a split's time went (all repetitions)
    local f=$1; shift
    echo "== fathom $*"
    FATHOM_SPLIT_PROFILE=1 "$fathom" bench "$work/$f" --device cuda -p 512 -n 64 -r "$reps" -t "$threads" "$@" 2>&1 \
        | grep -E "pp512|tg64|split time| [0-9.]+ \| +[0-9.]+$"
}
lb() { # file args...: llama-bench's, same tests
    local f=$1; shift
    echo "== llama-bench $*"
    "$llama/llama-bench" -m "$work/$f" -fa 1 -p 512 -n 64 -r "$reps" -t "$threads" "$@" 2>&1 | grep -E "^\|"
}
peak() { # command...: runs it, then prints the device's most used memory meanwhile
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 50 >"$work/smi.log" &
    local sampler=$!
    "$@"
    kill "$sampler"
    wait "$sampler" 2>/dev/null
    echo "   NVML used MiB: most $(sort -n "$work/smi.log" | tail -1), before $(head -1 "$work/smi.log")"
}

if wants same || wants pin; then fixture llama-3.1-8b d8.gguf; fi
if wants same; then
    for n in 16 0; do fb d8.gguf --gpu-layers "$n"; lb d8.gguf -ngl "$n"; done
fi
if wants pin; then
    for pin in 1 0 1 0; do
        echo "== fathom -ngl 0, FATHOM_SPLIT_PIN_WEIGHTS=$pin"
        FATHOM_SPLIT_PIN_WEIGHTS=$pin "$fathom" bench "$work/d8.gguf" --device cuda -p 512 -n 0 -r "$reps" \
            -t "$threads" --gpu-layers 0 2>&1 | grep -E "pp512"
    done
fi
if wants moe; then
    fixture qwen3-30b-a3b moe16.gguf 16
    for n in 16 8; do fb moe16.gguf --n-cpu-moe "$n"; lb moe16.gguf -ngl 99 -ncmoe "$n"; done
fi
if wants capped; then
    prompt=$(python3 -c 'print("the quick brown fox jumps over the lazy dog " * 57)')
    IFS=';' read -r -a cells <<<"${CELLS:-qwen3-30b-a3b 12 4096 18,20,22,24,26;qwen3-32b 24 32768;llama-3.1-70b 24 8192}"
    for cell in "${cells[@]}"; do
        read -r like cap ctx sweep <<<"$cell"
        f=capped-$like.gguf
        # One cell's file at a time on the disk (a file written beforehand is kept).
        find "$work" -maxdepth 1 -name 'capped-*.gguf' ! -name "$f" -delete
        fixture "$like" "$f"
        free=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits)
        target=$((free - cap * 1024))
        echo "== $like under ${cap} GiB at -c $ctx (llama.cpp --fit-target $target MiB of $free free)"
        "$fathom" inspect "$work/$f" --device cuda --memory "${cap}G" -c "$ctx" --json >"$work/plan.json"
        read -r ngl ncmoe < <(python3 -c 'import json, sys
p = json.load(open(sys.argv[1]))["placement"]
print(p["gpu_layers"], p["cpu_moe_layers"])' "$work/plan.json")
        echo "   fathom's placement: --gpu-layers $ngl --n-cpu-moe $ncmoe"
        peak "$fathom" generate "$work/$f" --device cuda --memory "${cap}G" -c "$ctx" --random-prompt 512 -n 32 \
            --temp 0 --ignore-eos -t "$threads" 2>&1 | grep -E "NVML|placement|prompt:|decode:|device"
        "$llama/llama-fit-params" -m "$work/$f" -c "$ctx" -fa on -fitt "$target" 2>&1 | tail -4
        peak "$llama/llama-completion" -m "$work/$f" -c "$ctx" -fit on -fitt "$target" -fa on -p "$prompt" -n 32 \
            -no-cnv --temp 0 --ignore-eos -t "$threads" </dev/null 2>&1 \
            | grep -E "NVML|prompt eval time|eval time|offloaded"
        fb "$f" --gpu-layers "$ngl" --n-cpu-moe "$ncmoe"
        lb "$f" -ngl "$ngl" -ncmoe "$ncmoe"
        for n in ${sweep//,/ }; do peak lb "$f" -ngl 99 -ncmoe "$n"; done
    done
fi
