//! Attention over the paged KV: which kernel a step takes (split,
//! tensor-core prefill, tensor-core decode, or the one-block kernel), how
//! many pieces a row's keys are cut into, and the merge
//! (`attention_*.cu`).

use std::ffi::c_void;

use cudarc::driver::sys;
use fathom_plan::cuda::{ATTENTION_MAX_SPLITS, ATTENTION_SPLIT_KEYS};
use fathom_plan::KvDtype;

use super::abi::{
    att_split_compiled, AttRope, ATT_DEC_GROUP, ATT_HEADS, ATT_MAX_DIM, ATT_MAX_SPLITS,
    ATT_MMA_WARPS, ATT_ROPE_MAX, ATT_SPLIT_WARPS, ATT_VPL, ATT_WARPS, RK_WARPS,
};
use super::CudaBackend;
use crate::{AttentionIo, AttentionShape, RopeParams, Step};

pub(super) const ATT_MMA_THREADS: u32 = 32 * ATT_MMA_WARPS as u32;

/// Rows a sequence a step needs on average (prefill chunks) to take the
/// tensor-core attention kernel.
pub(super) const ATT_MMA_MIN_ROWS: usize = 8;

/// Threads of a one-block or split attention block.
pub(super) const ATT_THREADS: u32 = 32 * ATT_WARPS as u32;

const _: () = assert!(ATTENTION_MAX_SPLITS as usize <= ATT_MAX_SPLITS);
const _: () = assert!(ATTENTION_SPLIT_KEYS as usize == 32 * ATT_SPLIT_WARPS);

/// Keys up to which a split attention block takes one query head
/// (`attention`).
pub(super) const ATTENTION_ONE_HEAD_KEYS: usize = 384;

/// Keys from which decode rows take the tensor-core decode kernel where it
/// applies (`decode_mma_kernel`).
pub(super) const ATTENTION_DECODE_MMA_KEYS: usize = 1024;

/// An attention kernel for rows where the split kernels apply
/// (`CudaBackend::row_kernel`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct RowKernel {
    pub(super) f: sys::CUfunction,
    /// Blocks a row: one a KV head and chunk of its query heads (the
    /// splits multiply them).
    pub(super) row_blocks: usize,
    /// It ropes, rounds and stores a decode step's own rows itself (its
    /// registers allow: `ATT_ROPE_FITS` in attention_split.cu).
    pub(super) ropes: bool,
}

/// What made a step's q, k and v ready for attention (roped, rounded to
/// the cache's precision, K and V stored).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Readied {
    /// Nothing: `attention` (no rope) rounds them first.
    No,
    ByRopeKv,
    /// The split attention kernel does it (a decode step): the kernel
    /// `row_kernel` chose, which `attend` asked whether it ropes.
    InAttention(AttRope, RowKernel),
}

impl CudaBackend {
    /// Cuts attention's key ranges into `n` pieces (as far as the planned
    /// partials hold them) instead of the backend's choice, so tests can
    /// check the split and merge kernels at small contexts; `None` restores
    /// the choice.
    #[doc(hidden)]
    pub fn force_attention_splits(&mut self, n: Option<usize>) {
        self.forced_splits = n;
    }

    /// Sends decode rows to the tensor-core decode kernel wherever it
    /// applies (`Some(true)`) or never (`Some(false)`) instead of by their
    /// keys, so tests can check both kernels at small contexts; `None`
    /// restores the choice.
    #[doc(hidden)]
    pub fn force_decode_mma(&mut self, on: Option<bool>) {
        self.forced_decode_mma = on;
    }

