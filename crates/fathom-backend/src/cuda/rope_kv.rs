//! Rope, rounding to the cache's precision and the KV store
//! (`rope_kv.cu`), and the descriptor of a layer's cache the attention
//! kernels read.

use std::ffi::c_void;

use fathom_plan::kv::KV_BLOCK_TOKENS;
use fathom_plan::KvDtype;

use super::abi::{KvDesc, RopeYarn, KV_BF16, KV_F16, KV_F32, KV_Q8_0};
use super::CudaBackend;
use crate::{AttentionShape, Buf, RopeParams, Step};

const _: () = assert!(KV_BLOCK_TOKENS as usize == super::abi::KV_BLOCK_TOKENS);

impl CudaBackend {
    pub(super) fn kv_desc(&self, layer: usize, shape: &AttentionShape) -> KvDesc {
        let (group, l) =
            self.slots[layer].unwrap_or_else(|| panic!("layer {layer} has no KV (no attention)"));
        let g = &self.kv.groups[group];
        assert!(
            g.n_kv_heads as usize == shape.n_kv_heads
                && g.key_dim as usize == shape.key_dim
                && g.value_dim as usize == shape.value_dim,
            "layer {layer}'s shape differs from its KV group's"
        );
        let dtype = self.kv.dtype;
        let k_row = dtype.row_bytes(g.n_kv_heads * g.key_dim);
        let v_row = dtype.row_bytes(g.n_kv_heads * g.value_dim);
        KvDesc {
            base: self.kv_base[group],
            block_bytes: g.block_bytes(),
            layer_off: l as u64 * KV_BLOCK_TOKENS * (k_row + v_row),
            k_row: k_row as i32,
            v_row: v_row as i32,
            ring: if g.window.is_some() {
                (g.blocks_per_sequence * KV_BLOCK_TOKENS) as i32
            } else {
                0
            },
            dtype: kv_dtype_id(dtype),
        }
    }

    /// The values of each `head_dim` head that `rope` rotates (its
    /// `rotated` part, else all), checked to be even and within the head.
    pub(super) fn rope_rotated(rope: &RopeParams, head_dim: usize) -> usize {
        let rot = rope.rotated.unwrap_or(head_dim);
        assert!(
            rot.is_multiple_of(2) && (2..=head_dim).contains(&rot),
            "rope: {rot} rotated values of a {head_dim}-value head (an even count, at most the head)"
        );
        rot
    }

    /// Device address of a rope's frequency factors (0 for none), checked
    /// to cover the pairs of the `rotated` values of a head.
    pub(super) fn rope_freqs(&self, rope: &RopeParams, rotated: usize) -> u64 {
        rope.freqs.map_or(0, |v| {
            let (p, l) = self.vectors[v.0 as usize];
            assert!(
                l >= rotated / 2,
                "rope: {l} frequency factors for {} pairs",
                rotated / 2
            );
            p
        })
    }

    /// A rope's YaRN scaling as the kernels take it (plain rope without).
    pub(super) fn rope_yarn(rope: &RopeParams) -> RopeYarn {
        rope.yarn.map_or_else(RopeYarn::default, |y| RopeYarn {
            freq_scale: y.freq_scale,
            low: y.corr[0],
            high: y.corr[1],
            mscale: y.mscale,
        })
    }

    /// Rounds three runs of values (address, count) to the KV dtype's
    /// precision in one launch.
    pub(super) fn round_to_kv(&mut self, runs: [(u64, usize); 3], dtype: i32) {
        let [(mut a, na), (mut b, nb), (mut c, nc)] = runs;
        let (mut na, mut nb, mut nc, mut dtype) = (na as i64, nb as i64, nc as i64, dtype);
        let values = runs.iter().map(|r| r.1).sum::<usize>();
        let f = self.k.round_to_kv;
        let grid = Self::grid_for(values, 256);
        self.launch(f, (grid, 1, 1), 256, &mut args![a, na, b, nb, c, nc, dtype]);
    }

    pub(super) fn rope(
        &mut self,
        x: Buf,
        step: &Step,
        n_heads: usize,
        head_dim: usize,
        rope: &RopeParams,
    ) {
        assert!(
            head_dim.is_multiple_of(2),
            "rope: head_dim {head_dim} is odd"
        );
        let mut xp = self.buf(x, step.rows * n_heads * head_dim * 4);
        let rotated = Self::rope_rotated(rope, head_dim);
        let mut freqs = self.rope_freqs(rope, rotated);
        let mut yarn = Self::rope_yarn(rope);
        if step.rows == 0 || !self.ready() {
            return;
        }
        let d = self.upload_step(step, None);
        let mut pos = d.row_pos;
        let (mut nh, mut hd, mut theta, mut neox, mut rot) = (
            n_heads as i32,
            head_dim as i32,
            rope.theta as f64,
            rope.neox as i32,
            rotated as i32,
        );
        let f = self.k.rope;
        let threads = (rotated / 2).next_multiple_of(32).min(1024) as u32;
        self.launch(
            f,
            (step.rows as u32, n_heads as u32, 1),
            threads,
            &mut args![xp, pos, nh, hd, theta, neox, freqs, rot, yarn],
        );
    }

    pub(super) fn kv_write(
        &mut self,
        layer: usize,
        step: &Step,
        k: Buf,
        v: Buf,
        shape: &AttentionShape,
    ) {
        let rows = step.rows;
        let kw = shape.n_kv_heads * shape.key_dim;
        let vw = shape.n_kv_heads * shape.value_dim;
        let mut kp = self.buf(k, rows * kw * 4);
        let mut vp = self.buf(v, rows * vw * 4);
        let mut kv = self.kv_desc(layer, shape);
        if rows == 0 || !self.ready() {
            return;
        }
        let group = self.slots[layer].map(|(g, _)| g);
        let mut st = self.upload_step(step, group);
        let pieces = kw.max(vw).div_ceil(256) as u32;
        let (mut kw, mut vw) = (kw as i32, vw as i32);
        let f = self.k.kv_write;
        self.launch(
            f,
            (rows as u32, 2, pieces),
            256,
            &mut args![st, kv, kp, vp, kw, vw],
        );
    }
}

/// A KV dtype as the kernels number it (`KV_*`).
pub(super) fn kv_dtype_id(dtype: KvDtype) -> i32 {
    match dtype {
        KvDtype::F16 => KV_F16,
        KvDtype::Bf16 => KV_BF16,
        KvDtype::F32 => KV_F32,
        KvDtype::Q8_0 => KV_Q8_0,
    }
}
