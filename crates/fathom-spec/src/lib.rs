//! `ModelSpec`: one normalized description of a model, whatever file format
//! it came from.
//!
//! The plan and the engine read dimensions, the per-layer attention kind and
//! the tensor table from here and never look at GGUF keys or `config.json`
//! field names themselves.

mod error;
mod from_gguf;
mod from_hf;

use fathom_checkpoint::Checkpoint;
use serde::Serialize;

pub use error::SpecError;

/// What a rope frequency base or scaling factor must be.
pub(crate) const POSITIVE: &str = "a finite number above 0";

pub(crate) fn positive(x: f64) -> bool {
    x > 0.0
}

/// What a norm epsilon must be: it is added to a mean of squares before a
/// square root, so 0 or less divides by zero (or takes the root of a
/// negative), and 1 or more drowns the activations.
pub(crate) const EPSILON: &str = "a finite number above 0 and below 1";

pub(crate) fn valid_epsilon(x: f64) -> bool {
    x > 0.0 && x < 1.0
}

/// What Qwen3.5's multimodal rope sections must be for text to run as
/// plain NeoX rope.
pub(crate) const MROPE_SECTIONS: &str =
    "non-negative integers (3 or 4) whose first three cover every rotated pair";

/// Whether Qwen3.5's interleaved multimodal rope reduces to plain NeoX
/// rope for text. Each rotated pair takes its position from one of the
/// `sections` (padded to 4 with zeros): pair i, taken modulo the sections'
/// sum, belongs to section i mod 3 while that section lasts, else to the
/// fourth. A text token has the same position in the first three and 0 in
/// the fourth, so text runs as plain rope exactly when none of the
/// `rotated_pairs` falls to the fourth section.
pub(crate) fn mrope_is_text_rope(sections: &[u64], rotated_pairs: u64) -> bool {
    if !(3..=4).contains(&sections.len()) {
        return false;
    }
    let total = sections.iter().fold(0u64, |s, &x| s.saturating_add(x));
    let in_text_section = |pair: u64| {
        let sector = pair % total.max(1);
        total > 0 && sector < sections[(sector % 3) as usize].saturating_mul(3)
    };
    (0..rotated_pairs).all(in_text_section)
}

/// The model families fathom knows how to plan and run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// Llama 2/3.x, SmolLM2, Mistral: GQA attention, SwiGLU FFN, rope.
    Llama,
    /// Qwen2 / Qwen2.5: Llama shape plus q/k/v biases.
    Qwen2,
    /// Qwen3: per-head q/k RMSNorm, no biases.
    Qwen3,
    /// Qwen3 mixture of experts: routed experts with top-k.
    Qwen3Moe,
    /// Gemma 3: interleaved sliding-window and global layers.
    Gemma3,
    /// Gemma 4 (GGUF `gemma4`): Gemma 3's block with wider heads and fewer
    /// KV heads in the global layers, an RMS-normed value, attention
    /// unscaled (q and k are normed), rope through part of a global head
    /// (`rope_freqs`), a learned scalar on each layer's output and a
    /// softcap on the logits.
    Gemma4,
    /// Qwen3.5 (GGUF `qwen35`): hybrid layers, most a gated delta rule
    /// (linear attention with a fixed recurrent state), every few a full
    /// attention whose output is gated by a sigmoid of a second half of the
    /// q projection; partial rope; dense FFN.
    Qwen35,
    /// Qwen3.5 mixture of experts (GGUF `qwen35moe`): the Qwen3.5 block
    /// with routed experts plus a sigmoid-gated shared expert.
    Qwen35Moe,
    /// OpenAI's gpt-oss (GGUF `gpt-oss`, llama.cpp's `LLM_ARCH_OPENAI_MOE`):
    /// routed experts with biases, a clamped SwiGLU and softmax over the
    /// chosen experts' logits; attention sinks, q/k/v/o biases, sliding
    /// windows on alternate layers, YaRN rope.
    GptOss,
    /// Anything else: the architecture name as the checkpoint spells it.
    /// It gets weights bytes (and KV when the generic fields exist) but
    /// cannot be run.
    Unknown(String),
}

