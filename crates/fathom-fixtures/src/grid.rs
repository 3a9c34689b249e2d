//! The synthetic checkpoints of the plan-vs-peak memory grids (`fathom
//! bench memory`, docs/benchmark_results/memory-cpu-*.md and, on a GPU,
//! memory-cuda-*.md).
//!
//! Each is a real model's shapes — head counts, GQA ratio, head size,
//! widths, vocabulary, sliding windows — written as a GGUF that runs:
//! deterministic random weights and a byte-level BPE vocabulary without
//! merges (prompts are token ids). Only an MoE is cut to fewer layers, so
//! that its file stays small; its layers keep the real expert count and
//! widths. The same definitions written header-only (sparse) are enough to
//! re-derive the plans, which is what the pinned test does.

use std::io;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::gguf::{GgufTensorType, GgufValue, GgufWriter};
use crate::gguf_model::gguf_writer;
use crate::models::{
    gemma3_1b, llama_3_1_8b, qwen2_5_7b, qwen3_30b_a3b, reshaped, smollm2_135m, tiny_qwen3,
};
use crate::{Data, ModelDef};

/// Seed of the random weights of every grid checkpoint.
pub const GRID_SEED: u64 = 5;

/// One synthetic checkpoint of the grid.
#[derive(Clone, Debug)]
pub struct GridModel {
    /// File name, also the model's key in the recorded results.
    pub file: &'static str,
    /// Which real model's shapes it has.
    pub shapes_of: &'static str,
    pub model: ModelDef,
    pub ggml_type: GgufTensorType,
}

/// Llama-3.2-1B: 16 layers of 2048, 32 query heads over 8 KV heads of 64,
/// FFN 8192, 128,256-token vocabulary, tied embeddings.
fn llama_3_2_1b() -> ModelDef {
    reshaped(
        &llama_3_1_8b(),
        json!({
            "hidden_size": 2048,
            "intermediate_size": 8192,
            "num_hidden_layers": 16,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "tie_word_embeddings": true,
            "rope_scaling": {
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3"
            },
        }),
    )
}

/// Qwen2.5-0.5B: 24 layers of 896, 14 query heads over 2 KV heads of 64,
/// q/k/v biases, FFN 4864, 151,936-token vocabulary, tied embeddings.
fn qwen2_5_0_5b() -> ModelDef {
    reshaped(
        &qwen2_5_7b(),
        json!({
            "hidden_size": 896,
            "intermediate_size": 4864,
            "num_hidden_layers": 24,
            "num_attention_heads": 14,
            "num_key_value_heads": 2,
            "max_window_layers": 21,
            "tie_word_embeddings": true,
        }),
    )
}

/// Qwen3-0.6B: 28 layers of 1024, 16 query heads over 8 KV heads of 128,
/// per-head q/k norms, FFN 3072, 151,936-token vocabulary, tied.
fn qwen3_0_6b() -> ModelDef {
    reshaped(
        &tiny_qwen3(),
        json!({
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "vocab_size": 151936,
            "max_position_embeddings": 40960,
            "max_window_layers": 28,
            "tie_word_embeddings": true,
        }),
    )
}

/// Qwen3-30B-A3B's layers — 128 experts of width 768, 8 routed per token,
/// 32 query heads over 4 KV heads of 128, its full vocabulary — but 4 of
/// its 48 layers.
fn qwen3_30b_a3b_4_layers() -> ModelDef {
    reshaped(&qwen3_30b_a3b(), json!({"num_hidden_layers": 4}))
}

