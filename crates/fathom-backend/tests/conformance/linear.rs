//! Hybrid models' ops (Qwen3.5): the gated delta rule with its causal
//! convolution, state carried across steps in each sequence's slot, and
//! the gates of attention and the shared expert.

use super::*;

use fathom_backend::{LinearIo, LinearShape, LinearWeights, ValueOrder};
use fathom_plan::recurrent::RecurrentPlan;

/// The gated delta rule's buffers, as the forward pass passes them.
const LINEAR_IO: LinearIo = LinearIo {
    qkv: Buf::Q,
    alpha: Buf::K,
    beta: Buf::V,
    out: Buf::AttnOut,
};

/// Linear layers of a case: the steps run each with its own inputs.
const LAYERS: usize = 2;
/// State slots planned: three sequences at once.
const SLOTS: usize = 3;

/// Writes `data` packed into `buf` whatever its row width (a narrow one,
/// such as a value per head or per row): as rows of 8, zero-padded.
fn set_packed(h: &mut Harness, buf: Buf, data: &[f32]) {
    let mut d = data.to_vec();
    d.resize(data.len().next_multiple_of(EYE), 0.0);
    h.set(buf, &d, EYE);
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The shapes: Qwen3.5-4B's linear layers (16 key and 32 value heads of
/// 128, 4 taps) in llama.cpp's tiled value order and in HF's grouped one,
/// and the tiny fixture's (2 and 4 heads of 32).
pub(crate) fn linear_cases() -> Vec<(&'static str, LinearShape)> {
    let q35 = LinearShape {
        key_heads: 16,
        value_heads: 32,
        head_dim: 128,
        conv_kernel: 4,
        eps: 1e-6,
        value_order: ValueOrder::Tiled,
    };
    let grouped = LinearShape {
        value_order: ValueOrder::Grouped,
        ..q35
    };
    let tiny = LinearShape {
        key_heads: 2,
        value_heads: 4,
        head_dim: 32,
        ..q35
    };
    vec![
        ("Qwen3.5-4B 16/32x128", q35),
        ("Qwen3.5-4B 16/32x128 grouped (HF)", grouped),
        ("tiny 2/4x32", tiny),
    ]
}

/// A KV layout whose plan holds `SLOTS` slots of `LAYERS` linear layers of
/// `shape` (and one small attention group beside them).
pub(crate) fn linear_kv(shape: &LinearShape) -> KvLayout {
    let conv = ((shape.conv_kernel - 1) * shape.channels()) as u64;
    let delta = (shape.value_heads * shape.head_dim * shape.head_dim) as u64;
    let per_sequence = LAYERS as u64 * (conv + delta) * 4;
    KvLayout {
        recurrent: Some(RecurrentPlan {
            layers: LAYERS as u64,
            dtype: "f32",
            conv_values_per_layer: conv,
            delta_values_per_layer: delta,
            bytes_per_sequence: per_sequence,
            sequences: SLOTS as u64,
            bytes: per_sequence * SLOTS as u64,
        }),
        ..small_kv()
    }
}

/// One sequence's states in one layer, as the reference keeps them (f64).
#[derive(Clone)]
struct State {
    /// Per channel its last `taps - 1` inputs, oldest first.
    conv: Vec<Vec<f64>>,
    /// Per value head, row j (value) over i (key).
    delta: Vec<Vec<f64>>,
}

impl State {
    fn zero(s: &LinearShape) -> State {
        State {
            conv: vec![vec![0.0; s.conv_kernel - 1]; s.channels()],
            delta: vec![vec![0.0; s.head_dim * s.head_dim]; s.value_heads],
        }
    }
}

struct LayerWeights {
    conv: Vec<f32>,
    dt_bias: Vec<f32>,
    decay: Vec<f32>,
}

/// The reference of one sequence's tokens (`qkv`, `alpha`, `beta` rows of
/// this sequence): the convolved qkv rows and the outputs.
fn delta_rule_ref(
    s: &LinearShape,
    w: &LayerWeights,
    state: &mut State,
    qkv: &[f32],
    alpha: &[f32],
    beta: &[f32],
) -> (Vec<f64>, Vec<f64>) {
    let (ch, hd, kh, vh, taps) = (
        s.channels(),
        s.head_dim,
        s.key_heads,
        s.value_heads,
        s.conv_kernel,
    );
    let tokens = qkv.len() / ch;
    let (mut conv_out, mut out) = (Vec::new(), Vec::new());
    for t in 0..tokens {
        let mut y: Vec<f64> = (0..ch)
            .map(|c| {
                let x = qkv[t * ch + c] as f64;
                let taps_w = &w.conv[c * taps..(c + 1) * taps];
                let past = &mut state.conv[c];
                let mut v: f64 = past.iter().zip(taps_w).map(|(&p, &w)| p * w as f64).sum();
                v += x * taps_w[taps - 1] as f64;
                if !past.is_empty() {
                    past.remove(0);
                    past.push(x);
                }
                v * sigmoid(v)
            })
            .collect();
        for head in y[..2 * kh * hd].chunks_mut(hd) {
            let ss: f64 = head.iter().map(|v| v * v).sum();
            let inv = 1.0 / (ss + s.eps as f64).sqrt();
            head.iter_mut().for_each(|v| *v *= inv);
        }
        for h in 0..vh {
            let src = match s.value_order {
                ValueOrder::Tiled => h % kh,
                ValueOrder::Grouped => h / (vh / kh),
            };
            let q = &y[src * hd..(src + 1) * hd];
            let k = &y[(kh + src) * hd..(kh + src + 1) * hd];
            let v = &y[(2 * kh + h) * hd..(2 * kh + h + 1) * hd];
            let x = alpha[t * vh + h] as f64 + w.dt_bias[h] as f64;
            let softplus = if x > 20.0 { x } else { x.exp().ln_1p() };
            let decay = (w.decay[h] as f64 * softplus).exp();
            let b = sigmoid(beta[t * vh + h] as f64);
            let st = &mut state.delta[h];
            for j in 0..hd {
                let row = &mut st[j * hd..(j + 1) * hd];
                row.iter_mut().for_each(|r| *r *= decay);
                let sk: f64 = row.iter().zip(k).map(|(r, k)| r * k).sum();
                let delta = (v[j] - sk) * b;
                row.iter_mut().zip(k).for_each(|(r, k)| *r += delta * k);
                let sq: f64 = row.iter().zip(q).map(|(r, q)| r * q).sum();
                out.push(sq / (hd as f64).sqrt());
            }
        }
        conv_out.extend(y);
    }
    (conv_out, out)
}

/// Four steps of three sequences (slots 2, 0, 1) over two linear layers:
/// a prefill and a one-token start, a chunk continuing both beside a third
/// sequence's prefill, a decode step of all three, then the third sequence
/// begun again at position 0 in its used slot (it must start from zeros)
/// beside a decode row. Per step and layer, the convolved qkv and the
/// output against the f64 reference.
pub(crate) fn test_gated_delta_rule(h: &mut Harness, rng: &mut Rng, label: &str, s: LinearShape) {
    let (ch, vh, hd, taps) = (s.channels(), s.value_heads, s.head_dim, s.conv_kernel);
    let weights: Vec<(LayerWeights, LinearWeights)> = (0..LAYERS)
        .map(|_| {
            let lw = LayerWeights {
                conv: uniform(rng, ch * taps),
                dt_bias: uniform(rng, vh),
                // −exp(A_log): negative decay rates.
                decay: uniform(rng, vh).iter().map(|a| -a.exp()).collect(),
            };
            let ids = LinearWeights {
                conv: h.b.load_vector(&lw.conv).expect("loads"),
                dt_bias: h.b.load_vector(&lw.dt_bias).expect("loads"),
                decay: h.b.load_vector(&lw.decay).expect("loads"),
            };
            (lw, ids)
        })
        .collect();
    let slots = [2usize, 0, 1];
    let mut states = vec![vec![State::zero(&s); 3]; LAYERS];
    // Per step, per sequence in it: (sequence, start, tokens).
    let steps: [&[(usize, usize, usize)]; 4] = [
        &[(0, 0, 5), (1, 0, 1)],
        &[(0, 5, 3), (1, 1, 7), (2, 0, 4)],
        &[(0, 8, 1), (1, 8, 1), (2, 4, 1)],
        &[(2, 0, 2), (0, 9, 1)],
    ];
    let tables: Vec<Vec<u32>> = Vec::new();
    for (si, step_rows) in steps.iter().enumerate() {
        let seqs: Vec<StepSeq> = step_rows
            .iter()
            .map(|&(_, start, tokens)| StepSeq {
                start,
                tokens,
                tables: &tables,
            })
            .collect();
        let rows: usize = step_rows.iter().map(|r| r.2).sum();
        let step = Step { seqs: &seqs, rows };
        let step_slots: Vec<usize> = step_rows.iter().map(|r| slots[r.0]).collect();
        for (layer, (lw, ids)) in weights.iter().enumerate() {
            let qkv: Vec<f32> = uniform(rng, rows * ch).iter().map(|v| v * 2.0).collect();
            let alpha = uniform(rng, rows * vh);
            let beta: Vec<f32> = uniform(rng, rows * vh).iter().map(|v| v * 3.0).collect();
            h.set(Buf::Q, &qkv, ch);
            set_packed(h, Buf::K, &alpha);
            set_packed(h, Buf::V, &beta);
            h.b.gated_delta_rule(layer, &s, ids, &step, &step_slots, LINEAR_IO);
            let (mut want_qkv, mut want_out) = (Vec::new(), Vec::new());
            let mut row = 0;
            for &(seq, start, tokens) in step_rows.iter() {
                if start == 0 {
                    states[layer][seq] = State::zero(&s);
                }
                let r = row..row + tokens;
                let (c, o) = delta_rule_ref(
                    &s,
                    lw,
                    &mut states[layer][seq],
                    &qkv[r.start * ch..r.end * ch],
                    &alpha[r.start * vh..r.end * vh],
                    &beta[r.start * vh..r.end * vh],
                );
                want_qkv.extend(c);
                want_out.extend(o);
                row += tokens;
            }
            let case = format!("{label} L{layer} step{si}");
            let got = h.get(Buf::AttnOut, rows, vh * hd);
            h.check("gated_delta_rule", &case, &got, &want_out, TOL_LINEAR);
            let got = h.get(Buf::Q, rows, ch);
            h.check("gated_delta conv", &case, &got, &want_qkv, TOL_LINEAR);
        }
    }
}

/// `split_heads` (Qwen3.5's gated q projection: 16 heads of 256 with their
/// gates), `sigmoid_gate` over its output and `add_gated_rows` (the shared
/// expert's gate, one a row).
pub(crate) fn test_gates(h: &mut Harness, rng: &mut Rng) {
    let (rows, heads, hd) = (3, 16, 256);
    let width = heads * hd;
    let x = uniform(rng, rows * 2 * width);
    h.set(Buf::FfnGate, &x, 2 * width);
    h.b.split_heads(Buf::FfnGate, rows, heads, hd, Buf::Q, Buf::FfnUp);
    let pieces = || x.chunks(2 * hd);
    let want_a: Vec<f64> = pieces()
        .flat_map(|p| p[..hd].iter().map(|&v| v as f64))
        .collect();
    let want_b: Vec<f64> = pieces()
        .flat_map(|p| p[hd..].iter().map(|&v| v as f64))
        .collect();
    let got = h.get(Buf::Q, rows, width);
    h.check("split_heads q", "3x16x(2x256)", &got, &want_a, TOL_EXACT);
    let got = h.get(Buf::FfnUp, rows, width);
    h.check("split_heads gate", "3x16x(2x256)", &got, &want_b, TOL_EXACT);

    let g: Vec<f32> = uniform(rng, rows * width).iter().map(|v| v * 6.0).collect();
    let o = uniform(rng, rows * width);
    h.set(Buf::FfnUp, &g, width);
    h.set(Buf::AttnOut, &o, width);
    h.b.sigmoid_gate(Buf::FfnUp, Buf::AttnOut, rows, width);
    let want: Vec<f64> = g
        .iter()
        .zip(&o)
        .map(|(&g, &o)| sigmoid(g as f64) * o as f64)
        .collect();
    let got = h.get(Buf::FfnUp, rows, width);
    h.check("sigmoid_gate", "3x4096", &got, &want, TOL_EXACT);

    let (rows, width) = (5, 2048);
    let (dst, src) = (uniform(rng, rows * width), uniform(rng, rows * width));
    let gate: Vec<f32> = uniform(rng, rows).iter().map(|v| v * 6.0).collect();
    h.set(Buf::BranchOut, &dst, width);
    h.set(Buf::MoeOut, &src, width);
    set_packed(h, Buf::RouterLogits, &gate);
    h.b.add_gated_rows(Buf::BranchOut, Buf::MoeOut, Buf::RouterLogits, rows, width);
    let want: Vec<f64> = (0..rows * width)
        .map(|i| dst[i] as f64 + sigmoid(gate[i / width] as f64) * src[i] as f64)
        .collect();
    let got = h.get(Buf::BranchOut, rows, width);
    h.check("add_gated_rows", "5x2048", &got, &want, TOL_EXACT);
}
