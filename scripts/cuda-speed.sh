#!/usr/bin/env bash
# Runs ON THE GPU MACHINE: fathom against llama.cpp CUDA on the same random-weight GGUFs of real shapes,
# alternately, in one call. Prints per file the medians of both, their ratio, and each engine's decode speed
# as a share of the copy-bandwidth ceiling (bytes read per token — the weights, and at depth the cached K/V —
# / time, against a device-to-device copy bandwidth measured in the same run with torch).
#
# Usage: cuda-speed.sh FATHOM LLAMA_BIN_DIR WORK_DIR OUT_DIR
#   FATHOM         a release `fathom` built elsewhere (the GPU machine needs no Rust)
#   LLAMA_BIN_DIR  llama.cpp's CUDA tools (build-llamacpp-cuda.sh); llama-quantize makes the Q4_K_M file
# Env: ROUNDS (2) alternating rounds; REPS (3) repetitions inside each run; FILES to pick a subset
# (space-separated; the default five, or also llama8b-q4_0.gguf, qwen35-4b-q8_0.gguf, qwen35moe-q4_k.gguf (the
# Qwen3.5-35B-A3B shape cut to 10 of its 40 layers), gemma4-q4_k.gguf (Gemma 4 31B cut to 12 of 60 layers) and
# gptoss20b-q8_0.gguf (gpt-oss-20b whole: MXFP4 experts, Q8_0 other matrices, as its GGUFs store them)):
# only those files are written.
set -uo pipefail
fathom=${1:?usage: cuda-speed.sh FATHOM LLAMA_BIN_DIR WORK_DIR OUT_DIR}
llama=${2:?llama bin dir}
work=${3:?work dir}
out=${4:?out dir}
rounds=${ROUNDS:-2}
reps=${REPS:-3}
mkdir -p "$work" "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem --format=csv \
    | tee "$out/gpu.csv"

files=${FILES:-"smollm2-q4_1.gguf llama8b-f16.gguf llama8b-q8_0.gguf llama8b-q4_k_m.gguf qwen3moe-q4_0.gguf"}
wants() { [[ " $files " == *" $1 "* ]]; }
fixture() { # like type file [layers]
    [[ -f "$work/$3" ]] || "$fathom" bench fixture --like "$1" --type "$2" ${4:+--layers "$4"} "$work/$3" >/dev/null 2>&1
}
# Only the files asked for (Q4_K_M is llama-quantize's of the F16).
wants smollm2-q4_1.gguf && fixture smollm2-135m Q4_1 smollm2-q4_1.gguf
{ wants llama8b-f16.gguf || wants llama8b-q4_k_m.gguf; } && fixture llama-3.1-8b F16 llama8b-f16.gguf
wants llama8b-q8_0.gguf && fixture llama-3.1-8b Q8_0 llama8b-q8_0.gguf
wants llama8b-q4_0.gguf && fixture llama-3.1-8b Q4_0 llama8b-q4_0.gguf
wants qwen3moe-q4_0.gguf && fixture qwen3-30b-a3b Q4_0 qwen3moe-q4_0.gguf
wants qwen35-4b-q8_0.gguf && fixture qwen3.5-4b Q8_0 qwen35-4b-q8_0.gguf
wants qwen35moe-q4_k.gguf && fixture qwen3.5-35b-a3b Q4_K qwen35moe-q4_k.gguf 10
wants gemma4-q4_k.gguf && fixture gemma-4-31b Q4_K gemma4-q4_k.gguf 12
wants gptoss20b-q8_0.gguf && fixture gpt-oss-20b Q8_0 gptoss20b-q8_0.gguf
if wants llama8b-q4_k_m.gguf && [[ ! -f "$work/llama8b-q4_k_m.gguf" ]]; then
    "$llama/llama-quantize" "$work/llama8b-f16.gguf" "$work/llama8b-q4_k_m.gguf" Q4_K_M 16 >/dev/null 2>&1
fi
ls -l "$work"

