#!/usr/bin/env bash
# Records llama.cpp reference behaviour for the SmolLM2-135M-Instruct Q4_1 GGUF:
#
#   out/smollm2_greedy.json   greedy (--temp 0) raw-prompt completions, 10 prompts x 48
#                             tokens, 2 threads: prompt ids, generated ids + text,
#                             top1-top2 logit margins, exact commands, llama.cpp version.
#                             Copy it to crates/fathom-engine/tests/data/smollm2_llama_cpp_greedy.json.
#                             The prompts were selected for llama.cpp's greedy choice never being a
#                             near-tie (margin >= 0.4 at each of the 48 steps); see "selection" in
#                             the output. PROMPTS_FILE=<json list of strings> overrides them
#                             (e.g. to screen candidates), MIN_MARGIN (default 0.4) is the bar the
#                             script reports against.
#   out/llama_bench.json      llama-bench -t 2 -p 512 -n 128 -r 5 -o json (+ load average)
#   out/peak_rss.json         /usr/bin/time -v peak RSS of llama-cli completions at
#                             -c 640 / 4096 / 8192, prompt filling the context + 64 tokens
#
# Usage: record_llama_cpp.sh [greedy|bench|rss|all]   (default all)
# Env: MODEL (default models/SmolLM2-135M-Instruct.Q4_1.gguf), LLAMA_CPP_DIR, OUT_DIR
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
export LLAMA_CPP_DIR=${LLAMA_CPP_DIR:-/work/peer/llama.cpp}
export MODEL=${MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}
export OUT_DIR=${OUT_DIR:-$HERE/out}
export BIN=$LLAMA_CPP_DIR/build/bin
WHAT=${1:-all}

"$ROOT/scripts/build-llama-cpp.sh" >&2
export LOGITS_BIN
LOGITS_BIN=$("$HERE/build_llama_logits.sh" | tail -1)
mkdir -p "$OUT_DIR"
if [[ ! -x /usr/bin/time ]]; then
    echo "installing GNU time" >&2
    apt-get install -y time >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y time >/dev/null; }
fi

python3 - "$WHAT" <<'PY'
import json, os, re, shlex, subprocess, sys, time

what = sys.argv[1]
BIN, MODEL, OUT = os.environ["BIN"], os.environ["MODEL"], os.environ["OUT_DIR"]
LOGITS_BIN = os.environ["LOGITS_BIN"]
THREADS = 2


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL, **kw)


def version():
    out = run([f"{BIN}/llama-cli", "--version"]).stderr + run([f"{BIN}/llama-cli", "--version"]).stdout
    info = open(os.path.join(os.environ["LLAMA_CPP_DIR"], "FATHOM_BUILD_INFO")).read().strip().splitlines()
    return {"llama_cli_version": " / ".join(l for l in out.splitlines() if l.strip()), "build_info": info}


def tokenize(text):
    out = run([f"{BIN}/llama-tokenize", "-m", MODEL, "-p", text, "--ids", "--log-disable"]).stdout
    return json.loads(out.strip().splitlines()[-1])


def tokenize_file(path):
    out = run([f"{BIN}/llama-tokenize", "-m", MODEL, "-f", path, "--ids", "--log-disable"]).stdout
    return json.loads(out.strip().splitlines()[-1])


def meta():
    return {"recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "loadavg_at_start": open("/proc/loadavg").read().split()[:3],
            "model": os.path.relpath(MODEL, os.getcwd()) if MODEL.startswith(os.getcwd()) else MODEL,
            "llama_cpp": version()}


# Chosen from ~95 screened candidates (counting, lists, repeated prose, code, quotations):
# only those whose greedy continuation has top1-top2 margin >= MIN_MARGIN at every step.
PROMPTS = [
    "1, 2, 3, 4, 5,",
    "0x00, 0x01, 0x02, 0x03,",
    "Sunday\nMonday\nTuesday\n",
    "January, February, March, April, May, June, July, August, September, October, November, December, "
    "January, February,",
    "The cat sat on the mat. " * 5,
    "The quick brown fox jumps over the lazy dog.\n" * 3,
    "Mary had a little lamb, its fleece was white as snow.",
    "SELECT id FROM t1;\nSELECT id FROM t2;\nSELECT id FROM t3;\n",
    "i = 1\ni = 2\ni = 3\ni = 4\n",
    "<li>Item</li>\n" * 3,
]
if os.environ.get("PROMPTS_FILE"):
    PROMPTS = json.load(open(os.environ["PROMPTS_FILE"]))
N_GEN = 48
MIN_MARGIN = float(os.environ.get("MIN_MARGIN", "0.4"))


