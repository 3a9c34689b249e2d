//! A hybrid model's linear-attention layers on the CPU: the short causal
//! convolution and the gated delta rule, token by token in each
//! sequence's state slot.
//!
//! The states live in one allocation sized by the plan's
//! `recurrent_state` term: per slot, per linear layer, the convolution's
//! last `conv_kernel - 1` inputs (channel-major: each channel's taps
//! together, oldest first) and then one `head_dim × head_dim` state per
//! value head (row j, the value index, over the key index).

use fathom_kernels::{ops, Pool};
use fathom_plan::recurrent::RecurrentPlan;

use super::attention::SharedOut;
use crate::{LinearShape, StepSeq};

/// Every slot's states, allocated once.
pub(super) struct RecurrentStore {
    states: Vec<f32>,
    conv: usize,
    delta: usize,
    /// Values of one slot: every layer's two states.
    per_slot: usize,
}

impl RecurrentStore {
    pub(super) fn new(plan: &RecurrentPlan) -> Self {
        let (conv, delta) = (
            plan.conv_values_per_layer as usize,
            plan.delta_values_per_layer as usize,
        );
        let per_slot = plan.layers as usize * (conv + delta);
        RecurrentStore {
            states: vec![0.0; per_slot * plan.sequences as usize],
            conv,
            delta,
            per_slot,
        }
    }

    pub(super) fn bytes(&self) -> usize {
        self.states.len() * 4
    }

    /// Layer `layer`'s (convolution, delta) states in `slot`.
    fn layer(&mut self, slot: usize, layer: usize) -> (&mut [f32], &mut [f32]) {
        let start = slot * self.per_slot + layer * (self.conv + self.delta);
        self.states[start..start + self.conv + self.delta].split_at_mut(self.conv)
    }
}

/// The small weights of one layer, as f32.
pub(super) struct Weights<'a> {
    pub conv: &'a [f32],
    pub dt_bias: &'a [f32],
    pub decay: &'a [f32],
}

/// The rows of one layer's step.
pub(super) struct Rows<'a> {
    pub qkv: &'a mut [f32],
    pub alpha: &'a [f32],
    pub beta: &'a [f32],
    pub out: &'a mut [f32],
}

/// ggml's softplus: `ln(1 + eˣ)`, `x` itself past 20 where that is exact
/// in f32.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Runs layer `layer` for the step's sequences (`states[i]` is sequence
/// i's slot), as [`crate::Backend::gated_delta_rule`] describes: first the
/// convolution token by token (cheap, and each token needs the inputs
/// before it), then the delta rule with one work item per (sequence,
/// value head), whose state and output columns no other item touches.
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    pool: &Pool,
    store: &mut RecurrentStore,
    layer: usize,
    shape: &LinearShape,
    w: &Weights,
    seqs: &[StepSeq],
    states: &[usize],
    rows: Rows,
) {
    assert_eq!(seqs.len(), states.len(), "one state slot per sequence");
    let (ch, hd) = (shape.channels(), shape.head_dim);
    let (kh, vh) = (shape.key_heads, shape.value_heads);
    let taps = shape.conv_kernel;
    assert!(
        taps >= 1 && store.conv == (taps - 1) * ch && store.delta == vh * hd * hd,
        "the layer's shape matches the planned states"
    );
    let slots = store.states.len() / store.per_slot.max(1);
    for (i, &slot) in states.iter().enumerate() {
        assert!(slot < slots, "state slot {slot} of {slots}");
        assert!(!states[..i].contains(&slot), "two sequences in slot {slot}");
    }
    let mut row = 0;
    for (seq, &slot) in seqs.iter().zip(states) {
        let (conv_state, delta_state) = store.layer(slot, layer);
        if seq.start == 0 {
            conv_state.fill(0.0);
            delta_state.fill(0.0);
        }
        for t in row..row + seq.tokens {
            let x = &mut rows.qkv[t * ch..(t + 1) * ch];
            convolve(conv_state, x, w.conv, taps);
            for head in x[..2 * kh * hd].chunks_exact_mut(hd) {
                unit_length(head, shape.eps);
            }
        }
        row += seq.tokens;
    }
    let qkv: &[f32] = rows.qkv;
    let (alpha, beta) = (rows.alpha, rows.beta);
    let inner = vh * hd;
    assert!(
        rows.out.len() >= row * inner,
        "the output holds the step's rows"
    );
    let out = SharedOut(rows.out.as_mut_ptr());
    let layer_start = layer * (store.conv + store.delta) + store.conv;
    let (per_slot, state_len) = (store.per_slot, store.states.len());
    let state = SharedOut(store.states.as_mut_ptr());
    let scale = 1.0 / (hd as f32).sqrt();
    let items = seqs.len() * vh;
    pool.run(&|worker, workers| {
        for item in (worker..items).step_by(workers) {
            let (i, h) = (item / vh, item % vh);
            let first_row: usize = seqs[..i].iter().map(|s| s.tokens).sum();
            let at = states[i] * per_slot + layer_start + h * hd * hd;
            assert!(at + hd * hd <= state_len);
            // SAFETY: in bounds by the assertion; (slot, head) is this
            // item's alone (the slots differ, checked above), so no other
            // worker reads or writes these values.
            let s = unsafe { std::slice::from_raw_parts_mut(state.ptr().add(at), hd * hd) };
            let src = shape.key_head(h);
            for t in first_row..first_row + seqs[i].tokens {
                let x = &qkv[t * ch..(t + 1) * ch];
                let q = &x[src * hd..(src + 1) * hd];
                let k = &x[(kh + src) * hd..(kh + src + 1) * hd];
                let v = &x[(2 * kh + h) * hd..(2 * kh + h + 1) * hd];
                let g = w.decay[h] * softplus(alpha[t * vh + h] + w.dt_bias[h]);
                // SAFETY: row t's columns of head h, inside the output
                // (asserted above) and written by this item only.
                let o = unsafe {
                    std::slice::from_raw_parts_mut(out.ptr().add(t * inner + h * hd), hd)
                };
                let b = sigmoid(beta[t * vh + h]);
                delta_step(s, [q, k], v, (g.exp(), b, scale), o);
            }
        }
    });
}

