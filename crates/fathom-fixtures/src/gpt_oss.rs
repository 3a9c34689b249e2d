//! gpt-oss fixtures, written straight as GGUF (llama.cpp's `gpt-oss`
//! architecture, `LLM_ARCH_OPENAI_MOE`): the keys and tensor names of
//! llama.cpp's converter, the experts in MXFP4 as every gpt-oss GGUF keeps
//! them, the other matrices in a type of the caller's choosing, norms,
//! biases, sinks and the router in F32.
//!
//! gpt-oss has no Hugging Face-shaped [`crate::ModelDef`] here: its
//! checkpoints fuse gate and up and store MXFP4 blocks and scales apart,
//! which nothing else in fathom reads; the GGUF is the format it runs.

use std::io;
use std::ops::Range;
use std::path::Path;

use crate::gguf::{GgufTensorType, GgufValue, GgufWriter};
use crate::Data;

/// The dimensions of a gpt-oss model.
#[derive(Debug, Clone, PartialEq)]
pub struct GptOssShape {
    pub name: &'static str,
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub experts: u64,
    pub experts_used: u64,
    pub expert_ffn: u64,
    pub vocab: u64,
    pub context: u64,
    pub window: u64,
    pub rope_theta: f32,
    pub yarn_factor: f32,
    pub yarn_original_context: u64,
    /// The experts' type: MXFP4, as every gpt-oss GGUF stores them (a test
    /// may take F32 to compare the rest without MXFP4's rounding).
    pub experts_type: GgufTensorType,
    /// Random data conditioned for comparing two engines' next-token
    /// distributions (see `value_range`): the real shapes, which
    /// `fathom bench fixture` writes for that. The tiny test model keeps
    /// plain random weights, whose logits a wrong piece moves most.
    pub conditioned: bool,
}

/// The gpt-oss shapes `fathom bench fixture --like NAME` writes, by name.
pub const GPT_OSS_LIKE: [crate::Like<GptOssShape>; 2] =
    [("gpt-oss-20b", gpt_oss_20b), ("gpt-oss-120b", gpt_oss_120b)];

/// gpt-oss-20b (openai/gpt-oss-20b's config.json): 24 layers of 2880,
/// 64 query and 8 KV heads of 64, 32 experts of 2880 with 4 used, a
/// 201,088-token vocabulary (o200k_harmony), windows of 128 on every
/// other layer, YaRN ×32 over 4,096 positions at rope base 150,000.
pub fn gpt_oss_20b() -> GptOssShape {
    GptOssShape {
        name: "gpt-oss-20b",
        layers: 24,
        hidden: 2880,
        heads: 64,
        kv_heads: 8,
        head_dim: 64,
        experts: 32,
        experts_used: 4,
        expert_ffn: 2880,
        vocab: 201_088,
        context: 131_072,
        window: 128,
        rope_theta: 150_000.0,
        yarn_factor: 32.0,
        yarn_original_context: 4096,
        experts_type: GgufTensorType::MXFP4,
        conditioned: true,
    }
}

/// gpt-oss-120b: gpt-oss-20b's layer with 128 experts, 36 layers.
pub fn gpt_oss_120b() -> GptOssShape {
    GptOssShape {
        name: "gpt-oss-120b",
        layers: 36,
        experts: 128,
        ..gpt_oss_20b()
    }
}

/// A small gpt-oss for the engine's tests: the real head shapes (64-value
/// heads, 8 query heads to 2 KV heads), 4 experts with 2 used, a window
/// of 8 tokens so short prompts cross it, three layers (sliding, full,
/// sliding).
pub fn gpt_oss_tiny() -> GptOssShape {
    GptOssShape {
        name: "gpt-oss-tiny",
        layers: 3,
        hidden: 256,
        heads: 8,
        kv_heads: 2,
        head_dim: 64,
        experts: 4,
        experts_used: 2,
        expert_ffn: 320,
        vocab: 512,
        context: 4096,
        window: 8,
        rope_theta: 150_000.0,
        yarn_factor: 32.0,
        yarn_original_context: 4096,
        experts_type: GgufTensorType::MXFP4,
        conditioned: false,
    }
}

