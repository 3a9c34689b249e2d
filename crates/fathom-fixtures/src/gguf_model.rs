//! A [`ModelDef`] as llama.cpp's `convert_hf_to_gguf.py` would write it:
//! llama.cpp's key and tensor names, ggml dimension order, experts merged.

use std::collections::HashMap;
use std::io;
use std::path::Path;

use serde_json::Value;

use crate::gguf::{GgufTensorType, GgufValue, GgufWriter};
use crate::{DType, Data, ModelDef};

/// Writes `model` as a GGUF v3 file and returns its size. See [`gguf_writer`]
/// for what goes in it.
pub fn write_gguf(
    model: &ModelDef,
    path: &Path,
    ggml_type: GgufTensorType,
    data: Data,
) -> io::Result<u64> {
    gguf_writer(model, ggml_type)?.write(path, data)
}

/// The GGUF description of `model`, ready to write or to extend first.
///
/// Metadata: `general.*`, the `{arch}.*` hyperparameters llama.cpp reads, and
/// a minimal tokenizer (`gpt2` with tokens `t0`, `t1`, …; no merges).
/// Tensors: 1-D tensors and MoE routers are F32 as llama.cpp keeps them;
/// other weights get `ggml_type` when their row length is a whole number of
/// blocks, else F16. Vision-tower and projector tensors are left out, as
/// llama.cpp puts them in a separate mmproj file. Llama-3 rope scaling adds
/// llama.cpp's `rope_freqs.weight`.
pub fn gguf_writer(model: &ModelDef, ggml_type: GgufTensorType) -> io::Result<GgufWriter> {
    let config = model.text_config();
    let arch = model.gguf_arch;
    let mut writer = GgufWriter::new()
        .kv("general.architecture", GgufValue::string(arch))
        .kv("general.name", GgufValue::string(model.name))
        .kv("general.alignment", GgufValue::U32(32))
        .kv("general.quantization_version", GgufValue::U32(2));
    for (key, value) in hyperparameters(model)? {
        writer = writer.kv(format!("{arch}.{key}"), value);
    }
    let vocab = int(config, "vocab_size")?;
    writer = writer
        .kv("tokenizer.ggml.model", GgufValue::string("gpt2"))
        .kv(
            "tokenizer.ggml.tokens",
            GgufValue::strings((0..vocab).map(|i| format!("t{i}"))),
        );
    let hybrid = config.get("linear_num_value_heads").is_some();
    let gemma4 = arch == "gemma4";
    if gemma4 {
        writer = writer.f32_values("rope_freqs.weight", gemma4_rope_factors(config)?);
    }
    for (name, dims) in tensors(model)? {
        let stored = stored_type(&name, &dims, ggml_type);
        let len = stored.ggml().padded_row_bytes(dims.iter().product());
        let range = match (hybrid, gemma4) {
            (true, _) => hybrid_range(&name),
            (_, true) => gemma4_range(&name),
            _ => None,
        };
        if let Some(range) = range {
            writer = writer.value_range(name.clone(), range);
        }
        writer = writer.tensor(name, &dims, stored.ggml_id(), len);
    }
    Ok(writer)
}

/// Where a Gemma 4 fixture's random values fall when [-0.1, 0.1) would
/// not make a working model. Its norms multiply by the stored weight (no
/// `1 + w`), so they are drawn near one; but the embeddings, scaled by
/// √hidden and tied to the output head, would then dominate the residual,
/// and every position's most likely next token would be its own (the output
/// head's dot product of a row with itself), which makes a top-token
/// comparison trivial. Post-attention and post-FFN norms of 20 to 30 let
/// the layers' outputs outweigh the embedding instead, and a final norm of
/// 2 to 3 spreads the logits about as far as the softcap of 30 leaves room
/// for (with a 262,144-token vocabulary of random rows the best two tokens
/// are then about 0.4 nats apart). Attention is not scaled by
/// 1/√head_dim, q and k being normed: q and k norms near 0.25 keep a
/// head's scores about unit-sized, so attention does not collapse onto one
/// position. Layer output scales near one.
fn gemma4_range(name: &str) -> Option<std::ops::Range<f32>> {
    if name == "output_norm.weight" {
        Some(2.0..3.0)
    } else if name.ends_with("post_attention_norm.weight") || name.ends_with("post_ffw_norm.weight")
    {
        Some(20.0..30.0)
    } else if name.ends_with("attn_q_norm.weight") || name.ends_with("attn_k_norm.weight") {
        Some(0.15..0.35)
    } else if name.ends_with("norm.weight") || name.ends_with("layer_output_scale.weight") {
        Some(0.8..1.2)
    } else {
        None
    }
}