/// One token through the causal convolution: each channel's output is its
/// taps over the last `taps - 1` inputs and this one, SiLU'd into `x`; the
/// state moves on by this input.
fn convolve(state: &mut [f32], x: &mut [f32], conv: &[f32], taps: usize) {
    let past = taps - 1;
    for (c, value) in x.iter_mut().enumerate() {
        let w = &conv[c * taps..(c + 1) * taps];
        let s = &mut state[c * past..(c + 1) * past];
        // Oldest first, as ggml sums.
        let mut y = 0.0;
        for i in 0..past {
            y += s[i] * w[i];
        }
        y += *value * w[past];
        if past > 0 {
            s.copy_within(1.., 0);
            s[past - 1] = *value;
        }
        *value = y * sigmoid(y);
    }
}

/// `x / √(Σx² + eps)`: llama.cpp's L2 norm of q and k heads.
fn unit_length(x: &mut [f32], eps: f32) {
    let ss = ops::dot_f32(x, x);
    ops::scale(x, 1.0 / (ss + eps).sqrt());
}

/// The gated delta rule for one value head and one token: decay the state
/// by `e^g`, move each row j (value j) towards `v[j]` along `k` by
/// `beta`, and read it with `q`.
fn delta_step(
    state: &mut [f32],
    [q, k]: [&[f32]; 2],
    v: &[f32],
    (decay, beta, scale): (f32, f32, f32),
    out: &mut [f32],
) {
    let hd = v.len();
    for (j, row) in state.chunks_exact_mut(hd).enumerate() {
        ops::scale(row, decay);
        let delta = (v[j] - ops::dot_f32(row, k)) * beta;
        ops::axpy(row, delta, k);
        out[j] = ops::dot_f32(row, q) * scale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule against its definition in whole matrices: S' = e^g S +
    /// β (v − e^g S k) kᵀ, o = S' q.
    #[test]
    fn delta_step_matches_the_matrix_form() {
        let hd = 3;
        let s0: Vec<f32> = (0..9).map(|i| (i as f32 * 0.37).sin()).collect();
        let (q, k, v) = ([0.2, -0.5, 0.3], [0.6, 0.0, -0.8], [1.0, 2.0, -1.0]);
        let (g, beta) = (-0.3f32, 0.7f32);
        let mut s = s0.clone();
        let mut out = [0.0; 3];
        delta_step(&mut s, [&q, &k], &v, (g.exp(), beta, 1.0), &mut out);
        for j in 0..hd {
            let decayed: Vec<f32> = (0..hd).map(|i| g.exp() * s0[j * hd + i]).collect();
            let sk: f32 = (0..hd).map(|i| decayed[i] * k[i]).sum();
            let row: Vec<f32> = (0..hd)
                .map(|i| decayed[i] + beta * (v[j] - sk) * k[i])
                .collect();
            for i in 0..hd {
                assert!((s[j * hd + i] - row[i]).abs() < 1e-6);
            }
            let o: f32 = (0..hd).map(|i| row[i] * q[i]).sum();
            assert!((out[j] - o).abs() < 1e-6, "{j}: {} vs {o}", out[j]);
        }
    }

    /// Three tokens through a 3-tap convolution in one channel: the state
    /// carries the last two inputs, starting from zeros.
    #[test]
    fn convolution_carries_the_last_inputs() {
        let w = [0.5, -1.0, 2.0];
        let mut state = [0.0, 0.0];
        let silu = |y: f32| y / (1.0 + (-y).exp());
        let mut outs = Vec::new();
        for input in [1.0f32, 3.0, -2.0] {
            let mut x = [input];
            convolve(&mut state, &mut x, &w, 3);
            outs.push(x[0]);
        }
        assert_eq!(state, [3.0, -2.0]);
        let want = [silu(2.0), silu(-1.0 + 6.0), silu(0.5 - 3.0 - 4.0)];
        for (o, w) in outs.iter().zip(want) {
            assert!((o - w).abs() < 1e-6, "{o} vs {w}");
        }
    }
}