    /// Attention of the step's rows; `rounded`: q, k and v already hold
    /// the cache's precision (rope_kv did it).
    pub(super) fn attention_of(
        &mut self,
        layer: usize,
        shape: &AttentionShape,
        step: &Step,
        io: AttentionIo,
        readied: Readied,
    ) {
        let AttentionIo { q, k, v, out } = io;
        let s = *shape;
        assert!(
            s.key_dim <= ATT_MAX_DIM && s.value_dim <= ATT_MAX_DIM,
            "attention: head dims {}/{} above {ATT_MAX_DIM}",
            s.key_dim,
            s.value_dim
        );
        assert!(s.n_kv_heads > 0 && s.n_heads.is_multiple_of(s.n_kv_heads));
        let rows = step.rows;
        let mut qp = self.buf(q, rows * s.n_heads * s.key_dim * 4);
        let mut kp = self.buf(k, rows * s.n_kv_heads * s.key_dim * 4);
        let mut vp = self.buf(v, rows * s.n_kv_heads * s.value_dim * 4);
        let mut op = self.buf(out, rows * s.n_heads * s.value_dim * 4);
        let mut kv = self.kv_desc(layer, shape);
        let mut sinks = self.attention_sinks(shape);
        if rows == 0 || !self.ready() {
            return;
        }
        // The step's own rows read what the cache will hold, as on the CPU:
        // K and V in the cache's precision, q in f16 against an f16 cache.
        let q_values = if self.kv.dtype == KvDtype::F16 {
            rows * s.n_heads * s.key_dim
        } else {
            0
        };
        if readied == Readied::No {
            self.round_to_kv(
                [
                    (kp, rows * s.n_kv_heads * s.key_dim),
                    (vp, rows * s.n_kv_heads * s.value_dim),
                    (qp, q_values),
                ],
                kv.dtype,
            );
        }
        let group = self.slots[layer].map(|(g, _)| g);
        let mut st = self.upload_step(step, group);
        let (mut nh, mut nkv, mut dk, mut dv) = (
            s.n_heads as i32,
            s.n_kv_heads as i32,
            s.key_dim as i32,
            s.value_dim as i32,
        );
        let mut window = s.window.map(|w| w as i32).unwrap_or(0);
        let mut scale = s.scale;
        let in_attention = matches!(readied, Readied::InAttention(..));
        if let Some((f, gp, tiles)) = self.attention_mma_plan(shape, step) {
            assert!(!in_attention, "a decode step on the prefill kernel");
            let (mut n_seqs, mut rows, mut gp) = (step.seqs.len() as i32, rows as i32, gp as i32);
            self.launch(
                f,
                (tiles as u32, s.n_kv_heads as u32, 1),
                ATT_MMA_THREADS,
                &mut args![st, kv, qp, kp, vp, op, n_seqs, rows, nh, nkv, gp, window, scale, sinks],
            );
            return;
        }
        let keys = Self::attended_keys(&s, step);
        let (mut rope, kernel) = match readied {
            Readied::InAttention(rope, kernel) => (rope, Some(kernel)),
            _ => (AttRope::default(), self.row_kernel(&s, keys, kv.dtype)),
        };
        let Some(RowKernel { f, row_blocks, .. }) = kernel else {
            assert!(
                !in_attention,
                "rope inside attention without the split kernels"
            );
            let f = self.k.attention;
            self.launch(
                f,
                (rows as u32, s.n_heads as u32, 1),
                ATT_THREADS,
                &mut args![st, kv, qp, kp, vp, op, nh, nkv, dk, dv, window, scale, sinks],
            );
            return;
        };
        let blocks = rows * row_blocks;
        let want = self
            .forced_splits
            .unwrap_or_else(|| Self::attention_splits(keys, blocks, self.sm_count));
        let per_split = rows * s.n_heads * (s.value_dim + 2) * 4;
        let fit = (self.partials.1 / per_split as u64) as usize;
        let splits = want.min(ATT_MAX_SPLITS).min(fit).max(1);
        let mut part = self.partials.0;
        // The output as x8 blocks too, by whichever kernel writes it last.
        let x8 = if s.value_dim.is_multiple_of(32) {
            self.x8_out(rows, s.n_heads * s.value_dim)
        } else {
            0
        };
        let (mut x8_split, mut x8_merge) = if splits > 1 { (0, x8) } else { (x8, 0) };
        self.launch(
            f,
            (rows as u32, row_blocks as u32, splits as u32),
            ATT_THREADS,
            &mut args![
                st, kv, qp, kp, vp, op, part, x8_split, nh, nkv, dk, dv, window, scale, rope, sinks
            ],
        );
        if splits > 1 {
            let mut n = splits as i32;
            let f = self.k.attention_merge;
            self.launch(
                f,
                (rows as u32, s.n_heads as u32, 1),
                128,
                &mut args![part, n, nh, dv, op, x8_merge, sinks],
            );
        }
        if x8 != 0 {
            self.x8_holds = Some((op, s.n_heads * s.value_dim));
        }
        self.attention_last = true;
    }

