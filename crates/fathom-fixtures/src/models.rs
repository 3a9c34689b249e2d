//! Real models' `config.json` contents and tensor tables, and tiny variants
//! of each family for fast dense tests.
//!
//! Each tensor table is derived from its config, so the two cannot disagree.

use serde_json::{json, Value};

use crate::{DType, ModelDef, TensorDef};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    Llama,
    Qwen2,
    Qwen3,
    Qwen3Moe,
    Gemma3,
    Gemma4,
    Qwen35,
    Qwen35Moe,
}

impl Family {
    const ALL: [Family; 8] = [
        Family::Llama,
        Family::Qwen2,
        Family::Qwen3,
        Family::Qwen3Moe,
        Family::Gemma3,
        Family::Gemma4,
        Family::Qwen35,
        Family::Qwen35Moe,
    ];

    fn gguf_arch(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Qwen3Moe => "qwen3moe",
            Family::Gemma3 => "gemma3",
            Family::Gemma4 => "gemma4",
            Family::Qwen35 => "qwen35",
            Family::Qwen35Moe => "qwen35moe",
        }
    }

    fn hybrid(self) -> bool {
        matches!(self, Family::Qwen35 | Family::Qwen35Moe)
    }

    fn moe(self) -> bool {
        matches!(self, Family::Qwen3Moe | Family::Qwen35Moe)
    }
}

/// Meta's base model: BF16, untied, llama3 rope scaling to 128k.
pub fn llama_3_1_8b() -> ModelDef {
    decoder_model("Llama-3.1-8B", Family::Llama, llama_3_1_8b_config())
}

/// The real shapes `fathom bench fixture --like NAME` writes, by name
/// (gpt-oss's take their own writer: [`crate::GPT_OSS_LIKE`]).
pub const LIKE: [crate::Like<ModelDef>; 9] = [
    ("smollm2-135m", smollm2_135m),
    ("llama-3.1-8b", llama_3_1_8b),
    ("llama-3.1-70b", llama_3_1_70b),
    ("qwen3-32b", qwen3_32b),
    ("qwen3-30b-a3b", qwen3_30b_a3b),
    ("gemma3-1b", gemma3_1b),
    ("gemma-4-31b", gemma_4_31b),
    ("qwen3.5-4b", qwen3_5_4b),
    ("qwen3.5-35b-a3b", qwen3_5_35b_a3b),
];

/// Llama-3.1-8B's block at 70B: 80 layers of 8192, 64 heads over 8 KV
/// heads, BF16, untied (about 141 GB): the shape tensor parallelism is for.
pub fn llama_3_1_70b() -> ModelDef {
    decoder_model("Llama-3.1-70B", Family::Llama, llama_3_1_70b_config())
}

/// Qwen3-32B: 64 dense layers of 5120, 64 heads over 8 KV heads (per-head
/// q/k norms), untied, BF16 (about 66 GB): the model a 24 GB card runs
/// split at long context.
pub fn qwen3_32b() -> ModelDef {
    decoder_model("Qwen3-32B", Family::Qwen3, qwen3_32b_config())
}

/// The Instruct release, whose config has the 32k context the brief asks for
/// (the base model's says 131072); biases on q/k/v, untied.
pub fn qwen2_5_7b() -> ModelDef {
    decoder_model("Qwen2.5-7B-Instruct", Family::Qwen2, qwen2_5_7b_config())
}

/// 128 experts of which 8 are used per token, in every one of 48 layers;
/// about 61 GB in BF16.
pub fn qwen3_30b_a3b() -> ModelDef {
    decoder_model("Qwen3-30B-A3B", Family::Qwen3Moe, qwen3_30b_a3b_config())
}

/// Qwen3.5-4B's language model: 32 layers of 2560, three gated-delta-rule
/// layers to each gated full-attention one, tied embeddings, BF16. The
/// published checkpoint's one multi-token-prediction layer is left out.
pub fn qwen3_5_4b() -> ModelDef {
    decoder_model("Qwen3.5-4B", Family::Qwen35, qwen3_5_4b_config())
}

