//! Quantization advice: which weight type lets the model fit.
//!
//! It reads only the weights and KV figures, never the backend term, so the
//! advice is the same on every device for the same budget.

use fathom_ggml::GgmlType;
use fathom_spec::ModelSpec;
use serde::Serialize;

/// Most precise first: the advice is the first that fits.
const CANDIDATES: [GgmlType; 6] = [
    GgmlType::F16,
    GgmlType::Q8_0,
    GgmlType::Q6_K,
    GgmlType::Q5_K,
    GgmlType::Q4_K,
    GgmlType::Q4_0,
];

/// The type llama.cpp falls back to for a matrix whose rows are not whole
/// blocks of `q`.
fn fallback(q: GgmlType) -> Option<GgmlType> {
    match q {
        GgmlType::Q6_K => Some(GgmlType::Q8_0),
        GgmlType::Q5_K => Some(GgmlType::Q5_1),
        GgmlType::Q4_K => Some(GgmlType::Q5_0),
        GgmlType::Q8_0 | GgmlType::Q5_1 | GgmlType::Q5_0 | GgmlType::Q4_0 => Some(GgmlType::F16),
        _ => None,
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuantOption {
    pub quant: &'static str,
    pub weights_bytes: u64,
    pub kv_bytes: u64,
    /// A hybrid model's recurrent state (0 otherwise).
    pub recurrent_bytes: u64,
    /// weights + kv + recurrent state.
    pub total_bytes: u64,
    pub fits: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuantAdvice {
    pub params: u64,
    pub available_bytes: u64,
    pub options: Vec<QuantOption>,
    /// The most precise option that fits, if any does.
    pub recommended: Option<&'static str>,
}

/// Weights bytes if the model were converted to `q` as llama.cpp converts:
/// 1-D tensors (norms, biases) stay F32; a matrix whose rows are not whole
/// blocks takes the fallback type (Q6_K -> Q8_0 -> F16, ...).
fn weights_bytes(spec: &ModelSpec, q: GgmlType) -> u64 {
    spec.tensors.iter().fold(0u64, |sum, t| {
        // llama-quantize keeps 1-D tensors and convolution taps in f32;
        // an HF file's `[1, hidden]` gate and `[channels, 1, taps]` taps
        // are what llama.cpp's converter squeezes to those.
        let dims = t.shape.iter().filter(|&&d| d != 1).count();
        let conv = ["ssm_conv1d.weight", "linear_attn.conv1d.weight"]
            .iter()
            .any(|suffix| t.name.ends_with(suffix));
        let bytes = if dims < 2 || conv {
            t.params.saturating_mul(4)
        } else {
            matrix_bytes(t.params, t.row_len, q)
        };
        sum.saturating_add(bytes)
    })
}

fn matrix_bytes(params: u64, row_len: u64, q: GgmlType) -> u64 {
    if row_len > 0 && row_len.is_multiple_of(q.block_elems()) {
        return (params / q.block_elems()).saturating_mul(q.block_bytes());
    }
    match fallback(q) {
        Some(fallback) => matrix_bytes(params, row_len, fallback),
        // F16 has one-element blocks: every row is whole.
        None => params.saturating_mul(q.block_bytes()),
    }
}

/// `state_bytes` is what the sequences hold besides KV (a hybrid model's
/// recurrent state), which no weight type changes.
pub fn advise(
    spec: &ModelSpec,
    kv_bytes: u64,
    state_bytes: u64,
    available_bytes: u64,
) -> QuantAdvice {
    let options: Vec<QuantOption> = CANDIDATES
        .into_iter()
        .map(|q| {
            let weights_bytes = weights_bytes(spec, q);
            let total_bytes = weights_bytes
                .saturating_add(kv_bytes)
                .saturating_add(state_bytes);
            QuantOption {
                quant: q.name(),
                weights_bytes,
                kv_bytes,
                recurrent_bytes: state_bytes,
                total_bytes,
                fits: total_bytes <= available_bytes,
            }
        })
        .collect();
    QuantAdvice {
        params: spec.params(),
        available_bytes,
        recommended: options.iter().find(|o| o.fits).map(|o| o.quant),
        options,
    }
}
