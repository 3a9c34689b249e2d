//! Norms, elementwise ops and rope.

use super::*;

pub(crate) fn rms_ref(x: &[f32], w: &[f32], eps: f32) -> Vec<f64> {
    let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
    let inv = 1.0 / (ss / x.len() as f64 + eps as f64).sqrt();
    x.iter()
        .zip(w)
        .map(|(&v, &w)| v as f64 * inv * w as f64)
        .collect()
}

pub(crate) fn test_elementwise(h: &mut Harness, rng: &mut Rng) {
    // rms_norm: SmolLM2 and Llama widths.
    for (rows, width) in [(5, 576), (3, 4096)] {
        let x = uniform(rng, rows * width);
        let w = uniform(rng, width);
        let wid = h.b.load_vector(&w).expect("loads");
        h.set(Buf::Residual, &x, width);
        h.b.rms_norm(Buf::Residual, wid, 1e-5, rows, width, Buf::Norm);
        let got = h.get(Buf::Norm, rows, width);
        let want: Vec<f64> = x.chunks(width).flat_map(|r| rms_ref(r, &w, 1e-5)).collect();
        h.check(
            "rms_norm",
            &format!("{rows}x{width}"),
            &got,
            &want,
            TOL_EXACT,
        );
    }
    // add_rms_norm: the residual add and the next norm (Norm is also the
    // branch, as after a post-norm).
    for (rows, width, branch) in [(5, 576, Buf::BranchOut), (3, 4096, Buf::Norm)] {
        let (a, b, w) = (
            uniform(rng, rows * width),
            uniform(rng, rows * width),
            uniform(rng, width),
        );
        let wid = h.b.load_vector(&w).expect("loads");
        h.set(Buf::Residual, &a, width);
        h.set(branch, &b, width);
        h.b.add_rms_norm(Buf::Residual, branch, wid, 1e-5, rows, width, Buf::Norm);
        let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        let got = h.get(Buf::Norm, rows, width);
        let want: Vec<f64> = sum
            .chunks(width)
            .flat_map(|r| rms_ref(r, &w, 1e-5))
            .collect();
        let case = format!("{rows}x{width} {}", branch.name());
        h.check("add_rms_norm", &case, &got, &want, TOL_EXACT);
        let got = h.get(Buf::Residual, rows, width);
        let want: Vec<f64> = sum.iter().map(|&v| v as f64).collect();
        h.check("add_rms_norm sum", &case, &got, &want, TOL_EXACT);
    }
    // head_norm: Qwen3 q (32 heads x 128).
    {
        let (rows, width, hd) = (4, 4096, 128);
        let x = uniform(rng, rows * width);
        let w = uniform(rng, hd);
        let wid = h.b.load_vector(&w).expect("loads");
        h.set(Buf::Q, &x, width);
        h.b.head_norm(Buf::Q, wid, 1e-6, rows, width, hd);
        let got = h.get(Buf::Q, rows, width);
        let want: Vec<f64> = x.chunks(hd).flat_map(|r| rms_ref(r, &w, 1e-6)).collect();
        h.check("head_norm", "4x(32x128)", &got, &want, TOL_EXACT);
    }
    let (rows, width) = (7, 1536);
    // add_bias
    {
        let x = uniform(rng, rows * width);
        let b = uniform(rng, width);
        let bid = h.b.load_vector(&b).expect("loads");
        h.set(Buf::Q, &x, width);
        h.b.add_bias(Buf::Q, bid, rows, width);
        let got = h.get(Buf::Q, rows, width);
        let want: Vec<f64> = x
            .iter()
            .enumerate()
            .map(|(i, &v)| v as f64 + b[i % width] as f64)
            .collect();
        h.check("add_bias", "7x1536", &got, &want, TOL_EXACT);
    }
    // add
    {
        let a = uniform(rng, rows * width);
        let b = uniform(rng, rows * width);
        h.set(Buf::Residual, &a, width);
        h.set(Buf::BranchOut, &b, width);
        h.b.add(Buf::Residual, Buf::BranchOut, rows, width);
        let got = h.get(Buf::Residual, rows, width);
        let want: Vec<f64> = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| x as f64 + y as f64)
            .collect();
        h.check("add", "7x1536", &got, &want, TOL_EXACT);
    }
    // glu, both activations
    for (act, name) in [(Glu::Silu, "silu"), (Glu::GeluTanh, "gelu_tanh")] {
        let g: Vec<f32> = uniform(rng, rows * width).iter().map(|v| v * 6.0).collect();
        let u = uniform(rng, rows * width);
        h.set(Buf::FfnGate, &g, width);
        h.set(Buf::FfnUp, &u, width);
        h.b.glu(Buf::FfnGate, Buf::FfnUp, rows, width, act);
        let got = h.get(Buf::FfnGate, rows, width);
        let want: Vec<f64> = g
            .iter()
            .zip(&u)
            .map(|(&g, &u)| glu_ref(g as f64, u as f64, act))
            .collect();
        h.check("glu", &format!("{name} 7x1536"), &got, &want, TOL_EXACT);
    }
    // zero
    {
        let x = uniform(rng, rows * width);
        h.set(Buf::BranchOut, &x, width);
        h.b.zero(Buf::BranchOut, rows, width);
        let got = h.get(Buf::BranchOut, rows, width);
        h.check("zero", "7x1536", &got, &vec![0.0; rows * width], TOL_EXACT);
    }
    // gather_rows
    {
        let w = 576;
        let x = uniform(rng, 10 * w);
        let idx = [3usize, 0, 9, 3, 7];
        h.set(Buf::Residual, &x, w);
        h.b.gather_rows(Buf::Residual, &idx, w, Buf::Norm);
        let got = h.get(Buf::Norm, idx.len(), w);
        let want: Vec<f64> = idx
            .iter()
            .flat_map(|&r| x[r * w..(r + 1) * w].iter().map(|&v| v as f64))
            .collect();
        h.check("gather_rows", "5 of 10x576", &got, &want, TOL_EXACT);
    }
}

