//! ModelSpec from a Hugging Face / MLX `config.json` and safetensors headers.

mod qwen35;
mod vocab;

use std::collections::HashMap;
use std::path::PathBuf;

use fathom_checkpoint::{HfCheckpoint, StDtype};
use serde_json::Value;

use crate::{
    gemma_layer_is_sliding, limits, positive, Attention, Family, Layer, ModelSpec, Rope, SpecError,
    TensorEntry, POSITIVE,
};

/// Gemma 3 configs written before `layer_types` existed rely on this default.
const GEMMA3_DEFAULT_PATTERN: u64 = 6;

pub(crate) fn spec(checkpoint: &HfCheckpoint) -> Result<ModelSpec, SpecError> {
    let cfg = Config {
        value: checkpoint.text_config(),
        path: checkpoint.dir.join("config.json"),
    };
    let model_type = cfg.str("model_type")?.unwrap_or("").to_string();
    let architecture = checkpoint
        .config
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| model_type.clone());
    let family = match model_type.as_str() {
        "llama" | "mistral" => Family::Llama,
        "qwen2" => Family::Qwen2,
        "qwen3" => Family::Qwen3,
        "qwen3_moe" => Family::Qwen3Moe,
        "gemma3" | "gemma3_text" => Family::Gemma3,
        "qwen3_5" | "qwen3_5_text" => Family::Qwen35,
        "qwen3_5_moe" | "qwen3_5_moe_text" => Family::Qwen35Moe,
        "" => Family::Unknown(architecture.clone()),
        other => Family::Unknown(other.to_string()),
    };
    let (tensors, skipped): (Vec<TensorEntry>, Vec<TensorEntry>) = tensor_table(checkpoint)
        .into_iter()
        .partition(|t| !is_vision_tensor(&t.name));
    let source = format!(
        "{} header{}, {} tensors",
        if checkpoint.quantization.is_some() {
            "MLX safetensors"
        } else {
            "safetensors"
        },
        match checkpoint.files.len() {
            1 => String::new(),
            n => format!("s of {n} shards"),
        },
        tensors.len()
    );
    let tied_embeddings = !tensors.iter().any(|t| t.name.ends_with("lm_head.weight"));
    let mut notes = Vec::new();
    if !skipped.is_empty() {
        let bytes = skipped
            .iter()
            .fold(0u64, |sum, t| sum.saturating_add(t.bytes));
        notes.push(format!(
            "{} vision tensors ({bytes} bytes) are not planned: fathom runs the language model only",
            skipped.len()
        ));
    }

    let n_layers = cfg.u64("num_hidden_layers")?;
    let hidden = cfg.u64("hidden_size")?;
    let n_heads = cfg.u64("num_attention_heads")?;
    let (Some(n_layers), Some(hidden), Some(n_heads)) = (n_layers, hidden, n_heads) else {
        if !matches!(family, Family::Unknown(_)) {
            let field = ["num_hidden_layers", "hidden_size", "num_attention_heads"]
                .into_iter()
                .find(|k| cfg.value.get(*k).is_none())
                .unwrap_or("num_hidden_layers");
            return Err(cfg.missing(field, family.name()));
        }
        notes.push(format!(
            "model type {:?} is not a family fathom runs, and its config.json lacks \
             num_hidden_layers / hidden_size / num_attention_heads: only the weights are planned",
            family.name()
        ));
        let spec = ModelSpec::weights_only(architecture, family, tensors, tied_embeddings, notes);
        return Ok(ModelSpec { source, ..spec });
    };
    let n_layers = limits::layers(&cfg.path, "num_hidden_layers", n_layers)?;
    let hidden = limits::dim(&cfg.path, "hidden_size", hidden)?;
    let n_heads = limits::nonzero_dim(&cfg.path, "num_attention_heads", n_heads)?;
    let n_kv_heads = match cfg.u64("num_key_value_heads")? {
        Some(h) => limits::dim(&cfg.path, "num_key_value_heads", h)?,
        None => n_heads,
    };
    let head_dim = match cfg.u64("head_dim")? {
        Some(d) => limits::nonzero_dim(&cfg.path, "head_dim", d)?,
        None => hidden / n_heads,
    };
    let ffn = limits::dim(
        &cfg.path,
        "intermediate_size",
        // MoE configs may leave it null (every FFN is experts).
        cfg.u64_or_null("intermediate_size")?.unwrap_or(0),
    )?;
    let n_experts = match cfg.u64("num_experts")? {
        Some(n) => Some(n),
        None => cfg.u64("num_local_experts")?,
    }
    .unwrap_or(0);
    let n_experts = limits::dim(&cfg.path, "num_experts", n_experts)?;
    let n_experts_active = cfg.u64("num_experts_per_tok")?.unwrap_or(0);
    let expert_ffn = match cfg.u64("moe_intermediate_size")? {
        Some(w) => limits::dim(&cfg.path, "moe_intermediate_size", w)?,
        None if n_experts > 0 => ffn,
        None => 0,
    };
    let vocab = limits::dim(&cfg.path, "vocab_size", cfg.u64("vocab_size")?.unwrap_or(0))?;
    let context_length = cfg.u64("max_position_embeddings")?.unwrap_or(0);

    let qwen35 = match family.is_qwen35() {
        true => Some(qwen35::read(&cfg, head_dim)?),
        false => None,
    };
    let attention = layer_attention(&cfg, &family, n_layers)?;
    let layers = attention
        .into_iter()
        .map(|attention| Layer {
            attention,
            // A linear-attention layer holds a recurrent state, no KV.
            n_kv_heads: match attention {
                Attention::Linear => 0,
                _ => n_kv_heads,
            },
            key_dim: head_dim,
            value_dim: head_dim,
            kv_elsewhere: false,
        })
        .collect();

    let scaling = cfg.value.get("rope_scaling").filter(|v| v.is_object());
    let rope = Rope {
        theta: match cfg.rope_field("rope_theta") {
            Some((field, v)) => match v.as_f64() {
                Some(x) if x.is_finite() && positive(x) => x,
                _ => return Err(cfg.invalid(&field, v, POSITIVE)),
            },
            None => 10_000.0,
        },
        local_theta: cfg.f64_where("rope_local_base_freq", positive, POSITIVE)?,
        factors_global_only: false,
        neox: family.rope_neox(),
        dims: qwen35.as_ref().and_then(|q| q.rope_dims),
        // Qwen3.5's multimodal rope is plain rope for text (its sections
        // are checked to be).
        scaling: scaling
            .and_then(|s| s.get("rope_type").or_else(|| s.get("type")))
            .and_then(Value::as_str)
            .filter(|s| *s != "default" && !(family.is_qwen35() && *s == "mrope"))
            .map(str::to_string),
        scaling_factor: match scaling.and_then(|s| s.get("factor")) {
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && positive(x) => Some(x),
                _ => return Err(cfg.invalid("rope_scaling.factor", v, POSITIVE)),
            },
            None => None,
        },
        llama3: scaling.and_then(llama3_rope),
        yarn: None,
    };
    if let Family::Unknown(name) = &family {
        notes.push(format!(
            "model type {name:?} is not a family fathom runs: the plan uses its generic \
             hyperparameters, and running it will fail"
        ));
    }
    let mtp_layers = qwen35.as_ref().map_or(0, |q| q.mtp_layers);
    if mtp_layers > 0 {
        notes.push(format!(
            "{mtp_layers} multi-token-prediction layer(s) (mtp.*): their weights are counted, \
             but fathom does not run them (no speculative decoding)"
        ));
    }
    let shared_expert_ffn = match family.is_qwen35() {
        true => limits::dim(
            &cfg.path,
            "shared_expert_intermediate_size",
            cfg.u64("shared_expert_intermediate_size")?.unwrap_or(0),
        )?,
        false => 0,
    };
    // Qwen3.5 MoE renormalizes the top-k weights unless told not to.
    let norm_topk_prob = match cfg.value.get("norm_topk_prob") {
        Some(v) => v.as_bool() == Some(true),
        None => family.is_qwen35() && n_experts > 0,
    };
    let vocab_header = vocab::header(checkpoint, &mut notes);
    Ok(ModelSpec {
        architecture,
        block: family.block_style(true),
        family,
        n_layers,
        hidden,
        n_heads,
        n_kv_heads,
        head_dim,
        ffn,
        vocab,
        n_experts,
        n_experts_active,
        expert_ffn,
        context_length,
        layers,
        rope: Some(rope),
        rms_norm_eps: cfg
            .f64_where("rms_norm_eps", crate::valid_epsilon, crate::EPSILON)?
            .unwrap_or(1e-6),
        attn_scale: cfg.f64("query_pre_attn_scalar")?.map(|s| 1.0 / s.sqrt()),
        final_logit_softcap: None,
        norm_topk_prob,
        shared_expert_ffn,
        linear: qwen35.map(|q| q.linear),
        mtp_layers,
        tokenizer_merges: 0,
        vocab_header,
        tied_embeddings,
        streamed_weights: 0,
        tensors,
        source,
        notes,
    })
}

