#!/usr/bin/env bash
# Runs ON THE GPU MACHINE (issue 12), with the carry scripts/test-gpu.sh
# staged (a release `fathom`, the GPU test binaries and their runner):
#   tests   the staged GPU tests (run.sh: conformance, CUDA vs CPU, the GPU
#           server: generate = serve, preemption) -> gpu-tests.log
#   memory  fathom bench memory --device cuda: the 21-cell CUDA grid, device
#           plan vs NVML per-process peak and host plan vs peak RSS per cell,
#           checkpoints written into WORK_DIR -> memory-cuda-<date>.json
#           (+ llama-bench -ngl 99 per batch-1 cell when LLAMA_BIN_DIR is given)
#   serve   fathom bench serve on the Llama-3.1-8B-shaped F16 checkpoint,
#           --device cuda: 1, 16 and 64 streaming clients (aggregate tok/s,
#           TTFT and inter-token latency median/p99), then the load test
#           (64 slots, queue 16, 96 requests at once, every fifth leaving;
#           NVML peak of the server vs its device plan) -> serve-cuda.json
# Usage: cuda-serve-evidence.sh CARRY_DIR WORK_DIR OUT_DIR [LLAMA_BIN_DIR]
#   (env: PHASES="tests memory serve", GRID=full, STREAMS=1,16,64;
#    MEMORY_JSON=FILE resumes a grid recorded earlier: its cells are kept and
#    only missing llama.cpp figures are added, e.g. in a second call that
#    builds llama.cpp with ../shared/gpu/build-llamacpp-cuda.sh first)
# At most 7 files go to OUT_DIR; summary.txt holds what to read first.
set -uo pipefail
carry=$(cd "${1:?usage: cuda-serve-evidence.sh CARRY_DIR WORK_DIR OUT_DIR [LLAMA_BIN_DIR]}" && pwd)
work=${2:?work dir}
out=${3:?out dir}
llama=${4:-}
phases=${PHASES:-tests memory serve}
mkdir -p "$work" "$out"
fathom="$carry/fathom"
summary="$out/summary.txt"
started=$(date +%s)
stamp() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$summary"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used,memory.total --format=csv \
    | tee -a "$summary"
echo "commit: $(cat "$carry/commit.txt" 2>/dev/null || echo unknown)" | tee -a "$summary"
rc=0

if [[ " $phases " == *" tests "* ]]; then
    stamp "tests: $carry/run.sh"
    bash "$carry/run.sh" > "$out/gpu-tests.log" 2>&1 || rc=1
    grep -E "^test result|FAILED|panicked|rc=" "$out/gpu-tests.log" | tail -12 | tee -a "$summary"
fi

if [[ " $phases " == *" memory "* ]]; then
    json="$out/memory-cuda-$(date -u +%F).json"
    if [[ -n "${MEMORY_JSON:-}" ]]; then
        json="$out/$(basename "$MEMORY_JSON")"
        [[ "$MEMORY_JSON" -ef "$json" ]] || cp "$MEMORY_JSON" "$json"
    fi
    peer=()
    [[ -n "$llama" ]] && peer=(--llama-cpp "$llama")
    stamp "memory: fathom bench memory --device cuda --grid ${GRID:-full}"
    # Run from WORK_DIR: checkpoints are written there once, cells run there.
    ( cd "$work" && "$fathom" bench memory --device cuda --grid "${GRID:-full}" --runs 1 \
        --work-dir "$work" --json "$json" "${peer[@]}" ) > "$out/memory.log" 2>&1 || rc=1
    tail -25 "$out/memory.log" | tee -a "$summary"
    # The carry's commit, where git was not there to read it.
    [[ -f "$json" ]] && python3 - "$json" "$carry/commit.txt" <<'PY' || true
import json, sys
path, commit_file = sys.argv[1], sys.argv[2]
doc = json.load(open(path))
try:
    commit = open(commit_file).read().strip()
except OSError:
    commit = None
if commit and not doc.get("commit"):
    doc["commit"] = commit
    doc["commits"] = [commit]
    json.dump(doc, open(path, "w"), indent=2)
    open(path, "a").write("\n")
PY
fi

if [[ " $phases " == *" serve "* ]]; then
    model="$work/llama-3.1-8b-shape-f16.gguf"
    if [[ ! -f "$model" ]]; then
        stamp "serve: writing $model"
        "$fathom" bench fixture --like llama-3.1-8b --type F16 --seed 5 "$model" >> "$out/serve.log" 2>&1
    fi
    stamp "serve: fathom bench serve (8B F16, --device cuda)"
    "$fathom" bench serve "$model" --streams "${STREAMS:-1,16,64}" -n 128 -p 128 --load --queue-size 16 \
        --json "$out/serve-cuda.json" --server-log "$out/serve-server.log" -- --device cuda \
        >> "$out/serve.log" 2>&1 || rc=1
    tail -12 "$out/serve.log" | tee -a "$summary"
fi
stamp "done, rc=$rc"
exit $rc