/// llama.cpp's converter turns Gemma 4's "proportional" rope (the first
/// `partial_rotary_factor` of a global head's pairs rotate at frequencies
/// over the whole head, the rest not at all) into NeoX rope over the whole
/// head with factors 1 for the rotating pairs and 1e30 for the others.
fn gemma4_rope_factors(c: &Value) -> io::Result<Vec<f32>> {
    let head = int(c, "global_head_dim")?;
    let full = &c["rope_parameters"]["full_attention"];
    let factor = full["partial_rotary_factor"].as_f64().unwrap_or(1.0);
    let (pairs, rotating) = (head / 2, (head as f64 * factor / 2.0) as u64);
    Ok((0..pairs)
        .map(|i| if i < rotating { 1.0 } else { 1e30 })
        .collect())
}

/// Gemma 4's keys as llama.cpp's converter writes them: two head shapes,
/// per-layer KV heads and the sliding-window pattern, each attention kind's
/// rope base, the logit softcap, and none of the E2B/E4B extras.
fn gemma4_hyperparameters(c: &Value) -> io::Result<Vec<(&'static str, GgufValue)>> {
    let layers = int(c, "num_hidden_layers")? as usize;
    let sliding: Vec<bool> = (0..layers as u64)
        .map(|i| crate::models::gemma4_sliding(c, i))
        .collect();
    let (kv_swa, kv_full) = (
        int(c, "num_key_value_heads")?,
        int(c, "num_global_key_value_heads")?,
    );
    let kv_heads = sliding
        .iter()
        .map(|&s| GgufValue::U32(if s { kv_swa } else { kv_full } as u32))
        .collect();
    let rope = &c["rope_parameters"];
    let mut kvs = model_keys(c)?;
    kvs.extend([
        ("feed_forward_length", u32_of(c, "intermediate_size")?),
        ("attention.head_count_kv", GgufValue::Array(4, kv_heads)),
        ("attention.key_length", u32_of(c, "global_head_dim")?),
        ("attention.value_length", u32_of(c, "global_head_dim")?),
        ("attention.key_length_swa", u32_of(c, "head_dim")?),
        ("attention.value_length_swa", u32_of(c, "head_dim")?),
        (
            "attention.layer_norm_rms_epsilon",
            f32_of(c, "rms_norm_eps")?,
        ),
        ("attention.sliding_window", u32_of(c, "sliding_window")?),
        (
            "attention.sliding_window_pattern",
            GgufValue::Array(7, sliding.into_iter().map(GgufValue::Bool).collect()),
        ),
        ("attention.shared_kv_layers", GgufValue::U32(0)),
        ("embedding_length_per_layer_input", GgufValue::U32(0)),
        (
            "rope.freq_base",
            f32_of(&rope["full_attention"], "rope_theta")?,
        ),
        (
            "rope.freq_base_swa",
            f32_of(&rope["sliding_attention"], "rope_theta")?,
        ),
        ("rope.dimension_count", u32_of(c, "global_head_dim")?),
        ("rope.dimension_count_swa", u32_of(c, "head_dim")?),
        (
            "final_logit_softcapping",
            f32_of(c, "final_logit_softcapping")?,
        ),
    ]);
    Ok(kvs)
}

/// The keys every architecture writes alike: sizes of the vocabulary, the
/// context, the hidden state, the layer stack and the query heads.
fn model_keys(c: &Value) -> io::Result<Vec<(&'static str, GgufValue)>> {
    Ok(vec![
        ("vocab_size", u32_of(c, "vocab_size")?),
        ("context_length", u32_of(c, "max_position_embeddings")?),
        ("embedding_length", u32_of(c, "hidden_size")?),
        ("block_count", u32_of(c, "num_hidden_layers")?),
        ("attention.head_count", u32_of(c, "num_attention_heads")?),
    ])
}

