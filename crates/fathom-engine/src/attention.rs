//! Causal attention over the paged KV cache with online softmax: no score
//! matrix, only one block of scores at a time.
//!
//! A chunk of T new tokens attends to the positions already cached and to
//! the chunk's own K and V, which are still in the activation arena; the
//! chunk is written to the cache afterwards. So a sliding-window layer's
//! ring never has to hold more than its window, even for a long chunk.

use fathom_kernels::{ops, Pool};
use fathom_plan::kv::KV_BLOCK_TOKENS;

use crate::kv::LayerKv;

const BLOCK: usize = KV_BLOCK_TOKENS as usize;
/// Query heads per KV head handled on the stack; real models use up to 16.
const MAX_GROUP: usize = 64;

/// Shapes of one attention call.
pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
    /// Position of the chunk's first token.
    pub start: usize,
    /// Tokens in the chunk.
    pub tokens: usize,
    pub window: Option<usize>,
    pub scale: f32,
}

/// A pointer the workers share to write disjoint slices of one buffer.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: every work item writes only its own (token, kv-head) slice of the
// output, so no two workers touch the same element.
unsafe impl Sync for SharedOut {}
unsafe impl Send for SharedOut {}

impl SharedOut {
    /// Through a method, so closures capture the whole (Sync) wrapper
    /// rather than its raw pointer field.
    fn ptr(self) -> *mut f32 {
        self.0
    }
}

/// `out[t][h]` = softmax(q·K / √d) V over positions `max(0, p-w+1) ..= p`.
/// `q`: T × heads × key_dim; `k`, `v`: T × kv_heads × dims (the chunk);
/// `scratch`: per worker, `BLOCK + value_dim + BLOCK × (key_dim + value_dim)` f32.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    pool: &Pool,
    shape: &AttentionShape,
    cache: Option<&LayerKv>,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    scratch: &mut [f32],
    scratch_per_worker: usize,
) {
    let s = shape;
    let group = s.n_heads / s.n_kv_heads;
    debug_assert!(group <= MAX_GROUP);
    let items = s.tokens * s.n_kv_heads;
    let out_len = out.len();
    let shared_out = SharedOut(out.as_mut_ptr());
    let shared_scratch = SharedOut(scratch.as_mut_ptr());
    let scratch_len = scratch.len();
    pool.run(&|worker, workers| {
        assert!((worker + 1) * scratch_per_worker <= scratch_len);
        // SAFETY: worker `w` owns scratch[w * per .. (w + 1) * per], in bounds
        // by the assertion above, and no other worker touches it.
        let scratch = unsafe {
            std::slice::from_raw_parts_mut(
                shared_scratch.ptr().add(worker * scratch_per_worker),
                scratch_per_worker,
            )
        };
        let (kbuf, rest) = scratch.split_at_mut(s.key_dim);
        let (vbuf, _) = rest.split_at_mut(s.value_dim);
        for item in (worker..items).step_by(workers) {
            let (t, g) = (item / s.n_kv_heads, item % s.n_kv_heads);
            let row = t * s.n_heads * s.value_dim + g * group * s.value_dim;
            let len = group * s.value_dim;
            assert!(row + len <= out_len);
            // SAFETY: items are distinct (token, kv head) pairs, so their
            // output slices are disjoint and in bounds (asserted).
            let acc = unsafe { std::slice::from_raw_parts_mut(shared_out.ptr().add(row), len) };
            attend_one(s, cache, q, k, v, t, g, group, acc, kbuf, vbuf);
        }
    });
}

#[allow(clippy::too_many_arguments)]
fn attend_one(
    s: &AttentionShape,
    cache: Option<&LayerKv>,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    t: usize,
    g: usize,
    group: usize,
    acc: &mut [f32],
    kbuf: &mut [f32],
    vbuf: &mut [f32],
) {
    let pos = s.start + t;
    let first = match s.window {
        Some(w) => (pos + 1).saturating_sub(w),
        None => 0,
    };
    let mut max = [f32::NEG_INFINITY; MAX_GROUP];
    let mut sum = [0f32; MAX_GROUP];
    acc.fill(0.0);
    let q_row = |h: usize| {
        let o = (t * s.n_heads + g * group + h) * s.key_dim;
        &q[o..o + s.key_dim]
    };
    let mut visit = |kj: &[f32], vj: &[f32]| {
        for h in 0..group {
            let score = ops::dot_f32(q_row(h), kj) * s.scale;
            let a = &mut acc[h * s.value_dim..(h + 1) * s.value_dim];
            if score > max[h] {
                let rescale = (max[h] - score).exp();
                ops::scale(a, rescale);
                sum[h] *= rescale;
                max[h] = score;
            }
            let w = (score - max[h]).exp();
            sum[h] += w;
            ops::axpy(a, w, vj);
        }
    };
    if let Some(cache) = cache {
        for p in first..s.start {
            cache.load(p, g, kbuf, vbuf);
            visit(kbuf, vbuf);
        }
    }
    for p in first.max(s.start)..=pos {
        let c = p - s.start;
        let ko = (c * s.n_kv_heads + g) * s.key_dim;
        let vo = (c * s.n_kv_heads + g) * s.value_dim;
        visit(&k[ko..ko + s.key_dim], &v[vo..vo + s.value_dim]);
    }
    for h in 0..group {
        ops::scale(
            &mut acc[h * s.value_dim..(h + 1) * s.value_dim],
            1.0 / sum[h],
        );
    }
}

/// Scratch each worker needs, in f32: what the plan's `attn_scratch` lists.
pub fn scratch_per_worker(key_dim: usize, value_dim: usize) -> usize {
    BLOCK + value_dim + BLOCK * (key_dim + value_dim)
}
