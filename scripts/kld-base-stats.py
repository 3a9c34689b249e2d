#!/usr/bin/env python3
"""How peaked the next-token distributions in a KL-divergence base file are.

Reads llama-perplexity's --kl-divergence-base file (the format
crates/fathom-cli/src/kld.rs documents) and prints, over its scored
positions, the median probability of the most likely token, the median gap
in log-probability between the best two, the median entropy, and how often
the most likely next token is the position's own token: a random-weight
fixture whose tied, scaled embeddings dominate the residual predicts its
input back at every position, and then a same-top comparison says nothing.

Usage: kld-base-stats.py BASE.kld
"""

import sys

import numpy as np


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    data = open(sys.argv[1], "rb").read()
    if data[:8] != b"_logits_":
        sys.exit(f"{sys.argv[1]}: not a KL-divergence base file")
    n_ctx, n_vocab, n_chunk = (int(x) for x in np.frombuffer(data[8:20], dtype=np.int32))
    at = 20 + 4 * n_ctx * n_chunk
    tokens = np.frombuffer(data[20:at], dtype=np.int32)
    width = 2 * ((n_vocab + 1) // 2) + 4
    rows = np.frombuffer(data[at:], dtype=np.uint16).reshape(-1, width)
    per_chunk = n_ctx - 1 - n_ctx // 2
    top, gap, entropy, own = [], [], [], []
    for i, row in enumerate(rows):
        scale = np.frombuffer(row[0:2].tobytes(), np.float32)[0]
        low = np.frombuffer(row[2:4].tobytes(), np.float32)[0]
        logp = scale * row[4:4 + n_vocab].astype(np.float64) + low
        p = np.exp(logp)
        p /= p.sum()
        best = np.sort(logp)[::-1]
        top.append(p.max())
        gap.append(best[0] - best[1])
        entropy.append(-(p * np.log(p + 1e-30)).sum())
        chunk, j = divmod(i, per_chunk)
        own.append(np.argmax(logp) == tokens[chunk * n_ctx + n_ctx // 2 + j])
    print(f"{len(rows)} positions: most likely token's probability (median) {np.median(top):.3f}; "
          f"gap to the second {np.median(gap):.2f} nats; entropy {np.median(entropy):.2f} nats; "
          f"the position's own token most likely at {100 * np.mean(own):.1f}%")


if __name__ == "__main__":
    main()
