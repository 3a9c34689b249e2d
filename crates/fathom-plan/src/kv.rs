//! The KV cache term: a paged pool of fixed-size blocks.

use fathom_ggml::GgmlType;
use fathom_spec::{Attention, ModelSpec};
use serde::Serialize;

use crate::PlanError;

/// Tokens per KV block. Every sequence's KV is a whole number of blocks per
/// layer, so the plan rounds up exactly as the pool will.
pub const KV_BLOCK_TOKENS: u64 = 16;

/// How K and V are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvDtype {
    F16,
    Bf16,
    F32,
    Q8_0,
}

impl KvDtype {
    pub const ALL: [KvDtype; 4] = [KvDtype::F16, KvDtype::Bf16, KvDtype::F32, KvDtype::Q8_0];

    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
            KvDtype::F32 => "f32",
            KvDtype::Q8_0 => "q8_0",
        }
    }

    pub fn parse(text: &str) -> Result<Self, PlanError> {
        KvDtype::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(text.trim()))
            .ok_or_else(|| PlanError::InvalidChoice {
                what: "KV dtype".into(),
                value: text.into(),
                valid: "f16, bf16, f32, q8_0".into(),
            })
    }

    /// The ggml type a KV row is stored as.
    pub fn ggml(self) -> GgmlType {
        match self {
            KvDtype::F16 => GgmlType::F16,
            KvDtype::Bf16 => GgmlType::BF16,
            KvDtype::F32 => GgmlType::F32,
            KvDtype::Q8_0 => GgmlType::Q8_0,
        }
    }

    /// Bytes of one row of `n` values: q8_0 stores blocks of 32 values as
    /// 32 bytes plus an f16 scale, and a partial block costs a whole one.
    pub fn row_bytes(self, n: u64) -> u64 {
        self.ggml().padded_row_bytes(n)
    }
}

/// Layers that share attention kind and KV shape, and so cost the same.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvGroup {
    /// `full` or `sliding`.
    pub attention: &'static str,
    /// The window for sliding layers.
    pub window: Option<u64>,
    pub layers: u64,
    pub n_kv_heads: u64,
    pub key_dim: u64,
    pub value_dim: u64,
    /// K + V bytes for one token in one layer.
    pub bytes_per_token_per_layer: u64,
    /// Tokens each sequence holds in each of these layers.
    pub tokens: u64,
    /// Blocks per sequence per layer (`tokens` rounded up).
    pub blocks_per_sequence: u64,
    /// Bytes for all layers of the group and all sequences.
    pub bytes: u64,
}

impl KvGroup {
    /// Bytes of one block: `KV_BLOCK_TOKENS` positions of K and V for
    /// every layer of the group.
    pub fn block_bytes(&self) -> u64 {
        self.layers
            .saturating_mul(KV_BLOCK_TOKENS)
            .saturating_mul(self.bytes_per_token_per_layer)
    }

    /// Blocks the group's bytes hold: sequences × blocks each, or a
    /// server's shared pool. The engine's bookkeeping and the backend's
    /// storage both count blocks with this.
    pub fn n_blocks(&self) -> u64 {
        self.bytes / self.block_bytes().max(1)
    }
}

/// The KV plan for `max_tokens` of context in each of `batch` sequences.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvPlan {
    /// Sum over attention layers of K + V bytes for one token.
    pub bytes_per_token: u64,
    pub block_tokens: u64,
    pub groups: Vec<KvGroup>,
    pub bytes: u64,
}

/// Each layer's group index (in order of first appearance), or `None`
/// for a layer without KV (no attention, or linear attention, whose state
/// is the recurrent term). Layers share a group when their
/// attention kind and KV shape match; the engine lays out its pool by the
/// same grouping, so this is the one place that decides it. A layer whose
/// KV is held on the other side of a placement (`kv_elsewhere`) numbers its
/// group like the others but holds none here (`None`), so both sides of a
/// split number the groups as the whole model does.
pub fn layer_groups(spec: &ModelSpec) -> Vec<Option<usize>> {
    numbered_groups(spec)
        .into_iter()
        .zip(&spec.layers)
        .map(|(g, l)| g.filter(|_| !l.kv_elsewhere))
        .collect()
}

