//! The forward pass: one decoder for the llama, qwen2, qwen3, qwen3_moe
//! and gemma3 families, which differ only in a few optional pieces (biases,
//! q/k norms, post norms, GeGLU, routed experts, sliding windows).

use fathom_checkpoint::Checkpoint;
use fathom_kernels::{matmul, ops, Pool};
use fathom_plan::KvDtype;
use fathom_spec::{Attention, Family, ModelSpec};

use crate::arena::Arena;
use crate::attention::{self, AttentionShape};
use crate::kv::{KvPool, SeqKv};

/// Tokens to run at the next positions of one sequence.
pub struct Segment<'a> {
    pub seq: &'a mut SeqKv,
    pub tokens: &'a [u32],
}
use crate::names::{LayerNames, Naming};
use crate::weights::{Matrix, MatrixView, WeightFiles};
use crate::EngineError;

/// Largest head dimension the per-head norms handle on the stack.
const MAX_HEAD_DIM: usize = 1024;

enum Ffn {
    Dense {
        gate: Matrix,
        up: Matrix,
        down: Matrix,
    },
    Moe {
        router: Matrix,
        experts: Vec<[Matrix; 3]>,
    },
}

struct Layer {
    attention: Attention,
    n_kv_heads: usize,
    key_dim: usize,
    value_dim: usize,
    attn_norm: Vec<f32>,
    wq: Matrix,
    wk: Matrix,
    wv: Matrix,
    wo: Matrix,
    bias: Option<[Vec<f32>; 3]>,
    qk_norm: Option<[Vec<f32>; 2]>,
    post_attn_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    post_ffn_norm: Option<Vec<f32>>,
    ffn: Ffn,
}

/// A loaded model: its spec, mapped weights and the per-layer views.
pub struct Model {
    pub spec: ModelSpec,
    files: WeightFiles,
    embed: Matrix,
    output: Matrix,
    out_norm: Vec<f32>,
    layers: Vec<Layer>,
    rope_freqs: Option<Vec<f32>>,
    neox: bool,
    eps: f32,
    embed_scale: f32,
    gelu: bool,
    attn_scale: f32,
    theta: f32,
    local_theta: f32,
    /// Bytes of 1-D tensors converted to f32 at load.
    pub converted_bytes: usize,
}

/// Loads the optional 1-D tensor `name`; Gemma's HF norms store `w` where
/// the model multiplies by `1 + w` (GGUF stores `1 + w` already).
fn vector(
    files: &WeightFiles,
    name: &str,
    len: usize,
    plus_one: bool,
    converted: &mut usize,
) -> Result<Vec<f32>, EngineError> {
    let mut v = files.vector(name, len)?;
    if plus_one {
        v.iter_mut().for_each(|x| *x += 1.0);
    }
    *converted += len * 4;
    Ok(v)
}