/// Qwen3.5-35B-A3B's language model: 40 hybrid layers of 2048, 256
/// experts of which 8 are used plus a gated shared expert in every layer,
/// untied, BF16 (about 69 GB). No multi-token-prediction layer.
pub fn qwen3_5_35b_a3b() -> ModelDef {
    decoder_model(
        "Qwen3.5-35B-A3B",
        Family::Qwen35Moe,
        qwen3_5_35b_a3b_config(),
    )
}

/// Text-only Gemma 3: tied embeddings, five sliding-window layers per full
/// one.
pub fn gemma3_1b() -> ModelDef {
    decoder_model("gemma-3-1b-it", Family::Gemma3, gemma3_1b_config())
}

/// Gemma 4 31B's language model: 60 layers of 5376, five sliding-window
/// layers (32 heads of 256 over 16 KV heads, window 1024) to each global
/// one (32 heads of 512 over 4 KV heads whose values are the keys'
/// projection), tied embeddings, BF16 (about 61 GB).
pub fn gemma_4_31b() -> ModelDef {
    decoder_model("gemma-4-31B-it", Family::Gemma4, gemma_4_31b_config())
}

/// The multimodal Gemma 3 checkpoint: the language model's settings under
/// `text_config` and its tensors under `language_model.model.`, beside the
/// SigLIP vision tower (`vision_tower.vision_model.`) and the projector
/// (`multi_modal_projector.`), which a text-only runtime must skip. The real
/// `text_config` leaves most values to defaults; here they are spelled out.
pub fn gemma3_4b_multimodal_text() -> ModelDef {
    let config = gemma3_4b_config();
    let dtype = dtype_of(&config);
    let text = &config["text_config"];
    let mut tensors = decoder(Family::Gemma3, text, "language_model.", dtype);
    tensors.extend(siglip(
        &config["vision_config"],
        num(text, "hidden_size"),
        dtype,
    ));
    ModelDef {
        name: "gemma-3-4b-it",
        config,
        tensors,
        gguf_arch: Family::Gemma3.gguf_arch(),
    }
}

/// Llama family at 135M parameters: GQA 9/3, tied embeddings. The Instruct
/// config, matching the project's real SmolLM2 test model.
pub fn smollm2_135m() -> ModelDef {
    decoder_model(
        "SmolLM2-135M-Instruct",
        Family::Llama,
        smollm2_135m_config(),
    )
}

/// Llama-3.1 config shrunk to two layers of width 256, F32, untied, without
/// rope scaling. Widths are multiples of 256 so every GGUF block type
/// applies.
pub fn tiny_llama() -> ModelDef {
    let config = with(
        llama_3_1_8b_config(),
        json!({"rope_scaling": null, "bos_token_id": 1, "eos_token_id": 2}),
    );
    decoder_model("tiny-llama", Family::Llama, with(config, tiny_dims()))
}

/// Qwen2.5 config shrunk like [`tiny_llama`], keeping the q/k/v biases.
pub fn tiny_qwen2() -> ModelDef {
    let config = with(
        qwen2_5_7b_config(),
        json!({"bos_token_id": 1, "eos_token_id": 2, "max_window_layers": 2}),
    );
    decoder_model("tiny-qwen2", Family::Qwen2, with(config, tiny_dims()))
}

/// A dense Qwen3 (per-head q/k norms, no biases, one FFN): Qwen3-32B's
/// config shrunk like [`tiny_llama`].
pub fn tiny_qwen3() -> ModelDef {
    let config = with(
        qwen3_32b_config(),
        json!({"bos_token_id": 1, "eos_token_id": 2, "max_window_layers": 2}),
    );
    decoder_model("tiny-qwen3", Family::Qwen3, with(config, tiny_dims()))
}

