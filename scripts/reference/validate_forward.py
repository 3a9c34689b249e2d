#!/usr/bin/env python3
"""Validates forward.py against llama.cpp (the peer built by scripts/build-llama-cpp.sh).

For each prompt: tokenize with llama-tokenize, let llama.cpp greedily generate N
tokens (fathom-llama-logits, which also reports every step's top logits), run
forward.py's model greedily (exact float32 math and --emulate-ggml), and report
how many generated tokens agree and, at the first disagreement, llama.cpp's
top-1/top-2 margin. A divergence is only acceptable at a near-tie (margin below
--tie-margin logits): the quantized-activation noise of ggml's CPU matmuls is
~0.1-0.3 logits rms on this model, so nothing can agree through closer ties.

Usage: validate_forward.py [--model M] [--n 32] [--min-match 16] [--out FILE]
                           [--prompts-from out/smollm2_greedy.json] [PROMPT ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import forward  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
LLAMA_CPP_DIR = os.environ.get("LLAMA_CPP_DIR", "/work/peer/llama.cpp")
BIN = os.path.join(LLAMA_CPP_DIR, "build", "bin")

PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a little",
    "def fibonacci(n):",
    "The three primary colors are",
]


def tokenize(model: str, prompt: str) -> list[int]:
    out = subprocess.run([os.path.join(BIN, "llama-tokenize"), "-m", model, "-p", prompt, "--ids", "--log-disable"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--min-match", type=int, default=16)
    ap.add_argument("--tie-margin", type=float, default=0.25)
    ap.add_argument("--out", default=os.path.join(HERE, "out", "forward_validation.json"))
    ap.add_argument("--prompts-from", help="JSON file: a list of prompts, or a record_llama_cpp.sh greedy "
                    "output (its prompts are used)")
    ap.add_argument("prompts", nargs="*")
    args = ap.parse_args()

    logits_bin = subprocess.run([os.path.join(HERE, "build_llama_logits.sh")], capture_output=True, text=True,
                                check=True).stdout.strip().splitlines()[-1]
    prompts = args.prompts or PROMPTS
    if args.prompts_from:
        doc = json.load(open(args.prompts_from))
        prompts = [p["prompt"] for p in doc["prompts"]] if isinstance(doc, dict) else doc
    models = {False: forward.Model(args.model), True: forward.Model(args.model, emulate_ggml=True)}
    report = {"model": args.model, "n": args.n, "tie_margin": args.tie_margin, "prompts": []}
    ok_all = True
    longest = 0
    for prompt in prompts:
        ids = tokenize(args.model, prompt)
        ref = json.loads(subprocess.run([logits_bin, args.model, ",".join(map(str, ids)), str(args.n),
                                         "--full-logits", "--threads", "2"],
                                        capture_output=True, text=True, check=True).stdout)
        ref_last = np.array(ref["prompt_last_logits"], dtype=np.float32)
        entry = {"prompt": prompt, "prompt_ids": ids, "llama_cpp_generated": ref["generated"]}
        for emulate, model in models.items():
            model.reset()
            logits = model.forward(ids)
            ours_last = logits[-1].copy()
            diff = ours_last - ref_last
            gen = []
            for _ in range(args.n):
                t = int(np.argmax(logits[-1]))
                gen.append(t)
                logits = model.forward([t])
            match = next((i for i, (a, b) in enumerate(zip(gen, ref["generated"])) if a != b), args.n)
            key = "emulate_ggml" if emulate else "exact"
            res = {
                "generated": gen,
                "match": match,
                "prompt_logits_rms_diff": float(np.sqrt(np.mean(diff * diff))),
                "prompt_logits_max_diff": float(np.max(np.abs(diff))),
                "prompt_logits_corr": float(np.corrcoef(ours_last, ref_last)[0, 1]),
            }
            if match < args.n:
                top = ref["steps"][match]["top"]
                res["llama_cpp_top_at_divergence"] = top[:3]
                res["llama_cpp_margin_at_divergence"] = top[0][1] - top[1][1]
                res["ours_at_divergence"] = gen[match]
                near_tie = res["llama_cpp_margin_at_divergence"] < args.tie_margin and \
                    gen[match] in [t for t, _ in top[:5]]
                res["ok"] = match >= args.min_match or near_tie
            else:
                res["ok"] = True
            if emulate:
                ok_all &= res["ok"]
                longest = max(longest, match)
            entry[key] = res
            print(f"{key:12s} match {match:2d}/{args.n}"
                  + (f" (llama.cpp margin {res['llama_cpp_margin_at_divergence']:.3f} at divergence)"
                     if match < args.n else "")
                  + f"  prompt logits rms diff {res['prompt_logits_rms_diff']:.4f}  {prompt!r}")
        report["prompts"].append(entry)
    ok_all &= longest >= args.min_match
    report["ok"] = bool(ok_all)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print("OK" if ok_all else "FAILED", "->", args.out)
    sys.exit(0 if ok_all else 1)


if __name__ == "__main__":
    main()
