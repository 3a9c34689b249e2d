//! The model families the engine tests run and the checkpoint formats
//! their fixtures are written in: one table for families.rs (against
//! numpy), cuda_vs_cpu.rs (CUDA against the CPU) and tensor_parallel.rs
//! (split over ranks against one device).

use std::path::Path;

use fathom_fixtures::{self as fx, Data, GgufTensorType, ModelDef};

/// A family: fathom-fixtures' tiny model of it (few layers, a narrow
/// FFN) given a real model's attention shape — head counts, GQA ratio,
/// head dim — or one that splits over tensor-parallel ranks.
pub struct Family {
    pub name: &'static str,
    tiny: fn() -> ModelDef,
    /// The real model whose attention shape [`Family::real_shaped`] gives.
    pub real: &'static str,
    /// Its hidden size, heads, KV heads and head dim.
    attention: [u64; 4],
    /// Heads and KV heads of [`Family::split_shaped`] (hidden 256, head
    /// dim 64).
    split_heads: [u64; 2],
    /// The tensor-parallel sizes the split shape is run over.
    pub splits: &'static [u64],
}

/// Split over 2 and 4 ranks, the KV heads are split (llama's 2 over 2),
/// held twice (over 4), or a single one is held by every rank (gemma3);
/// besides, biases (qwen2), q/k norms (qwen3), routed experts (qwen3_moe),
/// sliding windows and post norms (gemma3).
pub const FAMILIES: [Family; 5] = [
    // SmolLM2-135M: 9 heads over 3 KV heads of 64.
    Family {
        name: "llama",
        tiny: fx::tiny_llama,
        real: "SmolLM2-135M",
        attention: [576, 9, 3, 64],
        split_heads: [4, 2],
        splits: &[2, 4],
    },
    // Qwen2.5-0.5B: 14 heads over 2 KV heads of 64 (7:1), attention biases.
    Family {
        name: "qwen2",
        tiny: fx::tiny_qwen2,
        real: "Qwen2.5-0.5B",
        attention: [896, 14, 2, 64],
        split_heads: [4, 2],
        splits: &[2],
    },
    // Qwen3-8B: 32 heads over 8 KV heads of 128 (4:1), q/k norms.
    Family {
        name: "qwen3",
        tiny: fx::tiny_qwen3,
        real: "Qwen3-8B",
        attention: [512, 32, 8, 128],
        split_heads: [4, 2],
        splits: &[2, 4],
    },
    // Qwen3-30B-A3B: 32 heads over 4 KV heads of 128 (8:1), experts routed
    // top-2 of 4.
    Family {
        name: "qwen3_moe",
        tiny: fx::tiny_qwen3_moe,
        real: "Qwen3-30B-A3B",
        attention: [512, 32, 4, 128],
        split_heads: [4, 2],
        splits: &[2],
    },
    // Gemma-3-1B: 4 heads over 1 KV head of 256; the fixture's window of
    // 16, global attention every 2nd layer.
    Family {
        name: "gemma3",
        tiny: fx::tiny_gemma3,
        real: "Gemma-3-1B",
        attention: [1152, 4, 1, 256],
        split_heads: [4, 1],
        splits: &[2, 4],
    },
];

/// The family called `name`.
pub fn family(name: &str) -> &'static Family {
    FAMILIES
        .iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no family {name:?} in FAMILIES"))
}

impl Family {
    /// The tiny model with [`Family::real`]'s attention shape.
    pub fn real_shaped(&self) -> ModelDef {
        let [hidden, heads, kv_heads, head_dim] = self.attention;
        fx::reshaped(
            &(self.tiny)(),
            attention_shape(hidden, heads, kv_heads, head_dim),
        )
    }

    /// The tiny model with heads that split over [`Family::splits`] ranks.
    pub fn split_shaped(&self) -> ModelDef {
        let [heads, kv_heads] = self.split_heads;
        fx::reshaped(&(self.tiny)(), attention_shape(256, heads, kv_heads, 64))
    }

    /// The GGUF types the real-shaped model is written in: all of them,
    /// k-quants only where rows are whole 256-value blocks (the 512-wide
    /// shapes).
    pub fn gguf_types(&self) -> impl Iterator<Item = GgufTensorType> {
        let k_quants = self.attention[0].is_multiple_of(256);
        GgufTensorType::ALL
            .into_iter()
            .filter(move |ty| k_quants || ty.block_elems() != 256)
    }
}

/// A checkpoint format a fixture is written in.
#[derive(Clone, Copy, Debug)]
pub enum Format {
    /// A GGUF fathom and llama.cpp can run, matrices of this type.
    Gguf(GgufTensorType),
    /// An HF directory of one F32 safetensors file.
    Safetensors,
    /// An HF directory of MLX affine weights of this many bits, groups of
    /// 64.
    Mlx(u32),
}

/// The formats besides GGUF, compared on llama alone (their loaders do
/// not depend on the family).
pub const HF_FORMATS: [Format; 3] = [Format::Safetensors, Format::Mlx(4), Format::Mlx(8)];

impl Format {
    pub fn name(self) -> String {
        match self {
            Format::Gguf(ty) => ty.name().to_string(),
            Format::Safetensors => "safetensors F32".to_string(),
            Format::Mlx(bits) => format!("mlx {bits}-bit"),
        }
    }

    /// Writes `model` in this format, with random weights from `seed`, at
    /// `path`: a file for GGUF, a directory otherwise.
    pub fn write(self, model: &ModelDef, path: &Path, seed: u64) {
        let data = Data::Random { seed };
        match self {
            Format::Gguf(ty) => {
                fx::write_runnable_gguf(model, ty, path, data).unwrap();
            }
            Format::Safetensors => fx::write_hf_dir(model, path, 1, data).unwrap(),
            Format::Mlx(bits) => {
                fx::write_hf_dir(&fx::mlx_quantize(model, bits, 64), path, 1, data).unwrap()
            }
        }
    }
}

/// fathom-fixtures' tiny Gemma 4 (sliding and global layers alternating,
/// a 16-token window) in gemma-4-31B's head shapes at hidden 512: 32
/// heads, sliding ones over 16 KV heads of 256, global ones over 4 KV
/// heads of 512 whose values are the keys' projection.
pub fn gemma4_shaped() -> ModelDef {
    fx::reshaped(
        &fx::tiny_gemma4(),
        serde_json::json!({
            "hidden_size": 512,
            "num_attention_heads": 32,
            "num_key_value_heads": 16,
            "head_dim": 256,
            "global_head_dim": 512,
            "num_global_key_value_heads": 4,
        }),
    )
}

/// Config overrides giving a fixture an attention shape, with a small FFN
/// and 2 layers.
fn attention_shape(hidden: u64, heads: u64, kv_heads: u64, head_dim: u64) -> serde_json::Value {
    serde_json::json!({
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
    })
}

/// tiny-qwen3.5 in Qwen3.5-4B's head shapes (16 heads over 4 KV heads of
/// 256; 16 key and 32 value heads of 128 in the linear layers) at hidden
/// 512.
pub fn qwen3_5_shaped() -> ModelDef {
    fx::reshaped(
        &fx::tiny_qwen3_5(),
        serde_json::json!({
            "hidden_size": 512,
            "num_attention_heads": 16,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 32,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "mrope_section": [11, 11, 10],
        }),
    )
}