/// Qwen3-MoE config shrunk like [`tiny_llama`], with 4 experts of which 2
/// are used.
pub fn tiny_qwen3_moe() -> ModelDef {
    let config = with(
        qwen3_30b_a3b_config(),
        json!({
            "bos_token_id": 1,
            "eos_token_id": 2,
            "max_window_layers": 2,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 256,
        }),
    );
    decoder_model(
        "tiny-qwen3-moe",
        Family::Qwen3Moe,
        with(config, tiny_dims()),
    )
}

/// Qwen3.5-4B's config shrunk like [`tiny_llama`] to four layers (three
/// linear-attention, one gated full attention), with 2 key and 4 value
/// heads of 32 in the linear layers and a 16-value rope.
pub fn tiny_qwen3_5() -> ModelDef {
    let config = with(qwen3_5_4b_config(), tiny_dims());
    let config = with(
        config,
        json!({
            "num_hidden_layers": 4,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 32,
            "linear_value_head_dim": 32,
            "mrope_section": [3, 3, 2],
            "bos_token_id": 1,
            "eos_token_id": 2,
        }),
    );
    decoder_model("tiny-qwen3.5", Family::Qwen35, config)
}

/// [`tiny_qwen3_5`] with Qwen3.5-35B-A3B's FFN: 4 experts of 256, 2
/// used, and a gated shared expert of 256.
pub fn tiny_qwen3_5_moe() -> ModelDef {
    let config = with(
        tiny_qwen3_5().config,
        json!({
            "architectures": ["Qwen3_5MoeForCausalLM"],
            "model_type": "qwen3_5_moe_text",
            "intermediate_size": null,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 256,
            "shared_expert_intermediate_size": 256,
        }),
    );
    decoder_model("tiny-qwen3.5-moe", Family::Qwen35Moe, config)
}

/// Gemma-3-1B config shrunk like [`tiny_llama`] (one KV head, as the real
/// model), with a 16-token window and the pattern sliding, full.
pub fn tiny_gemma3() -> ModelDef {
    let config = with(gemma3_1b_config(), tiny_dims());
    let config = with(
        config,
        json!({
            "num_key_value_heads": 1,
            "query_pre_attn_scalar": 64,
            "sliding_window": 16,
            "sliding_window_pattern": 2,
            "layer_types": gemma3_layer_types(2, 2),
        }),
    );
    decoder_model("tiny-gemma3", Family::Gemma3, config)
}

/// Gemma 4 31B's config shrunk like [`tiny_llama`] to four layers
/// (sliding, global, sliding, global) with a 16-token window: sliding heads
/// of 64 over 2 KV heads, global heads of 128 over one KV head whose
/// values are the keys' projection.
pub fn tiny_gemma4() -> ModelDef {
    let config = with(gemma_4_31b_config(), tiny_dims());
    let config = with(
        config,
        json!({
            "num_hidden_layers": 4,
            "global_head_dim": 128,
            "num_global_key_value_heads": 1,
            "sliding_window": 16,
            "layer_types": gemma3_layer_types(4, 2),
        }),
    );
    decoder_model("tiny-gemma4", Family::Gemma4, config)
}

fn tiny_dims() -> Value {
    json!({
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "vocab_size": 1024,
        "max_position_embeddings": 2048,
        "torch_dtype": "float32",
    })
}

fn llama_3_1_8b_config() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": false,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 131072,
        "mlp_bias": false,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3"
        },
        "rope_theta": 500000.0,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.43.0.dev0",
        "use_cache": true,
        "vocab_size": 128256
    })
}

/// Meta's published `config.json` differs from the 8B's only in these.
fn llama_3_1_70b_config() -> Value {
    with(
        llama_3_1_8b_config(),
        json!({
            "hidden_size": 8192,
            "intermediate_size": 28672,
            "num_attention_heads": 64,
            "num_hidden_layers": 80,
        }),
    )
}