impl Family {
    pub fn name(&self) -> &str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Qwen3Moe => "qwen3_moe",
            Family::Gemma3 => "gemma3",
            Family::Gemma4 => "gemma4",
            Family::Qwen35 => "qwen35",
            Family::Qwen35Moe => "qwen35_moe",
            Family::GptOss => "gpt_oss",
            Family::Unknown(name) => name,
        }
    }

    /// Rope in the NeoX layout (rotating the two halves of a head) rather
    /// than interleaved pairs: how llama.cpp and HF treat each family.
    pub fn rope_neox(&self) -> bool {
        matches!(
            self,
            Family::Qwen2
                | Family::Qwen3
                | Family::Qwen3Moe
                | Family::Gemma3
                | Family::Gemma4
                | Family::Qwen35
                | Family::Qwen35Moe
                | Family::GptOss
        )
    }

    /// Qwen3.5's hybrid block (linear-attention layers, gated attention).
    pub fn is_qwen35(&self) -> bool {
        matches!(self, Family::Qwen35 | Family::Qwen35Moe)
    }
}

/// The gated activation of a family's FFN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// SwiGLU: silu(gate) × up.
    #[default]
    Silu,
    /// GeGLU with the tanh approximation of GELU.
    GeluTanh,
    /// gpt-oss's clamped SwiGLU: with g = min(gate, 7) and u = clamp(up,
    /// -7, 7), g × sigmoid(1.702 g) × (u + 1) (llama.cpp's `swiglu_oai`).
    SwigluOai,
}

/// How a family's decoder block differs from the plain Llama block, and
/// how its checkpoint format stores it: what the engine reads instead of
/// testing the family. Q/K/V biases (Qwen2) and per-head q/k norms (Qwen3,
/// Gemma 3) are taken when their tensors are present.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct BlockStyle {
    /// Norms multiply by `1 + w` and the file stores `w` (Gemma and
    /// Qwen3.5 in HF files, but for Qwen3.5's gated linear-attention norm;
    /// llama.cpp's converter stores `1 + w`).
    pub norm_adds_one: bool,
    /// Embeddings are scaled by √hidden (Gemma).
    pub embed_scaled: bool,
    /// Norms on the attention and FFN outputs before each residual add,
    /// and a pre-FFN norm of its own (Gemma 3).
    pub post_norms: bool,
    pub activation: Activation,
    /// Rope rotates the two halves of a head (NeoX) rather than adjacent
    /// pairs: the family's layout in GGUF; HF checkpoints rotate halves
    /// for every family (llama.cpp permutes llama's q/k rows).
    pub rope_neox: bool,
    /// The q projection holds, per head, the query and then as many values
    /// of an output gate: attention's output is multiplied by
    /// sigmoid(gate) before the output projection (Qwen3.5). Such a GGUF
    /// names the pre-FFN norm `post_attention_norm`.
    pub gated_attention: bool,
    /// Each attention head has a learned sink logit in its softmax's
    /// denominator (gpt-oss, `attn_sinks.weight`).
    pub attention_sinks: bool,
    /// The GGUF names the pre-FFN norm `post_attention_norm` (Qwen3.5,
    /// gpt-oss), though it is not a post norm.
    pub ffn_norm_post_attention: bool,
    /// Each value head is RMS-normed without a weight, and a layer without
    /// a v projection takes its values from the k projection (Gemma 4).
    pub value_norm: bool,
}

impl Family {
    /// The block of this family as stored in a GGUF (`hf` false) or a
    /// Hugging Face checkpoint.
    pub fn block_style(&self, hf: bool) -> BlockStyle {
        let gemma = matches!(self, Family::Gemma3 | Family::Gemma4);
        let gpt_oss = *self == Family::GptOss;
        BlockStyle {
            norm_adds_one: (gemma || self.is_qwen35()) && hf,
            embed_scaled: gemma,
            post_norms: gemma,
            activation: if gemma {
                Activation::GeluTanh
            } else if gpt_oss {
                Activation::SwigluOai
            } else {
                Activation::Silu
            },
            rope_neox: self.rope_neox() || hf,
            gated_attention: self.is_qwen35(),
            attention_sinks: gpt_oss,
            ffn_norm_post_attention: self.is_qwen35() || gpt_oss,
            value_norm: *self == Family::Gemma4,
        }
    }
}

