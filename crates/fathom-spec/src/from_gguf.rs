//! ModelSpec from GGUF metadata (`{arch}.*` keys as llama.cpp writes them).

mod gemma4;

use fathom_checkpoint::tokenizer_json::split_merge;
use fathom_checkpoint::{GgufFile, MetaValue};

use crate::{
    gemma_layer_is_sliding, limits, positive, Attention, Family, Layer, LinearAttention, ModelSpec,
    Rope, SpecError, TensorEntry, POSITIVE,
};

/// llama.cpp hard-codes Gemma 3's layer pattern and local rope base rather
/// than storing them; a file that does store them wins.
const GEMMA3_PATTERN: u64 = 6;
const GEMMA3_LOCAL_ROPE_THETA: f64 = 10_000.0;

pub(crate) fn spec(file: &GgufFile) -> Result<ModelSpec, SpecError> {
    let meta = Meta { file };
    let architecture = meta
        .str("general.architecture")?
        .ok_or_else(|| meta.missing("general.architecture", "any"))?
        .to_string();
    let family = match architecture.as_str() {
        "llama" | "mistral" => Family::Llama,
        "qwen2" => Family::Qwen2,
        "qwen3" => Family::Qwen3,
        "qwen3moe" => Family::Qwen3Moe,
        "gemma3" => Family::Gemma3,
        "gemma4" => Family::Gemma4,
        "qwen35" => Family::Qwen35,
        "qwen35moe" => Family::Qwen35Moe,
        "gpt-oss" => Family::GptOss,
        other => Family::Unknown(other.to_string()),
    };
    let tensors: Vec<TensorEntry> = file
        .tensors
        .iter()
        .map(|t| TensorEntry {
            name: t.name.clone(),
            dtype: t.ggml_type.name().to_string(),
            shape: t.dims.clone(),
            params: t.n_elements,
            row_len: t.dims.first().copied().unwrap_or(1),
            bytes: t.n_bytes,
        })
        .collect();
    let source = format!(
        "GGUF v{} header, {} tensors",
        file.version,
        file.tensors.len()
    );
    let tied_embeddings = !file.tensors.iter().any(|t| t.name == "output.weight");
    let key = |suffix: &str| format!("{architecture}.{suffix}");
    let mut notes = Vec::new();

    let n_layers = meta.u64(&key("block_count"))?;
    let hidden = meta.u64(&key("embedding_length"))?;
    let n_heads = meta.first_of_per_layer(&key("attention.head_count"))?;
    let (Some(n_layers), Some(hidden), Some(n_heads)) = (n_layers, hidden, n_heads) else {
        if family != Family::Unknown(architecture.clone()) {
            let field = ["block_count", "embedding_length", "attention.head_count"]
                .into_iter()
                .map(key)
                .find(|k| file.get(k).is_none())
                .unwrap_or_else(|| key("block_count"));
            return Err(meta.missing(&field, family.name()));
        }
        notes.push(format!(
            "architecture {architecture:?} is not a family fathom runs, and its GGUF lacks \
             {architecture}.block_count / embedding_length / attention.head_count: \
             only the weights are planned"
        ));
        let spec = ModelSpec::weights_only(architecture, family, tensors, tied_embeddings, notes);
        return Ok(ModelSpec { source, ..spec });
    };
    let n_layers = limits::layers(&meta.file.path, &key("block_count"), n_layers)?;
    // llama.cpp's block count includes the multi-token-prediction layers
    // stored after the decoder's; they are not run.
    let mtp_layers = meta.u64(&key("nextn_predict_layers"))?.unwrap_or(0);
    if mtp_layers >= n_layers {
        return Err(SpecError::InvalidField {
            path: meta.file.path.clone(),
            field: key("nextn_predict_layers"),
            value: mtp_layers.to_string(),
            expected: format!("fewer than the {n_layers} layers of {}", key("block_count")),
        });
    }
    let n_layers = n_layers - mtp_layers;
    let hidden = limits::dim(&meta.file.path, &key("embedding_length"), hidden)?;
    let n_heads = limits::nonzero_dim(&meta.file.path, &key("attention.head_count"), n_heads)?;

    let kv_heads = meta
        .per_layer(&key("attention.head_count_kv"), n_layers)?
        .unwrap_or_else(|| vec![n_heads; n_layers as usize]);
    for &h in &kv_heads {
        limits::dim(&meta.file.path, &key("attention.head_count_kv"), h)?;
    }
    let key_dim = match meta.u64(&key("attention.key_length"))? {
        Some(d) => limits::nonzero_dim(&meta.file.path, &key("attention.key_length"), d)?,
        None => hidden / n_heads,
    };
    let value_dim = match meta.u64(&key("attention.value_length"))? {
        Some(d) => limits::nonzero_dim(&meta.file.path, &key("attention.value_length"), d)?,
        None => key_dim,
    };
    let ffn = match meta.per_layer(&key("feed_forward_length"), n_layers)? {
        Some(widths) => widths.into_iter().max().unwrap_or(0),
        None => 0,
    };
    let ffn = limits::dim(&meta.file.path, &key("feed_forward_length"), ffn)?;
    let n_experts = meta.u64(&key("expert_count"))?.unwrap_or(0);
    let n_experts = limits::dim(&meta.file.path, &key("expert_count"), n_experts)?;
    let n_experts_active = meta.u64(&key("expert_used_count"))?.unwrap_or(0);
    let expert_ffn = match meta.u64(&key("expert_feed_forward_length"))? {
        Some(w) => limits::dim(&meta.file.path, &key("expert_feed_forward_length"), w)?,
        None if n_experts > 0 => ffn,
        None => 0,
    };
    let vocab = match meta.u64(&key("vocab_size"))? {
        Some(v) => v,
        None => match file
            .get("tokenizer.ggml.tokens")
            .and_then(MetaValue::as_array)
        {
            Some(tokens) => tokens.len() as u64,
            None => file
                .tensors
                .iter()
                .find(|t| t.name == "token_embd.weight")
                .and_then(|t| t.dims.get(1).copied())
                .unwrap_or(0),
        },
    };
    let vocab = limits::dim(&meta.file.path, &key("vocab_size"), vocab)?;
    let context_length = meta.u64(&key("context_length"))?.unwrap_or(0);

    let window = meta
        .u64(&key("attention.sliding_window"))?
        .filter(|&w| w > 0);
    let gpt_oss_sliding = if family == Family::GptOss {
        window.ok_or_else(|| meta.missing(&key("attention.sliding_window"), family.name()))?;
        sliding_pattern(&meta, &key, n_layers, GPT_OSS_PATTERN)?
    } else {
        Vec::new()
    };
    let gemma4 = match family {
        Family::Gemma4 => {
            if window.is_none() {
                return Err(meta.missing(&key("attention.sliding_window"), "gemma4"));
            }
            Some(gemma4::read(&meta, &key, n_layers, key_dim)?)
        }
        _ => None,
    };
    let sliding = |layer: u64| -> bool {
        match (&family, window) {
            (_, None) => false,
            (Family::Gemma3, Some(_)) => gemma_layer_is_sliding(layer, GEMMA3_PATTERN),
            (Family::GptOss, Some(_)) => gpt_oss_sliding[layer as usize],
            (Family::Gemma4, Some(_)) => gemma4.as_ref().is_some_and(|g| g.sliding[layer as usize]),
            // Other families that store a window use it in every layer.
            (_, Some(_)) => true,
        }
    };
    let (linear, recurrent) = if family.is_qwen35() {
        let linear = linear_attention(&meta, &key)?;
        (Some(linear), recurrent_layers(&meta, &key, n_layers)?)
    } else {
        (None, vec![false; n_layers as usize])
    };
    let layers = (0..n_layers)
        .map(|i| {
            let attention = match window {
                _ if recurrent[i as usize] => Attention::Linear,
                _ if gemma4.as_ref().is_some_and(|g| !g.holds_kv(i, n_layers)) => Attention::None,
                Some(window) if sliding(i) => Attention::Sliding { window },
                _ => Attention::Full,
            };
            // Gemma 4's sliding layers have heads of their own width.
            let (key_dim, value_dim) = match &gemma4 {
                Some(g) if sliding(i) => (g.key_dim_swa, g.value_dim_swa),
                _ => (key_dim, value_dim),
            };
            Layer {
                attention,
                n_kv_heads: if attention == Attention::Linear {
                    0
                } else {
                    kv_heads[i as usize]
                },
                key_dim,
                value_dim,
                kv_elsewhere: false,
            }
        })
        .collect();

    let rope = Rope {
        theta: meta
            .f64_where(&key("rope.freq_base"), positive, POSITIVE)?
            .unwrap_or(10_000.0),
        local_theta: match &gemma4 {
            Some(g) => Some(g.theta_swa),
            None => (family == Family::Gemma3).then_some(GEMMA3_LOCAL_ROPE_THETA),
        },
        factors_global_only: gemma4.is_some(),
        neox: family.rope_neox(),
        dims: if family.is_qwen35() {
            rotary_dims(&meta, &key, key_dim)?
        } else {
            None
        },
        scaling: meta
            .str(&key("rope.scaling.type"))?
            .filter(|s| *s != "none")
            .map(str::to_string),
        scaling_factor: meta.f64_where(&key("rope.scaling.factor"), positive, POSITIVE)?,
        // GGUF carries llama3 scaling as the `rope_freqs.weight` tensor.
        llama3: None,
        yarn: None,
    };
    // Only gpt-oss runs YaRN so far; other families keep their rope as
    // before (the scaling type is still reported).
    let rope = match family {
        Family::GptOss => Rope {
            yarn: yarn_rope(&meta, &key, &rope, context_length)?,
            ..rope
        },
        _ => rope,
    };
    if let Family::Unknown(name) = &family {
        notes.push(format!(
            "architecture {name:?} is not a family fathom runs: the plan uses its generic \
             hyperparameters, and running it will fail"
        ));
    }
    let rms_norm_eps = meta
        .f64_where(
            &key("attention.layer_norm_rms_epsilon"),
            crate::valid_epsilon,
            crate::EPSILON,
        )?
        .unwrap_or(1e-5);
    // llama.cpp's qwen3moe and qwen35moe graphs always renormalize the
    // top-k weights.
    // gpt-oss weights its chosen experts by a softmax over their logits:
    // the full softmax renormalized over the top k.
    let norm_topk_prob = matches!(
        family,
        Family::Qwen3Moe | Family::Qwen35Moe | Family::GptOss
    );
    let shared_expert_ffn = match meta.u64(&key("expert_shared_feed_forward_length"))? {
        Some(w) => limits::dim(
            &meta.file.path,
            &key("expert_shared_feed_forward_length"),
            w,
        )?,
        None => 0,
    };
    if let Some(g) = &gemma4 {
        notes.extend(g.notes(n_layers, n_experts));
    }
    if mtp_layers > 0 {
        notes.push(format!(
            "{mtp_layers} multi-token-prediction layer(s) after the decoder's: their weights are \
             counted, but fathom does not run them (no speculative decoding)"
        ));
    }
    Ok(ModelSpec {
        architecture,
        block: family.block_style(false),
        n_kv_heads: kv_heads.iter().copied().max().unwrap_or(0),
        family,
        n_layers,
        hidden,
        n_heads,
        head_dim: key_dim,
        ffn,
        vocab,
        n_experts,
        n_experts_active,
        expert_ffn,
        context_length,
        layers,
        rope: Some(rope),
        rms_norm_eps,
        // llama.cpp scales by 1/√key_dim for every family it converts
        // here but Gemma 4, whose normed q and k go unscaled.
        attn_scale: gemma4.is_some().then_some(1.0),
        final_logit_softcap: gemma4.as_ref().and_then(|g| g.softcap),
        norm_topk_prob,
        shared_expert_ffn,
        linear,
        mtp_layers,
        tokenizer_merges: file
            .get("tokenizer.ggml.merges")
            .and_then(MetaValue::as_array)
            .map_or(0, |m| m.len() as u64),
        vocab_header: vocab_header(file),
        tied_embeddings,
        streamed_weights: 0,
        tensors,
        source,
        notes,
    })
}

