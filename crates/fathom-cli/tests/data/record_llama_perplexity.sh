#!/usr/bin/env bash
# Records llama-perplexity's figures for SmolLM2-135M-Instruct Q4_1 on
# /usr/share/common-licenses/GPL-3 (on every Debian machine), which
# crates/fathom-cli/tests/perplexity.rs checks fathom against:
#
#   smollm2_gpl3_llama_ppl.json   PPL at -c 128 --chunks 8 and at the default -c 512 (all 14
#                                 chunks), with the exact commands and llama.cpp version
#   smollm2_gpl3_c16.kld          llama-perplexity --kl-divergence-base at -c 16 --chunks 1 -b 16
#                                 (-b 16: the default 2048 would pack 128 sequences, above its 64)
#                                 (7 scored positions: a row is 98 KB at a 49152-token vocabulary,
#                                 so this is what stays well under 1 MB)
#
# Usage: crates/fathom-cli/tests/data/record_llama_perplexity.sh   (from the repository root)
# Env: LLAMA_CPP_DIR (default /work/peer/llama.cpp), MODEL, TEXT, THREADS (default 2)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../../.." && pwd)
LLAMA_CPP_DIR=${LLAMA_CPP_DIR:-/work/peer/llama.cpp}
MODEL=${MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}
TEXT=${TEXT:-/usr/share/common-licenses/GPL-3}
THREADS=${THREADS:-2}
LLAMA_CPP_DIR=$LLAMA_CPP_DIR "$ROOT/scripts/build-llama-cpp.sh" >&2
BIN=$LLAMA_CPP_DIR/build/bin/llama-perplexity

python3 - "$BIN" "$MODEL" "$TEXT" "$THREADS" "$HERE" "$LLAMA_CPP_DIR" <<'PY'
import hashlib, json, re, subprocess, sys
bin_, model, text, threads, here, llama_dir = sys.argv[1:]

def run(args):
    cmd = [bin_, "-m", model, "-t", threads] + args
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    out = p.stdout + p.stderr
    final = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", out)
    running = [float(x) for x in re.findall(r"\[\d+\]([0-9.]+),", out)]
    return {
        "command": " ".join(["llama-perplexity"] + cmd[1:]).replace(model, "MODEL").replace(text, "TEXT").replace(here + "/", ""),
        "ppl": float(final.group(1)) if final else None,
        "uncertainty": float(final.group(2)) if final else None,
        "running": running,
    }

runs = {
    "c128_chunks8": run(["-f", text, "-c", "128", "--chunks", "8"]),
    "c512": run(["-f", text, "-c", "512"]),
}
base = f"{here}/smollm2_gpl3_c16.kld"
runs["c16_base"] = run(["-f", text, "-c", "16", "--chunks", "1", "-b", "16", "--kl-divergence-base", base])
info = open(f"{llama_dir}/FATHOM_BUILD_INFO").read().strip().splitlines()
doc = {
    "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "model_sha256": hashlib.sha256(open(model, "rb").read()).hexdigest(),
    "text": text,
    "text_sha256": hashlib.sha256(open(text, "rb").read()).hexdigest(),
    "threads": int(threads),
    "llama_cpp": info,
    "runs": runs,
}
json.dump(doc, open(f"{here}/smollm2_gpl3_llama_ppl.json", "w"), indent=1)
print(json.dumps({k: v["ppl"] for k, v in runs.items()}))
PY
