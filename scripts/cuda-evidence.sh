#!/usr/bin/env bash
# Runs ON THE GPU MACHINE, from a folder holding a release `fathom` built
# elsewhere (the GPU machine needs no Rust): writes random-weight GGUFs of
# real shapes with fathom's own fixture generator, then
#   1. memory: `fathom generate --device cuda` per (model, context), which
#      prints the device plan against its own peak (NVML, per process,
#      sampled every 10 ms), the host plan against peak RSS, and free device
#      memory after loading and at the end; nvidia-smi samples the process
#      too, as an independent reading;
#   2. speed: `fathom bench --device cuda` (pp512, tg128) and, when a
#      llama.cpp CUDA build is given, `llama-bench -ngl 99 -fa 1` on the
#      same files, alternately.
# Usage: cuda-evidence.sh FATHOM WORK_DIR OUT_DIR [LLAMA_BIN_DIR]
# Prints a summary; raw logs go to OUT_DIR.
set -uo pipefail
fathom=${1:?usage: cuda-evidence.sh FATHOM WORK_DIR OUT_DIR [LLAMA_BIN_DIR]}
work=${2:?work dir}
out=${3:?out dir}
llama=${4:-}
mkdir -p "$work" "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,memory.total --format=csv | tee "$out/gpu.csv"

fixture() { # like type file [layers]
    [[ -f "$work/$3" ]] || "$fathom" bench fixture --like "$1" --type "$2" ${4:+--layers "$4"} "$work/$3" 2>&1
}
fixture smollm2-135m Q4_1 smollm2-shape-q4_1.gguf
fixture llama-3.1-8b F16 llama8b-shape-f16.gguf
fixture llama-3.1-8b Q4_K llama8b-shape-q4_k.gguf
fixture qwen3-30b-a3b Q4_0 qwen3moe-shape-q4_0.gguf
ls -la "$work"

echo "== memory: device plan vs NVML per-process peak; host plan vs peak RSS"
cell() { # file ctx
    local name="$1-c$2" prompt=$(( $2 - 64 ))
    ( while sleep 0.05; do nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits; done ) \
        > "$out/smi-$name.csv" 2>/dev/null &
    local sampler=$!
    "$fathom" generate "$work/$1" --device cuda -c "$2" --random-prompt "$prompt" -n 64 --ignore-eos --temp 0 \
        > /dev/null 2> "$out/gen-$name.log"
    local rc=$?
    kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
    local smi_peak=$(awk -F', *' '{ if ($2 > m) m = $2 } END { print m + 0 }' "$out/smi-$name.csv")
    echo "-- $name (rc $rc; nvidia-smi per-process peak ${smi_peak} MiB)"
    grep -E "^(prompt|decode|memory|device):" "$out/gen-$name.log"
    [[ $rc == 0 ]] || tail -5 "$out/gen-$name.log"
}
cell smollm2-shape-q4_1.gguf 640
cell smollm2-shape-q4_1.gguf 8192
cell llama8b-shape-f16.gguf 1024
cell llama8b-shape-f16.gguf 8192
cell qwen3moe-shape-q4_0.gguf 1024
cell qwen3moe-shape-q4_0.gguf 4096

echo "== speed: fathom bench --device cuda vs llama-bench -ngl 99 -fa 1 (same files, alternating)"
for f in smollm2-shape-q4_1.gguf llama8b-shape-f16.gguf llama8b-shape-q4_k.gguf qwen3moe-shape-q4_0.gguf; do
    for round in 1 2; do
        "$fathom" bench "$work/$f" --device cuda -p 512 -n 128 -r 3 --json 2>/dev/null > "$out/fathom-$f-$round.json"
        if [[ -n "$llama" ]]; then
            "$llama/llama-bench" -m "$work/$f" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o json 2>/dev/null > "$out/llama-$f-$round.json"
        fi
    done
done
python3 - "$out" "$llama" <<'PY'
import json, os, statistics, sys
out, llama = sys.argv[1], sys.argv[2]
def load(p):
    try:
        return json.load(open(p))
    except Exception:
        return None
print(f"{'file':<28} {'fathom pp512':>12} {'llama pp512':>12} {'ratio':>6} {'fathom tg128':>12} {'llama tg128':>12} {'ratio':>6}")
for f in ["smollm2-shape-q4_1.gguf", "llama8b-shape-f16.gguf", "llama8b-shape-q4_k.gguf", "qwen3moe-shape-q4_0.gguf"]:
    fp, ft, lp, lt = [], [], [], []
    for r in (1, 2):
        d = load(f"{out}/fathom-{f}-{r}.json")
        if d:
            fp.append(d["pp_tokens_per_second"] or 0); ft.append(d["tg_tokens_per_second"] or 0)
        d = load(f"{out}/llama-{f}-{r}.json")
        for row in d or []:
            (lp if row["n_prompt"] > 0 else lt).append(row["avg_ts"])
    med = lambda x: statistics.median(x) if x else float("nan")
    a, b, c, e = med(fp), med(lp), med(ft), med(lt)
    print(f"{f:<28} {a:>12.1f} {b:>12.1f} {a/b if b==b and b else float('nan'):>6.2f} {c:>12.1f} {e:>12.1f} {c/e if e==e and e else float('nan'):>6.2f}")
PY