/// Which past tokens a layer's attention reads, and so how many of them its
/// KV cache must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Attention {
    /// Every past token.
    Full,
    /// The last `window` tokens.
    Sliding { window: u64 },
    /// No attention (and no KV) in this layer.
    None,
    /// Linear attention (Qwen3.5's gated delta rule): no KV, a recurrent
    /// state of fixed size per sequence ([`LinearAttention`]).
    Linear,
}

/// The gated delta rule of a hybrid model's linear-attention layers, from
/// llama.cpp's `ssm.*` keys. Each layer holds, per sequence, the last
/// `conv_kernel - 1` inputs of its causal convolution and one
/// `head_dim x head_dim` state per value head, whatever the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LinearAttention {
    /// Taps of the short causal convolution (`ssm.conv_kernel`).
    pub conv_kernel: u64,
    /// Query/key heads (`ssm.group_count`).
    pub key_heads: u64,
    /// Value heads, each with its own state (`ssm.time_step_rank`).
    pub value_heads: u64,
    /// Width of a key, query and value head (`ssm.state_size`; llama.cpp
    /// requires the value heads of `ssm.inner_size / value_heads` to match).
    pub head_dim: u64,
}

impl LinearAttention {
    /// Values of all value heads (`ssm.inner_size`).
    pub fn inner(&self) -> u64 {
        self.value_heads.saturating_mul(self.head_dim)
    }

    /// Channels the convolution runs over: q, k and v side by side.
    pub fn conv_channels(&self) -> u64 {
        self.key_heads
            .saturating_mul(self.head_dim)
            .saturating_mul(2)
            .saturating_add(self.inner())
    }

    /// f32 values of one layer's convolution state for one sequence.
    pub fn conv_state_values(&self) -> u64 {
        self.conv_kernel
            .saturating_sub(1)
            .saturating_mul(self.conv_channels())
    }

    /// f32 values of one layer's delta-rule state for one sequence.
    pub fn delta_state_values(&self) -> u64 {
        self.inner().saturating_mul(self.head_dim)
    }
}

/// One transformer layer as far as memory is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Layer {
    pub attention: Attention,
    pub n_kv_heads: u64,
    pub key_dim: u64,
    pub value_dim: u64,
    /// The layer runs on the other side of a placement between GPU and
    /// host: this side holds none of its KV (nor a linear-attention
    /// layer's recurrent state), but its attention still numbers the KV
    /// groups as in the whole model (false in a checkpoint's spec).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub kv_elsewhere: bool,
}

/// Rotary position embedding parameters.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rope {
    /// Base frequency of global (or all) layers.
    pub theta: f64,
    /// Base frequency of sliding-window layers when it differs (Gemma 3).
    pub local_theta: Option<f64>,
    /// The file's rope factors (`rope_freqs.weight`) belong to the global
    /// layers only; sliding layers rotate every pair at its own frequency
    /// (Gemma 4, whose factors of 1e30 stop three quarters of a global
    /// head from rotating).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub factors_global_only: bool,
    pub neox: bool,
    /// Leading values of each head that rotate, when fewer than the head
    /// (Qwen3.5 rotates a quarter); `None` rotates the whole head.
    pub dims: Option<u64>,
    /// The scaling type (`linear`, `yarn`, `llama3`, ...) when the model
    /// uses one.
    pub scaling: Option<String>,
    pub scaling_factor: Option<f64>,
    /// Llama 3's frequency-dependent scaling, when a config describes it
    /// (GGUF files store the resulting factors as `rope_freqs.weight`).
    pub llama3: Option<Llama3Rope>,
    /// YaRN scaling, as llama.cpp applies it (gpt-oss).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub yarn: Option<YarnRope>,
}

