#!/usr/bin/env bash
# fathom serve under 1, 4 and 16 concurrent greedy streaming requests on
# the same model: aggregate generated tok/s and time to first token.
# Each level runs ROUNDS times; medians are printed, with the ratio of
# each level's aggregate rate to the single-stream rate.
# Usage: scripts/bench-serve.sh [MODEL]
#   (env: THREADS=2 ROUNDS=3 TOKENS=128 PORT=18080 LEVELS="1 4 16")
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
TOKENS=${TOKENS:-128}
PORT=${PORT:-18080}
LEVELS=${LEVELS:-1 4 16}
scripts/fetch-model.sh
cargo build --release --locked -p fathom-cli >&2
MAX_LEVEL=$(echo "$LEVELS" | tr ' ' '\n' | sort -n | tail -1)
target/release/fathom serve "$MODEL" --port "$PORT" -t "$THREADS" \
    --parallel "$MAX_LEVEL" -c 512 >&2 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
python3 - "$PORT" "$ROUNDS" "$TOKENS" "$MODEL" "$THREADS" $LEVELS <<'PY'
import http.client, json, statistics, sys, threading, time

port, rounds, tokens, model, threads = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
levels = [int(x) for x in sys.argv[6:]]
prompts = [
    "Write a long story about a lighthouse keeper who",
    "Explain in detail how a steam engine works, starting with",
    "List every step of baking bread, from",
    "Describe the history of the printing press, beginning in",
]

deadline = time.time() + 120
while True:
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/health")
        r = c.getresponse()
        r.read()
        if r.status == 200:
            break
    except OSError:
        pass
    if time.time() > deadline:
        sys.exit("the server did not become healthy")
    time.sleep(0.2)
c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
c.request("GET", "/v1/models")
model_id = json.loads(c.getresponse().read())["data"][0]["id"]

def one(i, results):
    body = json.dumps({
        "model": model_id, "prompt": prompts[i % len(prompts)], "max_tokens": tokens,
        "temperature": 0, "stream": True, "ignore_eos": True,
        "stream_options": {"include_usage": True},
    })
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.read()
    first, generated = None, 0
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("choices") and chunk["choices"][0].get("text") and first is None:
            first = time.perf_counter() - start
        if chunk.get("usage"):
            generated = chunk["usage"]["completion_tokens"]
    results[i] = (first, generated)

print(f"{model}, {threads} threads, {tokens} tokens per request, medians of {rounds} rounds")
print(f"{'concurrent':>10} {'aggregate tok/s':>16} {'x single':>9} {'TTFT median ms':>15}")
single = None
for level in levels:
    rates, ttfts = [], []
    for _ in range(rounds):
        results = [None] * level
        workers = [threading.Thread(target=one, args=(i, results)) for i in range(level)]
        start = time.perf_counter()
        for w in workers: w.start()
        for w in workers: w.join()
        wall = time.perf_counter() - start
        rates.append(sum(g for _, g in results) / wall)
        ttfts.extend(f for f, _ in results if f is not None)
    rate = statistics.median(rates)
    single = single or rate
    print(f"{level:>10} {rate:>16.1f} {rate / single:>9.2f} {statistics.median(ttfts) * 1e3:>15.1f}")
PY
