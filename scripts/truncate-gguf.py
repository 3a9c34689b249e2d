#!/usr/bin/env python3
"""A llama-architecture GGUF cut to its first N layers, with its real weights and tokenizer, optionally with
the token embedding requantized (e.g. Q4_0) to make it smaller: a file of real weights small enough to carry to
a GPU machine (64 MiB a call) for the CUDA-vs-CPU KL-divergence check (docs/quality.md). Not a usable language
model: its perplexity is meaningless, its token distributions are what the check compares.

Usage: truncate-gguf.py IN.gguf OUT.gguf N_LAYERS [EMBED_TYPE]   (needs the `gguf` package, as scripts/test.sh
installs it)
"""
import sys
import gguf
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
r = gguf.GGUFReader(src)
arch = "llama"
w = gguf.GGUFWriter(dst, arch)
for key, field in r.fields.items():
    if key.startswith("GGUF.") or key == "general.architecture":
        continue
    vt = field.types[0]
    if key == f"{arch}.block_count":
        w.add_uint32(key, n)
        continue
    if vt == gguf.GGUFValueType.ARRAY:
        et = field.types[1]
        if et == gguf.GGUFValueType.STRING:
            vals = [bytes(field.parts[i]).decode("utf-8", errors="surrogateescape") for i in field.data]
        else:
            vals = [field.parts[i].tolist()[0] for i in field.data]
        w.add_key_value(key, vals, vt, sub_type=et)
    elif vt == gguf.GGUFValueType.STRING:
        w.add_key_value(key, bytes(field.parts[field.data[0]]).decode("utf-8", errors="surrogateescape"), vt)
    else:
        w.add_key_value(key, field.parts[field.data[0]].tolist()[0], vt)
from gguf import quants
embed_type = gguf.GGMLQuantizationType[sys.argv[4]] if len(sys.argv) > 4 else None
for t in r.tensors:
    if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= n:
        continue
    if t.name == "token_embd.weight" and embed_type is not None:
        # Requantized (from its stored Q8_0) to keep the file small enough to carry.
        values = quants.dequantize(t.data, t.tensor_type)
        w.add_tensor(t.name, quants.quantize(values, embed_type), raw_dtype=embed_type)
        continue
    w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