fn qwen2_5_7b_config() -> Value {
    json!({
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "hidden_act": "silu",
        "hidden_size": 3584,
        "initializer_range": 0.02,
        "intermediate_size": 18944,
        "max_position_embeddings": 32768,
        "max_window_layers": 28,
        "model_type": "qwen2",
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 131072,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.43.1",
        "use_cache": true,
        "use_sliding_window": false,
        "vocab_size": 152064
    })
}

/// Qwen's published `config.json` for Qwen3-30B-A3B differs from
/// Qwen3-32B's ([`qwen3_32b_config`]) in these.
fn qwen3_30b_a3b_config() -> Value {
    with(
        qwen3_32b_config(),
        json!({
            "architectures": ["Qwen3MoeForCausalLM"],
            "decoder_sparse_step": 1,
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "max_window_layers": 48,
            "mlp_only_layers": [],
            "model_type": "qwen3_moe",
            "moe_intermediate_size": 768,
            "norm_topk_prob": true,
            "num_attention_heads": 32,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "num_hidden_layers": 48,
            "num_key_value_heads": 4,
            "output_router_logits": false,
            "router_aux_loss_coef": 0.001,
        }),
    )
}

/// Qwen's published `config.json` for Qwen3-32B.
fn qwen3_32b_config() -> Value {
    json!({
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": false,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "initializer_range": 0.02,
        "intermediate_size": 25600,
        "max_position_embeddings": 40960,
        "max_window_layers": 64,
        "model_type": "qwen3",
        "num_attention_heads": 64,
        "num_hidden_layers": 64,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_scaling": null,
        "rope_theta": 1000000.0,
        "sliding_window": null,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": true,
        "use_sliding_window": false,
        "vocab_size": 151936
    })
}

fn gemma3_1b_config() -> Value {
    json!({
        "architectures": ["Gemma3ForCausalLM"],
        "attention_bias": false,
        "attention_dropout": 0.0,
        "attn_logit_softcapping": null,
        "bos_token_id": 2,
        "cache_implementation": "hybrid",
        "eos_token_id": [1, 106],
        "final_logit_softcapping": null,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 1152,
        "initializer_range": 0.02,
        "intermediate_size": 6912,
        "layer_types": gemma3_layer_types(26, 6),
        "max_position_embeddings": 32768,
        "model_type": "gemma3_text",
        "num_attention_heads": 4,
        "num_hidden_layers": 26,
        "num_key_value_heads": 1,
        "pad_token_id": 0,
        "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-06,
        "rope_local_base_freq": 10000,
        "rope_scaling": null,
        "rope_theta": 1000000,
        "sliding_window": 512,
        "sliding_window_pattern": 6,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.50.0.dev0",
        "use_cache": true,
        "vocab_size": 262144
    })
}

fn gemma3_4b_config() -> Value {
    json!({
        "architectures": ["Gemma3ForConditionalGeneration"],
        "boi_token_index": 255999,
        "eoi_token_index": 256000,
        "eos_token_id": [1, 106],
        "image_token_index": 262144,
        "initializer_range": 0.02,
        "mm_tokens_per_image": 256,
        "model_type": "gemma3",
        "text_config": {
            "attention_bias": false,
            "attention_dropout": 0.0,
            "attn_logit_softcapping": null,
            "final_logit_softcapping": null,
            "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh",
            "hidden_size": 2560,
            "intermediate_size": 10240,
            "layer_types": gemma3_layer_types(34, 6),
            "max_position_embeddings": 131072,
            "model_type": "gemma3_text",
            "num_attention_heads": 8,
            "num_hidden_layers": 34,
            "num_key_value_heads": 4,
            "query_pre_attn_scalar": 256,
            "rms_norm_eps": 1e-06,
            "rope_local_base_freq": 10000.0,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "rope_theta": 1000000.0,
            "sliding_window": 1024,
            "sliding_window_pattern": 6,
            "vocab_size": 262208
        },
        "torch_dtype": "bfloat16",
        "transformers_version": "4.50.0.dev0",
        "vision_config": {
            "hidden_size": 1152,
            "image_size": 896,
            "intermediate_size": 4304,
            "model_type": "siglip_vision_model",
            "num_attention_heads": 16,
            "num_hidden_layers": 27,
            "patch_size": 14,
            "vision_use_head": false
        }
    })
}

