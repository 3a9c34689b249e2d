//! Synthetic checkpoints with real architectures' shapes, for tests and
//! benchmarks.
//!
//! The memory planner reads headers only, so a header-only *sparse* file —
//! the header written, the tensor data left as a hole — tests it at real
//! sizes (a 61 GB checkpoint) without real disk. Small dense files with
//! deterministic pseudo-random data serve engine tests; their generator,
//! [`Rng`], is the one the workspace's tests and benches draw from.
//!
//! The formats are written here from their specifications rather than through
//! `fathom-checkpoint`, so that a bug in the readers cannot hide behind the
//! same bug in the writers. Block layouts come from `fathom-ggml`'s table,
//! which checks itself against ggml's block structs at compile time.

mod convert;
mod gguf;
mod gguf_model;
mod gpt_oss;
mod grid;
mod hf;
mod mlx;
mod models;
mod random;
mod safetensors;

pub use convert::write_converted_gguf;
pub use gguf::{GgufTensorInfo, GgufTensorType, GgufValue, GgufWriter};
pub use gguf_model::{gguf_writer, write_gguf};
pub use gpt_oss::{
    gpt_oss_120b, gpt_oss_20b, gpt_oss_tiny, gpt_oss_writer, write_gpt_oss_gguf, GptOssShape,
    GPT_OSS_LIKE,
};
pub use grid::{
    cuda_memory_grid_models, memory_grid_models, write_grid_model, write_runnable_gguf, GridModel,
    GRID_SEED,
};
pub use hf::write_hf_dir;
pub use mlx::mlx_quantize;
pub use models::{
    gemma3_1b, gemma3_4b_multimodal_text, gemma_4_31b, llama_3_1_70b, llama_3_1_8b, qwen2_5_7b,
    qwen3_30b_a3b, qwen3_5_35b_a3b, qwen3_5_4b, reshaped, smollm2_135m, tiny_gemma3, tiny_gemma4,
    tiny_llama, tiny_qwen2, tiny_qwen3, tiny_qwen3_5, tiny_qwen3_5_moe, tiny_qwen3_moe, LIKE,
};
pub use random::{random_token_ids, Rng};

/// A shape `fathom bench fixture --like NAME` writes: its name and what
/// describes it ([`LIKE`], [`GPT_OSS_LIKE`]).
pub type Like<T> = (&'static str, fn() -> T);
pub use safetensors::write_safetensors;

/// Element type of a safetensors tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
    BF16,
    /// MLX packs quantized weights into 32-bit words.
    U32,
}

impl DType {
    pub fn size(self) -> u64 {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// The spelling in a safetensors header.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::U32 => "U32",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorDef {
    pub name: String,
    /// Hugging Face order: `[out_features, in_features]` for a Linear.
    pub shape: Vec<u64>,
    pub dtype: DType,
}

impl TensorDef {
    pub fn new(name: impl Into<String>, shape: &[u64], dtype: DType) -> Self {
        TensorDef {
            name: name.into(),
            shape: shape.to_vec(),
            dtype,
        }
    }

    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    pub fn byte_len(&self) -> u64 {
        self.numel() * self.dtype.size()
    }
}

/// A checkpoint as Hugging Face publishes it: `config.json` plus the tensor
/// table.
#[derive(Clone, Debug)]
pub struct ModelDef {
    pub name: &'static str,
    /// The `config.json` contents, with the real model's field names.
    pub config: serde_json::Value,
    pub tensors: Vec<TensorDef>,
    /// llama.cpp's architecture name, the prefix of its GGUF keys.
    pub gguf_arch: &'static str,
}

impl ModelDef {
    /// Elements as stored, which for an MLX-quantized model counts packed
    /// words, not weights.
    pub fn parameter_count(&self) -> u64 {
        self.tensors.iter().map(TensorDef::numel).sum()
    }

    pub fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(TensorDef::byte_len).sum()
    }

    /// The language model's settings: multimodal checkpoints nest them under
    /// `text_config`.
    pub fn text_config(&self) -> &serde_json::Value {
        self.config.get("text_config").unwrap_or(&self.config)
    }
}

/// What goes where the tensor bytes belong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Data {
    /// A hole: the file has its full length but costs no disk.
    Sparse,
    /// Deterministic values in [-0.1, 0.1) for float types (arbitrary bits
    /// for packed types), derived from the seed and the tensor's name so a
    /// tensor gets the same values however the checkpoint is sharded.
    Random { seed: u64 },
}
