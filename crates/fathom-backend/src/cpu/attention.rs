//! Causal attention over the paged KV cache with online softmax: no score
//! matrix, only one block of scores at a time. Per query and head, a
//! block's scores are worked out first, the running sums rescaled once if
//! the block raises the maximum, and the block's weights taken in one
//! vector pass; blocks end at multiples of the KV block size, so a
//! query's output does not depend on how its sequence was cut into steps.
//!
//! A chunk of T new tokens attends to the positions already cached and to
//! the chunk's own K and V, which are still in the activation arena; the
//! chunk is written to the cache afterwards. So a sliding-window layer's
//! ring never has to hold more than its window, even for a long chunk.

use fathom_kernels::ops::{self, Rows};
use fathom_kernels::Pool;
use fathom_plan::kv::KV_BLOCK_TOKENS;

use super::kv::{KvStore, LayerKv};
use crate::{AttentionShape, Step, StepSeq};

const BLOCK: usize = KV_BLOCK_TOKENS as usize;
/// Query heads per KV head handled on the stack; real models use up to 16.
const MAX_GROUP: usize = 64;

/// One sequence's chunk within a step, as a work item sees it.
struct Span<'a> {
    /// Position of the chunk's first token.
    start: usize,
    /// Tokens in the chunk.
    tokens: usize,
    /// The chunk's first row in the step's q, k, v and output.
    row: usize,
    /// The sequence's cached positions.
    cache: Option<LayerKv<'a>>,
}

/// A pointer the workers share to write disjoint slices of one buffer.
#[derive(Clone, Copy)]
pub(super) struct SharedOut(pub(super) *mut f32);
// SAFETY: every user gives each work item its own slices of the buffer
// (attention: a (token, kv-head) slice of the output; the delta rule: a
// (sequence, value-head) state and its output columns), so no two workers
// touch the same element.
unsafe impl Sync for SharedOut {}
unsafe impl Send for SharedOut {}

impl SharedOut {
    /// Through a method, so closures capture the whole (Sync) wrapper
    /// rather than its raw pointer field.
    pub(super) fn ptr(self) -> *mut f32 {
        self.0
    }
}

/// Query tokens per work item: a tile of queries shares each loaded block
/// of K and V, so a prefill chunk converts each cached row once per tile
/// rather than once per token.
const TILE: usize = 16;

/// `out[t][h]` = softmax(q·K / √d) V over positions `max(0, p-w+1) ..= p`,
/// for every sequence of the step (its cache is `layer` of `kv`) in one
/// hand-off to the pool.
/// The buffers of one layer's attention: `q` rows × heads × key_dim; `k`,
/// `v` rows × kv_heads × dims (the step's own rows); `out` rows × heads ×
/// value_dim; `scratch` per worker, [`scratch_per_worker`] f32 each.
pub struct Buffers<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub out: &'a mut [f32],
    pub scratch: &'a mut [f32],
    /// Each query head's sink logit (gpt-oss), in the softmax's
    /// denominator only.
    pub sinks: Option<&'a [f32]>,
}