    /// Device address of a layer's attention sinks (one logit a query
    /// head), or 0 for none.
    fn attention_sinks(&self, s: &AttentionShape) -> u64 {
        s.sinks.map_or(0, |v| {
            let (p, l) = self.vectors[v.0 as usize];
            assert!(
                l >= s.n_heads,
                "attention: {l} sinks for {} heads",
                s.n_heads
            );
            p
        })
    }

    /// The kernel that attends rows of shape `s` over `keys` keys against a
    /// cache of KV dtype `dtype` (`KV_*` in abi.rs) where the split
    /// kernels apply (`None`: the one-block kernel): the tensor-core decode
    /// kernel or the split kernel of the shape's value dims a lane and
    /// query heads a block. `attend` asks it whether a decode step's rope
    /// can go inside attention, `attention_of` which kernel to launch.
    pub(super) fn row_kernel(
        &self,
        s: &AttentionShape,
        keys: usize,
        dtype: i32,
    ) -> Option<RowKernel> {
        let vpl = Self::split_vpl(s)?;
        if let Some(f) = self.decode_mma_kernel(s, keys) {
            return Some(RowKernel {
                f,
                row_blocks: s.n_kv_heads,
                ropes: true,
            });
        }
        let heads = Self::split_heads(s, keys, vpl);
        let hi = ATT_HEADS
            .iter()
            .position(|&h| h == heads)
            .expect("a power of two up to 8");
        let chunks = (s.n_heads / s.n_kv_heads).div_ceil(heads);
        Some(RowKernel {
            f: self.k.attention_split[dtype as usize][vpl][hi],
            row_blocks: s.n_kv_heads * chunks,
            ropes: ATT_VPL[vpl] * heads <= ATT_ROPE_MAX,
        })
    }

    /// Pieces to cut a row's `keys` into when a row takes `blocks` blocks:
    /// as many as one wave of blocks holds (2 a multiprocessor: the split
    /// and decode kernels' registers allow 2 blocks of 128 threads), in as
    /// few rounds of 32 keys a warp as that allows, the rounds even across
    /// the block's 4 warps (a piece of 4 × rounds runs of 32 keys, at least
    /// `ATTENTION_SPLIT_KEYS` keys). On the H200 at an 8B-shaped layer's 8
    /// KV heads: 33 pieces at 4,097 to 4,224 keys (one run a warp) rather
    /// than 32 (some warps two); 32 at 8,192 (two runs a warp) rather than
    /// 64 (two waves).
    pub(super) fn attention_splits(keys: usize, blocks: usize, sm_count: usize) -> usize {
        const RUN: usize = 32;
        const WARPS: usize = ATTENTION_SPLIT_KEYS as usize / RUN;
        let most = (2 * sm_count / blocks.max(1)).max(1);
        let runs = keys.div_ceil(RUN);
        let rounds = runs.div_ceil(WARPS * most).max(1);
        runs.div_ceil(WARPS * rounds)
    }

    /// The split kernels' `ATT_VPL` index for this shape, or `None` where
    /// they do not apply: they read 8 key values and 2..16 value dims at a
    /// time (aligned vector loads); other head dims take the one-block
    /// kernel.
    pub(super) fn split_vpl(s: &AttentionShape) -> Option<usize> {
        let vpl = ATT_VPL.iter().position(|&n| 32 * n >= s.value_dim)?;
        (s.key_dim.is_multiple_of(8)
            && s.value_dim.is_multiple_of(8)
            && s.value_dim.is_multiple_of(ATT_VPL[vpl]))
        .then_some(vpl)
    }

    /// Keys the longest row of the step attends to.
    pub(super) fn attended_keys(s: &AttentionShape, step: &Step) -> usize {
        let keys = step
            .seqs
            .iter()
            .map(|q| q.start + q.tokens)
            .max()
            .unwrap_or(0);
        s.window.map_or(keys, |w| keys.min(w))
    }