impl Model {
    pub fn load(checkpoint: &Checkpoint, spec: ModelSpec) -> Result<Self, EngineError> {
        if !spec.is_known_family() || spec.layers.is_empty() {
            return Err(EngineError::UnsupportedFamily {
                architecture: spec.architecture.clone(),
            });
        }
        let files = WeightFiles::open(checkpoint)?;
        let naming = match checkpoint {
            Checkpoint::Gguf(_) => Naming::Gguf,
            Checkpoint::Hf(_) => {
                let prefix = ["model.", "language_model.model.", "model.language_model."]
                    .into_iter()
                    .find(|p| files.has(&format!("{p}embed_tokens.weight")))
                    .unwrap_or("model.");
                Naming::Hf {
                    prefix: prefix.to_string(),
                }
            }
        };
        let hf = matches!(naming, Naming::Hf { .. });
        let gemma = spec.family == Family::Gemma3;
        let plus_one = gemma && hf;
        let (d, vocab) = (spec.hidden as usize, spec.vocab as usize);
        let mut converted = 0usize;

        let embed = files.matrix(&naming.embed(), vocab, d)?;
        let output = if files.has(&naming.output()) {
            files.matrix(&naming.output(), vocab, d)?
        } else {
            embed
        };
        let out_norm = vector(&files, &naming.output_norm(), d, plus_one, &mut converted)?;
        let mut layers = Vec::with_capacity(spec.layers.len());
        for (i, l) in spec.layers.iter().enumerate() {
            let n = naming.layer(&spec.family, i);
            layers.push(load_layer(
                &files,
                &naming,
                &spec,
                i,
                l,
                &n,
                plus_one,
                &mut converted,
            )?);
        }
        let rope = spec.rope.clone().unwrap_or(fathom_spec::Rope {
            theta: 10_000.0,
            local_theta: None,
            neox: false,
            scaling: None,
            scaling_factor: None,
            llama3: None,
        });
        let head_dim = spec.head_dim as usize;
        let rope_freqs = if files.has("rope_freqs.weight") {
            Some(vector(
                &files,
                "rope_freqs.weight",
                head_dim / 2,
                false,
                &mut converted,
            )?)
        } else {
            rope.llama3
                .as_ref()
                .map(|l3| l3.freq_factors(rope.theta, head_dim))
        };
        for l in &layers {
            if l.key_dim > MAX_HEAD_DIM || l.value_dim > MAX_HEAD_DIM || l.n_kv_heads == 0 {
                return Err(EngineError::BadShape {
                    tensor: "attention heads".into(),
                    shape: vec![l.n_kv_heads as u64, l.key_dim as u64],
                    expected: vec![MAX_HEAD_DIM as u64],
                });
            }
        }
        Ok(Model {
            embed,
            output,
            out_norm,
            layers,
            rope_freqs,
            // HF checkpoints rotate halves for every family; llama.cpp
            // permutes llama's q/k rows so adjacent pairs rotate in GGUF.
            neox: rope.neox || hf,
            eps: spec.rms_norm_eps as f32,
            embed_scale: if gemma { (d as f32).sqrt() } else { 1.0 },
            gelu: gemma,
            attn_scale: spec
                .attn_scale
                .unwrap_or(1.0 / (spec.head_dim as f64).sqrt()) as f32,
            theta: rope.theta as f32,
            local_theta: rope.local_theta.unwrap_or(rope.theta) as f32,
            converted_bytes: converted,
            files,
            spec,
        })
    }

    /// Brings every weight page into memory, reporting bytes done of total.
    pub fn prefault(&self, progress: &mut dyn FnMut(u64, u64)) {
        let mut matrices = vec![self.embed, self.output];
        for l in &self.layers {
            matrices.extend([l.wq, l.wk, l.wv, l.wo]);
            match &l.ffn {
                Ffn::Dense { gate, up, down } => matrices.extend([*gate, *up, *down]),
                Ffn::Moe { router, experts } => {
                    matrices.push(*router);
                    matrices.extend(experts.iter().flatten().copied());
                }
            }
        }
        self.files.prefault(&matrices, progress);
    }

    /// Each layer's KV group, exactly as the plan grouped them.
    pub fn layer_groups(&self) -> Vec<Option<usize>> {
        fathom_plan::kv::layer_groups(&self.spec)
    }

    /// out = x · mᵀ for `n` rows of x, with the kernel for m's storage.
    fn mm(&self, pool: &Pool, m: &Matrix, x: &[f32], n: usize, out: &mut [f32], q8: &mut [u8]) {
        match self.files.view(m) {
            MatrixView::Blocks(w) => matmul(pool, &w, x, n, out, q8),
            MatrixView::Affine(w) => fathom_kernels::affine_matmul(pool, &w, x, n, out),
        }
    }