/// The language model's settings of Qwen3.5-4B's `text_config`.
fn qwen3_5_4b_config() -> Value {
    json!({
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "hidden_size": 2560,
        "intermediate_size": 9216,
        "num_hidden_layers": 32,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "full_attention_interval": 4,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
        "rope_theta": 10_000_000.0,
        "rms_norm_eps": 1e-6,
        "vocab_size": 248_320,
        "max_position_embeddings": 262_144,
        "tie_word_embeddings": true,
        "bos_token_id": 248_044,
        "eos_token_id": 248_044,
        "torch_dtype": "bfloat16",
    })
}

/// Qwen3.5-35B-A3B's `text_config`, language model only: the 4B's
/// linear-attention heads and rope, at another width, with experts.
fn qwen3_5_35b_a3b_config() -> Value {
    with(
        qwen3_5_4b_config(),
        json!({
            "architectures": ["Qwen3_5MoeForCausalLM"],
            "model_type": "qwen3_5_moe_text",
            "hidden_size": 2048,
            "intermediate_size": null,
            "num_hidden_layers": 40,
            "num_key_value_heads": 2,
            "num_experts": 256,
            "num_experts_per_tok": 8,
            "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512,
            "tie_word_embeddings": false,
        }),
    )
}

fn smollm2_135m_config() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": false,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 576,
        "initializer_range": 0.041666666666666664,
        "intermediate_size": 1536,
        "is_llama_config": true,
        "max_position_embeddings": 8192,
        "mlp_bias": false,
        "model_type": "llama",
        "num_attention_heads": 9,
        "num_hidden_layers": 30,
        "num_key_value_heads": 3,
        "pad_token_id": 2,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_interleaved": false,
        "rope_scaling": null,
        "rope_theta": 100000,
        "tie_word_embeddings": true,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.42.3",
        "use_cache": true,
        "vocab_size": 49152
    })
}

fn gemma_4_31b_config() -> Value {
    json!({
        "architectures": ["Gemma4ForCausalLM"],
        "attention_bias": false,
        "attention_k_eq_v": true,
        "bos_token_id": 2,
        "enable_moe_block": false,
        "eos_token_id": [1, 106],
        "final_logit_softcapping": 30.0,
        "global_head_dim": 512,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 5376,
        "hidden_size_per_layer_input": 0,
        "intermediate_size": 21504,
        "layer_types": gemma3_layer_types(60, 6),
        "max_position_embeddings": 262144,
        "model_type": "gemma4_text",
        "num_attention_heads": 32,
        "num_global_key_value_heads": 4,
        "num_hidden_layers": 60,
        "num_key_value_heads": 16,
        "num_kv_shared_layers": 0,
        "pad_token_id": 0,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "full_attention": {
                "partial_rotary_factor": 0.25,
                "rope_theta": 1000000.0,
                "rope_type": "proportional"
            },
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}
        },
        "sliding_window": 1024,
        "tie_word_embeddings": true,
        "torch_dtype": "bfloat16",
        "use_double_wide_mlp": false,
        "vocab_size": 262144
    })
}

/// Transformers' rule: every `pattern`-th layer attends to everything, the
/// rest to a sliding window.
fn gemma3_layer_types(layers: usize, pattern: usize) -> Value {
    (1..=layers)
        .map(|i| {
            if i % pattern == 0 {
                "full_attention"
            } else {
                "sliding_attention"
            }
        })
        .collect()
}