/// Where a Qwen3.5 fixture's random values fall when [-0.1, 0.1) would
/// not make a working model: the decay rate `ssm_a` (llama.cpp stores
/// −exp(A_log)) must be negative or the recurrent state grows without
/// bound; norms near one let every layer's branch count; and a final norm
/// of about 3.5 spreads the logits (their spread is about 3.5 × 0.058 ×
/// √hidden, about 10 at Qwen3.5-4B's width) so next-token distributions
/// are peaked, as a trained model's are (with a norm near 2 the best two
/// tokens were about a nat apart), and a top-token comparison is not
/// decided by near-ties.
fn hybrid_range(name: &str) -> Option<std::ops::Range<f32>> {
    if name == "output_norm.weight" {
        Some(3.0..4.0)
    } else if name.ends_with(".ssm_a") {
        Some(-1.0..-0.05)
    } else if name.ends_with("norm.weight") {
        Some(0.8..1.2)
    } else if name.ends_with("ssm_conv1d.weight") {
        Some(-0.5..0.5)
    } else {
        None
    }
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

fn int(config: &Value, key: &str) -> io::Result<u64> {
    config[key]
        .as_u64()
        .ok_or_else(|| invalid(format!("config has no integer {key:?}")))
}

fn u32_of(config: &Value, key: &str) -> io::Result<GgufValue> {
    let value = int(config, key)?;
    u32::try_from(value)
        .map(GgufValue::U32)
        .map_err(|_| invalid(format!("config {key:?} = {value} does not fit a GGUF u32")))
}

fn f32_of(config: &Value, key: &str) -> io::Result<GgufValue> {
    config[key]
        .as_f64()
        .map(|v| GgufValue::F32(v as f32))
        .ok_or_else(|| invalid(format!("config has no number {key:?}")))
}

fn head_dim(config: &Value) -> io::Result<u64> {
    match config["head_dim"].as_u64() {
        Some(d) => Ok(d),
        None => Ok(int(config, "hidden_size")? / int(config, "num_attention_heads")?.max(1)),
    }
}

/// `{arch}.*` keys, without the prefix.
fn hyperparameters(model: &ModelDef) -> io::Result<Vec<(&'static str, GgufValue)>> {
    let c = model.text_config();
    if model.gguf_arch == "gemma4" {
        return gemma4_hyperparameters(c);
    }
    let head_dim = u32::try_from(head_dim(c)?)
        .map_err(|_| invalid("head_dim does not fit a GGUF u32".into()))?;
    let mut kvs = model_keys(c)?;
    kvs.extend([
        ("attention.head_count_kv", u32_of(c, "num_key_value_heads")?),
        ("attention.key_length", GgufValue::U32(head_dim)),
        ("attention.value_length", GgufValue::U32(head_dim)),
        (
            "attention.layer_norm_rms_epsilon",
            f32_of(c, "rms_norm_eps")?,
        ),
        ("rope.freq_base", f32_of(c, "rope_theta")?),
    ]);
    if c["intermediate_size"].is_u64() {
        kvs.push(("feed_forward_length", u32_of(c, "intermediate_size")?));
    }
    let rotated = match c["partial_rotary_factor"].as_f64() {
        Some(f) => (f64::from(head_dim) * f) as u32,
        None => head_dim,
    };
    kvs.push(("rope.dimension_count", GgufValue::U32(rotated)));
    let scaling = &c["rope_scaling"];
    if scaling["rope_type"] == "linear" {
        kvs.push(("rope.scaling.type", GgufValue::string("linear")));
        kvs.push(("rope.scaling.factor", f32_of(scaling, "factor")?));
    }
    if c.get("num_experts").is_some() {
        kvs.push(("expert_count", u32_of(c, "num_experts")?));
        kvs.push(("expert_used_count", u32_of(c, "num_experts_per_tok")?));
        kvs.push((
            "expert_feed_forward_length",
            u32_of(c, "moe_intermediate_size")?,
        ));
    }
    if model.gguf_arch == "gemma3" {
        kvs.push(("attention.sliding_window", u32_of(c, "sliding_window")?));
    }
    if c.get("linear_num_value_heads").is_some() {
        kvs.extend(hybrid_hyperparameters(c)?);
    }
    Ok(kvs)
}

/// Qwen3.5's keys as llama.cpp's converter writes them: the gated delta
/// rule's `ssm.*` dimensions, the layer pattern, the multimodal rope's
/// sections and the shared expert's width.
fn hybrid_hyperparameters(c: &Value) -> io::Result<Vec<(&'static str, GgufValue)>> {
    let value_heads = int(c, "linear_num_value_heads")?;
    let inner = value_heads * int(c, "linear_value_head_dim")?;
    let u32_value = |v: u64| {
        u32::try_from(v)
            .map(GgufValue::U32)
            .map_err(|_| invalid(format!("{v} does not fit a GGUF u32")))
    };
    let mut sections: Vec<GgufValue> = c["mrope_section"]
        .as_array()
        .ok_or_else(|| invalid("config has no mrope_section array".into()))?
        .iter()
        .map(|v| v.as_i64().map(|x| GgufValue::I32(x as i32)))
        .collect::<Option<_>>()
        .ok_or_else(|| invalid("mrope_section holds a non-integer".into()))?;
    sections.resize(4, GgufValue::I32(0));
    let mut kvs = vec![
        ("ssm.conv_kernel", u32_of(c, "linear_conv_kernel_dim")?),
        ("ssm.state_size", u32_of(c, "linear_key_head_dim")?),
        ("ssm.group_count", u32_of(c, "linear_num_key_heads")?),
        ("ssm.time_step_rank", u32_value(value_heads)?),
        ("ssm.inner_size", u32_value(inner)?),
        (
            "full_attention_interval",
            u32_of(c, "full_attention_interval")?,
        ),
        ("rope.dimension_sections", GgufValue::Array(5, sections)),
    ];
    if c.get("shared_expert_intermediate_size").is_some() {
        kvs.push((
            "expert_shared_feed_forward_length",
            u32_of(c, "shared_expert_intermediate_size")?,
        ));
    }
    Ok(kvs)
}

/// GGUF names and ggml dims (reversed from Hugging Face order), in the
/// checkpoint's order; each layer's experts become one `[in, out, n_expert]`
/// tensor where its first expert was.
pub(crate) fn tensors(model: &ModelDef) -> io::Result<Vec<(String, Vec<u64>)>> {
    let config = model.text_config();
    let mut out: Vec<(String, Vec<u64>)> = Vec::new();
    if config["rope_scaling"]["rope_type"] == "llama3" {
        out.push(("rope_freqs.weight".into(), vec![head_dim(config)? / 2]));
    }
    if model.gguf_arch == "gemma4" {
        out.push((
            "rope_freqs.weight".into(),
            vec![int(config, "global_head_dim")? / 2],
        ));
    }
    let gemma = matches!(model.gguf_arch, "gemma3" | "gemma4");
    let hybrid = config.get("linear_num_value_heads").is_some();
    let mut merged: HashMap<String, usize> = HashMap::new();
    for tensor in &model.tensors {
        if tensor.dtype == DType::U32 {
            return Err(invalid(format!(
                "tensor {:?} is MLX-packed U32, which GGUF cannot hold",
                tensor.name
            )));
        }
        if let Some(split) = stacked_experts(&tensor.name, &tensor.shape) {
            out.extend(split);
            continue;
        }
        let Some((name, expert)) = gguf_name(&tensor.name, gemma, hybrid)? else {
            continue;
        };
        let mut dims: Vec<u64> = tensor.shape.iter().rev().copied().collect();
        if is_squeezed(&name) {
            dims.retain(|&d| d != 1);
        }
        if !expert {
            out.push((name, dims));
        } else if let Some(&at) = merged.get(&name) {
            out[at].1[2] += 1;
        } else {
            merged.insert(name.clone(), out.len());
            out.push((name, [dims, vec![1]].concat()));
        }
    }
    Ok(out)
}

/// llama.cpp's name for a Hugging Face tensor, and whether it is one expert
/// of a merged tensor; `None` for tensors outside the language model.
pub(crate) fn gguf_name(hf: &str, gemma: bool, hybrid: bool) -> io::Result<Option<(String, bool)>> {
    if hf.starts_with("vision_tower.") || hf.starts_with("multi_modal_projector.") {
        return Ok(None);
    }
    let unknown = || invalid(format!("no GGUF name for tensor {hf:?}"));
    let name = hf.strip_prefix("language_model.").unwrap_or(hf);
    let global = match name {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(global) = global {
        return Ok(Some((global.into(), false)));
    }
    let rest = name.strip_prefix("model.layers.").ok_or_else(unknown)?;
    let (layer, suffix) = rest.split_once('.').ok_or_else(unknown)?;
    // Qwen3.5's decay parameters are not `module.kind` names.
    let whole = match suffix {
        "linear_attn.dt_bias" => Some("ssm_dt.bias"),
        "linear_attn.A_log" => Some("ssm_a"),
        "layer_scalar" => Some("layer_output_scale.weight"),
        _ => None,
    };
    if let Some(whole) = whole {
        return Ok(Some((format!("blk.{layer}.{whole}"), false)));
    }
    if let Some(expert) = suffix.strip_prefix("mlp.experts.") {
        let merged = match expert.split_once('.').map(|(_, proj)| proj) {
            Some("gate_proj.weight") => "ffn_gate_exps",
            Some("up_proj.weight") => "ffn_up_exps",
            Some("down_proj.weight") => "ffn_down_exps",
            _ => return Err(unknown()),
        };
        return Ok(Some((format!("blk.{layer}.{merged}.weight"), true)));
    }
    let (module, kind) = suffix.rsplit_once('.').ok_or_else(unknown)?;
    let gguf = match module {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" if gemma || hybrid => "post_attention_norm",
        "post_attention_layernorm" | "pre_feedforward_layernorm" => "ffn_norm",
        "post_feedforward_layernorm" => "post_ffw_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        "mlp.gate" => "ffn_gate_inp",
        "mlp.shared_expert.gate_proj" => "ffn_gate_shexp",
        "mlp.shared_expert.up_proj" => "ffn_up_shexp",
        "mlp.shared_expert.down_proj" => "ffn_down_shexp",
        "mlp.shared_expert_gate" => "ffn_gate_inp_shexp",
        "linear_attn.in_proj_qkv" => "attn_qkv",
        "linear_attn.in_proj_z" => "attn_gate",
        "linear_attn.in_proj_b" => "ssm_beta",
        "linear_attn.in_proj_a" => "ssm_alpha",
        "linear_attn.conv1d" => "ssm_conv1d",
        "linear_attn.norm" => "ssm_norm",
        "linear_attn.out_proj" => "ssm_out",
        _ => return Err(unknown()),
    };
    Ok(Some((format!("blk.{layer}.{gguf}.{kind}"), false)))
}

/// A layer's stacked experts (Qwen3.5 MoE's HF `mlp.experts.gate_up_proj`,
/// `[experts, 2 × width, hidden]`, and `mlp.experts.down_proj`) as
/// llama.cpp's merged tensors, in ggml order: gate_up split into its gate
/// and up halves.
pub(crate) fn stacked_experts(hf: &str, shape: &[u64]) -> Option<Vec<(String, Vec<u64>)>> {
    let name = hf.strip_prefix("language_model.").unwrap_or(hf);
    let (layer, module) = name.strip_prefix("model.layers.")?.split_once('.')?;
    let blk = |n: &str| format!("blk.{layer}.{n}.weight");
    match (module, shape) {
        ("mlp.experts.gate_up_proj", &[experts, rows, hidden]) => Some(
            ["ffn_gate_exps", "ffn_up_exps"]
                .map(|n| (blk(n), vec![hidden, rows / 2, experts]))
                .to_vec(),
        ),
        ("mlp.experts.down_proj", &[experts, hidden, width]) => {
            Some(vec![(blk("ffn_down_exps"), vec![width, hidden, experts])])
        }
        _ => None,
    }
}

/// The tensors llama.cpp's converter stores without their unit
/// dimensions: the convolution taps (`[channels, 1, taps]` in the HF
/// file) and the shared expert's one-row gate.
pub(crate) fn is_squeezed(gguf_name: &str) -> bool {
    gguf_name.ends_with("ssm_conv1d.weight") || gguf_name.ends_with("ffn_gate_inp_shexp.weight")
}

fn stored_type(name: &str, dims: &[u64], wanted: GgufTensorType) -> GgufTensorType {
    // llama.cpp keeps the convolution taps in f32 as well.
    if dims.len() <= 1
        || name.ends_with("ffn_gate_inp.weight")
        || name.ends_with("ssm_conv1d.weight")
    {
        GgufTensorType::F32
    } else if dims[0].is_multiple_of(wanted.ggml().block_elems()) {
        wanted
    } else {
        GgufTensorType::F16
    }
}