/// YaRN (Peng et al.): each rotary pair's frequency is interpolated
/// (divided by `factor`) below the band of pairs `beta_slow ..
/// beta_fast` rotations over the original context, kept above it and
/// blended between, and cos and sin are scaled by `attn_factor` × (1 +
/// 0.1 ln factor): llama.cpp's `rope_yarn` with `ext_factor` 1.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct YarnRope {
    pub factor: f64,
    /// The context the model was trained at before scaling
    /// (`rope.scaling.original_context_length`).
    pub original_context: u64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    /// `rope.scaling.attn_factor` (1 when absent).
    pub attn_factor: f64,
}

impl YarnRope {
    /// The first and last rotary pair of the blend, for `dims` rotated
    /// values at base `theta`: llama.cpp's `ggml_rope_yarn_corr_dims`
    /// (floor of the fast end, ceiling of the slow end, within the head).
    pub fn corr_dims(&self, dims: u64, theta: f64) -> [f64; 2] {
        let n = dims as f64;
        let dim = |rotations: f64| {
            n * (self.original_context as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln()
                / (2.0 * theta.ln())
        };
        let start = dim(self.beta_fast).floor().max(0.0);
        let end = dim(self.beta_slow).ceil().min(n - 1.0);
        [start, end]
    }
}

/// Llama 3.1's rope scaling: low frequencies are divided by `factor`, high
/// ones kept, and the band between blended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Llama3Rope {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_context: f64,
}

impl Llama3Rope {
    /// The divisor of each rotary pair's frequency, as llama.cpp's
    /// converter computes `rope_freqs`.
    pub fn freq_factors(&self, theta: f64, head_dim: usize) -> Vec<f32> {
        let low_wavelen = self.original_context / self.low_freq_factor;
        let high_wavelen = self.original_context / self.high_freq_factor;
        (0..head_dim / 2)
            .map(|i| {
                let freq = theta.powf(-2.0 * i as f64 / head_dim as f64);
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                let divisor = if wavelen < high_wavelen {
                    1.0
                } else if wavelen > low_wavelen {
                    self.factor
                } else {
                    let smooth = (self.original_context / wavelen - self.low_freq_factor)
                        / (self.high_freq_factor - self.low_freq_factor);
                    1.0 / ((1.0 - smooth) / self.factor + smooth)
                };
                divisor as f32
            })
            .collect()
    }
}

/// One tensor of the checkpoint as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TensorEntry {
    pub name: String,
    /// The stored dtype as its format names it (`Q4_1`, `BF16`, `U32`, ...).
    pub dtype: String,
    /// Shape as stored by the format (GGUF: ggml order, row length first).
    pub shape: Vec<u64>,
    /// Model parameters this tensor holds (MLX packed words count as the
    /// weights they pack; MLX scales and biases count as none).
    pub params: u64,
    /// Elements in one row (the contiguous, innermost dimension) in
    /// unpacked weights: what a quantization's block size must divide.
    pub row_len: u64,
    pub bytes: u64,
}

/// The sizes of a checkpoint's tokenizer: the one a GGUF header embeds
/// (`tokenizer.ggml.*`, read from the parsed metadata), or a Hugging Face
/// directory's `tokenizer.json` (counted in one streaming pass): what the
/// tokenizer's tables built from them hold, and what is alive beside them
/// while they are built (the parsed metadata, or the file's bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VocabHeader {
    /// Entries of `tokenizer.ggml.tokens`; for `tokenizer.json`, the ids
    /// the vocabulary and added tokens span (unused ids get placeholders).
    pub tokens: u64,
    /// Their strings' bytes, summed.
    pub token_bytes: u64,
    /// Metadata arrays of one element per token (`tokens`, `token_type`,
    /// `scores`); 0 for `tokenizer.json`.
    pub token_arrays: u64,
    /// Entries of `tokenizer.ggml.merges` (`model.merges`).
    pub merges: u64,
    /// Their strings' bytes, summed.
    pub merge_bytes: u64,
    /// SentencePiece (`tokenizer.ggml.model` = `llama`): the tokenizer
    /// keeps an f32 score per token.
    pub scores_kept: bool,
    /// [`string_heap_bytes`] summed over the tokens: what one heap copy of
    /// every token string takes.
    pub token_chunks: u64,
    /// The same over the merge lines the parsed metadata holds (0 for
    /// `tokenizer.json`, whose lines are not kept).
    pub merge_chunks: u64,
    /// The same over the merges' two parts (a line split at its first space
    /// after the first byte).
    pub merge_part_chunks: u64,
    /// A Hugging Face `tokenizer.json`'s size: the tokenizer reads it whole
    /// (and holds no metadata arrays). 0 for a GGUF header.
    pub tokenizer_json_bytes: u64,
}

