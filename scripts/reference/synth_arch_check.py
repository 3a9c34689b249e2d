#!/usr/bin/env python3
"""Checks forward.py's architecture variants against llama.cpp on tiny synthetic GGUFs.

For each of llama, qwen2, qwen3, qwen3moe and gemma3 this writes a tiny random
model with F32 weights (so llama.cpp's matmuls are plain float32, no activation
quantization) and the SmolLM2 tokenizer (llama.cpp needs a vocabulary to load a
model; the vocabulary size is 49152 either way), then compares forward.py's
logits with llama.cpp's (fathom-llama-logits, f32 KV cache; forward.py emulates
ggml's f16 GELU table, the one rounding left) at every step of a
prompt + greedy continuation. Sequences are longer than the gemma3 sliding
window so the local/global layer split is exercised.

Usage: synth_arch_check.py [--keep DIR] [ARCH ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import forward  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
TOKENIZER_SOURCE = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")

ARCHS = ["llama", "qwen2", "qwen3", "qwen3moe", "gemma3"]


def copy_tokenizer(w: gguf.GGUFWriter, src: gguf.GGUFReader) -> int:
    f = lambda k: src.fields[k].contents()  # noqa: E731
    tokens = f("tokenizer.ggml.tokens")
    w.add_tokenizer_model(f("tokenizer.ggml.model"))
    w.add_tokenizer_pre(f("tokenizer.ggml.pre"))
    w.add_token_list(tokens)
    w.add_token_types(f("tokenizer.ggml.token_type"))
    w.add_token_merges(f("tokenizer.ggml.merges"))
    w.add_bos_token_id(f("tokenizer.ggml.bos_token_id"))
    w.add_eos_token_id(f("tokenizer.ggml.eos_token_id"))
    w.add_add_bos_token(False)
    return len(tokens)


def write_model(arch: str, path: str, rng: np.random.Generator) -> dict:
    src = gguf.GGUFReader(TOKENIZER_SOURCE)
    n_embd, n_head, n_head_kv, n_ff, n_layer = 64, 4, 2, 96, 6
    head_dim = 32 if arch in ("qwen3", "qwen3moe", "gemma3") else n_embd // n_head  # qwen3: q dim != n_embd
    n_expert, n_expert_used, n_ff_exp = 8, 3, 48
    window = 5

    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"synthetic-{arch}")
    n_vocab = copy_tokenizer(w, src)
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base({"llama": 500000.0, "qwen2": 1000000.0, "gemma3": 1000000.0}.get(arch, 1000000.0))
    w.add_rope_dimension_count(head_dim)
    if arch == "qwen3moe":
        w.add_expert_count(n_expert)
        w.add_expert_used_count(n_expert_used)
        w.add_expert_feed_forward_length(n_ff_exp)
    if arch == "gemma3":
        w.add_sliding_window(window)

    def mat(rows, cols, *lead):
        return (rng.standard_normal((*lead, rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def normw(n):  # gemma GGUFs store 1 + w; any positive-ish vector does here
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    w.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, n_embd)).astype(np.float32))
    w.add_tensor("output_norm.weight", normw(n_embd))
    if arch == "llama":  # untied output for one of them
        w.add_tensor("output.weight", mat(n_vocab, n_embd))
    for il in range(n_layer):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", normw(n_embd))
        w.add_tensor(p + "attn_q.weight", mat(n_head * head_dim, n_embd))
        w.add_tensor(p + "attn_k.weight", mat(n_head_kv * head_dim, n_embd))
        w.add_tensor(p + "attn_v.weight", mat(n_head_kv * head_dim, n_embd))
        w.add_tensor(p + "attn_output.weight", mat(n_embd, n_head * head_dim))
        if arch == "qwen2":
            w.add_tensor(p + "attn_q.bias", (0.5 * rng.standard_normal(n_head * head_dim)).astype(np.float32))
            w.add_tensor(p + "attn_k.bias", (0.5 * rng.standard_normal(n_head_kv * head_dim)).astype(np.float32))
            w.add_tensor(p + "attn_v.bias", (0.5 * rng.standard_normal(n_head_kv * head_dim)).astype(np.float32))
        if arch in ("qwen3", "qwen3moe", "gemma3"):
            w.add_tensor(p + "attn_q_norm.weight", normw(head_dim))
            w.add_tensor(p + "attn_k_norm.weight", normw(head_dim))
        if arch == "gemma3":
            w.add_tensor(p + "post_attention_norm.weight", normw(n_embd))
            w.add_tensor(p + "post_ffw_norm.weight", normw(n_embd))
        w.add_tensor(p + "ffn_norm.weight", normw(n_embd))
        if arch == "qwen3moe":
            w.add_tensor(p + "ffn_gate_inp.weight", mat(n_expert, n_embd) * 4)
            w.add_tensor(p + "ffn_gate_exps.weight", mat(n_ff_exp, n_embd, n_expert))
            w.add_tensor(p + "ffn_up_exps.weight", mat(n_ff_exp, n_embd, n_expert))
            w.add_tensor(p + "ffn_down_exps.weight", mat(n_embd, n_ff_exp, n_expert))
        else:
            w.add_tensor(p + "ffn_gate.weight", mat(n_ff, n_embd))
            w.add_tensor(p + "ffn_up.weight", mat(n_ff, n_embd))
            w.add_tensor(p + "ffn_down.weight", mat(n_embd, n_ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"n_embd": n_embd, "n_head": n_head, "n_head_kv": n_head_kv, "head_dim": head_dim, "n_layer": n_layer}


def check(arch: str, path: str, logits_bin: str, prompt: list[int], n_gen: int) -> dict:
    ref = json.loads(subprocess.run([logits_bin, path, ",".join(map(str, prompt)), str(n_gen), "--kv-f32",
                                     "--top", "8", "--full-logits"],
                                    capture_output=True, text=True, check=True).stdout)
    model = forward.Model(path)
    # F32 weights and an f32 KV cache leave one ggml rounding: GELU goes through an f16 table
    model.emulate_gelu_f16 = True
    logits = model.forward(prompt)
    full = np.array(ref["prompt_last_logits"], dtype=np.float32)
    max_full = float(np.max(np.abs(logits[-1] - full)))
    scale = float(np.max(np.abs(full)))
    worst = 0.0
    agree = 0
    for step, s in enumerate(ref["steps"]):
        ours = logits[-1]
        for tok, val in s["top"]:
            worst = max(worst, abs(float(ours[tok]) - val))
        if int(np.argmax(ours)) == s["token"]:
            agree += 1
        logits = model.forward([s["token"]])  # follow llama.cpp's tokens
    return {"arch": arch, "prompt_len": len(prompt), "steps": n_gen, "argmax_agree": agree,
            "prompt_logits_max_abs_diff": max_full, "logit_scale": scale,
            "top8_logits_max_abs_diff_all_steps": worst}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("archs", nargs="*", default=ARCHS)
    ap.add_argument("--keep", help="write the synthetic GGUFs here (default: a temp dir)")
    ap.add_argument("--tol", type=float, default=2e-3, help="max abs logit difference allowed")
    args = ap.parse_args()
    logits_bin = subprocess.run([os.path.join(HERE, "build_llama_logits.sh")], capture_output=True, text=True,
                                check=True).stdout.strip().splitlines()[-1]
    out_dir = args.keep or tempfile.mkdtemp(prefix="synth-gguf-")
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(1234)
    prompt = [int(t) for t in rng.integers(100, 40000, size=9)]
    ok = True
    results = []
    for arch in args.archs:
        path = os.path.join(out_dir, f"synthetic-{arch}.gguf")
        write_model(arch, path, rng)
        r = check(arch, path, logits_bin, prompt, n_gen=8)
        r["ok"] = r["prompt_logits_max_abs_diff"] < args.tol and r["top8_logits_max_abs_diff_all_steps"] < args.tol \
            and r["argmax_agree"] == r["steps"]
        ok &= r["ok"]
        results.append(r)
        print(json.dumps(r))
    if not args.keep:
        for f in os.listdir(out_dir):
            os.remove(os.path.join(out_dir, f))
        os.rmdir(out_dir)
    print("OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