/// Each attention layer's group, held here or not.
fn numbered_groups(spec: &ModelSpec) -> Vec<Option<usize>> {
    let mut keys: Vec<(Attention, u64, u64, u64)> = Vec::new();
    spec.layers
        .iter()
        .map(|l| {
            if matches!(l.attention, Attention::None | Attention::Linear) {
                return None;
            }
            let key = (l.attention, l.n_kv_heads, l.key_dim, l.value_dim);
            Some(keys.iter().position(|k| *k == key).unwrap_or_else(|| {
                keys.push(key);
                keys.len() - 1
            }))
        })
        .collect()
}

pub fn plan(spec: &ModelSpec, max_tokens: u64, batch: u64, dtype: KvDtype) -> KvPlan {
    let mut groups: Vec<KvGroup> = Vec::new();
    for (layer, group) in spec.layers.iter().zip(numbered_groups(spec)) {
        let Some(group) = group else { continue };
        let held = u64::from(!layer.kv_elsewhere);
        if let Some(g) = groups.get_mut(group) {
            g.layers += held;
            continue;
        }
        let (attention, window, tokens) = match layer.attention {
            Attention::Sliding { window } => ("sliding", Some(window), window.min(max_tokens)),
            _ => ("full", None, max_tokens),
        };
        groups.push(KvGroup {
            attention,
            window,
            layers: held,
            n_kv_heads: layer.n_kv_heads,
            key_dim: layer.key_dim,
            value_dim: layer.value_dim,
            bytes_per_token_per_layer: dtype
                .row_bytes(layer.n_kv_heads.saturating_mul(layer.key_dim))
                .saturating_add(dtype.row_bytes(layer.n_kv_heads.saturating_mul(layer.value_dim))),
            tokens,
            blocks_per_sequence: tokens.div_ceil(KV_BLOCK_TOKENS),
            bytes: 0,
        });
    }
    for g in &mut groups {
        g.bytes = g
            .layers
            .saturating_mul(g.blocks_per_sequence)
            .saturating_mul(KV_BLOCK_TOKENS)
            .saturating_mul(g.bytes_per_token_per_layer)
            .saturating_mul(batch);
    }
    KvPlan {
        bytes_per_token: groups.iter().fold(0u64, |sum, g| {
            sum.saturating_add(g.layers.saturating_mul(g.bytes_per_token_per_layer))
        }),
        block_tokens: KV_BLOCK_TOKENS,
        bytes: groups
            .iter()
            .fold(0u64, |sum, g| sum.saturating_add(g.bytes)),
        groups,
    }
}

impl KvPlan {
    /// `30 layers x 3 kv heads x (64 + 64) dims x f16, 8192 tokens (512 blocks of 16) x 1 seq`.
    pub fn derivation(&self, dtype: KvDtype, batch: u64) -> String {
        if self.groups.is_empty() {
            return "no layer holds KV (none known, or linear attention only): no KV planned"
                .into();
        }
        let parts: Vec<String> = self
            .groups
            .iter()
            .filter(|g| g.layers > 0)
            .map(|g| {
                let kind = match g.window {
                    Some(w) => format!("sliding window {w}, "),
                    None => String::new(),
                };
                format!(
                    "{} layers x {} kv heads x ({} + {}) dims x {}, {kind}{} tokens ({} blocks of {})",
                    g.layers,
                    g.n_kv_heads,
                    g.key_dim,
                    g.value_dim,
                    dtype.name(),
                    g.tokens,
                    g.blocks_per_sequence,
                    self.block_tokens
                )
            })
            .collect();
        format!("{} x {batch} seq", parts.join(" + "))
    }
}
