//! The activation arena: one allocation sized for the largest step.
//!
//! The engine carves its working buffers out of this arena at start-up, in
//! this order and with this alignment, so the plan and the allocation are
//! the same list. Activations are f32; quantized matmuls also need the
//! input rows quantized to 8 bits.

use fathom_ggml::ActFormat;
use fathom_spec::ModelSpec;
use serde::Serialize;

use crate::kv::KV_BLOCK_TOKENS;

/// Every buffer starts on a cache line, so SIMD loads never split one.
pub const ARENA_ALIGN: u64 = 64;

const F32: u64 = 4;

/// One named buffer of the arena.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArenaBuffer {
    pub name: &'static str,
    /// f32 elements (or bytes, for `q8_rows`), as `rows x width`.
    pub rows: u64,
    pub width: u64,
    /// Size rounded up to [`ARENA_ALIGN`].
    pub bytes: u64,
}

/// The activation arena for one step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ActivationPlan {
    /// Tokens processed in the largest step: a prefill chunk, or one token
    /// per sequence when decoding a batch wider than a chunk.
    pub step_tokens: u64,
    pub buffers: Vec<ArenaBuffer>,
    pub bytes: u64,
}

/// Bytes of one row of `n` values quantized for a matmul: the largest of
/// the kernels' activation formats (`Q8S`, 36 bytes per 32 values, and
/// `Q8_K`, 292 per 256), since the weight type picks which one a product
/// uses.
pub fn q8_row_bytes(n: u64) -> u64 {
    ActFormat::max_row_bytes(n)
}

fn aligned(bytes: u64) -> u64 {
    bytes.div_ceil(ARENA_ALIGN).saturating_mul(ARENA_ALIGN)
}

pub fn plan(
    spec: &ModelSpec,
    max_tokens: u64,
    batch: u64,
    max_tokens_per_step: u64,
    threads: u64,
) -> ActivationPlan {
    if spec.layers.is_empty() {
        return ActivationPlan {
            step_tokens: 0,
            buffers: Vec::new(),
            bytes: 0,
        };
    }
    let t = max_tokens_per_step
        .min(batch.saturating_mul(max_tokens))
        .max(batch);
    let d = spec.hidden;
    let key_dim = spec.layers.iter().map(|l| l.key_dim).max().unwrap_or(0);
    let value_dim = spec.layers.iter().map(|l| l.value_dim).max().unwrap_or(0);
    let kv_heads = spec.n_kv_heads;
    let q_width = spec.n_heads.saturating_mul(key_dim);
    let attn_width = spec.n_heads.saturating_mul(value_dim);
    let ffn = spec.ffn.max(spec.expert_ffn);
    let widest_input = d.max(ffn).max(attn_width);

    let mut list: Vec<(&'static str, u64, u64, u64)> = vec![
        ("residual", t, d, F32),
        ("norm", t, d, F32),
        ("q", t, q_width, F32),
        ("k", t, kv_heads.saturating_mul(key_dim), F32),
        ("v", t, kv_heads.saturating_mul(value_dim), F32),
        ("attn_out", t, attn_width, F32),
        ("branch_out", t, d, F32),
        ("ffn_gate", t, ffn, F32),
        ("ffn_up", t, ffn, F32),
    ];
    if spec.n_experts > 0 {
        list.push(("router_logits", t, spec.n_experts, F32));
        // Chosen expert id (u32) and its weight (f32) per token per slot.
        list.push(("expert_routes", t, spec.n_experts_active, 8));
        // The rows routed to one expert, gathered, and that expert's output.
        list.push(("moe_in", t, d, F32));
        list.push(("moe_out", t, d, F32));
    }
    list.push(("q8_rows", t, q8_row_bytes(widest_input), 1));
    // Logits only for the last position of each sequence.
    list.push(("logits", batch, spec.vocab, F32));
    // Sampling candidates (token id, probability) for one sequence at a time.
    list.push(("sampler", 1, spec.vocab, 8));
    // Each sequence's token ids, for the penalties and the prompt cache.
    list.push(("token_ids", batch, max_tokens, 4));
    // Online-softmax attention per worker: one KV block's scores, the output
    // accumulator, and one block of K and V dequantized to f32.
    let per_thread = KV_BLOCK_TOKENS
        .saturating_add(value_dim)
        .saturating_add(KV_BLOCK_TOKENS.saturating_mul(key_dim.saturating_add(value_dim)));
    list.push(("attn_scratch", threads.max(1), per_thread, F32));

    let buffers: Vec<ArenaBuffer> = list
        .into_iter()
        .map(|(name, rows, width, elem)| ArenaBuffer {
            name,
            rows,
            width,
            bytes: aligned(rows.saturating_mul(width).saturating_mul(elem)),
        })
        .collect();
    ActivationPlan {
        step_tokens: t,
        bytes: buffers.iter().fold(0u64, |s, b| s.saturating_add(b.bytes)),
        buffers,
    }
}

impl ActivationPlan {
    pub fn derivation(&self, batch: u64, vocab: u64, threads: u64) -> String {
        if self.buffers.is_empty() {
            return "model dimensions unknown: no activations planned".into();
        }
        format!(
            "arena for a {}-token step: {} buffers, logits {batch} x {vocab}, attention scratch x {threads} threads",
            self.step_tokens,
            self.buffers.len()
        )
    }
}