/// The heap a string of `len` bytes takes on its own (a Rust `String`'s
/// buffer): glibc malloc's chunk on a 64-bit target, the length plus an
/// 8-byte header rounded up to 16 bytes, at least 32; nothing when empty.
/// A vocabulary is hundreds of thousands of strings of about 9 bytes, so
/// the chunks, not the bytes, are most of its strings' memory.
pub fn string_heap_bytes(len: u64) -> u64 {
    if len == 0 {
        0
    } else {
        len.saturating_add(8 + 15)
            .saturating_div(16)
            .saturating_mul(16)
            .max(32)
    }
}

/// The normalized description of one model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSpec {
    /// The architecture as the checkpoint names it (`llama`, `Qwen3MoeForCausalLM`...).
    pub architecture: String,
    pub family: Family,
    /// The family's block as the checkpoint stores it.
    #[serde(skip)]
    pub block: BlockStyle,
    pub n_layers: u64,
    pub hidden: u64,
    pub n_heads: u64,
    /// KV heads of the widest layer (per-layer values are in `layers`).
    pub n_kv_heads: u64,
    pub head_dim: u64,
    /// Dense FFN width (0 for models whose every FFN is MoE).
    pub ffn: u64,
    pub vocab: u64,
    pub n_experts: u64,
    pub n_experts_active: u64,
    /// FFN width of one expert.
    pub expert_ffn: u64,
    /// The trained context length (0 when the checkpoint does not say).
    pub context_length: u64,
    /// One entry per layer; empty when the dimensions could not be read
    /// (an unknown family without the generic fields).
    pub layers: Vec<Layer>,
    pub rope: Option<Rope>,
    /// Epsilon of the RMS norms.
    pub rms_norm_eps: f64,
    /// Attention logit scale when it is not 1/√key_dim (Gemma 3's
    /// `query_pre_attn_scalar`).
    pub attn_scale: Option<f64>,
    /// Logits become `cap × tanh(logits / cap)` (Gemma 4's
    /// `final_logit_softcapping`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_logit_softcap: Option<f64>,
    /// MoE: renormalize the top-k router weights to sum to one.
    pub norm_topk_prob: bool,
    /// FFN width of a shared expert beside the routed ones (Qwen3.5 MoE;
    /// 0 when there is none).
    pub shared_expert_ffn: u64,
    /// The gated delta rule of the [`Attention::Linear`] layers, when the
    /// model has any.
    pub linear: Option<LinearAttention>,
    /// Multi-token-prediction layers stored after the decoder's
    /// (`nextn_predict_layers`): counted in the weights, not run.
    pub mtp_layers: u64,
    /// BPE merges of the tokenizer the checkpoint embeds (GGUF
    /// `tokenizer.ggml.merges`; 0 when it has none or they are not read):
    /// the runtime's tokenizer tables grow with them as with the tokens.
    #[serde(skip_serializing_if = "is_zero")]
    pub tokenizer_merges: u64,
    /// The tokenizer's sizes as the header (GGUF) or `tokenizer.json`
    /// (Hugging Face) gives them, for the runtime term's exact vocabulary
    /// tables; all zero without either.
    /// Not serialized: the spec JSON reads as before.
    #[serde(skip)]
    pub vocab_header: VocabHeader,
    pub tied_embeddings: bool,
    pub tensors: Vec<TensorEntry>,
    /// Bytes of the largest weight matrix (with an MLX matrix's scales and
    /// biases) that the other side of a placement holds for a layer this
    /// side may run it for: a device spec's room for the host layers'
    /// matrices that a large step copies to the GPU to multiply there. 0
    /// in a checkpoint's spec.
    #[serde(skip_serializing_if = "is_zero")]
    pub streamed_weights: u64,
    /// Where the tensor table came from, for the plan's weights line
    /// (`GGUF v3 header, 272 tensors`).
    pub source: String,
    /// Things a reader of the plan should know (unknown family, missing
    /// fields that were defaulted, ...).
    pub notes: Vec<String>,
}