/// Llama 3.1's `rope_scaling` with `rope_type: llama3` and its four numbers.
fn llama3_rope(scaling: &Value) -> Option<crate::Llama3Rope> {
    let kind = scaling.get("rope_type").or_else(|| scaling.get("type"))?;
    if kind.as_str()? != "llama3" {
        return None;
    }
    let num = |k: &str| {
        scaling
            .get(k)
            .and_then(Value::as_f64)
            .filter(|x| x.is_finite() && *x > 0.0)
    };
    let rope = crate::Llama3Rope {
        factor: num("factor")?,
        low_freq_factor: num("low_freq_factor")?,
        high_freq_factor: num("high_freq_factor")?,
        original_context: num("original_max_position_embeddings")?,
    };
    (rope.high_freq_factor > rope.low_freq_factor).then_some(rope)
}

/// Per-layer attention from `layer_types` when present (newer configs;
/// Qwen3.5's name its linear-attention layers), else from each family's
/// older fields.
fn layer_attention(
    cfg: &Config,
    family: &Family,
    n_layers: u64,
) -> Result<Vec<Attention>, SpecError> {
    let window = cfg.u64_or_null("sliding_window")?.filter(|&w| w > 0);
    let linear = family.is_qwen35();
    if let Some(types) = cfg.value.get("layer_types") {
        let other = match linear {
            true => "linear_attention",
            false => "sliding_attention",
        };
        let expected =
            format!("an array of {n_layers} strings, each \"full_attention\" or \"{other}\"");
        let invalid = || cfg.invalid("layer_types", types, &expected);
        let items = types.as_array().ok_or_else(invalid)?;
        if items.len() as u64 != n_layers {
            return Err(invalid());
        }
        return items
            .iter()
            .map(|t| match (t.as_str(), window) {
                (Some("full_attention"), _) => Ok(Attention::Full),
                (Some("linear_attention"), _) if linear => Ok(Attention::Linear),
                (Some("sliding_attention"), _) if linear => Err(invalid()),
                (Some("sliding_attention"), Some(window)) => Ok(Attention::Sliding { window }),
                (Some("sliding_attention"), None) => {
                    Err(cfg.missing("sliding_window", family.name()))
                }
                _ => Err(invalid()),
            })
            .collect();
    }
    if linear {
        return qwen35::interval_layers(cfg, n_layers);
    }
    let Some(window) = window else {
        return Ok(vec![Attention::Full; n_layers as usize]);
    };
    let sliding = |layer: u64| -> Result<bool, SpecError> {
        Ok(match family {
            Family::Gemma3 => {
                let pattern = cfg
                    .u64("sliding_window_pattern")?
                    .unwrap_or(GEMMA3_DEFAULT_PATTERN);
                gemma_layer_is_sliding(layer, pattern)
            }
            // Qwen2-style configs carry a window that is off unless
            // `use_sliding_window`, and then only from `max_window_layers` on.
            Family::Qwen2 | Family::Qwen3 | Family::Qwen3Moe => {
                cfg.value.get("use_sliding_window").and_then(Value::as_bool) == Some(true)
                    && layer >= cfg.u64("max_window_layers")?.unwrap_or(0)
            }
            // Mistral v0.1 slides in every layer.
            _ => true,
        })
    };
    (0..n_layers)
        .map(|i| {
            Ok(if sliding(i)? {
                Attention::Sliding { window }
            } else {
                Attention::Full
            })
        })
        .collect()
}