pub fn attend(
    pool: &Pool,
    shape: &AttentionShape,
    step: &Step,
    kv: &KvStore,
    layer: usize,
    bufs: Buffers,
) {
    let Buffers {
        q,
        k,
        v,
        out,
        scratch,
        sinks,
    } = bufs;
    if let Some(sinks) = sinks {
        assert!(sinks.len() >= shape.n_heads, "{} sinks", sinks.len());
    }
    let scratch_per_worker = scratch_per_worker(shape.key_dim, shape.value_dim);
    let s = shape;
    let group = s.n_heads / s.n_kv_heads;
    assert!(group <= MAX_GROUP, "{group} query heads per KV head");
    let seqs = step.seqs;
    let items_of = |seq: &StepSeq| seq.tokens.div_ceil(TILE) * s.n_kv_heads;
    let items: usize = seqs.iter().map(items_of).sum();
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
        let (kbuf, rest) = scratch.split_at_mut(BLOCK * s.key_dim);
        let (vbuf, rest) = rest.split_at_mut(BLOCK * s.value_dim);
        // A block's scores for a few query heads (the plan's `BLOCK +
        // value_dim` values: 9 heads of 128 values' layers at a time).
        let scores = &mut rest[..];
        // Items are numbered sequence by sequence; walk along with them.
        let (mut index, mut first_item, mut first_row) = (0, 0, 0);
        for item in (worker..items).step_by(workers) {
            while item >= first_item + items_of(&seqs[index]) {
                first_item += items_of(&seqs[index]);
                first_row += seqs[index].tokens;
                index += 1;
            }
            let seq = &seqs[index];
            let span = Span {
                start: seq.start,
                tokens: seq.tokens,
                row: first_row,
                cache: kv.layer(seq.tables, layer, s.key_dim, s.value_dim),
            };
            let local = item - first_item;
            let (tile, g) = (local / s.n_kv_heads, local % s.n_kv_heads);
            let t0 = tile * TILE;
            let t1 = (t0 + TILE).min(span.tokens);
            let mut acc: [&mut [f32]; TILE] = Default::default();
            for t in t0..t1 {
                let row = (span.row + t) * s.n_heads * s.value_dim + g * group * s.value_dim;
                let len = group * s.value_dim;
                assert!(row + len <= out_len);
                // SAFETY: items are distinct (span, query tile, kv head)
                // triples, so their output slices are disjoint and in
                // bounds (asserted).
                acc[t - t0] =
                    unsafe { std::slice::from_raw_parts_mut(shared_out.ptr().add(row), len) };
            }
            let rows = span.row..span.row + span.tokens;
            let tile = QueryTile {
                q: &q[rows.start * s.n_heads * s.key_dim..rows.end * s.n_heads * s.key_dim],
                k: &k[rows.start * s.n_kv_heads * s.key_dim..rows.end * s.n_kv_heads * s.key_dim],
                v: &v[rows.start * s.n_kv_heads * s.value_dim
                    ..rows.end * s.n_kv_heads * s.value_dim],
                t0,
                t1,
                g,
                group,
            };
            let sinks = sinks.map(|all| &all[g * group..(g + 1) * group]);
            attend_tile(
                s,
                &span,
                &tile,
                &mut acc[..t1 - t0],
                kbuf,
                vbuf,
                scores,
                sinks,
            );
        }
    });
}

/// Online softmax state of one (query, head).
#[derive(Clone, Copy)]
struct Running {
    max: f32,
    sum: f32,
}

/// One work item: queries `t0..t1` of a sequence's chunk (`q`, `k`, `v`
/// its rows) for the `group` query heads of KV head `g`.
struct QueryTile<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    t0: usize,
    t1: usize,
    g: usize,
    group: usize,
}