impl ModelSpec {
    /// Builds the spec from a checkpoint's headers.
    pub fn from_checkpoint(checkpoint: &Checkpoint) -> Result<Self, SpecError> {
        match checkpoint {
            Checkpoint::Gguf(file) => from_gguf::spec(file),
            Checkpoint::Hf(dir) => from_hf::spec(dir),
        }
    }

    /// Bytes of every stored tensor: what the weights occupy as stored.
    pub fn weights_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .fold(0u64, |sum, t| sum.saturating_add(t.bytes))
    }

    /// Number of model parameters.
    pub fn params(&self) -> u64 {
        self.tensors
            .iter()
            .fold(0u64, |sum, t| sum.saturating_add(t.params))
    }

    /// Whether the engine knows how to run this family.
    pub fn is_known_family(&self) -> bool {
        !matches!(self.family, Family::Unknown(_))
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Gemma 3 makes every `pattern`-th layer global and the rest sliding.
fn gemma_layer_is_sliding(layer: u64, pattern: u64) -> bool {
    pattern == 0 || !(layer + 1).is_multiple_of(pattern)
}

impl ModelSpec {
    /// A spec that carries only the tensor table: an unknown family whose
    /// dimensions could not be read.
    fn weights_only(
        architecture: String,
        family: Family,
        tensors: Vec<TensorEntry>,
        tied_embeddings: bool,
        notes: Vec<String>,
    ) -> Self {
        ModelSpec {
            architecture,
            block: BlockStyle::default(),
            family,
            n_layers: 0,
            hidden: 0,
            n_heads: 0,
            n_kv_heads: 0,
            head_dim: 0,
            ffn: 0,
            vocab: 0,
            n_experts: 0,
            n_experts_active: 0,
            expert_ffn: 0,
            context_length: 0,
            layers: Vec::new(),
            rope: None,
            rms_norm_eps: 0.0,
            attn_scale: None,
            final_logit_softcap: None,
            norm_topk_prob: false,
            shared_expert_ffn: 0,
            linear: None,
            mtp_layers: 0,
            tokenizer_merges: 0,
            vocab_header: VocabHeader::default(),
            tied_embeddings,
            source: String::new(),
            tensors,
            streamed_weights: 0,
            notes,
        }
    }
}

/// Bounds on hyperparameters read from files: a hostile header must not make
/// fathom allocate a billion layers or overflow a product of widths.
mod limits {
    use std::path::Path;

    use crate::SpecError;

    pub const MAX_LAYERS: u64 = 4096;
    /// Generous: the widest real models have dims around 2^17 and vocabularies around 2^18.
    pub const MAX_DIM: u64 = 1 << 24;

    fn check(path: &Path, field: &str, value: u64, min: u64, max: u64) -> Result<u64, SpecError> {
        if (min..=max).contains(&value) {
            Ok(value)
        } else {
            Err(SpecError::InvalidField {
                path: path.to_path_buf(),
                field: field.to_string(),
                value: value.to_string(),
                expected: format!("an integer from {min} to {max}"),
            })
        }
    }

    pub fn layers(path: &Path, field: &str, value: u64) -> Result<u64, SpecError> {
        check(path, field, value, 1, MAX_LAYERS)
    }

    pub fn dim(path: &Path, field: &str, value: u64) -> Result<u64, SpecError> {
        check(path, field, value, 0, MAX_DIM)
    }

    pub fn nonzero_dim(path: &Path, field: &str, value: u64) -> Result<u64, SpecError> {
        check(path, field, value, 1, MAX_DIM)
    }
}
