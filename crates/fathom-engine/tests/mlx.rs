//! MLX affine 4- and 8-bit checkpoints run in place: their logits equal
//! those of a dense F32 copy whose weights numpy dequantized independently.

mod common;

use std::path::Path;
use std::process::Command;

use common::{compare, engine, inputs, smollm2};
use fathom_checkpoint::Checkpoint;
use fathom_fixtures::{self as fx, Data};
use fathom_plan::KvDtype;

/// Reads model.safetensors of `src`, dequantizes every packed U32 weight
/// with its `.scales` and `.biases` (w = scale * q + bias, values packed
/// little-endian in u32 words), writes an F32 copy to `dst` with the config
/// minus its quantization.
const DEQUANTIZE: &str = r#"
import json, struct, sys
import numpy as np
src, dst = sys.argv[1], sys.argv[2]
cfg = json.load(open(f"{src}/config.json"))
bits, group = cfg["quantization"]["bits"], cfg["quantization"]["group_size"]
for k in ("quantization", "quantization_config"):
    cfg.pop(k, None)
raw = open(f"{src}/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
header.pop("__metadata__", None)
def load(name):
    h = header[name]
    b, e = h["data_offsets"]
    data = raw[8 + n + b:8 + n + e]
    kind = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "U32": np.uint32}[h["dtype"]]
    a = np.frombuffer(data, dtype=kind).reshape(h["shape"])
    if h["dtype"] == "BF16":
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return a
out = {}
for name, h in header.items():
    if name.endswith(".scales") or name.endswith(".biases"):
        continue
    a = load(name)
    if h["dtype"] == "U32":
        prefix = name[: -len(".weight")]
        per = 32 // bits
        shifts = (np.arange(per, dtype=np.uint32) * bits)
        q = ((a[..., None] >> shifts) & ((1 << bits) - 1)).reshape(a.shape[0], -1).astype(np.float32)
        s = load(prefix + ".scales").astype(np.float32)
        z = load(prefix + ".biases").astype(np.float32)
        a = q * np.repeat(s, group, axis=1) + np.repeat(z, group, axis=1)
    out[name] = np.ascontiguousarray(a, dtype=np.float32)
meta, offset = {}, 0
for name, a in out.items():
    meta[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
    offset += a.nbytes
hdr = json.dumps(meta).encode()
hdr += b" " * (-len(hdr) % 8)
import os
os.makedirs(dst, exist_ok=True)
with open(f"{dst}/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(hdr)) + hdr)
    for a in out.values():
        f.write(a.tobytes())
json.dump(cfg, open(f"{dst}/config.json", "w"))
"#;

fn dequantize_with_numpy(src: &Path, dst: &Path) {
    let status = Command::new("python3")
        .args(["-c", DEQUANTIZE])
        .arg(src)
        .arg(dst)
        .status()
        .expect("python3");
    assert!(status.success());
}

fn check(bits: u32) {
    let base = std::env::temp_dir().join(format!("fathom-mlx{bits}-{}", std::process::id()));
    let (quantized, dense) = (base.join("q"), base.join("f32"));
    let model = fx::mlx_quantize(&fx::tiny_llama(), bits, 64);
    fx::write_hf_dir(&model, &quantized, 1, Data::Random { seed: 3 }).unwrap();
    dequantize_with_numpy(&quantized, &dense);
    let tokenizer =
        || fathom_engine::load_tokenizer(&Checkpoint::open(&smollm2()).unwrap()).unwrap();
    let tokens: Vec<u32> = (0..24).map(|i| (i * 53 + 5) % 1000).collect();
    let ours = engine(&quantized, inputs(32, KvDtype::F32), Some(tokenizer()))
        .logits(&tokens)
        .unwrap()
        .to_vec();
    let reference = engine(&dense, inputs(32, KvDtype::F32), Some(tokenizer()))
        .logits(&tokens)
        .unwrap()
        .to_vec();
    let _ = std::fs::remove_dir_all(&base);
    let a = compare(&ours, &reference);
    println!("MLX {bits}-bit vs numpy-dequantized F32: {a:?}");
    // The same products in another order: only float rounding differs.
    assert!(a.same_argmax && a.max_rel < 1e-4, "{a:?}");
}

#[test]
fn mlx_4_bit_matches_its_dequantized_copy() {
    check(4);
}

#[test]
fn mlx_8_bit_matches_its_dequantized_copy() {
    check(8);
}
