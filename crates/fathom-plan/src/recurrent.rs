//! The recurrent-state term: what a hybrid model's linear-attention layers
//! hold per sequence.
//!
//! A gated-delta-rule layer (Qwen3.5) keeps, for each sequence, the last
//! `conv_kernel - 1` inputs of its short causal convolution and one
//! `head_dim x head_dim` state per value head. Neither grows with the
//! context, so the term is per sequence and not per token, and these
//! layers hold no KV. The states are f32, as llama.cpp keeps them: a
//! state is rewritten every token, and rounding it each time would
//! compound.

use fathom_spec::{Attention, ModelSpec};
use serde::Serialize;

/// Bytes of one state value.
pub const STATE_VALUE_BYTES: u64 = 4;

/// The recurrent state of every linear-attention layer, for `sequences`
/// sequences at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecurrentPlan {
    /// Linear-attention layers.
    pub layers: u64,
    /// `f32`: the dtype of both states.
    pub dtype: &'static str,
    /// Convolution state values of one layer for one sequence:
    /// (conv_kernel - 1) x channels.
    pub conv_values_per_layer: u64,
    /// Delta-rule state values of one layer for one sequence:
    /// value_heads x head_dim x head_dim.
    pub delta_values_per_layer: u64,
    /// Both states of every layer for one sequence: the slot one sequence
    /// takes.
    pub bytes_per_sequence: u64,
    /// Slots: the sequences held at once.
    pub sequences: u64,
    pub bytes: u64,
}

/// `None` for a model without linear-attention layers. Under a placement
/// between GPU and host each side's spec counts the layers it runs: a
/// layer run on the other side (`kv_elsewhere`) keeps its state there, as
/// its KV would be.
pub fn plan(spec: &ModelSpec, sequences: u64) -> Option<RecurrentPlan> {
    let linear = spec.linear?;
    let layers = spec
        .layers
        .iter()
        .filter(|l| l.attention == Attention::Linear && !l.kv_elsewhere)
        .count() as u64;
    if layers == 0 {
        return None;
    }
    let conv = linear.conv_state_values();
    let delta = linear.delta_state_values();
    let bytes_per_sequence = layers
        .saturating_mul(conv.saturating_add(delta))
        .saturating_mul(STATE_VALUE_BYTES);
    Some(RecurrentPlan {
        layers,
        dtype: "f32",
        conv_values_per_layer: conv,
        delta_values_per_layer: delta,
        bytes_per_sequence,
        sequences,
        bytes: bytes_per_sequence.saturating_mul(sequences),
    })
}

impl RecurrentPlan {
    /// `24 linear-attention layers x (conv 3 x 8192 + delta 32 x 128 x 128) f32 = 50.25 MiB a sequence x 4 seq`.
    pub fn derivation(&self, spec: &ModelSpec) -> String {
        let (kernel, channels, heads, dim) = spec.linear.map_or((0, 0, 0, 0), |l| {
            (
                l.conv_kernel.saturating_sub(1),
                l.conv_channels(),
                l.value_heads,
                l.head_dim,
            )
        });
        format!(
            "{} linear-attention layers x (conv {kernel} x {channels} + delta {heads} x {dim} x {dim}) {} = {} a sequence x {} seq, whatever the context",
            self.layers,
            self.dtype,
            crate::size::format_binary(self.bytes_per_sequence),
            self.sequences
        )
    }
}