# Device-to-device copy bandwidth (read + write), as the ceiling's reference.
python3 - > "$out/copy.txt" 2>&1 <<'PY'
import torch, time
n = 4 << 30
a = torch.empty(n, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(20): b.copy_(a)
torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 20
print(f"{2 * n / dt:.4e}")
PY
echo "copy bandwidth (read + write): $(cat "$out/copy.txt") B/s"

for f in $files; do
    for round in $(seq "$rounds"); do
        "$fathom" bench "$work/$f" --device cuda -p 512 -n 128 -r "$reps" --json 2>/dev/null \
            > "$out/fathom-$f-$round.json"
        "$llama/llama-bench" -m "$work/$f" -ngl 99 -fa 1 -p 512 -n 128 -r "$reps" -o json 2>/dev/null \
            > "$out/llama-$f-$round.json"
    done
done
if [[ " $files " == *" llama8b-f16.gguf "* ]]; then
    "$fathom" bench "$work/llama8b-f16.gguf" --device cuda -p 0 -d 4096 -n 128 -r "$reps" --json 2>/dev/null \
        > "$out/fathom-d4096.json"
    "$llama/llama-bench" -m "$work/llama8b-f16.gguf" -ngl 99 -fa 1 -p 0 -d 4096 -n 128 -r "$reps" -o json \
        2>/dev/null > "$out/llama-d4096.json"
fi

python3 - "$out" "$work" "$rounds" $files <<'PY'
import json, os, statistics, sys
out, work, rounds, files = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
copy = float(open(f"{out}/copy.txt").read().split()[-1])
def load(p):
    try:
        return json.load(open(p))
    except Exception:
        return None
med = lambda x: statistics.median(x) if x else float("nan")
def rows(f, tag=""):
    fp, ft, lp, lt = [], [], [], []
    for r in range(1, rounds + 1):
        d = load(f"{out}/fathom-{f}-{r}.json" if not tag else f"{out}/fathom-{tag}.json")
        if d:
            fp.append(d.get("pp_tokens_per_second") or 0); ft.append(d.get("tg_tokens_per_second") or 0)
        for row in load(f"{out}/llama-{f}-{r}.json" if not tag else f"{out}/llama-{tag}.json") or []:
            (lp if row["n_prompt"] > 0 else lt).append(row["avg_ts"])
        if tag:
            break
    return med(fp), med(lp), med(ft), med(lt)
ratio = lambda a, b: a / b if b == b and b else float("nan")
# Bytes read per decoded token: the weight tensors (the file less its header; an MoE — qwen3moe, qwen35moe,
# gpt-oss — reads only its active experts, so its share is not a bandwidth figure and is left out), and at depth
# the cached K and V.
print(f"copy bandwidth {copy / 1e12:.2f} TB/s (read + write)")
print(f"{'file':<22} {'fathom pp512':>12} {'llama pp512':>12} {'ratio':>6} {'fathom tg128':>12} "
      f"{'llama tg128':>12} {'ratio':>6} {'fathom %ceil':>12} {'llama %ceil':>11}")
for f in files:
    a, b, c, e = rows(f)
    size = os.path.getsize(f"{work}/{f}")
    ceil = copy / size if "moe" not in f and "gptoss" not in f else float("nan")
    print(f"{f:<22} {a:>12.1f} {b:>12.1f} {ratio(a, b):>6.2f} {c:>12.1f} {e:>12.1f} {ratio(c, e):>6.2f} "
          f"{100 * c / ceil:>11.1f}% {100 * e / ceil:>10.1f}%")
if "llama8b-f16.gguf" in files:
    _, _, c, e = rows("llama8b-f16.gguf", "d4096")
    # At depth a token also reads the cached K and V of every position: the 8B shape's f16 cache holds
    # 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes = 131,072 bytes a position, 4,096 + 64 positions
    # on average over tg128.
    kv = 131072 * (4096 + 64)
    ceil = copy / (os.path.getsize(f"{work}/llama8b-f16.gguf") + kv)
    print(f"{'llama8b-f16 tg @ d4096':<22} {'':>12} {'':>12} {'':>6} {c:>12.1f} {e:>12.1f} {ratio(c, e):>6.2f} "
          f"{100 * c / ceil:>11.1f}% {100 * e / ceil:>10.1f}%")
PY
