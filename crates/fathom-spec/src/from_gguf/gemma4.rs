//! Gemma 4's keys: which layers slide, the two head shapes, the sliding
//! layers' rope base, and the variants fathom plans but does not run.

use super::Meta;
use crate::{limits, positive, SpecError, POSITIVE};

/// What a `gemma4` GGUF adds to the generic keys.
pub(super) struct Gemma4 {
    /// One flag per layer (`attention.sliding_window_pattern`).
    pub sliding: Vec<bool>,
    /// Key and value width of a sliding layer's head
    /// (`attention.key_length_swa`, `value_length_swa`); the global
    /// layers' are the generic `key_length` and `value_length`.
    pub key_dim_swa: u64,
    pub value_dim_swa: u64,
    /// Rope base of the sliding layers (`rope.freq_base_swa`, llama.cpp's
    /// default 10000).
    pub theta_swa: f64,
    /// The last layers that reuse an earlier layer's KV instead of holding
    /// their own (`attention.shared_kv_layers`, the E2B/E4B models).
    pub shared_kv_layers: u64,
    /// Width of the per-layer token embeddings
    /// (`embedding_length_per_layer_input`, 0 when the model has none).
    pub per_layer_input: u64,
    pub softcap: Option<f64>,
}

pub(super) fn read(
    meta: &Meta,
    key: &dyn Fn(&str) -> String,
    n_layers: u64,
    key_dim: u64,
) -> Result<Gemma4, SpecError> {
    let path = &meta.file.path;
    let required = |suffix: &str| -> Result<u64, SpecError> {
        let field = key(suffix);
        meta.u64(&field)?
            .ok_or_else(|| meta.missing(&field, "gemma4"))
    };
    let sliding_key = key("attention.sliding_window_pattern");
    let sliding = meta
        .layer_flags(&sliding_key, n_layers)?
        .ok_or_else(|| meta.missing(&sliding_key, "gemma4"))?;
    let key_dim_swa = limits::nonzero_dim(
        path,
        &key("attention.key_length_swa"),
        required("attention.key_length_swa")?,
    )?;
    let value_dim_swa = limits::nonzero_dim(
        path,
        &key("attention.value_length_swa"),
        required("attention.value_length_swa")?,
    )?;
    // llama.cpp's converter rotates whole heads and stops the unrotated
    // part of a global head with rope factors; a file that rotates part of
    // a head through rope.dimension_count would need partial rope too.
    for (suffix, head) in [
        ("rope.dimension_count", key_dim),
        ("rope.dimension_count_swa", key_dim_swa),
    ] {
        let field = key(suffix);
        match meta.u64(&field)? {
            Some(dims) if dims != head => {
                return Err(SpecError::InvalidField {
                    path: path.clone(),
                    field,
                    value: dims.to_string(),
                    expected: format!(
                        "the head's {head} values (Gemma 4 rotates whole heads; rope_freqs \
                         stops the unrotated part of a global head)"
                    ),
                })
            }
            _ => {}
        }
    }
    if !sliding.iter().all(|&s| s)
        && !meta
            .file
            .tensors
            .iter()
            .any(|t| t.name == "rope_freqs.weight")
    {
        return Err(meta.missing("rope_freqs.weight (tensor)", "gemma4"));
    }
    let shared_kv_layers = meta.u64(&key("attention.shared_kv_layers"))?.unwrap_or(0);
    if shared_kv_layers >= n_layers {
        return Err(SpecError::InvalidField {
            path: path.clone(),
            field: key("attention.shared_kv_layers"),
            value: shared_kv_layers.to_string(),
            expected: format!("fewer than the {n_layers} layers"),
        });
    }
    let per_layer_input = limits::dim(
        path,
        &key("embedding_length_per_layer_input"),
        required("embedding_length_per_layer_input")?,
    )?;
    Ok(Gemma4 {
        sliding,
        key_dim_swa,
        value_dim_swa,
        theta_swa: meta
            .f64_where(&key("rope.freq_base_swa"), positive, POSITIVE)?
            .unwrap_or(10_000.0),
        shared_kv_layers,
        per_layer_input,
        softcap: meta.f64_where(&key("final_logit_softcapping"), positive, POSITIVE)?,
    })
}

impl Gemma4 {
    /// Whether layer `i` holds KV of its own.
    pub fn holds_kv(&self, i: u64, n_layers: u64) -> bool {
        i < n_layers - self.shared_kv_layers
    }

    /// What a reader of the plan should know about the variants the
    /// engine does not run.
    pub fn notes(&self, n_layers: u64, n_experts: u64) -> Vec<String> {
        let mut notes = Vec::new();
        if self.shared_kv_layers > 0 {
            notes.push(format!(
                "the last {} of {n_layers} layers reuse earlier layers' KV (shared_kv_layers): \
                 planned without KV of their own, as llama.cpp holds them; fathom does not run \
                 such a model yet",
                self.shared_kv_layers
            ));
        }
        if self.per_layer_input > 0 {
            notes.push(format!(
                "per-layer token embeddings of {} values a layer: counted in the weights; \
                 fathom does not run such a model yet",
                self.per_layer_input
            ));
        }
        if n_experts > 0 {
            notes.push(
                "Gemma 4's mixture of experts (its own router, GELU experts and norms): counted \
                 in the weights; fathom does not run it yet"
                    .into(),
            );
        }
        notes
    }
}
