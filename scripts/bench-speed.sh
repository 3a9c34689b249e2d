#!/usr/bin/env bash
# fathom vs llama.cpp speed on the same GGUFs, same threads, same run:
# prompt processing of 512 tokens (pp512) and generation of 128 (tg128),
# the two tools run ROUNDS times alternately per file; prints medians and
# ratios, one row per file and test.
#
# Usage: scripts/bench-speed.sh [MODEL...]   (default: SmolLM2-135M-Instruct Q4_1)
#   THREADS=2 ROUNDS=3 REPS=3
#   ISA=auto      fathom's kernels (FATHOM_ISA: auto, avx512, avx2, portable) and
#                 the llama.cpp peer to match: avx2 (and portable) use the peer
#                 built with AVX-512 off (scripts/build-llama-cpp.sh LLAMA_CPP_ISA=avx2),
#                 auto and avx512 the native one
#   LLAMA_BENCH   a llama-bench binary to use instead of the built peer
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -gt 0 ]] || { scripts/fetch-model.sh; set -- models/SmolLM2-135M-Instruct.Q4_1.gguf; }
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
REPS=${REPS:-3}
ISA=${ISA:-auto}
case $ISA in
    avx2 | portable) PEER_ISA=avx2 ;;
    *) PEER_ISA=native ;;
esac
LLAMA_CPP_DIR=${LLAMA_CPP_DIR:-/work/peer/llama.cpp}
if [[ -z ${LLAMA_BENCH:-} ]]; then
    LLAMA_CPP_ISA=$PEER_ISA scripts/build-llama-cpp.sh >&2
    if [[ $PEER_ISA == avx2 ]]; then
        LLAMA_BENCH=${LLAMA_CPP_BUILD:-$LLAMA_CPP_DIR/build-avx2}/bin/llama-bench
    else
        LLAMA_BENCH=${LLAMA_CPP_BUILD:-$LLAMA_CPP_DIR/build}/bin/llama-bench
    fi
fi
cargo build --release --locked -p fathom-cli >&2
FATHOM=${CARGO_TARGET_DIR:-target}/release/fathom
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for i in $(seq "$#"); do
    model=${!i}
    for round in $(seq "$ROUNDS"); do
        if ! "$LLAMA_BENCH" -m "$model" -t "$THREADS" -p 512 -n 128 -r "$REPS" -o json > "$out/llama-$i-$round.json"; then
            echo "llama-bench failed on $model: no row for it" >&2
            rm -f "$out/llama-$i-$round.json"
            break
        fi
        FATHOM_ISA=$ISA "$FATHOM" bench "$model" --device cpu -t "$THREADS" -p 512 -n 128 -r "$REPS" --json \
            > "$out/fathom-$i-$round.json"
    done
done
python3 - "$out" "$ROUNDS" "$THREADS" "$LLAMA_BENCH" "$@" <<'PY'
import json, os, statistics, sys
out, rounds, threads, peer, models = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
print(f"{threads} threads, medians of {rounds} alternating rounds; llama.cpp: {peer}")
print("| file | fathom kernels | test | llama.cpp tok/s | fathom tok/s | fathom / llama.cpp |")
print("| --- | --- | --- | ---: | ---: | ---: |")
for i, model in enumerate(models, 1):
    llama = {"pp": [], "tg": []}
    fathom = {"pp": [], "tg": []}
    if not os.path.exists(f"{out}/llama-{i}-{rounds}.json"):
        continue
    for r in range(1, rounds + 1):
        for row in json.load(open(f"{out}/llama-{i}-{r}.json")):
            llama["pp" if row["n_prompt"] > 0 else "tg"].append(row["avg_ts"])
        f = json.load(open(f"{out}/fathom-{i}-{r}.json"))
        fathom["pp"].append(f["pp_tokens_per_second"])
        fathom["tg"].append(f["tg_tokens_per_second"])
        kernels = f.get("kernels")
    name = model.rsplit("/", 1)[-1]
    for key, test in (("pp", "pp512"), ("tg", "tg128")):
        l, f = statistics.median(llama[key]), statistics.median(fathom[key])
        print(f"| {name} | {kernels} | {test} | {l:.2f} | {f:.2f} | {f / l:.2f} |")
PY