/// `model` with some config fields replaced and its tensor table rebuilt
/// for them: real attention shapes at a size tests can afford, e.g.
/// `reshaped(&tiny_qwen2(), json!({"num_attention_heads": 14, ...}))`.
/// Panics for models that are not a plain decoder of a known family.
pub fn reshaped(model: &ModelDef, overrides: Value) -> ModelDef {
    let family = Family::ALL
        .into_iter()
        .find(|f| f.gguf_arch() == model.gguf_arch && model.config.get("text_config").is_none())
        .expect("a plain decoder of a known family");
    decoder_model(model.name, family, with(model.config.clone(), overrides))
}

fn with(mut config: Value, overrides: Value) -> Value {
    if let Value::Object(fields) = overrides {
        for (key, value) in fields {
            config[key] = value;
        }
    }
    config
}

fn decoder_model(name: &'static str, family: Family, config: Value) -> ModelDef {
    let tensors = decoder(family, &config, "", dtype_of(&config));
    ModelDef {
        name,
        config,
        tensors,
        gguf_arch: family.gguf_arch(),
    }
}

fn dtype_of(config: &Value) -> DType {
    match config["torch_dtype"].as_str() {
        Some("float32") => DType::F32,
        Some("float16") => DType::F16,
        _ => DType::BF16,
    }
}

fn num(config: &Value, key: &str) -> u64 {
    config[key]
        .as_u64()
        .unwrap_or_else(|| panic!("fixture config lacks the integer {key:?}"))
}

/// The tensor table of a decoder-only language model, in the order of its
/// modules; `outer` prefixes `model.` and `lm_head.`.
fn decoder(family: Family, config: &Value, outer: &str, dtype: DType) -> Vec<TensorDef> {
    let hidden = num(config, "hidden_size");
    let heads = num(config, "num_attention_heads");
    let kv_heads = num(config, "num_key_value_heads");
    let head_dim = config["head_dim"].as_u64().unwrap_or(hidden / heads);
    let ffn = config["intermediate_size"].as_u64().unwrap_or(0);
    let vocab = num(config, "vocab_size");
    let tied = config["tie_word_embeddings"]
        .as_bool()
        .unwrap_or(matches!(family, Family::Gemma3 | Family::Gemma4));
    let q_out = heads * head_dim;
    let kv_out = kv_heads * head_dim;

    let mut tensors = Vec::new();
    let mut add = |name: String, shape: &[u64]| tensors.push(TensorDef::new(name, shape, dtype));
    add(
        format!("{outer}model.embed_tokens.weight"),
        &[vocab, hidden],
    );
    let interval = config["full_attention_interval"].as_u64().unwrap_or(1);
    for layer in 0..num(config, "num_hidden_layers") {
        let p = format!("{outer}model.layers.{layer}.");
        add(format!("{p}input_layernorm.weight"), &[hidden]);
        if family.hybrid() && !(layer + 1).is_multiple_of(interval) {
            gated_delta_rule(config, &p, hidden, &mut add);
            add(format!("{p}post_attention_layernorm.weight"), &[hidden]);
            mlp(family, config, &p, hidden, ffn, &mut add);
            continue;
        }
        if family == Family::Gemma4 {
            gemma4_attention(config, &p, layer, &mut add);
        } else {
            // Qwen3.5's q projection carries an output gate per head.
            let q_out = if family.hybrid() { 2 * q_out } else { q_out };
            for (proj, out) in [("q", q_out), ("k", kv_out), ("v", kv_out)] {
                add(format!("{p}self_attn.{proj}_proj.weight"), &[out, hidden]);
                if family == Family::Qwen2 {
                    add(format!("{p}self_attn.{proj}_proj.bias"), &[out]);
                }
            }
            add(
                format!("{p}self_attn.o_proj.weight"),
                &[hidden, heads * head_dim],
            );
            if family != Family::Llama && family != Family::Qwen2 {
                add(format!("{p}self_attn.q_norm.weight"), &[head_dim]);
                add(format!("{p}self_attn.k_norm.weight"), &[head_dim]);
            }
        }
        add(format!("{p}post_attention_layernorm.weight"), &[hidden]);
        if matches!(family, Family::Gemma3 | Family::Gemma4) {
            add(format!("{p}pre_feedforward_layernorm.weight"), &[hidden]);
            add(format!("{p}post_feedforward_layernorm.weight"), &[hidden]);
        }
        mlp(family, config, &p, hidden, ffn, &mut add);
        if family == Family::Gemma4 {
            add(format!("{p}layer_scalar"), &[1]);
        }
    }
    add(format!("{outer}model.norm.weight"), &[hidden]);
    if !tied {
        add(format!("{outer}lm_head.weight"), &[vocab, hidden]);
    }
    tensors
}