/// The ops a backend that [`Backend::runs_scaled_rows`] adds (Gemma 4):
/// values normed per head without a weight (gemma-4-31B's sliding heads of
/// 256 and global heads of 512), a layer's output scale over rows of its
/// hidden width, and the logit softcap (cap 30) over values well into
/// tanh's flat ends.
pub(crate) fn test_scaled_rows(h: &mut Harness, rng: &mut Rng) {
    if !h.b.runs_scaled_rows() {
        println!("{}: no scaled-row ops; skipped", h.b.name());
        return;
    }
    for (rows, heads, hd) in [(3, 16, 256), (5, 4, 512)] {
        let width = heads * hd;
        let x = uniform(rng, rows * width);
        h.set(Buf::V, &x, width);
        h.b.head_norm_unweighted(Buf::V, 1e-6, rows, width, hd);
        let got = h.get(Buf::V, rows, width);
        let ones = vec![1f32; hd];
        let want: Vec<f64> = x.chunks(hd).flat_map(|r| rms_ref(r, &ones, 1e-6)).collect();
        let case = format!("{rows}x({heads}x{hd})");
        h.check("head_norm_unweighted", &case, &got, &want, TOL_EXACT);
    }
    {
        let (rows, width, factor) = (5, 5376, 0.37f32);
        let x = uniform(rng, rows * width);
        h.set(Buf::Residual, &x, width);
        h.b.scale(Buf::Residual, factor, rows, width);
        let got = h.get(Buf::Residual, rows, width);
        let want: Vec<f64> = x.iter().map(|&v| v as f64 * factor as f64).collect();
        h.check("scale", "5x5376", &got, &want, TOL_EXACT);
    }
    {
        let (rows, width, cap) = (3, 8192, 30f32);
        let x: Vec<f32> = uniform(rng, rows * width)
            .iter()
            .map(|v| v * 100.0)
            .collect();
        h.set(Buf::Logits, &x, width);
        h.b.softcap(Buf::Logits, cap, rows, width);
        let got = h.get(Buf::Logits, rows, width);
        let want: Vec<f64> = x
            .iter()
            .map(|&v| cap as f64 * (v as f64 / cap as f64).tanh())
            .collect();
        h.check("softcap", "3x8192 cap 30", &got, &want, TOL_EXACT);
    }
}