/// Multimodal checkpoints carry an image encoder that a text runtime never
/// reads, so it is never resident.
fn is_vision_tensor(name: &str) -> bool {
    [
        "vision_tower.",
        "multi_modal_projector.",
        "vision_model.",
        "model.visual.",
    ]
    .iter()
    .any(|prefix| name.starts_with(prefix))
}

/// The stored tensors, with MLX packed words counted as the weights they pack.
fn tensor_table(checkpoint: &HfCheckpoint) -> Vec<TensorEntry> {
    let bits = checkpoint.quantization.map(|q| u64::from(q.bits));
    let packed: HashMap<&str, bool> = checkpoint
        .tensors
        .iter()
        .filter_map(|t| Some((t.name.strip_suffix(".weight")?, t.dtype == StDtype::U32)))
        .collect();
    checkpoint
        .tensors
        .iter()
        .map(|t| {
            let numel = t.shape.iter().fold(1u64, |n, &d| n.saturating_mul(d));
            let is_packed_weight = t.dtype == StDtype::U32
                && t.name
                    .strip_suffix(".weight")
                    .is_some_and(|p| packed.get(p) == Some(&true));
            let is_quant_aux = [".scales", ".biases"].iter().any(|suffix| {
                t.name
                    .strip_suffix(suffix)
                    .is_some_and(|p| packed.get(p) == Some(&true))
            });
            let stored_row = t.shape.last().copied().unwrap_or(1);
            let (params, row_len) = match bits {
                Some(bits) if is_packed_weight => (
                    numel.saturating_mul(32) / bits,
                    stored_row.saturating_mul(32) / bits,
                ),
                Some(_) if is_quant_aux => (0, stored_row),
                _ => (numel, stored_row),
            };
            TensorEntry {
                name: t.name.clone(),
                dtype: t.dtype.name().to_string(),
                shape: t.shape.clone(),
                params,
                row_len,
                bytes: t.n_bytes(),
            }
        })
        .collect()
}

