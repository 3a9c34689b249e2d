#!/usr/bin/env python3
"""Converts a llama-family GGUF into a Hugging Face style directory.

  gguf_to_safetensors.py MODEL.gguf OUT_DIR [--dtype f32|f16]

Writes OUT_DIR/config.json (real HF field names), OUT_DIR/model.safetensors
(weights dequantized by the `gguf` package, stored as F32 or F16, HF tensor
names) and, when the GGUF embeds a GPT-2 style BPE tokenizer, vocab.json,
merges.txt, special_tokens_map.json and tokenizer_config.json.

Layout notes:
  * GGUF lists tensor dims fastest-first; a GGUF weight [in, out] is the HF
    Linear weight (out, in), i.e. the numpy array gguf gives us, unchanged.
  * llama.cpp's convert_hf_to_gguf.py (LlamaModel.modify_tensors) permutes the
    rows of q_proj / k_proj for the llama architecture so that llama.cpp can use
    its "normal" rope (rotating adjacent pairs) on what HF rotates as halves
    (NeoX style):
        permute(w, n_head) = w.reshape(n_head, 2, head_dim // 2, in)
                              .swapaxes(1, 2).reshape(w.shape)
    (n_head := n_head_kv for k_proj). We apply the inverse, reshape to
    (n_head, head_dim // 2, 2, in) and swap back, so the output is a genuine HF
    checkpoint. qwen2 / qwen3 GGUFs are not permuted (llama.cpp uses NeoX rope
    for them) and are copied as is.
  * No output.weight in the GGUF means tied embeddings: tie_word_embeddings is
    set and no lm_head.weight is written (HF ties it to embed_tokens).

Safetensors is written directly (8-byte little-endian header length, JSON
header, raw little-endian data), so no extra package is needed.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys

import numpy as np

try:
    import gguf
    from gguf.quants import dequantize
except ImportError:  # pragma: no cover
    sys.exit("needs the gguf package: pip install gguf numpy")

SUPPORTED = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

# GGUF name (after "blk.N.") -> HF name (after "model.layers.N.")
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def field(reader: gguf.GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def f32_repr(x: float) -> float:
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-")) if x is not None else x


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of convert_hf_to_gguf.py's LlamaModel.permute (rows = heads * head_dim)."""
    rows = w.shape[0]
    half = rows // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tensor_array(t) -> np.ndarray:
    arr = dequantize(t.data, t.tensor_type)
    shape = tuple(int(d) for d in reversed(t.shape))
    return np.asarray(arr, dtype=np.float32).reshape(shape)


def write_safetensors(path: str, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    header: dict = {"__metadata__": metadata}
    offset = 0
    names = sorted(tensors)
    for name in names:
        a = tensors[name]
        dtype = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}[a.dtype]
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * ((8 - len(hjson) % 8) % 8)  # keep the data 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for name in names:
            f.write(np.ascontiguousarray(tensors[name]).astype(tensors[name].dtype.newbyteorder("<")).tobytes())