    /// Query heads a split attention block takes: the GQA group, in chunks
    /// of a power of two, so that a K/V row is read once for them all; up
    /// to ATTENTION_ONE_HEAD_KEYS keys, one head a block (the chain of a
    /// head's dots and softmax sums is then the kernel's time, not the K/V
    /// bytes: measured on the H200, decode at short context 3-4% faster
    /// for an 8B-shaped Q4_0 and SmolLM2, 8B F16 1% slower from 512 keys).
    pub(super) fn split_heads(s: &AttentionShape, keys: usize, vpl: usize) -> usize {
        if keys <= ATTENTION_ONE_HEAD_KEYS {
            return 1;
        }
        let most = ATT_HEADS
            .into_iter()
            .filter(|&h| att_split_compiled(ATT_VPL[vpl], h))
            .max()
            .unwrap_or(1);
        (s.n_heads / s.n_kv_heads).next_power_of_two().min(most)
    }

    /// The tensor-core decode kernel (`attention_decode_mma_<D>`) where it
    /// applies: an f16 cache, equal key and value dims of 64 or 128, GQA
    /// groups of up to `ATT_DEC_GROUP` query heads, and at least
    /// `ATTENTION_DECODE_MMA_KEYS` keys (or as a test forces). Rows of the
    /// same shape with fewer keys take the split kernels (one query head a
    /// block up to `ATTENTION_ONE_HEAD_KEYS`).
    pub(super) fn decode_mma_kernel(
        &self,
        s: &AttentionShape,
        keys: usize,
    ) -> Option<sys::CUfunction> {
        let f = match (s.key_dim, s.value_dim) {
            (64, 64) => self.k.attention_decode_mma[0],
            (128, 128) => self.k.attention_decode_mma[1],
            _ => return None,
        };
        let fits = self.kv.dtype == KvDtype::F16 && s.n_heads / s.n_kv_heads <= ATT_DEC_GROUP;
        let wanted = self
            .forced_decode_mma
            .unwrap_or(keys >= ATTENTION_DECODE_MMA_KEYS);
        (fits && wanted).then_some(f)
    }

    /// The tensor-core prefill kernel for this step, when it applies: an
    /// f16 cache, equal key and value dims of 64 or 128, GQA groups of up to
    /// 16 query heads, and at least `ATT_MMA_MIN_ROWS` rows a sequence on
    /// average (decode rows alone go to the split kernels, which also cut
    /// long contexts across blocks). Returns the kernel, the group padded to
    /// a power of two, and the grid's tiles (each sequence's rows in runs of
    /// a block's `4 × 16 / padded group` rows).
    pub(super) fn attention_mma_plan(
        &self,
        shape: &AttentionShape,
        step: &Step,
    ) -> Option<(sys::CUfunction, usize, usize)> {
        let group = shape.n_heads / shape.n_kv_heads;
        let gp = group.next_power_of_two();
        let f = match shape.key_dim {
            64 => self.k.attention_mma[0],
            128 => self.k.attention_mma[1],
            _ => return None,
        };
        let fits = self.kv.dtype == KvDtype::F16
            && shape.value_dim == shape.key_dim
            && gp <= 16
            && step.rows >= ATT_MMA_MIN_ROWS * step.seqs.len();
        if !fits || self.forced_splits.is_some() {
            return None;
        }
        let block_rows = ATT_MMA_WARPS * (16 / gp);
        let tiles = step
            .seqs
            .iter()
            .map(|q| q.tokens.div_ceil(block_rows))
            .sum();
        Some((f, gp, tiles))
    }