def greedy():
    records = []
    for prompt in PROMPTS:
        ids = tokenize(prompt)
        cli = [f"{BIN}/llama-cli", "-m", MODEL, "-p", prompt, "-n", str(N_GEN), "--temp", "0", "-t", str(THREADS),
               "-no-cnv", "--no-display-prompt", "-s", "0", "--no-warmup"]
        cli_text = run(cli).stdout
        # llama-cli prints a trailing newline pair when it stops; compare modulo trailing newlines
        simple = [f"{BIN}/llama-simple", "-m", MODEL, "-n", str(N_GEN), prompt]
        simple_out = run(simple).stdout
        ids_cmd = [LOGITS_BIN, MODEL, ",".join(map(str, ids)), str(N_GEN), "--threads", str(THREADS), "--top", "2"]
        ref = json.loads(run(ids_cmd).stdout)
        gen_ids, gen_text = ref["generated"], ref["generated_text"]
        margins = [round(s["top"][0][1] - s["top"][1][1], 4) for s in ref["steps"]]
        records.append({
            "prompt": prompt,
            "prompt_ids": ids,
            "generated_ids": gen_ids,
            "generated_text": gen_text,
            "top1_top2_margins": margins,
            "min_margin_first_40": min(margins[:40]),
            "min_margin_all": min(margins),
            "llama_cli_text": cli_text,
            "llama_cli_agrees": cli_text.rstrip("\n") == gen_text.rstrip("\n"),
            "llama_simple_agrees": simple_out.rstrip("\n") == (prompt + gen_text).rstrip("\n"),
            "retokenized_generated_text": tokenize(gen_text) if gen_text else [],
            "commands": {
                "prompt_ids": shlex.join([f"{BIN}/llama-tokenize", "-m", MODEL, "-p", prompt, "--ids", "--log-disable"]),
                "llama_cli": shlex.join(cli) + " </dev/null",
                "llama_simple": shlex.join(simple),
                "generated_ids": shlex.join(ids_cmd),
            },
        })
        print(f"greedy: {prompt!r} -> {gen_text!r} (cli agrees: {records[-1]['llama_cli_agrees']}, "
              f"min margin: first 40 {min(margins[:40])}, all {min(margins)})", file=sys.stderr)
    doc = {
        **meta(),
        "n_generated": N_GEN, "threads": THREADS, "sampling": "greedy (--temp 0 = argmax)",
        "how_ids_were_obtained": (
            "llama-cli/llama-simple print text only. generated_ids come from fathom-llama-logits "
            "(scripts/reference/llama_logits.cpp, a small client of the same llama.cpp build: whole prompt in "
            "one llama_decode, then one token per decode, argmax of the logits, default f16 KV cache). "
            "llama_cli_agrees / llama_simple_agrees check that the ids detokenize to exactly the text those "
            "tools printed (modulo trailing newlines). retokenized_generated_text is llama-tokenize applied "
            "to the generated text, for reference (BPE re-tokenization need not reproduce the generated ids)."),
        "selection": (
            "The prompts are not a random sample: they were chosen (from ~95 screened candidates, most of "
            "which failed) so that llama.cpp's own greedy choice is never a near-tie. Two correct "
            "implementations that round differently (8-bit activation quantization, f16 KV, summation "
            "order) can legitimately pick different tokens wherever llama.cpp's top-1 vs top-2 logit margin "
            f"is tiny (< ~0.25), and the continuations diverge from there. Criterion: margin >= {MIN_MARGIN} "
            "at every one of the first 40 generated positions (required) and ideally all "
            f"{N_GEN}; see top1_top2_margins / min_margin_first_40 / min_margin_all per prompt "
            f"(all {N_GEN} steps meet it: {all(r['min_margin_all'] >= MIN_MARGIN for r in records)}). "
            "Such prompts are in practice repetitive or strongly patterned (counting, lists, repeated "
            "lines, code/HTML/SQL patterns); most open-ended prose, quotation and code prompts screened "
            "hit a near-tie within the first 20 tokens."),
        "prompts": records,
    }
    with open(os.path.join(OUT, "smollm2_greedy.json"), "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)


def bench(attempts=int(os.environ.get("BENCH_ATTEMPTS", "3"))):
    """llama-bench is sensitive to other load on this shared 2-core box (OpenMP threads spin),
    so it is run up to BENCH_ATTEMPTS times; the attempt with the smallest relative stddev is
    reported, all attempts are kept."""
    cmd = [f"{BIN}/llama-bench", "-m", MODEL, "-t", str(THREADS), "-p", "512", "-n", "128", "-r", "5", "-o", "json"]
    m = meta()
    runs = []
    for _ in range(attempts):
        load0 = open("/proc/loadavg").read().split()[:3]
        data = json.loads(run(cmd).stdout)
        summary = {f"{'pp' if r['n_prompt'] else 'tg'}{r['n_prompt'] or r['n_gen']}":
                   {"avg_ts": r["avg_ts"], "stddev_ts": r["stddev_ts"], "max_sample_ts": max(r["samples_ts"])}
                   for r in data}
        rel = max(v["stddev_ts"] / v["avg_ts"] for v in summary.values())
        runs.append({"loadavg_before": load0, "loadavg_after": open("/proc/loadavg").read().split()[:3],
                     "max_rel_stddev": rel, "summary": summary, "llama_bench": data})
        print("bench attempt:", json.dumps(summary), file=sys.stderr)
        if rel < 0.05 and float(load0[0]) < 2.5:
            break
    # contention only ever slows a run down: per metric, report the attempt with the best average
    summary, chosen = {}, {}
    for key in runs[0]["summary"]:
        i = max(range(len(runs)), key=lambda j: runs[j]["summary"][key]["avg_ts"])
        summary[key] = {**runs[i]["summary"][key], "attempt": i}
    doc = {**m, "command": shlex.join(cmd), "summary": summary,
           "note": "per metric, the attempt with the highest average (other load on this shared 2-core box "
                   "only slows llama.cpp's spinning OpenMP threads down); max_sample_ts is the best single "
                   "repetition. Check loadavg_before/after of that attempt.",
           "attempts": runs}
    with open(os.path.join(OUT, "llama_bench.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print("bench:", json.dumps(summary), file=sys.stderr)


def long_prompt(n_tokens, path):
    """Writes a prompt file of (just under) n_tokens tokens: numbered varied sentences."""
    words = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar "
             "papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()
    lines, i = [], 0
    text = ""
    # grow in chunks, then trim by lines with a real token count
    while True:
        lines.append(f"Note {i}: the {words[i % 26]} team met the {words[(i * 7) % 26]} team at {i % 24}:00 "
                     f"and reported {i * 13 % 997} items.")
        i += 1
        if i % 50 == 0:
            text = "\n".join(lines)
            with open(path, "w") as f:
                f.write(text)
            if len(tokenize_file(path)) >= n_tokens:
                break
    while True:
        text = "\n".join(lines)
        with open(path, "w") as f:
            f.write(text)
        n = len(tokenize_file(path))
        if n <= n_tokens:
            return n
        lines.pop()


def rss():
    results = []
    m = meta()
    for ctx in (640, 4096, 8192):
        n_gen = 64
        path = os.path.join(OUT, f"long_prompt_{ctx}.txt")
        n_prompt = long_prompt(ctx - n_gen - 16, path)
        cmd = [f"{BIN}/llama-cli", "-m", MODEL, "-f", path, "-c", str(ctx), "-n", str(n_gen), "--temp", "0",
               "-t", str(THREADS), "-no-cnv", "--no-display-prompt", "-s", "0", "--no-warmup"]
        full = ["/usr/bin/time", "-v"] + cmd
        t0 = time.time()
        res = subprocess.run(full, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        wall = time.time() - t0
        if res.returncode != 0:
            sys.exit(f"failed: {shlex.join(full)}\n{res.stderr[-3000:]}")
        kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", res.stderr).group(1))
        perf = {k: v for k, v in re.findall(r"llama_perf_context_print:\s+(prompt eval time|eval time)\s+=\s+(.*)", res.stderr)}
        kv = re.findall(r"llama_kv_cache_unified:.*?size\s*=\s*([\d.]+ MiB.*)", res.stderr)
        results.append({"ctx": ctx, "prompt_tokens": n_prompt, "generated_tokens": n_gen,
                        "max_rss_kib": kb, "max_rss_mib": round(kb / 1024, 1), "wall_s": round(wall, 2),
                        "kv_cache": kv[:1], "perf": perf,
                        "prompt_file": os.path.relpath(path, os.getcwd()),
                        "command": shlex.join(full) + " </dev/null"})
        print(f"rss: ctx {ctx} prompt {n_prompt} -> {kb / 1024:.1f} MiB", file=sys.stderr)
    doc = {**m, "note": "peak RSS as reported by GNU time (includes mmapped model pages actually touched; "
                        "llama.cpp mmaps the GGUF by default). KV cache type f16 (default).",
           "runs": results}
    with open(os.path.join(OUT, "peak_rss.json"), "w") as f:
        json.dump(doc, f, indent=1)


if what in ("greedy", "all"):
    greedy()
if what in ("bench", "all"):
    bench()
if what in ("rss", "all"):
    rss()
PY
