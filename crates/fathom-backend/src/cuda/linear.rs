//! A hybrid model's linear-attention layers on the GPU (`linear.cu`): the
//! short causal convolution and the gated delta rule, each sequence from
//! its recurrent-state slot, with the CPU backend's numerics
//! (`cpu/linear.rs`, f32 state).
//!
//! The states are the plan's `recurrent_state` term, carved from the one
//! allocation (`DeviceLayout::recurrent`) in the CPU backend's layout: per
//! slot, per linear layer, the convolution's last `conv_kernel - 1` inputs
//! (channel-major, oldest first), then a `head_dim × head_dim` state per
//! value head (row j, the value index, over the key index). Each
//! sequence's slot id lies in the step area (`StepWords::state_slots`), so
//! a decode step replayed as a graph reads this step's slots, and a
//! sequence at position 0 starts from zeros, whatever its slot held.
//!
//! Two launches a layer, whatever the step: `linear_conv` (a block a head
//! of channels and sequence) and `gated_delta_<D>` (a block per 16 state
//! rows of a (value head, sequence)). Each runs a sequence's tokens one
//! after another inside the kernel, so a prefill chunk costs a chain of
//! per-token steps in one launch, parallel over heads and state rows only.

use std::ffi::c_void;

use super::abi::{LIN_HEAD_DIMS, LIN_MAX_TAPS, LIN_ROWS, LIN_WARPS};
use super::CudaBackend;
use crate::{LinearIo, LinearShape, LinearWeights, Step, VectorId};

impl CudaBackend {
    /// Device address of a vector, checked to hold `len` values.
    fn vector(&self, id: VectorId, len: usize, what: &str) -> u64 {
        let (p, l) = self.vectors[id.0 as usize];
        assert!(l >= len, "{what}: {l} values for {len}");
        p
    }

    /// [`crate::Backend::gated_delta_rule`].
    pub(super) fn gated_delta_rule(
        &mut self,
        layer: usize,
        shape: &LinearShape,
        w: &LinearWeights,
        step: &Step,
        states: &[usize],
        io: LinearIo,
    ) {
        let r = self
            .kv
            .recurrent
            .as_ref()
            .expect("a hybrid model's plan has a recurrent_state term");
        let (conv, delta) = (
            r.conv_values_per_layer as usize,
            r.delta_values_per_layer as usize,
        );
        let (layers, slots) = (r.layers as usize, r.sequences as usize);
        let (ch, hd, taps) = (shape.channels(), shape.head_dim, shape.conv_kernel);
        let (kh, vh) = (shape.key_heads, shape.value_heads);
        assert!(
            (1..=LIN_MAX_TAPS).contains(&taps),
            "gated_delta_rule: {taps} convolution taps (1 to {LIN_MAX_TAPS} run on CUDA)"
        );
        let kernel = LIN_HEAD_DIMS
            .iter()
            .position(|&d| d == hd)
            .unwrap_or_else(|| {
                panic!("gated_delta_rule: head dim {hd} (CUDA runs {LIN_HEAD_DIMS:?})")
            });
        assert!(
            conv == (taps - 1) * ch && delta == vh * hd * hd && layer < layers && kh > 0,
            "the layer's shape matches the planned states"
        );
        assert_eq!(step.seqs.len(), states.len(), "one state slot per sequence");
        for (i, &slot) in states.iter().enumerate() {
            assert!(slot < slots, "state slot {slot} of {slots}");
            assert!(!states[..i].contains(&slot), "two sequences in slot {slot}");
        }
        let rows = step.rows;
        let mut qkv = self.buf(io.qkv, rows * ch * 4);
        let mut alpha = self.buf(io.alpha, rows * vh * 4);
        let mut beta = self.buf(io.beta, rows * vh * 4);
        let mut out = self.buf(io.out, rows * vh * hd * 4);
        let mut conv_w = self.vector(w.conv, ch * taps, "convolution taps");
        let mut dt_bias = self.vector(w.dt_bias, vh, "dt_bias");
        let mut decay = self.vector(w.decay, vh, "decay");
        let mut base = self.recurrent;
        if rows == 0 || !self.ready() {
            return;
        }
        let mut st = self.upload_step(step, None);
        let words: Vec<u32> = states.iter().map(|&s| s as u32).collect();
        let mut slot_ids = self.stage_slots(&words);
        let mut slot_values = (layers * (conv + delta)) as i64;
        let mut conv_off = (layer * (conv + delta)) as i64;
        let mut delta_off = conv_off + conv as i64;
        let (mut channels, mut taps, mut qk_heads) = (ch as i32, taps as i32, 2 * kh as i32);
        let (mut eps, mut n_rows) = (shape.eps, rows as i32);
        let n_seqs = step.seqs.len() as u32;
        let f = self.k.linear_conv;
        self.launch(
            f,
            ((ch / hd) as u32, n_seqs, 1),
            hd as u32,
            &mut args![
                st,
                qkv,
                conv_w,
                base,
                slot_ids,
                slot_values,
                conv_off,
                channels,
                taps,
                qk_heads,
                eps,
                n_rows
            ],
        );
        let (mut key_heads, mut value_heads) = (kh as i32, vh as i32);
        let mut key_stride = shape.key_head_stride() as i32;
        let f = self.k.gated_delta[kernel];
        self.launch(
            f,
            (hd.div_ceil(LIN_WARPS * LIN_ROWS) as u32, vh as u32, n_seqs),
            (LIN_WARPS * 32) as u32,
            &mut args![
                st,
                qkv,
                alpha,
                beta,
                dt_bias,
                decay,
                base,
                slot_ids,
                slot_values,
                delta_off,
                key_heads,
                key_stride,
                value_heads,
                n_rows,
                out
            ],
        );
    }
}
