//! The activation arena: one allocation sized for the largest step.
//!
//! The backend allocates its buffers (all but the host-side sampler
//! candidates and token ids, which the engine holds) as one allocation at
//! start-up and carves them at the offsets computed here, so the plan and
//! the allocation are the same list. Activations are f32; quantized
//! matmuls also need the input rows quantized to 8 bits.

use fathom_ggml::ActFormat;
use fathom_spec::ModelSpec;
use serde::Serialize;

use crate::kv::KV_BLOCK_TOKENS;

/// Every buffer starts on a cache line, so SIMD loads never split one.
pub const ARENA_ALIGN: u64 = 64;

const F32: u64 = 4;

/// A buffer of the activation arena: how the engine and the backends
/// address it (the plan's list names each one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Buf {
    Residual,
    Norm,
    Q,
    K,
    V,
    AttnOut,
    BranchOut,
    FfnGate,
    FfnUp,
    RouterLogits,
    /// (expert id u32, weight f32) per token per active expert.
    ExpertRoutes,
    MoeIn,
    MoeOut,
    /// Activation rows quantized for a matmul (bytes).
    Q8Rows,
    Logits,
    /// Sampling candidates (token id u32, probability f32): host side.
    Sampler,
    /// Each sequence's token ids (u32): host side.
    TokenIds,
    AttnScratch,
}

impl Buf {
    pub const ALL: [Buf; 18] = [
        Buf::Residual,
        Buf::Norm,
        Buf::Q,
        Buf::K,
        Buf::V,
        Buf::AttnOut,
        Buf::BranchOut,
        Buf::FfnGate,
        Buf::FfnUp,
        Buf::RouterLogits,
        Buf::ExpertRoutes,
        Buf::MoeIn,
        Buf::MoeOut,
        Buf::Q8Rows,
        Buf::Logits,
        Buf::Sampler,
        Buf::TokenIds,
        Buf::AttnScratch,
    ];

    /// The name the plan prints.
    pub fn name(self) -> &'static str {
        match self {
            Buf::Residual => "residual",
            Buf::Norm => "norm",
            Buf::Q => "q",
            Buf::K => "k",
            Buf::V => "v",
            Buf::AttnOut => "attn_out",
            Buf::BranchOut => "branch_out",
            Buf::FfnGate => "ffn_gate",
            Buf::FfnUp => "ffn_up",
            Buf::RouterLogits => "router_logits",
            Buf::ExpertRoutes => "expert_routes",
            Buf::MoeIn => "moe_in",
            Buf::MoeOut => "moe_out",
            Buf::Q8Rows => "q8_rows",
            Buf::Logits => "logits",
            Buf::Sampler => "sampler",
            Buf::TokenIds => "token_ids",
            Buf::AttnScratch => "attn_scratch",
        }
    }

    /// Held by the engine on the host (sampling, token history), not by
    /// the backend's arena.
    pub fn host_side(self) -> bool {
        matches!(self, Buf::Sampler | Buf::TokenIds)
    }
}