/// The embedded tokenizer's counts and string bytes, from the parsed
/// metadata (no file reads): entries that are not strings count no bytes,
/// as the tokenizer then refuses the file.
fn vocab_header(file: &GgufFile) -> crate::VocabHeader {
    let array = |key: &str| file.get(key).and_then(MetaValue::as_array);
    let bytes = |items: &[MetaValue]| {
        items
            .iter()
            .filter_map(MetaValue::as_str)
            .map(|s| s.len() as u64)
            .sum::<u64>()
    };
    let chunks = |items: &[MetaValue]| {
        items
            .iter()
            .filter_map(MetaValue::as_str)
            .map(|s| crate::string_heap_bytes(s.len() as u64))
            .sum::<u64>()
    };
    let tokens = array("tokenizer.ggml.tokens").unwrap_or(&[]);
    let merges = array("tokenizer.ggml.merges").unwrap_or(&[]);
    let merge_part_chunks = merges
        .iter()
        .filter_map(MetaValue::as_str)
        .filter_map(split_merge)
        .map(|(left, right)| {
            crate::string_heap_bytes(left.len() as u64)
                + crate::string_heap_bytes(right.len() as u64)
        })
        .sum::<u64>();
    let n = tokens.len();
    crate::VocabHeader {
        tokens: n as u64,
        token_bytes: bytes(tokens),
        token_arrays: if n == 0 {
            0
        } else {
            [
                "tokenizer.ggml.tokens",
                "tokenizer.ggml.token_type",
                "tokenizer.ggml.scores",
            ]
            .into_iter()
            .filter(|k| array(k).is_some_and(|a| a.len() == n))
            .count() as u64
        },
        merges: merges.len() as u64,
        merge_bytes: bytes(merges),
        scores_kept: n > 0
            && file.get("tokenizer.ggml.model").and_then(MetaValue::as_str) == Some("llama"),
        token_chunks: chunks(tokens),
        merge_chunks: chunks(merges),
        merge_part_chunks,
        tokenizer_json_bytes: 0,
    }
}