def write_tokenizer(reader: gguf.GGUFReader, out: str, bos: int | None, eos: int | None) -> bool:
    if field(reader, "tokenizer.ggml.model") != "gpt2":
        return False
    tokens = field(reader, "tokenizer.ggml.tokens")
    merges = field(reader, "tokenizer.ggml.merges") or []
    types = field(reader, "tokenizer.ggml.token_type") or []
    with open(os.path.join(out, "vocab.json"), "w") as f:
        json.dump({tok: i for i, tok in enumerate(tokens)}, f, ensure_ascii=False)
    with open(os.path.join(out, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
        for m in merges:
            f.write(m + "\n")
    special = [tokens[i] for i, t in enumerate(types) if t == gguf.TokenType.CONTROL]
    stm = {"additional_special_tokens": special}
    if bos is not None:
        stm["bos_token"] = tokens[bos]
    if eos is not None:
        stm["eos_token"] = tokens[eos]
    unk = field(reader, "tokenizer.ggml.unknown_token_id")
    if unk is not None:
        stm["unk_token"] = tokens[unk]
    pad = field(reader, "tokenizer.ggml.padding_token_id")
    if pad is not None:
        stm["pad_token"] = tokens[pad]
    with open(os.path.join(out, "special_tokens_map.json"), "w") as f:
        json.dump(stm, f, indent=2, ensure_ascii=False)
    cfg = {"tokenizer_class": "GPT2Tokenizer", "add_bos_token": bool(field(reader, "tokenizer.ggml.add_bos_token", False)),
           "model_max_length": 8192, "clean_up_tokenization_spaces": False, **stm}
    tmpl = field(reader, "tokenizer.chat_template")
    if tmpl:
        cfg["chat_template"] = tmpl
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf")
    ap.add_argument("out_dir")
    ap.add_argument("--dtype", choices=["f32", "f16"], default="f32")
    ap.add_argument("--no-tokenizer", action="store_true")
    args = ap.parse_args()

    reader = gguf.GGUFReader(args.gguf)
    arch = field(reader, "general.architecture")
    if arch not in SUPPORTED:
        sys.exit(f"architecture {arch!r} not supported (only {', '.join(SUPPORTED)})")
    a = lambda k, d=None: field(reader, f"{arch}.{k}", d)  # noqa: E731
    n_embd = int(a("embedding_length"))
    n_head = int(a("attention.head_count"))
    n_head_kv = int(a("attention.head_count_kv", n_head))
    head_dim = int(a("attention.key_length", n_embd // n_head))
    names = {t.name for t in reader.tensors}
    tied = "output.weight" not in names
    vocab = a("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    bos = field(reader, "tokenizer.ggml.bos_token_id")
    eos = field(reader, "tokenizer.ggml.eos_token_id")

    config = {
        "architectures": [SUPPORTED[arch]],
        "model_type": arch,
        "hidden_size": n_embd,
        "intermediate_size": int(a("feed_forward_length")),
        "num_hidden_layers": int(a("block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_head_kv,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(a("context_length", 2048)),
        # GGUF stores these as float32; print the shortest float32 repr (1e-05, not 9.99999974e-06)
        "rms_norm_eps": f32_repr(a("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": f32_repr(a("rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "vocab_size": int(vocab),
        "tie_word_embeddings": tied,
        "torch_dtype": "float32" if args.dtype == "f32" else "float16",
        "use_cache": True,
    }
    if arch == "llama":
        config.update({"attention_bias": "blk.0.attn_q.bias" in names, "mlp_bias": False, "pretraining_tp": 1})
    if arch == "qwen3":
        config["attention_bias"] = "blk.0.attn_q.bias" in names
    if bos is not None:
        config["bos_token_id"] = int(bos)
    if eos is not None:
        config["eos_token_id"] = int(eos)
    if a("rope.scaling.type") not in (None, "none"):
        sys.exit("rope scaling present: not handled by this converter")
    if "rope_freqs.weight" in names:
        sys.exit("rope_freqs (llama3 rope scaling) present: not handled by this converter")

    out_dtype = np.float32 if args.dtype == "f32" else np.float16
    tensors: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        if t.name in GLOBAL_NAMES:
            hf = GLOBAL_NAMES[t.name]
        elif t.name.startswith("blk."):
            _, il, rest = t.name.split(".", 2)
            if rest not in LAYER_NAMES:
                sys.exit(f"unexpected tensor {t.name}")
            hf = f"model.layers.{il}.{LAYER_NAMES[rest]}"
        else:
            sys.exit(f"unexpected tensor {t.name}")
        w = tensor_array(t)
        if arch == "llama" and t.name.endswith(("attn_q.weight", "attn_q.bias")):
            w = unpermute_rows(w, n_head)
        elif arch == "llama" and t.name.endswith(("attn_k.weight", "attn_k.bias")):
            w = unpermute_rows(w, n_head_kv)
        tensors[hf] = w.astype(out_dtype)

    os.makedirs(args.out_dir, exist_ok=True)
    write_safetensors(os.path.join(args.out_dir, "model.safetensors"), tensors,
                      {"format": "pt", "source": os.path.basename(args.gguf)})
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    gen = {k: config[k] for k in ("bos_token_id", "eos_token_id") if k in config}
    with open(os.path.join(args.out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    tok = False if args.no_tokenizer else write_tokenizer(reader, args.out_dir, bos, eos)
    print(json.dumps({"out_dir": args.out_dir, "tensors": len(tensors), "dtype": args.dtype,
                      "tied_embeddings": tied, "tokenizer_files": tok}))


if __name__ == "__main__":
    main()