/// One named buffer of the arena.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArenaBuffer {
    #[serde(skip)]
    pub id: Buf,
    pub name: &'static str,
    /// f32 elements (or bytes, for `q8_rows`), as `rows x width`.
    pub rows: u64,
    pub width: u64,
    /// Size rounded up to [`ARENA_ALIGN`].
    pub bytes: u64,
    /// Where the buffer starts in its arena: the backend's (device) arena,
    /// or the engine's host one for [`Buf::host_side`] buffers.
    #[serde(skip)]
    pub offset: u64,
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
    // The widest layer's k and v rows: where layers differ (Gemma 4's
    // global layers have wider heads but fewer of them), the widest head
    // times the most heads would overstate both.
    let widest = |dim: fn(&fathom_spec::Layer) -> u64| {
        spec.layers
            .iter()
            .map(|l| l.n_kv_heads.saturating_mul(dim(l)))
            .max()
            .unwrap_or(0)
    };
    let q_width = spec.n_heads.saturating_mul(key_dim);
    let attn_width = spec.n_heads.saturating_mul(value_dim);
    let mut ffn = spec.ffn.max(spec.expert_ffn).max(spec.shared_expert_ffn);
    let (mut q, mut k, mut v, mut out) = (
        q_width,
        widest(|l| l.key_dim),
        widest(|l| l.value_dim),
        attn_width,
    );
    if spec.block.gated_attention {
        // The q projection with its gate lands in `ffn_gate` and is split
        // into `q` and `ffn_up`, which then holds the gated output.
        ffn = ffn.max(q_width.saturating_mul(2)).max(attn_width);
    }
    if let Some(l) = spec.linear {
        // A linear-attention layer: q, k and v for the convolution in `q`,
        // the decay and update inputs in `k` and `v`, the recurrence's
        // output in `attn_out`, its output gate in `ffn_up`.
        q = q.max(l.conv_channels());
        k = k.max(l.value_heads);
        v = v.max(l.value_heads);
        out = out.max(l.inner());
        ffn = ffn.max(l.inner());
    }
    let widest_input = d.max(ffn).max(out);

    let mut list: Vec<(Buf, u64, u64, u64)> = vec![
        (Buf::Residual, t, d, F32),
        (Buf::Norm, t, d, F32),
        (Buf::Q, t, q, F32),
        (Buf::K, t, k, F32),
        (Buf::V, t, v, F32),
        (Buf::AttnOut, t, out, F32),
        (Buf::BranchOut, t, d, F32),
        (Buf::FfnGate, t, ffn, F32),
        (Buf::FfnUp, t, ffn, F32),
    ];
    if spec.n_experts > 0 {
        list.push((Buf::RouterLogits, t, spec.n_experts, F32));
        // Chosen expert id (u32) and its weight (f32) per token per slot.
        list.push((Buf::ExpertRoutes, t, spec.n_experts_active, 8));
        // The rows routed to one expert, gathered, and that expert's output.
        list.push((Buf::MoeIn, t, d, F32));
        list.push((Buf::MoeOut, t, d, F32));
    }
    list.push((Buf::Q8Rows, t, q8_row_bytes(widest_input), 1));
    // Logits only for the last position of each sequence.
    list.push((Buf::Logits, batch, spec.vocab, F32));
    // Sampling candidates (token id, probability) for one sequence at a time.
    list.push((Buf::Sampler, 1, spec.vocab, 8));
    // Each sequence's token ids, for the penalties and the prompt cache.
    list.push((Buf::TokenIds, batch, max_tokens, 4));
    // Online-softmax attention per worker: one KV block's scores, the output
    // accumulator, and one block of K and V dequantized to f32.
    let per_thread = KV_BLOCK_TOKENS
        .saturating_add(value_dim)
        .saturating_add(KV_BLOCK_TOKENS.saturating_mul(key_dim.saturating_add(value_dim)));
    list.push((Buf::AttnScratch, threads.max(1), per_thread, F32));

    // Offsets: device-side buffers one after another in the backend's
    // arena, host-side ones likewise in the engine's.
    let (mut device_end, mut host_end) = (0u64, 0u64);
    let buffers: Vec<ArenaBuffer> = list
        .into_iter()
        .map(|(id, rows, width, elem)| {
            let bytes = aligned(rows.saturating_mul(width).saturating_mul(elem));
            let end = if id.host_side() {
                &mut host_end
            } else {
                &mut device_end
            };
            let offset = *end;
            *end = end.saturating_add(bytes);
            ArenaBuffer {
                id,
                name: id.name(),
                rows,
                width,
                bytes,
                offset,
            }
        })
        .collect();
    ActivationPlan {
        step_tokens: t,
        bytes: buffers.iter().fold(0u64, |s, b| s.saturating_add(b.bytes)),
        buffers,
    }
}

impl ActivationPlan {
    /// The buffer `id`, when the plan has one.
    pub fn buffer(&self, id: Buf) -> Option<&ArenaBuffer> {
        self.buffers.iter().find(|b| b.id == id)
    }

    /// Bytes of the backend's arena (device-side buffers) or of the
    /// engine's host arena.
    pub fn arena_bytes(&self, host_side: bool) -> u64 {
        self.buffers
            .iter()
            .filter(|b| b.id.host_side() == host_side)
            .fold(0u64, |s, b| s.saturating_add(b.bytes))
    }

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
