//! Qwen3.5's `config.json` fields (transformers' `qwen3_5_text` and
//! `qwen3_5_moe_text`, nested under `text_config` in the multimodal
//! checkpoints): the gated delta rule's `linear_*` dimensions, the layer
//! pattern, the partial multimodal rope and the gated attention.

use serde_json::Value;

use super::Config;
use crate::{limits, Attention, LinearAttention, SpecError};

/// transformers' `Qwen3_5TextConfig` default when a config leaves
/// `partial_rotary_factor` out: a quarter of each head is rotated.
const DEFAULT_PARTIAL_ROTARY_FACTOR: f64 = 0.25;

/// What the Qwen3.5 fields give the spec beyond the generic ones.
pub(super) struct Qwen35 {
    pub linear: LinearAttention,
    /// The rotated part of a head when it is less than the head.
    pub rope_dims: Option<u64>,
    /// Multi-token-prediction layers (`mtp_num_hidden_layers`), whose
    /// `mtp.*` tensors are counted but not run.
    pub mtp_layers: u64,
}

/// Reads and checks the Qwen3.5 fields; `head_dim` is the full-attention
/// layers' head.
pub(super) fn read(cfg: &Config, head_dim: u64) -> Result<Qwen35, SpecError> {
    let required = |field: &str| -> Result<u64, SpecError> {
        let value = cfg
            .u64(field)?
            .ok_or_else(|| cfg.missing(field, "qwen3_5"))?;
        limits::nonzero_dim(&cfg.path, field, value)
    };
    let key_dim = required("linear_key_head_dim")?;
    let value_dim = required("linear_value_head_dim")?;
    if value_dim != key_dim {
        return Err(cfg.invalid(
            "linear_value_head_dim",
            &Value::from(value_dim),
            &format!(
                "{key_dim} (linear_key_head_dim): fathom's gated delta rule runs key and \
                 value heads of one width, as llama.cpp's does"
            ),
        ));
    }
    let linear = LinearAttention {
        conv_kernel: required("linear_conv_kernel_dim")?,
        key_heads: required("linear_num_key_heads")?,
        value_heads: required("linear_num_value_heads")?,
        head_dim: key_dim,
    };
    if !linear.value_heads.is_multiple_of(linear.key_heads) {
        return Err(cfg.invalid(
            "linear_num_value_heads",
            &Value::from(linear.value_heads),
            &format!(
                "a multiple of linear_num_key_heads = {}: each key head serves whole value heads",
                linear.key_heads
            ),
        ));
    }
    // The output gate is what fathom's Qwen3.5 attention runs; a config
    // that turns it off describes a block fathom does not run.
    if let Some(gate) = cfg.value.get("attn_output_gate") {
        if gate.as_bool() != Some(true) {
            return Err(cfg.invalid(
                "attn_output_gate",
                gate,
                "true (Qwen3.5's attention output is gated)",
            ));
        }
    }
    let (factor_field, factor) = match cfg.rope_field("partial_rotary_factor") {
        Some((field, v)) => match v.as_f64() {
            Some(f) if f > 0.0 && f <= 1.0 => (field, f),
            _ => return Err(cfg.invalid(&field, v, "a number above 0 and at most 1")),
        },
        None => (
            "partial_rotary_factor".to_string(),
            DEFAULT_PARTIAL_ROTARY_FACTOR,
        ),
    };
    // As llama.cpp's converter computes `rope.dimension_count`.
    let dims = (head_dim as f64 * factor) as u64;
    if dims == 0 || !dims.is_multiple_of(2) {
        return Err(cfg.invalid(
            &factor_field,
            &Value::from(factor),
            &format!(
                "a fraction of the {head_dim}-value head that rotates an even number of values"
            ),
        ));
    }
    if let Some((field, value)) = cfg.rope_field("mrope_section") {
        let sections: Option<Vec<u64>> = value
            .as_array()
            .and_then(|items| items.iter().map(Value::as_u64).collect());
        if !sections.is_some_and(|s| crate::mrope_is_text_rope(&s, dims / 2)) {
            return Err(cfg.invalid(&field, value, crate::MROPE_SECTIONS));
        }
    }
    Ok(Qwen35 {
        linear,
        rope_dims: (dims < head_dim).then_some(dims),
        mtp_layers: cfg.u64("mtp_num_hidden_layers")?.unwrap_or(0),
    })
}

/// Qwen3.5's layers without `layer_types`: every layer linear attention
/// but each `full_attention_interval`-th. A config without the interval
/// is refused rather than given a guessed pattern.
pub(super) fn interval_layers(cfg: &Config, n_layers: u64) -> Result<Vec<Attention>, SpecError> {
    let field = "full_attention_interval";
    let interval = cfg
        .u64(field)?
        .ok_or_else(|| cfg.missing(field, "qwen3_5"))?;
    if interval == 0 {
        return Err(cfg.invalid(
            field,
            &Value::from(0),
            "at least 1 (every interval-th layer is full attention)",
        ));
    }
    Ok((0..n_layers)
        .map(|i| match (i + 1).is_multiple_of(interval) {
            true => Attention::Full,
            false => Attention::Linear,
        })
        .collect())
}