    /// Runs every segment's tokens at the next positions of its sequence,
    /// all rows through each matmul together, and leaves segment i's last
    /// logits in row i of `arena.logits`. The caller has reserved KV blocks
    /// up to `seq.len + tokens.len()` for each segment.
    pub fn forward(
        &self,
        pool: &Pool,
        arena: &mut Arena,
        kv: &mut KvPool,
        segments: &mut [Segment],
    ) -> Result<(), EngineError> {
        let t_n: usize = segments.iter().map(|s| s.tokens.len()).sum();
        let s = &self.spec;
        let (d, vocab) = (s.hidden as usize, s.vocab as usize);
        assert!(
            segments.iter().all(|s| !s.tokens.is_empty())
                && t_n <= arena.step_tokens
                && segments.len() * vocab <= arena.logits.len(),
            "{} segments of {t_n} tokens, arena step {}",
            segments.len(),
            arena.step_tokens
        );
        let tokens = segments.iter().flat_map(|s| s.tokens.iter().copied());
        for (t, tok) in tokens.enumerate() {
            if tok as usize >= vocab {
                return Err(EngineError::BadToken { id: tok, vocab });
            }
            let dst = &mut arena.residual[t * d..(t + 1) * d];
            match self.files.view(&self.embed) {
                MatrixView::Blocks(w) => {
                    let row_bytes = w.ty.row_bytes(d);
                    let row = &w.data[tok as usize * row_bytes..(tok as usize + 1) * row_bytes];
                    fathom_kernels::dequantize_row(w.ty, row, dst);
                }
                MatrixView::Affine(w) => {
                    fathom_kernels::affine_dequantize_row(&w, tok as usize, dst)
                }
            }
            if self.embed_scale != 1.0 {
                ops::scale(dst, self.embed_scale);
            }
        }
        for (li, layer) in self.layers.iter().enumerate() {
            self.attention_block(pool, arena, kv, segments, li, layer, t_n);
            for t in 0..t_n {
                ops::rms_norm(
                    &arena.residual[t * d..(t + 1) * d],
                    &layer.ffn_norm,
                    self.eps,
                    &mut arena.norm[t * d..(t + 1) * d],
                );
            }
            match &layer.ffn {
                Ffn::Dense { gate, up, down } => {
                    self.dense_ffn(pool, arena, gate, up, down, t_n, d)
                }
                Ffn::Moe { router, experts } => self.moe_ffn(pool, arena, router, experts, t_n, d),
            }
            self.add_branch(arena, layer.post_ffn_norm.as_deref(), t_n, d);
        }
        // Logits for each segment's last position only.
        let mut last = 0;
        for (i, seg) in segments.iter_mut().enumerate() {
            last += seg.tokens.len();
            seg.seq.len += seg.tokens.len();
            let row = (last - 1) * d;
            ops::rms_norm(
                &arena.residual[row..row + d],
                &self.out_norm,
                self.eps,
                &mut arena.norm[i * d..(i + 1) * d],
            );
        }
        let n = segments.len();
        self.mm(
            pool,
            &self.output,
            &arena.norm[..n * d],
            n,
            &mut arena.logits[..n * vocab],
            &mut arena.q8_rows,
        );
        Ok(())
    }