/// The memory grid's synthetic checkpoints, in the order the grid runs them.
pub fn memory_grid_models() -> Vec<GridModel> {
    vec![
        GridModel {
            file: "llama-3.2-1b-shape-q4_0.gguf",
            shapes_of: "Llama-3.2-1B",
            model: llama_3_2_1b(),
            ggml_type: GgufTensorType::Q4_0,
        },
        GridModel {
            file: "llama-3.2-1b-shape-f16.gguf",
            shapes_of: "Llama-3.2-1B",
            model: llama_3_2_1b(),
            ggml_type: GgufTensorType::F16,
        },
        GridModel {
            file: "qwen2.5-0.5b-shape-q8_0.gguf",
            shapes_of: "Qwen2.5-0.5B",
            model: qwen2_5_0_5b(),
            ggml_type: GgufTensorType::Q8_0,
        },
        GridModel {
            file: "qwen3-0.6b-shape-q8_0.gguf",
            shapes_of: "Qwen3-0.6B",
            model: qwen3_0_6b(),
            ggml_type: GgufTensorType::Q8_0,
        },
        GridModel {
            file: "qwen3-30b-a3b-4-layer-shape-q4_0.gguf",
            shapes_of: "Qwen3-30B-A3B (4 of 48 layers)",
            model: qwen3_30b_a3b_4_layers(),
            ggml_type: GgufTensorType::Q4_0,
        },
        GridModel {
            file: "gemma-3-1b-shape-q8_0.gguf",
            shapes_of: "gemma-3-1b",
            model: gemma3_1b(),
            ggml_type: GgufTensorType::Q8_0,
        },
    ]
}

/// Qwen3-30B-A3B's layers, 16 of its 48 (a third of the file, so the GPU
/// machine writes it in seconds).
fn qwen3_30b_a3b_16_layers() -> ModelDef {
    reshaped(&qwen3_30b_a3b(), json!({"num_hidden_layers": 16}))
}

/// The CUDA memory grid's checkpoints (`fathom bench memory --device
/// cuda`), written on the GPU machine: SmolLM2-135M's shapes in Q4_1,
/// Llama-3.1-8B's in F16 and Q4_K, a third of Qwen3-30B-A3B's layers (the
/// full expert count and widths) in Q4_0, and gemma-3-1b's (sliding
/// windows) in Q8_0.
pub fn cuda_memory_grid_models() -> Vec<GridModel> {
    vec![
        GridModel {
            file: "smollm2-135m-shape-q4_1.gguf",
            shapes_of: "SmolLM2-135M",
            model: smollm2_135m(),
            ggml_type: GgufTensorType::Q4_1,
        },
        GridModel {
            file: "llama-3.1-8b-shape-f16.gguf",
            shapes_of: "Llama-3.1-8B",
            model: llama_3_1_8b(),
            ggml_type: GgufTensorType::F16,
        },
        GridModel {
            file: "llama-3.1-8b-shape-q4_k.gguf",
            shapes_of: "Llama-3.1-8B",
            model: llama_3_1_8b(),
            ggml_type: GgufTensorType::Q4_K,
        },
        GridModel {
            file: "qwen3-30b-a3b-16-layer-shape-q4_0.gguf",
            shapes_of: "Qwen3-30B-A3B (16 of 48 layers)",
            model: qwen3_30b_a3b_16_layers(),
            ggml_type: GgufTensorType::Q4_0,
        },
        GridModel {
            file: "gemma-3-1b-shape-q8_0.gguf",
            shapes_of: "gemma-3-1b",
            model: gemma3_1b(),
            ggml_type: GgufTensorType::Q8_0,
        },
    ]
}

/// Writes `model` into `dir` as a GGUF fathom and llama.cpp can run (its
/// vocabulary as a byte-level BPE without merges), dense with the grid's
/// random weights or header-only with [`Data::Sparse`]. Returns its path.
pub fn write_grid_model(model: &GridModel, dir: &Path, data: Data) -> io::Result<PathBuf> {
    let path = dir.join(model.file);
    write_runnable_gguf(&model.model, model.ggml_type, &path, data)?;
    Ok(path)
}

/// Writes `model` with matrices of `ggml_type` as a GGUF fathom and
/// llama.cpp can run: its vocabulary as a byte-level BPE without merges.
/// Returns the bytes written.
pub fn write_runnable_gguf(
    model: &ModelDef,
    ggml_type: GgufTensorType,
    path: &Path,
    data: Data,
) -> io::Result<u64> {
    runnable(gguf_writer(model, ggml_type)?).write(path, data)
}

/// `writer` with the vocabulary llama.cpp can run: a byte-level BPE
/// without merges.
pub(crate) fn runnable(writer: GgufWriter) -> GgufWriter {
    writer
        .kv("tokenizer.ggml.pre", GgufValue::string("default"))
        .kv(
            "tokenizer.ggml.merges",
            GgufValue::strings(Vec::<String>::new()),
        )
}
