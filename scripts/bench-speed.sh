#!/usr/bin/env bash
# fathom vs llama.cpp speed on the same GGUF, same threads, same run:
# prompt processing of 512 tokens (pp512) and generation of 128 (tg128),
# each tool run ROUNDS times alternately; prints medians and ratios.
# Usage: scripts/bench-speed.sh [MODEL] (env: THREADS=2 ROUNDS=3 REPS=3)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
REPS=${REPS:-3}
scripts/fetch-model.sh
scripts/build-llama-cpp.sh >&2
LLAMA_BENCH=${LLAMA_CPP_DIR:-/work/peer/llama.cpp}/build/bin/llama-bench
cargo build --release --locked -p fathom-cli >&2
FATHOM=target/release/fathom
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for round in $(seq "$ROUNDS"); do
    "$LLAMA_BENCH" -m "$MODEL" -t "$THREADS" -p 512 -n 128 -r "$REPS" -o json > "$out/llama-$round.json"
    "$FATHOM" bench "$MODEL" -t "$THREADS" -p 512 -n 128 -r "$REPS" --json > "$out/fathom-$round.json"
done
python3 - "$out" "$ROUNDS" "$MODEL" "$THREADS" <<'PY'
import json, statistics, sys
out, rounds, model, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
llama = {"pp": [], "tg": []}
fathom = {"pp": [], "tg": []}
for r in range(1, rounds + 1):
    for row in json.load(open(f"{out}/llama-{r}.json")):
        key = "pp" if row["n_prompt"] > 0 else "tg"
        llama[key].append(row["avg_ts"])
    f = json.load(open(f"{out}/fathom-{r}.json"))
    fathom["pp"].append(f["pp_tokens_per_second"])
    fathom["tg"].append(f["tg_tokens_per_second"])
print(f"{model}, {threads} threads, medians of {rounds} alternating rounds")
print(f"{'test':<6} {'llama.cpp tok/s':>16} {'fathom tok/s':>14} {'ratio':>7}")
for key, name in (("pp", "pp512"), ("tg", "tg128")):
    l, f = statistics.median(llama[key]), statistics.median(fathom[key])
    print(f"{name:<6} {l:>16.2f} {f:>14.2f} {f / l:>7.2f}")
PY