/// Typed reads of `config.json` fields, where a value of the wrong type is
/// an error naming the field rather than a silent default.
struct Config<'a> {
    value: &'a Value,
    path: PathBuf,
}

impl Config<'_> {
    fn invalid(&self, field: &str, value: &Value, expected: &str) -> SpecError {
        let mut shown = value.to_string();
        if shown.len() > 80 {
            shown.truncate(shown.floor_char_boundary(80));
            shown.push_str("...");
        }
        SpecError::InvalidField {
            path: self.path.clone(),
            field: field.to_string(),
            value: shown,
            expected: expected.to_string(),
        }
    }

    fn missing(&self, field: &str, family: &str) -> SpecError {
        SpecError::MissingField {
            path: self.path.clone(),
            field: field.to_string(),
            family: family.to_string(),
        }
    }

    fn u64(&self, field: &str) -> Result<Option<u64>, SpecError> {
        match self.value.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.invalid(field, v, "a non-negative integer")),
        }
    }

    /// Like [`Self::u64`], with JSON `null` meaning absent (`sliding_window: null`).
    fn u64_or_null(&self, field: &str) -> Result<Option<u64>, SpecError> {
        match self.value.get(field) {
            Some(Value::Null) => Ok(None),
            _ => self.u64(field),
        }
    }

    fn f64(&self, field: &str) -> Result<Option<f64>, SpecError> {
        match self.value.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x)),
                _ => Err(self.invalid(field, v, "a finite number")),
            },
        }
    }

    /// A finite number that `valid` accepts; `expected` says which.
    fn f64_where(
        &self,
        field: &str,
        valid: fn(f64) -> bool,
        expected: &str,
    ) -> Result<Option<f64>, SpecError> {
        match self.f64(field)? {
            Some(x) if !valid(x) => Err(self.invalid(field, &self.value[field], expected)),
            x => Ok(x),
        }
    }

    /// A rope field at the top of the config or inside `rope_parameters`
    /// (transformers 5) or `rope_scaling` (older configs), with the path
    /// it was found at.
    fn rope_field(&self, field: &str) -> Option<(String, &Value)> {
        if let Some(v) = self.value.get(field).filter(|v| !v.is_null()) {
            return Some((field.to_string(), v));
        }
        ["rope_parameters", "rope_scaling"]
            .into_iter()
            .find_map(|outer| {
                let v = self.value.get(outer)?.get(field).filter(|v| !v.is_null())?;
                Some((format!("{outer}.{field}"), v))
            })
    }

    fn str(&self, field: &str) -> Result<Option<&str>, SpecError> {
        match self.value.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.invalid(field, v, "a string")),
        }
    }
}