/// Whether Gemma 4 layer `layer` is a sliding-window one (`layer_types`).
pub(crate) fn gemma4_sliding(config: &Value, layer: u64) -> bool {
    config["layer_types"][layer as usize] == "sliding_attention"
}

/// A Gemma 4 layer's attention: sliding layers have `head_dim` heads over
/// `num_key_value_heads`; global ones `global_head_dim` heads over
/// `num_global_key_value_heads`, and no v projection when
/// `attention_k_eq_v` (the values are the keys' projection).
fn gemma4_attention(config: &Value, p: &str, layer: u64, add: &mut impl FnMut(String, &[u64])) {
    let hidden = num(config, "hidden_size");
    let heads = num(config, "num_attention_heads");
    let sliding = gemma4_sliding(config, layer);
    let (head, kv_heads) = if sliding {
        (num(config, "head_dim"), num(config, "num_key_value_heads"))
    } else {
        (
            num(config, "global_head_dim"),
            num(config, "num_global_key_value_heads"),
        )
    };
    let a = format!("{p}self_attn.");
    add(format!("{a}q_proj.weight"), &[heads * head, hidden]);
    add(format!("{a}k_proj.weight"), &[kv_heads * head, hidden]);
    if sliding || config["attention_k_eq_v"] != true {
        add(format!("{a}v_proj.weight"), &[kv_heads * head, hidden]);
    }
    add(format!("{a}o_proj.weight"), &[hidden, heads * head]);
    add(format!("{a}q_norm.weight"), &[head]);
    add(format!("{a}k_norm.weight"), &[head]);
}

/// A layer's FFN: routed experts (with Qwen3.5's gated shared expert), or
/// one gated FFN.
fn mlp(
    family: Family,
    config: &Value,
    p: &str,
    hidden: u64,
    ffn: u64,
    add: &mut impl FnMut(String, &[u64]),
) {
    let gated = |add: &mut dyn FnMut(String, &[u64]), x: &str, width: u64| {
        add(format!("{x}gate_proj.weight"), &[width, hidden]);
        add(format!("{x}up_proj.weight"), &[width, hidden]);
        add(format!("{x}down_proj.weight"), &[hidden, width]);
    };
    if !family.moe() {
        return gated(add, &format!("{p}mlp."), ffn);
    }
    let experts = num(config, "num_experts");
    let expert_ffn = num(config, "moe_intermediate_size");
    add(format!("{p}mlp.gate.weight"), &[experts, hidden]);
    if family.hybrid() {
        // Qwen3.5 MoE's files stack a layer's experts, gate then up rows
        // in one tensor, with no `.weight`.
        add(
            format!("{p}mlp.experts.gate_up_proj"),
            &[experts, 2 * expert_ffn, hidden],
        );
        add(
            format!("{p}mlp.experts.down_proj"),
            &[experts, hidden, expert_ffn],
        );
    } else {
        for e in 0..experts {
            gated(add, &format!("{p}mlp.experts.{e}."), expert_ffn);
        }
    }
    if let Some(shared) = config["shared_expert_intermediate_size"].as_u64() {
        gated(add, &format!("{p}mlp.shared_expert."), shared);
        // One sigmoid gate value per token: a Linear of one output, which
        // llama.cpp's converter stores squeezed.
        add(format!("{p}mlp.shared_expert_gate.weight"), &[1, hidden]);
    }
}

