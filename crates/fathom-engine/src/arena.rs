//! The activation arena: the plan's `activation_detail`, allocated once.
//!
//! Every buffer is sized from the plan's list, so the engine cannot use a
//! buffer the plan did not count; the forward pass only ever slices them.

use fathom_plan::activations::ArenaBuffer;

/// The working buffers of one forward step.
pub struct Arena {
    pub step_tokens: usize,
    pub residual: Vec<f32>,
    pub norm: Vec<f32>,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub attn_out: Vec<f32>,
    pub branch_out: Vec<f32>,
    pub ffn_gate: Vec<f32>,
    pub ffn_up: Vec<f32>,
    pub router_logits: Vec<f32>,
    /// (expert, weight) per token per active expert.
    pub expert_routes: Vec<(u32, f32)>,
    pub moe_in: Vec<f32>,
    pub moe_out: Vec<f32>,
    pub q8_rows: Vec<u8>,
    pub logits: Vec<f32>,
    pub attn_scratch: Vec<f32>,
    /// (token, probability) candidates for sampling.
    pub sampler: Vec<(u32, f32)>,
}

impl Arena {
    /// Allocates every buffer the plan lists, at the plan's size.
    pub fn new(step_tokens: u64, buffers: &[ArenaBuffer]) -> Self {
        let elems = |name: &str| -> usize {
            buffers
                .iter()
                .find(|b| b.name == name)
                .map_or(0, |b| (b.rows * b.width) as usize)
        };
        let f32s = |name: &str| vec![0f32; elems(name)];
        Arena {
            step_tokens: step_tokens as usize,
            residual: f32s("residual"),
            norm: f32s("norm"),
            q: f32s("q"),
            k: f32s("k"),
            v: f32s("v"),
            attn_out: f32s("attn_out"),
            branch_out: f32s("branch_out"),
            ffn_gate: f32s("ffn_gate"),
            ffn_up: f32s("ffn_up"),
            router_logits: f32s("router_logits"),
            expert_routes: vec![(0, 0.0); elems("expert_routes")],
            moe_in: f32s("moe_in"),
            moe_out: f32s("moe_out"),
            q8_rows: vec![0u8; elems("q8_rows")],
            logits: f32s("logits"),
            attn_scratch: f32s("attn_scratch"),
            sampler: vec![(0, 0.0); elems("sampler")],
        }
    }
}