    /// One layer's attention for every segment: projections over all rows,
    /// then rope, the cache and attention per segment, and the output
    /// projection added to the residual.
    #[allow(clippy::too_many_arguments)]
    fn attention_block(
        &self,
        pool: &Pool,
        arena: &mut Arena,
        kv: &mut KvPool,
        segments: &[Segment],
        li: usize,
        layer: &Layer,
        t_n: usize,
    ) {
        let d = self.spec.hidden as usize;
        let n_heads = self.spec.n_heads as usize;
        let (dk, dv, kvh) = (layer.key_dim, layer.value_dim, layer.n_kv_heads);
        let (qw, kw, vw) = (n_heads * dk, kvh * dk, kvh * dv);
        for t in 0..t_n {
            ops::rms_norm(
                &arena.residual[t * d..(t + 1) * d],
                &layer.attn_norm,
                self.eps,
                &mut arena.norm[t * d..(t + 1) * d],
            );
        }
        let x = &arena.norm[..t_n * d];
        self.mm(
            pool,
            &layer.wq,
            x,
            t_n,
            &mut arena.q[..t_n * qw],
            &mut arena.q8_rows,
        );
        self.mm(
            pool,
            &layer.wk,
            x,
            t_n,
            &mut arena.k[..t_n * kw],
            &mut arena.q8_rows,
        );
        self.mm(
            pool,
            &layer.wv,
            x,
            t_n,
            &mut arena.v[..t_n * vw],
            &mut arena.q8_rows,
        );
        if let Some([bq, bk, bv]) = &layer.bias {
            for t in 0..t_n {
                ops::add(&mut arena.q[t * qw..(t + 1) * qw], bq);
                ops::add(&mut arena.k[t * kw..(t + 1) * kw], bk);
                ops::add(&mut arena.v[t * vw..(t + 1) * vw], bv);
            }
        }
        if let Some([qn, kn]) = &layer.qk_norm {
            head_norm(&mut arena.q[..t_n * qw], dk, qn, self.eps);
            head_norm(&mut arena.k[..t_n * kw], dk, kn, self.eps);
        }
        let (theta, window) = match layer.attention {
            Attention::Sliding { window } => (self.local_theta, Some(window as usize)),
            _ => (self.theta, None),
        };
        let freqs = self.rope_freqs.as_deref();
        let mut row = 0;
        for seg in segments {
            for i in 0..seg.tokens.len() {
                let (t, pos) = (row + i, seg.seq.len + i);
                let q = &mut arena.q[t * qw..(t + 1) * qw];
                ops::rope(q, n_heads, dk, pos, theta, self.neox, freqs);
                let k = &mut arena.k[t * kw..(t + 1) * kw];
                ops::rope(k, kvh, dk, pos, theta, self.neox, freqs);
            }
            row += seg.tokens.len();
        }
        kv.round_to_cache(&mut arena.k[..t_n * kw], dk);
        kv.round_to_cache(&mut arena.v[..t_n * vw], dv);
        if kv.dtype() == KvDtype::F16 {
            // As llama.cpp multiplies q with an f16 K cache: in f16.
            crate::kv::round_to(KvDtype::F16, &mut arena.q[..t_n * qw], dk);
        }
        let shape = AttentionShape {
            n_heads,
            n_kv_heads: kvh,
            key_dim: dk,
            value_dim: dv,
            window,
            scale: self.attn_scale,
        };
        attention::attend(
            pool,
            &shape,
            segments,
            kv,
            li,
            &arena.q[..t_n * qw],
            &arena.k[..t_n * kw],
            &arena.v[..t_n * vw],
            &mut arena.attn_out[..t_n * n_heads * dv],
            &mut arena.attn_scratch,
            attention::scratch_per_worker(dk, dv),
        );
        let mut row = 0;
        for seg in segments {
            for i in 0..seg.tokens.len() {
                let t = row + i;
                kv.write(
                    seg.seq,
                    li,
                    seg.seq.len + i,
                    &arena.k[t * kw..(t + 1) * kw],
                    &arena.v[t * vw..(t + 1) * vw],
                );
            }
            row += seg.tokens.len();
        }
        self.mm(
            pool,
            &layer.wo,
            &arena.attn_out[..t_n * n_heads * dv],
            t_n,
            &mut arena.branch_out[..t_n * d],
            &mut arena.q8_rows,
        );
        self.add_branch(arena, layer.post_attn_norm.as_deref(), t_n, d);
    }

    /// residual += (optionally normed) branch_out.
    fn add_branch(&self, arena: &mut Arena, post_norm: Option<&[f32]>, t_n: usize, d: usize) {
        for t in 0..t_n {
            let r = t * d..(t + 1) * d;
            match post_norm {
                Some(w) => {
                    ops::rms_norm(
                        &arena.branch_out[r.clone()],
                        w,
                        self.eps,
                        &mut arena.norm[r.clone()],
                    );
                    ops::add(&mut arena.residual[r.clone()], &arena.norm[r]);
                }
                None => ops::add(&mut arena.residual[r.clone()], &arena.branch_out[r]),
            }
        }
    }