/// `sinks`: the sink logits of the tile's `group` query heads.
#[allow(clippy::too_many_arguments)]
fn attend_tile(
    s: &AttentionShape,
    span: &Span,
    tile: &QueryTile,
    acc: &mut [&mut [f32]],
    kbuf: &mut [f32],
    vbuf: &mut [f32],
    scores: &mut [f32],
    sinks: Option<&[f32]>,
) {
    let QueryTile {
        q,
        k,
        v,
        t0,
        t1,
        g,
        group,
    } = *tile;
    let (dk, dv) = (s.key_dim, s.value_dim);
    let start = span.start;
    let first = |t: usize| match s.window {
        Some(w) => (start + t + 1).saturating_sub(w),
        None => 0,
    };
    let mut state = [Running {
        max: f32::NEG_INFINITY,
        sum: 0.0,
    }; TILE * MAX_GROUP];
    for a in acc.iter_mut() {
        a.fill(0.0);
    }
    // Query heads whose block of scores the scratch holds at once.
    let heads_at_once = (scores.len() / BLOCK).max(1);
    let (lo, hi) = (first(t0), start + t1 - 1);
    let mut block_start = lo;
    while block_start <= hi {
        // Key positions in blocks that end at multiples of BLOCK, whether
        // they come from the cache, the chunk or both: a query's keys fall
        // into the same blocks however its sequence was cut into chunks,
        // and its softmax's rescales (one per block that raises the
        // maximum) with them, so its output does not depend on the cut.
        let block_end = ((block_start / BLOCK + 1) * BLOCK).min(hi + 1);
        let loaded = block_start..block_end.min(start).max(block_start);
        if !loaded.is_empty() {
            let cache = span
                .cache
                .as_ref()
                .expect("positions before the chunk are cached");
            let n = loaded.len();
            cache.load_block(block_start, n, g, &mut kbuf[..n * dk], &mut vbuf[..n * dv]);
        }
        // Keys before `cut` come from the cache (the block's rows in kbuf
        // and vbuf), the rest from the step's chunk.
        let chunk_stride = (s.n_kv_heads * dk, s.n_kv_heads * dv);
        for t in t0..t1 {
            let (from, to) = (first(t).max(block_start), (start + t + 1).min(block_end));
            if from >= to {
                continue;
            }
            let cut = start.clamp(from, to);
            let (cached, fresh) = (from..cut, cut..to);
            let in_chunk = |p: usize, d: usize| ((p - start) * s.n_kv_heads + g) * d;
            // The block's scores for as many of the group's heads as the
            // scratch holds at a time (one call: each loaded piece of a
            // key serves all of them).
            for heads in (0..group).step_by(heads_at_once) {
                let heads = heads..(heads + heads_at_once).min(group);
                let queries = Rows {
                    data: &q[(t * s.n_heads + g * group + heads.start) * dk..],
                    stride: dk,
                    count: heads.len(),
                };
                let rows_of = |data, stride, count| Rows {
                    data,
                    stride,
                    count,
                };
                if !cached.is_empty() {
                    let rows = &kbuf[(cached.start - block_start) * dk..];
                    ops::scores_f32(queries, rows_of(rows, dk, cached.len()), dk, scores, BLOCK);
                }
                if !fresh.is_empty() {
                    let rows = &k[in_chunk(fresh.start, dk)..];
                    let fresh_keys = rows_of(rows, chunk_stride.0, fresh.len());
                    ops::scores_f32(queries, fresh_keys, dk, &mut scores[cached.len()..], BLOCK);
                }
                for h in heads.clone() {
                    // One rescale of what came before when the block raises
                    // the maximum, and its weights in one vector pass over
                    // the whole block (so the sum does not depend on where
                    // the cache ends).
                    let at = (h - heads.start) * BLOCK;
                    let scores = &mut scores[at..at + (to - from)];
                    for score in scores.iter_mut() {
                        *score *= s.scale;
                    }
                    let st = &mut state[(t - t0) * group + h];
                    let max = scores.iter().fold(st.max, |m, &v| m.max(v));
                    if max > st.max {
                        let rescale = (st.max - max).exp();
                        ops::scale(&mut acc[t - t0][h * dv..(h + 1) * dv], rescale);
                        st.sum *= rescale;
                        st.max = max;
                    }
                    st.sum += ops::exp_shifted_sum(scores, st.max);
                }
                // The heads' weighted values, each loaded value row serving
                // all of them.
                let out = &mut acc[t - t0][heads.start * dv..];
                let weights = |from: usize| Rows {
                    data: &scores[from..],
                    stride: BLOCK,
                    count: heads.len(),
                };
                if !cached.is_empty() {
                    let rows =
                        rows_of(&vbuf[(cached.start - block_start) * dv..], dv, cached.len());
                    ops::weighted_rows(out, dv, weights(0), rows, dv);
                }
                if !fresh.is_empty() {
                    let rows = &v[in_chunk(fresh.start, dv)..];
                    let fresh_values = rows_of(rows, chunk_stride.1, fresh.len());
                    ops::weighted_rows(out, dv, weights(cached.len()), fresh_values, dv);
                }
            }
        }
        block_start = block_end;
    }
    for t in t0..t1 {
        for h in 0..group {
            let st = state[(t - t0) * group + h];
            let a = &mut acc[t - t0][h * dv..(h + 1) * dv];
            // A sink joins the denominator as one more score, as
            // llama.cpp's softmax does: when it passes the maximum, what
            // came before is rescaled to it.
            let sum = match sinks.map(|sk| sk[h]) {
                Some(sink) if sink > st.max => {
                    let rescale = (st.max - sink).exp();
                    ops::scale(a, rescale);
                    st.sum * rescale + 1.0
                }
                Some(sink) => st.sum + (sink - st.max).exp(),
                None => st.sum,
            };
            ops::scale(a, 1.0 / sum);
        }
    }
}

/// Scratch each worker needs, in f32: what the plan's `attn_scratch` lists.
pub fn scratch_per_worker(key_dim: usize, value_dim: usize) -> usize {
    BLOCK + value_dim + BLOCK * (key_dim + value_dim)
}