/// Where random values fall where [-0.1, 0.1) would not make a working
/// model whose next-token distributions two engines can compare. Random
/// weights make a network that amplifies rounding: each layer's branches
/// outweigh the residual they add to, so the 8-bit rounding of the
/// matmuls' inputs (both engines round, each in its own order) compounds
/// from layer to layer, and a choice of four experts near a tie flips and
/// jumps a layer's output. Drawn without the conditioning below, two runs
/// of fathom's own kernels that differ only in summation order (AVX2
/// against AVX-512) disagreed on the top token at 8 % of the positions of
/// 4 layers (mean KLD 0.059). So, in a shape that is `conditioned`,
/// besides the norms ([`scale_of`] holds the factors):
///
/// - the token embeddings are drawn 225 times the other matrices'
///   magnitude (about 8 RMS, against an estimated 1.5 for an expert
///   block's output): a part of the residual that rounding does not
///   touch. The output head is not tied to them, so no position predicts
///   its own token;
/// - the attention output projection 3 times, so attention still counts
///   beside those embeddings (a rope base of 10,000 instead of 150,000
///   moves the 4-layer fixture's distributions by a mean KLD of 0.12,
///   against 0.003 between fathom's AVX2 and AVX-512 kernels;
///   docs/models.md has the measurements);
/// - the router's biases from -6 to 6, as wide as its logits' spread
///   (about 3 over 2,880 inputs), so a rounding error flips the choice of
///   the four experts less often.
///
/// The attention input norms are near 0.3, which keeps the attention
/// scores soft (with gpt-oss's 64-value heads and YaRN's ×1.35 on q and
/// k, weights of ±0.1 on a unit-RMS input give scores about 17 apart:
/// nearly argmax attention, where rounding switches the winning key); the
/// other norms near one; the final norm about 3.5, which spreads the
/// logits (about 3.5 × 0.058 × √hidden apart: 11 at 2,880 wide) so
/// next-token distributions are peaked, as a trained model's are; the
/// attention sinks from -1 to 3, so a sink takes a real share of a short
/// window's softmax (e³ against 128 scores near e⁰).
fn value_range(name: &str, conditioned: bool) -> Option<Range<f32>> {
    if name == "output_norm.weight" {
        Some(3.0..4.0)
    } else if name.ends_with("attn_norm.weight") {
        Some(0.2..0.4)
    } else if name.ends_with("norm.weight") {
        Some(0.8..1.2)
    } else if name.ends_with("attn_sinks.weight") {
        Some(-1.0..3.0)
    } else if conditioned && name.ends_with("ffn_gate_inp.bias") {
        Some(-6.0..6.0)
    } else {
        None
    }
}

/// How many times the default magnitude a matrix is drawn
/// ([`value_range`] says why).
fn scale_of(name: &str, conditioned: bool) -> Option<f32> {
    if !conditioned {
        None
    } else if name == "token_embd.weight" {
        Some(225.0)
    } else if name.ends_with("attn_output.weight") {
        Some(3.0)
    } else {
        None
    }
}