pub(crate) fn rope_ref(
    x: &[f32],
    heads: usize,
    hd: usize,
    pos: usize,
    theta: f32,
    neox: bool,
    freqs: Option<&[f32]>,
) -> Vec<f64> {
    let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let half = hd / 2;
    for i in 0..half {
        let mut freq = (theta as f64).powf(-2.0 * i as f64 / hd as f64);
        if let Some(f) = freqs {
            freq /= f[i] as f64;
        }
        let (s, c) = (pos as f64 * freq).sin_cos();
        for h in 0..heads {
            let (a, b) = if neox {
                (i, i + half)
            } else {
                (2 * i, 2 * i + 1)
            };
            let (x0, x1) = (x[h * hd + a] as f64, x[h * hd + b] as f64);
            out[h * hd + a] = x0 * c - x1 * s;
            out[h * hd + b] = x0 * s + x1 * c;
        }
    }
    out
}

/// [`rope_ref`] of the first `rotated` values of each `hd`-value head of
/// `x`, the rest passed through (partial rope; `rotated == hd` is the
/// whole head).
pub(crate) fn rope_partial_ref(
    x: &[f32],
    hd: usize,
    rotated: usize,
    pos: usize,
    theta: f32,
    neox: bool,
    freqs: Option<&[f32]>,
) -> Vec<f64> {
    x.chunks(hd)
        .flat_map(|head| {
            let mut out = rope_ref(&head[..rotated], 1, rotated, pos, theta, neox, freqs);
            out.extend(head[rotated..].iter().map(|&v| v as f64));
            out
        })
        .collect()
}

pub(crate) fn test_rope(h: &mut Harness, rng: &mut Rng) {
    let tables: Vec<Vec<u32>> = Vec::new();
    let seqs = [
        StepSeq {
            start: 0,
            tokens: 3,
            tables: &tables,
        },
        StepSeq {
            start: 40_000,
            tokens: 2,
            tables: &tables,
        },
        StepSeq {
            start: 17,
            tokens: 1,
            tables: &tables,
        },
    ];
    let step = Step {
        seqs: &seqs,
        rows: 6,
    };
    let positions: Vec<usize> = step.positions().collect();
    let factors: Vec<f32> = (0..256).map(|i| 1.0 + (i % 7) as f32).collect();
    let fid = h.b.load_vector(&factors).expect("loads");
    for (label, heads, hd, theta, neox, freqs, rotated) in [
        ("SmolLM2 9x64 normal", 9, 64, 100_000.0, false, None, None),
        ("Qwen 16x128 neox", 16, 128, 1_000_000.0, true, None, None),
        (
            "Llama3 32x128 freqs",
            32,
            128,
            500_000.0,
            false,
            Some(fid),
            None,
        ),
        // Qwen3.5: a quarter of each head rotates.
        (
            "Qwen3.5 16x256 partial 64",
            16,
            256,
            1e7,
            true,
            None,
            Some(64),
        ),
        (
            "Gemma4 global 16x512",
            16,
            512,
            1_000_000.0,
            true,
            Some(fid),
            None,
        ),
    ] {
        let width = heads * hd;
        let x = uniform(rng, step.rows * width);
        h.set(Buf::Q, &x, width);
        h.b.rope(
            Buf::Q,
            &step,
            heads,
            hd,
            &RopeParams {
                theta,
                neox,
                freqs,
                rotated,
                yarn: None,
            },
        );
        let got = h.get(Buf::Q, step.rows, width);
        let f = freqs.map(|_| &factors[..]);
        let rot = rotated.unwrap_or(hd);
        let want: Vec<f64> = x
            .chunks(width)
            .zip(&positions)
            .flat_map(|(r, &p)| rope_partial_ref(r, hd, rot, p, theta, neox, f))
            .collect();
        h.check("rope", label, &got, &want, TOL_ROPE);
    }
}
