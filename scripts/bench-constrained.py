#!/usr/bin/env python3
"""Constrained decoding against the same unconstrained request, through
`fathom serve` over HTTP: aggregate decode tokens/s at 1 and 16 concurrent
streams for plain text, a JSON schema, a GBNF grammar and a required tool
call (SmolLM2's generic format), the token-mask time per token and the
compile time per request (from /metrics), and the time to first token with
and without the schema cache.

Every request asks for exactly -n tokens (`ignore_eos`; the schema and
grammar need answers longer than that), so the modes decode the same number of
tokens; tok/s is completion tokens over the whole time of the requests, their
prefill included (the tool call's prompt is longer: it lists the tools), and
a tool call's text is held back until it is complete, so its time to first
token is the whole answer's. Usage (from the repository root; builds the release binary):

    scripts/bench-constrained.py [--streams 1,16] [-n 128] [--rounds 5] [-t 2] [--json FILE]
                                 [--temperature T] [--model FILE --route completions] [-- SERVE_ARGS...]

`--temperature 0` makes every request greedy. A constrained request,
greedy or sampled, asks the constraint about its likeliest tokens first and
computes a mask only when they do not settle the pick (see
`masks_per_token`; on a device, sampled rows' masks are computed ahead
while the step runs).

`--route completions` (for checkpoints without a chat template, such as the
random-weight fixtures `fathom bench fixture` writes for GPU runs) sends raw
prompts and leaves the tool call out.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")

# At least 64 items: longer than -n tokens, so no answer ends early.
SCHEMA = {
    "type": "object",
    "properties": {"items": {"type": "array", "items": {"type": "string", "maxLength": 30}, "minItems": 64}},
    "required": ["items"],
    "additionalProperties": False,
}
GBNF = 'root ::= "[" item (", " item)*\nitem ::= "\\"" [a-zA-Z ]{1,30} "\\""\n'
TOOLS = [{"type": "function", "function": {
    "name": "add_items", "description": "Add items to a shopping list",
    "parameters": {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string", "maxLength": 30},
                                                                             "minItems": 64}},
                   "required": ["items"], "additionalProperties": False}}}]
MODES = {
    "plain": {},
    "json_schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "list", "schema": SCHEMA}}},
    "gbnf": {"grammar": GBNF},
    "tool_call": {"tools": TOOLS, "tool_choice": "required"},
}


ROUTE = {"path": "/v1/chat/completions"}


def post_stream(base, body):
    """Streams one completion; returns (time to first token, total time, completion tokens, prompt tokens)."""
    req = urllib.request.Request(base + ROUTE["path"], data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    first = None
    tokens = prompt_tokens = 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if (line.startswith(b"data: {") and first is None and b'"content":""' not in line
                    and b'"text":""' not in line):
                first = time.perf_counter()
            if line.startswith(b'data: {') and b'"usage":{' in line:
                usage = json.loads(line[6:])["usage"]
                tokens, prompt_tokens = usage["completion_tokens"], usage["prompt_tokens"]
    end = time.perf_counter()
    return (first or end) - start, end - start, tokens, prompt_tokens


def metrics(base):
    text = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    out = {}
    for name in ["fathom_constraint_masks_total", "fathom_constraint_mask_seconds_total",
                 "fathom_constraint_compile_seconds_total", "fathom_constrained_requests_total",
                 "fathom_generated_tokens_total"]:
        m = re.search(r"^" + name + r" ([0-9.e+-]+)$", text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    return out


def one_round(base, mode, streams, n, seed, temperature):
    """Aggregate decode tok/s of `streams` concurrent requests, and their TTFTs."""
    results = [None] * streams

    def one(i):
        body = {"max_tokens": n, "ignore_eos": True, "stream": True, "seed": seed + i,
                "stream_options": {"include_usage": True}}
        body.update(prompt("List things to buy for a picnic, as JSON."))
        body.update(MODES[mode])
        if temperature is not None:
            body["temperature"] = temperature
        results[i] = post_stream(base, body)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(x[2] for x in results)
    assert tokens == streams * n, f"{mode}: {tokens} tokens, not {streams} x {n}"
    return tokens / wall, [x[0] for x in results], results[0][3]


def prompt(text):
    if ROUTE["path"] == "/v1/completions":
        return {"prompt": text + "\n"}
    return {"messages": [{"role": "user", "content": text}]}


def cpu_flags():
    try:
        flags = open("/proc/cpuinfo").read().split("flags\t\t: ", 1)[1].split("\n", 1)[0].split()
    except (OSError, IndexError):
        return "unknown"
    return " ".join(f for f in ["avx2", "avx512f", "avx512_vnni", "avx512_bf16"] if f in flags)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", default="1,16")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--port", type=int, default=18299)
    ap.add_argument("--fathom", default=os.path.join(ROOT, "target", "release", "fathom"))
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--temperature", type=float, help="every request's temperature (0: greedy)")
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--route", choices=["chat", "completions"], default="chat")
    ap.add_argument("serve_args", nargs="*", help="more `fathom serve` arguments, after --")
    args = ap.parse_args()
    if args.route == "completions":
        ROUTE["path"] = "/v1/completions"
        del MODES["tool_call"]
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "--locked", "-p", "fathom-cli"], cwd=ROOT, check=True)
    levels = [int(s) for s in args.streams.split(",")]
    server = subprocess.Popen([args.fathom, "serve", args.model, "--port", str(args.port), "-np", str(max(levels)),
                               "-c", str(args.n + 256), "-t", str(args.threads)] + args.serve_args,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{args.port}"
    try:
        for _ in range(600):
            try:
                if urllib.request.urlopen(base + "/health", timeout=1).status == 200:
                    break
            except Exception:
                time.sleep(0.1)
        print(f"CPU flags: {cpu_flags()}; {args.threads} threads; -n {args.n}, median of {args.rounds} rounds; "
              f"{os.path.basename(args.model)} {' '.join(args.serve_args)}")
        rows = []
        # Time to first token of a schema the cache has not seen, then seen.
        fresh = dict(SCHEMA, description="fresh")
        body = {"max_tokens": 2, "stream": True, **prompt("A list."),
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": fresh}}}
        ttft_fresh = post_stream(base, body)[0]
        ttft_cached = post_stream(base, body)[0]
        plain_ttft = post_stream(base, {"max_tokens": 2, "stream": True, **prompt("A list.")})[0]
        for streams in levels:
            # Modes take turns within each round, so load from elsewhere on
            # the machine falls on all of them alike; the median round counts.
            rates = {m: [] for m in MODES}
            ttfts = {m: [] for m in MODES}
            spent = {m: [0.0, 0.0, 0.0, 0.0] for m in MODES}
            prompt_tokens = {}
            for r in range(args.rounds):
                for mode in MODES:
                    m0 = metrics(base)
                    rate, t, prompt_tokens[mode] = one_round(base, mode, streams, args.n, 7 + 1000 * r,
                                                               args.temperature)
                    m1 = metrics(base)
                    rates[mode].append(rate)
                    ttfts[mode].extend(t)
                    for k, name in enumerate(["fathom_constraint_masks_total", "fathom_constraint_mask_seconds_total",
                                              "fathom_constrained_requests_total",
                                              "fathom_constraint_compile_seconds_total"]):
                        spent[mode][k] += m1[name] - m0[name]
            median = {m: statistics.median(r) for m, r in rates.items()}
            baseline = median["plain"]
            for mode in MODES:
                masks, mask_s, reqs, comp = spent[mode]
                rate = median[mode]
                ttft = sum(ttfts[mode]) / len(ttfts[mode])
                tokens = streams * args.n * args.rounds
                row = {"streams": streams, "mode": mode, "prompt_tokens": prompt_tokens[mode], "tok_s": round(rate, 1),
                       "rounds_tok_s": [round(r, 1) for r in rates[mode]],
                       "vs_plain": round(rate / baseline, 3), "ttft_ms": round(ttft * 1000, 1),
                       "mask_ms_per_token": round(1000 * mask_s / tokens, 3) if reqs else None,
                       "masks_per_token": round(masks / tokens, 3) if reqs else None,
                       "compile_ms_per_request": round(1000 * comp / reqs, 3) if reqs else None}
                rows.append(row)
                print(f"{streams:>3} streams  {mode:<12} prompt {prompt_tokens[mode]:4d}  {rate:8.1f} tok/s  "
                      f"{rate / baseline:6.3f} x plain  "
                      f"TTFT {ttft * 1000:7.1f} ms  mask {row['mask_ms_per_token'] or 0:.3f} ms/token  "
                      f"({row['masks_per_token'] or 0:.2f} masks/token)  "
                      f"compile {row['compile_ms_per_request'] or 0:.3f} ms/request")
        print(f"time to first token (2-token request): plain {plain_ttft * 1000:.1f} ms, a new schema "
              f"{ttft_fresh * 1000:.1f} ms, the same schema again (cached) {ttft_cached * 1000:.1f} ms")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"command": " ".join(sys.argv), "cpu_flags": cpu_flags(), "threads": args.threads, "n": args.n,
                           "temperature": args.temperature,
                           "rounds": args.rounds, "statistic": "median", "rows": rows,
                           "ttft_ms": {"plain": plain_ttft * 1000, "new_schema": ttft_fresh * 1000,
                                       "cached_schema": ttft_cached * 1000}}, f, indent=1)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    sys.exit(main())