    fn activate(&self, gate: &mut [f32], up: &[f32]) {
        if self.gelu {
            ops::gelu_tanh_mul(gate, up);
        } else {
            ops::silu_mul(gate, up);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn dense_ffn(
        &self,
        pool: &Pool,
        arena: &mut Arena,
        gate: &Matrix,
        up: &Matrix,
        down: &Matrix,
        t_n: usize,
        d: usize,
    ) {
        let f = gate.rows;
        let x = &arena.norm[..t_n * d];
        self.mm(
            pool,
            gate,
            x,
            t_n,
            &mut arena.ffn_gate[..t_n * f],
            &mut arena.q8_rows,
        );
        self.mm(
            pool,
            up,
            x,
            t_n,
            &mut arena.ffn_up[..t_n * f],
            &mut arena.q8_rows,
        );
        self.activate(&mut arena.ffn_gate[..t_n * f], &arena.ffn_up[..t_n * f]);
        self.mm(
            pool,
            down,
            &arena.ffn_gate[..t_n * f],
            t_n,
            &mut arena.branch_out[..t_n * d],
            &mut arena.q8_rows,
        );
    }

    /// Routed experts: each token's top-k experts by router softmax; each
    /// expert runs once over the rows routed to it.
    fn moe_ffn(
        &self,
        pool: &Pool,
        arena: &mut Arena,
        router: &Matrix,
        experts: &[[Matrix; 3]],
        t_n: usize,
        d: usize,
    ) {
        let n_exp = experts.len();
        let k = self.spec.n_experts_active as usize;
        self.mm(
            pool,
            router,
            &arena.norm[..t_n * d],
            t_n,
            &mut arena.router_logits[..t_n * n_exp],
            &mut arena.q8_rows,
        );
        for t in 0..t_n {
            let logits = &mut arena.router_logits[t * n_exp..(t + 1) * n_exp];
            ops::softmax(logits);
            let routes = &mut arena.expert_routes[t * k..(t + 1) * k];
            for slot in routes.iter_mut() {
                let (best, &p) = logits
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .expect("experts exist");
                *slot = (best as u32, p);
                logits[best] = f32::NEG_INFINITY;
            }
            if self.spec.norm_topk_prob {
                let total: f32 = routes.iter().map(|r| r.1).sum();
                routes.iter_mut().for_each(|r| r.1 /= total);
            }
        }
        arena.branch_out[..t_n * d].fill(0.0);
        for (e, [gate, up, down]) in experts.iter().enumerate() {
            // Gather the rows routed to expert e.
            let mut n = 0;
            for t in 0..t_n {
                if arena.expert_routes[t * k..(t + 1) * k]
                    .iter()
                    .any(|r| r.0 as usize == e)
                {
                    let (src, dst) = (t * d, n * d);
                    let row: &[f32] = &arena.norm[src..src + d];
                    arena.moe_in[dst..dst + d].copy_from_slice(row);
                    n += 1;
                }
            }
            if n == 0 {
                continue;
            }
            let f = gate.rows;
            self.mm(
                pool,
                gate,
                &arena.moe_in[..n * d],
                n,
                &mut arena.ffn_gate[..n * f],
                &mut arena.q8_rows,
            );
            self.mm(
                pool,
                up,
                &arena.moe_in[..n * d],
                n,
                &mut arena.ffn_up[..n * f],
                &mut arena.q8_rows,
            );
            self.activate(&mut arena.ffn_gate[..n * f], &arena.ffn_up[..n * f]);
            self.mm(
                pool,
                down,
                &arena.ffn_gate[..n * f],
                n,
                &mut arena.moe_out[..n * d],
                &mut arena.q8_rows,
            );
            // Scatter back, weighted by each token's router weight for e.
            let mut i = 0;
            for t in 0..t_n {
                if let Some(&(_, w)) = arena.expert_routes[t * k..(t + 1) * k]
                    .iter()
                    .find(|r| r.0 as usize == e)
                {
                    ops::axpy(
                        &mut arena.branch_out[t * d..(t + 1) * d],
                        w,
                        &arena.moe_out[i * d..(i + 1) * d],
                    );
                    i += 1;
                }
            }
        }
    }
}

/// RMS-normalizes each head of each row in place (Qwen3 and Gemma 3 q/k norms).
fn head_norm(x: &mut [f32], head_dim: usize, weight: &[f32], eps: f32) {
    let mut tmp = [0f32; MAX_HEAD_DIM];
    for head in x.chunks_exact_mut(head_dim) {
        tmp[..head_dim].copy_from_slice(head);
        ops::rms_norm(&tmp[..head_dim], weight, eps, head);
    }
}

#[allow(clippy::too_many_arguments)]
fn load_layer(
    files: &WeightFiles,
    naming: &Naming,
    spec: &ModelSpec,
    i: usize,
    l: &fathom_spec::Layer,
    n: &LayerNames,
    plus_one: bool,
    converted: &mut usize,
) -> Result<Layer, EngineError> {
    let d = spec.hidden as usize;
    let n_heads = spec.n_heads as usize;
    let (kvh, dk, dv) = (
        l.n_kv_heads as usize,
        l.key_dim as usize,
        l.value_dim as usize,
    );
    let opt =
        |name: &str, len: usize, converted: &mut usize| -> Result<Option<Vec<f32>>, EngineError> {
            if files.has(name) {
                vector(files, name, len, plus_one, converted).map(Some)
            } else {
                Ok(None)
            }
        };
    let bias = if files.has(&n.q_bias) {
        let mut b = |name: &str, len| vector(files, name, len, false, converted);
        Some([
            b(&n.q_bias, n_heads * dk)?,
            b(&n.k_bias, kvh * dk)?,
            b(&n.v_bias, kvh * dv)?,
        ])
    } else {
        None
    };
    let qk_norm = match (
        opt(&n.q_norm, dk, converted)?,
        opt(&n.k_norm, dk, converted)?,
    ) {
        (Some(q), Some(k)) => Some([q, k]),
        _ => None,
    };
    let gemma = spec.family == Family::Gemma3;
    let post_attn_norm = if gemma {
        Some(vector(files, &n.post_attn_norm, d, plus_one, converted)?)
    } else {
        None
    };
    let post_ffn_norm = if gemma {
        Some(vector(files, &n.post_ffn_norm, d, plus_one, converted)?)
    } else {
        None
    };
    let ffn = if spec.n_experts > 0 {
        let (e_n, f) = (spec.n_experts as usize, spec.expert_ffn as usize);
        let experts = (0..e_n)
            .map(|e| -> Result<[Matrix; 3], EngineError> {
                match naming {
                    Naming::Gguf => {
                        let [g, u, dn] = Naming::gguf_experts(i);
                        Ok([
                            files.stacked_matrix(&g, e, e_n, f, d)?,
                            files.stacked_matrix(&u, e, e_n, f, d)?,
                            files.stacked_matrix(&dn, e, e_n, d, f)?,
                        ])
                    }
                    Naming::Hf { .. } => {
                        let [g, u, dn] = naming.hf_expert(i, e);
                        Ok([
                            files.matrix(&g, f, d)?,
                            files.matrix(&u, f, d)?,
                            files.matrix(&dn, d, f)?,
                        ])
                    }
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ffn::Moe {
            router: files.matrix(&n.router, e_n, d)?,
            experts,
        }
    } else {
        let f = spec.ffn as usize;
        Ffn::Dense {
            gate: files.matrix(&n.gate, f, d)?,
            up: files.matrix(&n.up, f, d)?,
            down: files.matrix(&n.down, d, f)?,
        }
    };
    Ok(Layer {
        attention: l.attention,
        n_kv_heads: kvh,
        key_dim: dk,
        value_dim: dv,
        attn_norm: vector(files, &n.attn_norm, d, plus_one, converted)?,
        wq: files.matrix(&n.q, n_heads * dk, d)?,
        wk: files.matrix(&n.k, kvh * dk, d)?,
        wv: files.matrix(&n.v, kvh * dv, d)?,
        wo: files.matrix(&n.o, d, n_heads * dv)?,
        bias,
        qk_norm,
        post_attn_norm,
        ffn_norm: vector(files, &n.ffn_norm, d, plus_one, converted)?,
        post_ffn_norm,
        ffn,
    })
}