/// A Qwen3.5 linear-attention layer: the q/k/v and output-gate input
/// projections, the per-head decay (alpha) and update (beta) projections,
/// the causal convolution (a depthwise Conv1d, `[channels, 1, taps]`), the
/// decay's bias and log-rate, the per-head output norm and the output
/// projection.
fn gated_delta_rule(config: &Value, p: &str, hidden: u64, add: &mut impl FnMut(String, &[u64])) {
    let head = num(config, "linear_key_head_dim");
    let value_heads = num(config, "linear_num_value_heads");
    let inner = value_heads * num(config, "linear_value_head_dim");
    let channels = 2 * num(config, "linear_num_key_heads") * head + inner;
    let a = format!("{p}linear_attn.");
    add(format!("{a}in_proj_qkv.weight"), &[channels, hidden]);
    add(format!("{a}in_proj_z.weight"), &[inner, hidden]);
    add(format!("{a}in_proj_b.weight"), &[value_heads, hidden]);
    add(format!("{a}in_proj_a.weight"), &[value_heads, hidden]);
    add(
        format!("{a}conv1d.weight"),
        &[channels, 1, num(config, "linear_conv_kernel_dim")],
    );
    add(format!("{a}dt_bias"), &[value_heads]);
    add(format!("{a}A_log"), &[value_heads]);
    add(format!("{a}norm.weight"), &[head]);
    add(format!("{a}out_proj.weight"), &[hidden, inner]);
}

/// Gemma 3's SigLIP vision tower and the projector into the language model.
fn siglip(config: &Value, text_hidden: u64, dtype: DType) -> Vec<TensorDef> {
    let hidden = num(config, "hidden_size");
    let ffn = num(config, "intermediate_size");
    let patch = num(config, "patch_size");
    let positions = (num(config, "image_size") / patch).pow(2);

    let mut tensors = Vec::new();
    let mut add = |name: String, shape: &[u64]| tensors.push(TensorDef::new(name, shape, dtype));
    let v = "vision_tower.vision_model.";
    add(
        format!("{v}embeddings.patch_embedding.weight"),
        &[hidden, 3, patch, patch],
    );
    add(format!("{v}embeddings.patch_embedding.bias"), &[hidden]);
    add(
        format!("{v}embeddings.position_embedding.weight"),
        &[positions, hidden],
    );
    for layer in 0..num(config, "num_hidden_layers") {
        let p = format!("{v}encoder.layers.{layer}.");
        for norm in ["layer_norm1", "layer_norm2"] {
            add(format!("{p}{norm}.weight"), &[hidden]);
            add(format!("{p}{norm}.bias"), &[hidden]);
        }
        for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
            add(format!("{p}self_attn.{proj}.weight"), &[hidden, hidden]);
            add(format!("{p}self_attn.{proj}.bias"), &[hidden]);
        }
        add(format!("{p}mlp.fc1.weight"), &[ffn, hidden]);
        add(format!("{p}mlp.fc1.bias"), &[ffn]);
        add(format!("{p}mlp.fc2.weight"), &[hidden, ffn]);
        add(format!("{p}mlp.fc2.bias"), &[hidden]);
    }
    add(format!("{v}post_layernorm.weight"), &[hidden]);
    add(format!("{v}post_layernorm.bias"), &[hidden]);
    add(
        "multi_modal_projector.mm_input_projection_weight".into(),
        &[hidden, text_hidden],
    );
    add(
        "multi_modal_projector.mm_soft_emb_norm.weight".into(),
        &[hidden],
    );
    tensors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemma3_layer_types_follow_the_pattern() {
        let types = gemma3_layer_types(12, 6);
        assert_eq!(types[4], "sliding_attention");
        assert_eq!(types[5], "full_attention");
        assert_eq!(types[11], "full_attention");
        assert_eq!(types.as_array().unwrap().len(), 12);
    }
}