/// The GGUF description of `shape` with `matrices` as the type of the
/// attention projections, the embeddings and the output head (the experts
/// are MXFP4): metadata as llama.cpp's converter writes it, and a minimal
/// tokenizer (`gpt2`, tokens `t0`, `t1`, ..., no merges).
pub fn gpt_oss_writer(shape: &GptOssShape, matrices: GgufTensorType) -> io::Result<GgufWriter> {
    let s = shape;
    let u32_of = |v: u64| {
        u32::try_from(v)
            .map(GgufValue::U32)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{v} exceeds u32")))
    };
    let arch = "gpt-oss";
    let mut w = GgufWriter::new()
        .kv("general.architecture", GgufValue::string(arch))
        .kv("general.name", GgufValue::string(s.name))
        .kv("general.alignment", GgufValue::U32(32))
        .kv("general.quantization_version", GgufValue::U32(2));
    let keys = [
        ("block_count", u32_of(s.layers)?),
        ("context_length", u32_of(s.context)?),
        ("embedding_length", u32_of(s.hidden)?),
        ("feed_forward_length", u32_of(s.expert_ffn)?),
        ("attention.head_count", u32_of(s.heads)?),
        ("attention.head_count_kv", u32_of(s.kv_heads)?),
        ("rope.freq_base", GgufValue::F32(s.rope_theta)),
        ("attention.layer_norm_rms_epsilon", GgufValue::F32(1e-5)),
        ("expert_count", u32_of(s.experts)?),
        ("expert_used_count", u32_of(s.experts_used)?),
        ("attention.key_length", u32_of(s.head_dim)?),
        ("attention.value_length", u32_of(s.head_dim)?),
        ("attention.sliding_window", u32_of(s.window)?),
        ("expert_feed_forward_length", u32_of(s.expert_ffn)?),
        ("rope.scaling.type", GgufValue::string("yarn")),
        ("rope.scaling.factor", GgufValue::F32(s.yarn_factor)),
        (
            "rope.scaling.original_context_length",
            u32_of(s.yarn_original_context)?,
        ),
    ];
    for (key, value) in keys {
        w = w.kv(format!("{arch}.{key}"), value);
    }
    w = w.kv("tokenizer.ggml.model", GgufValue::string("gpt2")).kv(
        "tokenizer.ggml.tokens",
        GgufValue::strings((0..s.vocab).map(|i| format!("t{i}"))),
    );
    let (d, q, kv) = (s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let (e, f) = (s.experts, s.expert_ffn);
    let f32_ty = GgufTensorType::F32;
    let mxfp4 = s.experts_type;
    let mut tensors: Vec<(String, Vec<u64>, GgufTensorType)> = vec![
        ("token_embd.weight".into(), vec![d, s.vocab], matrices),
        ("output_norm.weight".into(), vec![d], f32_ty),
        ("output.weight".into(), vec![d, s.vocab], matrices),
    ];
    for i in 0..s.layers {
        let b = |n: &str| format!("blk.{i}.{n}");
        tensors.extend([
            (b("attn_norm.weight"), vec![d], f32_ty),
            (b("attn_q.weight"), vec![d, q], matrices),
            (b("attn_q.bias"), vec![q], f32_ty),
            (b("attn_k.weight"), vec![d, kv], matrices),
            (b("attn_k.bias"), vec![kv], f32_ty),
            (b("attn_v.weight"), vec![d, kv], matrices),
            (b("attn_v.bias"), vec![kv], f32_ty),
            (b("attn_output.weight"), vec![q, d], matrices),
            (b("attn_output.bias"), vec![d], f32_ty),
            (b("attn_sinks.weight"), vec![s.heads], f32_ty),
            (b("post_attention_norm.weight"), vec![d], f32_ty),
            (b("ffn_gate_inp.weight"), vec![d, e], f32_ty),
            (b("ffn_gate_inp.bias"), vec![e], f32_ty),
            (b("ffn_gate_exps.weight"), vec![d, f, e], mxfp4),
            (b("ffn_gate_exps.bias"), vec![f, e], f32_ty),
            (b("ffn_up_exps.weight"), vec![d, f, e], mxfp4),
            (b("ffn_up_exps.bias"), vec![f, e], f32_ty),
            (b("ffn_down_exps.weight"), vec![f, d, e], mxfp4),
            (b("ffn_down_exps.bias"), vec![d, e], f32_ty),
        ]);
    }
    for (name, dims, ty) in tensors {
        // A row that is not whole blocks of the chosen type stays F16, as
        // the converter falls back.
        let ty = if dims[0].is_multiple_of(ty.ggml().block_elems()) {
            ty
        } else {
            GgufTensorType::F16
        };
        let len = ty.ggml().padded_row_bytes(dims.iter().product());
        if let Some(range) = value_range(&name, s.conditioned) {
            w = w.value_range(name.clone(), range);
        }
        if let Some(factor) = scale_of(&name, s.conditioned) {
            w = w.scaled(name.clone(), factor);
        }
        w = w.tensor(name, &dims, ty.ggml_id(), len);
    }
    Ok(w)
}

/// Writes [`gpt_oss_writer`]'s file with the minimal tokenizer made
/// loadable (`pre` "default", no merges) and returns its size.
pub fn write_gpt_oss_gguf(
    shape: &GptOssShape,
    matrices: GgufTensorType,
    path: &Path,
    data: Data,
) -> io::Result<u64> {
    gpt_oss_writer(shape, matrices)?
        .kv("tokenizer.ggml.pre", GgufValue::string("default"))
        .kv(
            "tokenizer.ggml.merges",
            GgufValue::strings(Vec::<String>::new()),
        )
        .write(path, data)
}