    pub(super) fn attend(
        &mut self,
        layer: usize,
        shape: &AttentionShape,
        step: &Step,
        io: AttentionIo,
        rope: &RopeParams,
    ) {
        let s = *shape;
        assert!(
            s.key_dim.max(s.value_dim) <= ATT_MAX_DIM && s.key_dim.is_multiple_of(2),
            "attend: head dims {}/{} (even key dims up to {ATT_MAX_DIM})",
            s.key_dim,
            s.value_dim
        );
        let rows = step.rows;
        let mut qp = self.buf(io.q, rows * s.n_heads * s.key_dim * 4);
        let mut kp = self.buf(io.k, rows * s.n_kv_heads * s.key_dim * 4);
        let mut vp = self.buf(io.v, rows * s.n_kv_heads * s.value_dim * 4);
        let rotated = Self::rope_rotated(rope, s.key_dim);
        let mut freqs = self.rope_freqs(rope, rotated);
        let mut yarn = Self::rope_yarn(rope);
        let mut kv = self.kv_desc(layer, shape);
        if rows == 0 || !self.ready() {
            return;
        }
        if layer == 1 {
            self.issue_step_head();
        }
        let group = self.slots[layer].map(|(g, _)| g);
        let mut st = self.upload_step(step, group);
        // A ring's slots may hold positions this step still attends to:
        // there the store waits for attention (kv_write).
        let early = kv.ring == 0;
        let (mut nh, mut nkv, mut dk, mut dv) = (
            s.n_heads as i32,
            s.n_kv_heads as i32,
            s.key_dim as i32,
            s.value_dim as i32,
        );
        let (mut theta, mut neox, mut store) = (rope.theta as f64, rope.neox as i32, early as i32);
        // A decode step (a token a sequence) on the split kernels, without
        // a ring: attention ropes, rounds and stores what it reads itself
        // (where its registers allow: `ATT_ROPE_FITS` in attention_split.cu;
        // whole heads only: a partial rope goes through rope_kv).
        let kernel = self
            .row_kernel(&s, Self::attended_keys(&s, step), kv.dtype)
            .filter(|k| k.ropes && rotated == s.key_dim);
        if let (true, true, Some(kernel)) = (early, step.seqs.iter().all(|q| q.tokens == 1), kernel)
        {
            let rope = AttRope {
                ratio: theta.powf(-2.0 / s.key_dim as f64),
                freqs,
                neox,
                fused: 1,
                yarn,
            };
            let readied = Readied::InAttention(rope, kernel);
            self.attention_of(layer, shape, step, io, readied);
            return;
        }
        let mut rot = rotated as i32;
        let f = self.k.rope_kv;
        self.launch(
            f,
            (
                rows as u32,
                (s.n_heads + 2 * s.n_kv_heads).div_ceil(RK_WARPS) as u32,
                1,
            ),
            32 * RK_WARPS as u32,
            &mut args![st, kv, qp, kp, vp, nh, nkv, dk, dv, theta, neox, freqs, store, rot, yarn],
        );
        self.attention_of(layer, shape, step, io, Readied::ByRopeKv);
        if !early {
            self.kv_write(layer, step, io.k, io.v, shape);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::CudaBackend;

    /// Attention's pieces on an H200 (132 multiprocessors): one wave of
    /// blocks at most (2 a multiprocessor), a warp's rounds of 32 keys the
    /// fewest that allows, more than 128 keys a piece but the last.
    #[test]
    fn attention_splits_fill_one_wave_with_even_rounds() {
        let splits = |keys, blocks| CudaBackend::attention_splits(keys, blocks, 132);
        // An 8B-shaped decode row (8 KV heads, a block each).
        assert_eq!(splits(100, 8), 1);
        assert_eq!(splits(1024, 8), 8);
        assert_eq!(splits(4097, 8), 33);
        assert_eq!(splits(8192, 8), 32);
        assert_eq!(splits(32768, 8), 32);
        for keys in [1, 77, 129, 1000, 4097, 5000, 8192, 20000] {
            for blocks in [1, 8, 32, 128, 264, 1000] {
                let n = splits(keys, blocks);
                let runs = keys.div_ceil(32);
                let most = (264 / blocks).max(1);
                assert!(
                    n >= 1 && n <= most,
                    "{keys} keys, {blocks} blocks: {n} pieces"
                );
                // A warp's rounds: the fewest one wave allows.
                let rounds = runs.div_ceil(n).div_ceil(4);
                assert_eq!(
                    rounds,
                    runs.div_ceil(4 * most),
                    "{keys} keys, {blocks} blocks"
                );
                assert!(n == 1 || keys > 128 * (n - 1), "{keys} keys in {n} pieces");
            }
        }
    }
}