/// llama.cpp's default sliding-window pattern for gpt-oss: every second
/// layer is full attention, starting with the second.
const GPT_OSS_PATTERN: u64 = 2;

/// Which layers use the sliding window, as llama.cpp's
/// `load_swa_pattern` reads them: `attention.sliding_window_pattern` as
/// one flag per layer, or as a period n (layer i slides unless i mod n
/// is n - 1; 0 makes every layer slide), else `default` as the period.
fn sliding_pattern(
    meta: &Meta,
    key: &dyn Fn(&str) -> String,
    n_layers: u64,
    default: u64,
) -> Result<Vec<bool>, SpecError> {
    let field = key("attention.sliding_window_pattern");
    let period = match meta.file.get(&field) {
        None => default,
        Some(value) => match value.as_u64() {
            Some(n) => n,
            None => {
                let expected = format!("an integer or an array of at least {n_layers} booleans");
                let items = value
                    .as_array()
                    .filter(|items| items.len() as u64 >= n_layers)
                    .ok_or_else(|| meta.invalid(&field, value, &expected))?;
                return items[..n_layers as usize]
                    .iter()
                    .map(|v| {
                        v.as_bool()
                            .or_else(|| v.as_u64().filter(|&x| x <= 1).map(|x| x == 1))
                            .ok_or_else(|| meta.invalid(&field, value, &expected))
                    })
                    .collect();
            }
        },
    };
    Ok((0..n_layers)
        .map(|i| period == 0 || i % period < period - 1)
        .collect())
}

