//! The GGUF llama.cpp's `convert_hf_to_gguf.py` would make of a Hugging
//! Face directory this crate writes: the same weights under llama.cpp's
//! names, with the converter's transforms. A test that runs both files
//! and gets the same logits shows that a runtime reading the HF directory
//! directly applies those transforms itself.

use std::collections::HashMap;
use std::io;
use std::path::Path;

use serde_json::Value;

use crate::gguf::GgufTensorType;
use crate::gguf_model::{gguf_name, gguf_writer, stacked_experts};
use crate::grid::runnable;
use crate::random::{Rng, WEIGHTS};
use crate::{DType, ModelDef, TensorDef};

/// Writes, as an F32 GGUF fathom and llama.cpp can run, the weights that
/// [`crate::write_hf_dir`] writes for `model` (an F32 model) with
/// `Data::Random { seed }`, converted as llama.cpp converts Qwen3.5: norms
/// stored as `1 + w` (all but the linear-attention layers' gated norm),
/// `A_log` as the decay rate `−exp(A_log)`, the convolution taps and the
/// shared expert's gate squeezed, the stacked experts' `gate_up_proj`
/// split into llama.cpp's gate and up tensors, and, where a key head serves several
/// value heads, the value heads moved from grouped order (each key head's
/// value heads together, as the HF file stores them) to tiled order
/// (value head h served by key head h mod key heads, as ggml broadcasts).
/// Returns the bytes written.
pub fn write_converted_gguf(model: &ModelDef, path: &Path, seed: u64) -> io::Result<u64> {
    let config = model.text_config();
    let hybrid = config.get("linear_num_value_heads").is_some();
    let gemma = matches!(model.gguf_arch, "gemma3" | "gemma4");
    let heads = ValueHeads::of(config)?;
    let mut values: HashMap<String, Vec<f32>> = HashMap::new();
    for tensor in &model.tensors {
        if tensor.dtype != DType::F32 {
            return Err(invalid(format!(
                "tensor {:?} is {:?}: the converted GGUF takes an F32 model",
                tensor.name, tensor.dtype
            )));
        }
        if let Some(split) = stacked_experts(&tensor.name, &tensor.shape) {
            // gate_up: each expert's gate rows, then its up rows.
            let v = hf_values(tensor, seed);
            let halves = split.len();
            let part = v.len() / tensor.shape[0] as usize / halves;
            for (h, (name, _)) in split.into_iter().enumerate() {
                let out = values.entry(name).or_default();
                for expert in v.chunks_exact(part * halves) {
                    out.extend_from_slice(&expert[h * part..(h + 1) * part]);
                }
            }
            continue;
        }
        let Some((name, _expert)) = gguf_name(&tensor.name, gemma, hybrid)? else {
            continue;
        };
        let converted = convert(tensor, hf_values(tensor, seed), heads.as_ref());
        // Each layer's experts, in order, make one merged tensor.
        values.entry(name).or_default().extend(converted);
    }
    let mut writer = gguf_writer(model, GgufTensorType::F32)?;
    for (name, values) in values {
        writer = writer.f32_values(name, values);
    }
    runnable(writer).write(path, crate::Data::Random { seed })
}

/// The values [`crate::write_safetensors`] draws for an F32 tensor.
fn hf_values(tensor: &TensorDef, seed: u64) -> Vec<f32> {
    let mut rng = Rng::for_tensor(seed, &tensor.name);
    (0..tensor.numel()).map(|_| rng.f32_in(WEIGHTS)).collect()
}

/// A Qwen3.5 model's linear-attention heads, when its key heads each
/// serve several value heads (else the order needs no change).
struct ValueHeads {
    key_heads: usize,
    per_key: usize,
    head_dim: usize,
}

impl ValueHeads {
    fn of(config: &Value) -> io::Result<Option<ValueHeads>> {
        let n = |key: &str| config[key].as_u64().map(|v| v as usize);
        let (Some(kh), Some(vh), Some(hd)) = (
            n("linear_num_key_heads"),
            n("linear_num_value_heads"),
            n("linear_value_head_dim"),
        ) else {
            return Ok(None);
        };
        if kh == 0 || !vh.is_multiple_of(kh) {
            return Err(invalid(format!(
                "{vh} value heads do not divide among {kh} key heads"
            )));
        }
        Ok((vh != kh).then_some(ValueHeads {
            key_heads: kh,
            per_key: vh / kh,
            head_dim: hd,
        }))
    }

    /// `block` holds the value heads one after another, `unit` values
    /// each; returns them in tiled order: grouped head g·per_key + j
    /// (key head g's j-th) becomes head j·key_heads + g.
    fn tiled(&self, block: &[f32], unit: usize) -> Vec<f32> {
        let mut out = vec![0.0; block.len()];
        for g in 0..self.key_heads {
            for j in 0..self.per_key {
                let from = (g * self.per_key + j) * unit;
                let to = (j * self.key_heads + g) * unit;
                out[to..to + unit].copy_from_slice(&block[from..from + unit]);
            }
        }
        out
    }

    /// Rows `start..` of a matrix of `cols` columns, tiled, the rest kept.
    fn tiled_rows(
        &self,
        v: &[f32],
        start_row: usize,
        rows_per_head: usize,
        cols: usize,
    ) -> Vec<f32> {
        let at = start_row * cols;
        let mut out = v[..at].to_vec();
        out.extend(self.tiled(&v[at..], rows_per_head * cols));
        out
    }
}

/// One HF tensor's values as the converter stores them.
fn convert(tensor: &TensorDef, mut v: Vec<f32>, heads: Option<&ValueHeads>) -> Vec<f32> {
    let name = tensor.name.as_str();
    if name.ends_with("norm.weight") && !name.ends_with("linear_attn.norm.weight") {
        v.iter_mut().for_each(|x| *x += 1.0);
    }
    if name.ends_with("linear_attn.A_log") {
        v.iter_mut().for_each(|x| *x = -x.exp());
    }
    let Some(h) = heads.filter(|_| name.contains("linear_attn.")) else {
        return v;
    };
    let cols = tensor.shape.last().copied().unwrap_or(1) as usize;
    let qk_rows = 2 * h.key_heads * h.head_dim;
    let suffix = name.rsplit_once("linear_attn.").map_or("", |(_, s)| s);
    match suffix {
        // q and k keep their order; the value rows move.
        "in_proj_qkv.weight" | "conv1d.weight" => h.tiled_rows(&v, qk_rows, h.head_dim, cols),
        "in_proj_z.weight" => h.tiled_rows(&v, 0, h.head_dim, cols),
        "in_proj_a.weight" | "in_proj_b.weight" => h.tiled_rows(&v, 0, 1, cols),
        "A_log" | "dt_bias" => h.tiled(&v, 1),
        // The output projection reads the value heads along each row.
        "out_proj.weight" => v
            .chunks_exact(cols)
            .flat_map(|row| h.tiled(row, h.head_dim))
            .collect(),
        _ => v,
    }
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}