/// YaRN scaling when `rope.scaling.type` is `yarn`: the factor
/// (`rope.scaling.factor`, required), the original context
/// (`rope.scaling.original_context_length`, else the trained context),
/// `rope.scaling.attn_factor` (else 1), and llama.cpp's defaults for the
/// band, 32 and 1 rotations, which its gpt-oss loader does not read from
/// the file.
fn yarn_rope(
    meta: &Meta,
    key: &dyn Fn(&str) -> String,
    rope: &Rope,
    context_length: u64,
) -> Result<Option<crate::YarnRope>, SpecError> {
    if rope.scaling.as_deref() != Some("yarn") {
        return Ok(None);
    }
    let factor_key = key("rope.scaling.factor");
    let factor = rope
        .scaling_factor
        .ok_or_else(|| meta.missing(&factor_key, "yarn rope scaling"))?;
    let orig_key = key("rope.scaling.original_context_length");
    let original_context = meta.u64(&orig_key)?.unwrap_or(context_length);
    if original_context == 0 {
        return Err(meta.missing(&orig_key, "yarn rope scaling"));
    }
    let attn_factor = meta
        .f64_where(&key("rope.scaling.attn_factor"), positive, POSITIVE)?
        .unwrap_or(1.0);
    Ok(Some(crate::YarnRope {
        factor,
        original_context,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attn_factor,
    }))
}

/// The gated delta rule's dimensions from the `ssm.*` keys, each required.
fn linear_attention(
    meta: &Meta,
    key: &dyn Fn(&str) -> String,
) -> Result<LinearAttention, SpecError> {
    let path = &meta.file.path;
    let read = |suffix: &str| -> Result<u64, SpecError> {
        let field = key(suffix);
        let value = meta
            .u64(&field)?
            .ok_or_else(|| meta.missing(&field, "qwen35"))?;
        limits::nonzero_dim(path, &field, value)
    };
    let linear = LinearAttention {
        conv_kernel: read("ssm.conv_kernel")?,
        key_heads: read("ssm.group_count")?,
        value_heads: read("ssm.time_step_rank")?,
        head_dim: read("ssm.state_size")?,
    };
    let inner = read("ssm.inner_size")?;
    if inner != linear.inner() {
        return Err(SpecError::InvalidField {
            path: path.clone(),
            field: key("ssm.inner_size"),
            value: inner.to_string(),
            expected: format!(
                "{} ({} value heads of ssm.state_size {}): value and key heads of one width",
                linear.inner(),
                linear.value_heads,
                linear.head_dim
            ),
        });
    }
    if !linear.value_heads.is_multiple_of(linear.key_heads) {
        return Err(SpecError::InvalidField {
            path: path.clone(),
            field: key("ssm.time_step_rank"),
            value: linear.value_heads.to_string(),
            expected: format!(
                "a multiple of {} = {}: each key head serves whole value heads",
                key("ssm.group_count"),
                linear.key_heads
            ),
        });
    }
    Ok(linear)
}

/// Which layers are linear attention: `attention.recurrent_layers` (one
/// flag per layer) when the file has it, else every layer but each
/// `full_attention_interval`-th, as llama.cpp reads them. A file with
/// neither is refused rather than given a guessed pattern.
fn recurrent_layers(
    meta: &Meta,
    key: &dyn Fn(&str) -> String,
    n_layers: u64,
) -> Result<Vec<bool>, SpecError> {
    if let Some(flags) = meta.layer_flags(&key("attention.recurrent_layers"), n_layers)? {
        return Ok(flags);
    }
    let interval_key = key("full_attention_interval");
    let interval = meta
        .u64(&interval_key)?
        .ok_or_else(|| meta.missing(&interval_key, "qwen35"))?;
    if interval == 0 {
        return Err(SpecError::InvalidField {
            path: meta.file.path.clone(),
            field: interval_key,
            value: "0".into(),
            expected: "at least 1 (every interval-th layer is full attention)".into(),
        });
    }
    Ok((0..n_layers)
        .map(|i| !(i + 1).is_multiple_of(interval))
        .collect())
}

/// The rotated part of a head (`rope.dimension_count`) when it is less
/// than the head, with Qwen3.5's multimodal rope sections checked to reduce
/// to plain NeoX rope for text ([`crate::mrope_is_text_rope`]).
fn rotary_dims(
    meta: &Meta,
    key: &dyn Fn(&str) -> String,
    head_dim: u64,
) -> Result<Option<u64>, SpecError> {
    let dims_key = key("rope.dimension_count");
    let Some(dims) = meta.u64(&dims_key)? else {
        return Ok(None);
    };
    if dims == 0 || dims > head_dim || !dims.is_multiple_of(2) {
        return Err(SpecError::InvalidField {
            path: meta.file.path.clone(),
            field: dims_key,
            value: dims.to_string(),
            expected: format!("an even number from 2 to the head's {head_dim} values"),
        });
    }
    let sections_key = key("rope.dimension_sections");
    if let Some(value) = meta.file.get(&sections_key) {
        let sections: Option<Vec<u64>> = value
            .as_array()
            .filter(|items| items.len() == 4)
            .and_then(|items| items.iter().map(MetaValue::as_u64).collect());
        if !sections.is_some_and(|s| crate::mrope_is_text_rope(&s, dims / 2)) {
            return Err(meta.invalid(&sections_key, value, crate::MROPE_SECTIONS));
        }
    }
    Ok((dims < head_dim).then_some(dims))
}

/// Typed reads of GGUF metadata, where a value of the wrong type is an
/// error naming the key rather than a silent default.
struct Meta<'a> {
    file: &'a GgufFile,
}

impl Meta<'_> {
    fn invalid(&self, key: &str, value: &MetaValue, expected: &str) -> SpecError {
        SpecError::InvalidField {
            path: self.file.path.clone(),
            field: key.to_string(),
            value: short_debug(value),
            expected: expected.to_string(),
        }
    }

    fn missing(&self, key: &str, family: &str) -> SpecError {
        SpecError::MissingField {
            path: self.file.path.clone(),
            field: key.to_string(),
            family: family.to_string(),
        }
    }

    fn u64(&self, key: &str) -> Result<Option<u64>, SpecError> {
        match self.file.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.invalid(key, v, "a non-negative integer")),
        }
    }

    fn f64(&self, key: &str) -> Result<Option<f64>, SpecError> {
        match self.file.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x)),
                _ => Err(self.invalid(key, v, "a finite number")),
            },
        }
    }

    /// A finite number that `valid` accepts; `expected` says which.
    fn f64_where(
        &self,
        key: &str,
        valid: fn(f64) -> bool,
        expected: &str,
    ) -> Result<Option<f64>, SpecError> {
        match self.f64(key)? {
            Some(x) if !valid(x) => {
                Err(self.invalid(key, self.file.get(key).expect("read just above"), expected))
            }
            x => Ok(x),
        }
    }

    fn str(&self, key: &str) -> Result<Option<&str>, SpecError> {
        match self.file.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.invalid(key, v, "a string")),
        }
    }

    /// A value llama.cpp allows either as one integer or as one per layer.
    fn per_layer(&self, key: &str, n_layers: u64) -> Result<Option<Vec<u64>>, SpecError> {
        let Some(value) = self.file.get(key) else {
            return Ok(None);
        };
        if let Some(x) = value.as_u64() {
            return Ok(Some(vec![x; n_layers as usize]));
        }
        let expected = format!("an integer or an array of {n_layers} integers");
        let items = value
            .as_array()
            .ok_or_else(|| self.invalid(key, value, &expected))?;
        if items.len() as u64 != n_layers {
            return Err(self.invalid(key, value, &expected));
        }
        items
            .iter()
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| self.invalid(key, value, &expected))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// One flag per layer (booleans, or 0 and 1), the first `n_layers` of
    /// an array at least that long.
    fn layer_flags(&self, key: &str, n_layers: u64) -> Result<Option<Vec<bool>>, SpecError> {
        let Some(value) = self.file.get(key) else {
            return Ok(None);
        };
        let expected = format!("an array of at least {n_layers} booleans");
        let items = value
            .as_array()
            .filter(|items| items.len() as u64 >= n_layers)
            .ok_or_else(|| self.invalid(key, value, &expected))?;
        items[..n_layers as usize]
            .iter()
            .map(|v| {
                v.as_bool()
                    .or_else(|| v.as_u64().filter(|&x| x <= 1).map(|x| x == 1))
                    .ok_or_else(|| self.invalid(key, value, &expected))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// The first layer's value of a per-layer key, before the layer count is known.
    fn first_of_per_layer(&self, key: &str) -> Result<Option<u64>, SpecError> {
        match self.file.get(key) {
            None => Ok(None),
            Some(v) => match v
                .as_u64()
                .or_else(|| v.as_array()?.iter().find_map(MetaValue::as_u64))
            {
                Some(x) => Ok(Some(x)),
                None => Err(self.invalid(key, v, "an integer or an array of integers")),
            },
        }
    }
}

/// Errors quote values, but a 250k-entry token array is no message.
fn short_debug(value: &MetaValue) -> String {
    match value {
        MetaValue::Array(_, items) => format!("an array of {} items", items.len()),
        MetaValue::Str(s) if s.len() > 64 => format!("{:?}...", &s[..s.floor_char_boundary(64)]),
        other => format!("{other:?}"),
    }
}
