//! Embedding, matrix products (one token, prefill, fused GLU, many at once) against f64 references.

use super::*;

pub(crate) fn test_embed(h: &mut Harness, rng: &mut Rng) {
    let (vocab, d) = (64, 2048);
    for kind in all_kinds() {
        let (m, values) = random_matrix(rng, kind, vocab, d);
        let id = h.b.load_matrix(m).expect("loads");
        let tokens: Vec<u32> = (0..7).map(|_| rng.below(vocab) as u32).collect();
        h.b.embed(id, &tokens, 1.25, Buf::Residual);
        let got = h.get(Buf::Residual, tokens.len(), d);
        let want: Vec<f64> = tokens
            .iter()
            .flat_map(|&t| {
                values[t as usize * d..(t as usize + 1) * d]
                    .iter()
                    .map(|&v| v as f64 * 1.25)
            })
            .collect();
        h.check(
            "embed",
            &format!("{} 64x2048 x7", kind_name(kind)),
            &got,
            &want,
            TOL_EXACT,
        );
    }
}

pub(crate) fn reference_matmul(
    values: &[f32],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
) -> Vec<f64> {
    let mut out = vec![0f64; n * rows];
    for t in 0..n {
        let xr = &x[t * cols..(t + 1) * cols];
        for r in 0..rows {
            let w = &values[r * cols..(r + 1) * cols];
            out[t * rows + r] = w.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum();
        }
    }
    out
}

pub(crate) fn test_matmul<B: Backend + ?Sized>(
    h: &mut Harness<B>,
    rng: &mut Rng,
    only_prefill: bool,
) {
    // (label, out rows, in cols, kinds, token counts)
    let k_quant = |k: &Result<WeightType, u32>| matches!(k, Ok(t) if t.block_elems() == 256);
    let all = all_kinds();
    type Case = (
        &'static str,
        usize,
        usize,
        Vec<Result<WeightType, u32>>,
        Vec<usize>,
    );
    let cases: Vec<Case> = vec![
        (
            "Qwen3-MoE expert 768x2048",
            768,
            2048,
            all.clone(),
            vec![1, 2, 3, 8, 9, 16, 37, 64, 77],
        ),
        // Decode batches on a matrix of rows not a multiple of 16 (token
        // counts even: the harness reads rows x tokens in runs of 8).
        (
            "100x2048",
            100,
            2048,
            vec![
                Ok(WeightType::F16),
                Ok(WeightType::BF16),
                Ok(WeightType::Q8_0),
                Ok(WeightType::Q4_K),
            ],
            vec![2, 6, 16, 40],
        ),
        (
            "SmolLM2 ffn_up 1536x576",
            1536,
            576,
            all.iter().filter(|k| !k_quant(k)).cloned().collect(),
            vec![1, 67],
        ),
        (
            "Llama-8B ffn_down 4096x14336",
            4096,
            14336,
            vec![
                Ok(WeightType::Q4_K),
                Ok(WeightType::Q6_K),
                Ok(WeightType::F16),
            ],
            vec![1, 20],
        ),
        // One token on more than 2,048 rows (a warp a row): Q5_K's 32-value
        // chunks, and Q8_0's and Q4_0's 2-byte aligned blocks read as
        // aligned words. Then the 32-value kernels on four warps a row (128
        // chunks; 2048-wide rows take two).
        (
            "Llama-8B ffn_down 4096x14336",
            4096,
            14336,
            vec![
                Ok(WeightType::Q5_K),
                Ok(WeightType::Q8_0),
                Ok(WeightType::Q4_0),
            ],
            vec![1],
        ),
        (
            "Llama-8B attn_k 1024x4096",
            1024,
            4096,
            vec![
                Ok(WeightType::Q4_K),
                Ok(WeightType::Q5_K),
                Ok(WeightType::Q6_K),
            ],
            vec![1],
        ),
    ];
    for (label, rows, cols, kinds, tokens) in cases {
        for kind in kinds {
            let (m, values) = random_matrix(rng, kind, rows, cols);
            let id = h.b.load_matrix(m).expect("loads");
            for &n in tokens.iter().filter(|&&n| !only_prefill || n > 8) {
                let case = format!("{} {label} x{n}", kind_name(kind));
                check_matmul(h, rng, (id, &values), (rows, cols), n, &case);
            }
        }
    }
}

/// `n` random rows through matrix `id` (`rows × cols`, of `values`)
/// against the f64 reference.
pub(crate) fn check_matmul<B: Backend + ?Sized>(
    h: &mut Harness<B>,
    rng: &mut Rng,
    (id, values): (MatrixId, &[f32]),
    (rows, cols): (usize, usize),
    n: usize,
    case: &str,
) {
    let x = uniform(rng, n * cols);
    h.set(Buf::FfnGate, &x, cols);
    h.b.matmul(id, Buf::FfnGate, n, Buf::FfnUp);
    let got = h.get(Buf::FfnUp, n, rows);
    let want = reference_matmul(values, rows, cols, &x, n);
    h.check("matmul", case, &got, &want, TOL_MATMUL);
}

pub(crate) fn glu_ref(g: f64, u: f64, act: Glu) -> f64 {
    let a = match act {
        Glu::Silu => g / (1.0 + (-g).exp()),
        Glu::GeluTanh => {
            0.5 * g
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g)).tanh())
        }
        Glu::SwigluOai => {
            let g = g.min(7.0);
            return g / (1.0 + (-1.702 * g).exp()) * (u.clamp(-7.0, 7.0) + 1.0);
        }
    };
    a * u
}

/// matmul_glu: a gate and an up projection of one type with the activation
/// (fused on the GPU up to 8 rows), against the f64 reference of the three.
pub(crate) fn test_matmul_glu(h: &mut Harness, rng: &mut Rng) {
    let (rows, cols) = (768, 2048);
    for kind in all_kinds() {
        let (gm, gv) = random_matrix(rng, kind, rows, cols);
        let (um, uv) = random_matrix(rng, kind, rows, cols);
        let (g, u) = (
            h.b.load_matrix(gm).expect("loads"),
            h.b.load_matrix(um).expect("loads"),
        );
        for (n, act) in [
            (1, Glu::Silu),
            (3, Glu::GeluTanh),
            (9, Glu::Silu),
            (30, Glu::GeluTanh),
            (64, Glu::Silu),
        ] {
            let x = uniform(rng, n * cols);
            h.set(Buf::Norm, &x, cols);
            h.b.matmul_glu([g, u], Buf::Norm, n, act, [Buf::FfnGate, Buf::FfnUp], rows);
            let got = h.get(Buf::FfnGate, n, rows);
            let want: Vec<f64> = reference_matmul(&gv, rows, cols, &x, n)
                .iter()
                .zip(reference_matmul(&uv, rows, cols, &x, n))
                .map(|(&g, u)| glu_ref(g, u, act))
                .collect();
            h.check(
                "matmul_glu",
                &format!("{} 768x2048 x{n}", kind_name(kind)),
                &got,
                &want,
                TOL_MATMUL,
            );
        }
    }
}

/// matmul_many: q, k and v projections of one input (one launch for one
/// token on the GPU when they share a type, each with its own rows and
/// warps a row), two of them, and a mixed-type set (one matmul each),
/// against the f64 reference of each.
pub(crate) fn test_matmul_many(h: &mut Harness, rng: &mut Rng) {
    let cols = 2048;
    let shapes = [(512, Buf::Q), (128, Buf::K), (128, Buf::V)];
    for kind in all_kinds() {
        let loaded: Vec<_> = shapes
            .iter()
            .map(|&(rows, out)| {
                let (m, values) = random_matrix(rng, kind, rows, cols);
                (h.b.load_matrix(m).expect("loads"), values, rows, out)
            })
            .collect();
        for (count, n) in [(3, 1), (2, 1), (3, 2), (3, 24), (2, 57)] {
            let x = uniform(rng, n * cols);
            h.set(Buf::Norm, &x, cols);
            let ws: Vec<_> = loaded[..count].iter().map(|l| l.0).collect();
            let outs: Vec<_> = loaded[..count].iter().map(|l| l.3).collect();
            h.b.matmul_many(&ws, Buf::Norm, n, &outs);
            for (_, values, rows, out) in &loaded[..count] {
                let got = h.get(*out, n, *rows);
                let want = reference_matmul(values, *rows, cols, &x, n);
                h.check(
                    "matmul_many",
                    &format!("{} {rows}x{cols} of {count} x{n}", kind_name(kind)),
                    &got,
                    &want,
                    TOL_MATMUL,
                );
            }
        }
    }
    // More blocks than one wave holds (q, k and v of thousands of rows):
    // on CUDA the float kinds take one wave of equal warps that share
    // rows (`matvec_balanced`), the last block partly filled. Its own
    // random stream, so the cases after it see the data they always saw.
    let mut wave_rng = Rng::xorshift64_star(0x0ae1_7a3e_5eed_0002);
    let shapes = [(4104, Buf::Q), (1032, Buf::K), (1024, Buf::V)];
    for kind in [WeightType::F16, WeightType::BF16, WeightType::F32] {
        let loaded: Vec<_> = shapes
            .iter()
            .map(|&(rows, out)| {
                let (m, values) = random_matrix(&mut wave_rng, Ok(kind), rows, cols);
                (h.b.load_matrix(m).expect("loads"), values, rows, out)
            })
            .collect();
        let x = uniform(&mut wave_rng, cols);
        h.set(Buf::Norm, &x, cols);
        let ws: Vec<_> = loaded.iter().map(|l| l.0).collect();
        let outs: Vec<_> = loaded.iter().map(|l| l.3).collect();
        h.b.matmul_many(&ws, Buf::Norm, 1, &outs);
        for (_, values, rows, out) in &loaded {
            let got = h.get(*out, 1, *rows);
            let want = reference_matmul(values, *rows, cols, &x, 1);
            h.check(
                "matmul_many",
                &format!("{kind:?} {rows}x{cols} of 3 (one wave)"),
                &got,
                &want,
                TOL_MATMUL,
            );
        }
    }
    let mixed = [Ok(WeightType::Q4_K), Ok(WeightType::Q6_K)];
    let (ma, va) = random_matrix(rng, mixed[0], 256, cols);
    let (mb, vb) = random_matrix(rng, mixed[1], 256, cols);
    let ids = [
        h.b.load_matrix(ma).expect("loads"),
        h.b.load_matrix(mb).expect("loads"),
    ];
    let x = uniform(rng, cols);
    h.set(Buf::Norm, &x, cols);
    h.b.matmul_many(&ids, Buf::Norm, 1, &[Buf::Q, Buf::K]);
    for (out, values) in [(Buf::Q, &va), (Buf::K, &vb)] {
        let got = h.get(out, 1, 256);
        let want = reference_matmul(values, 256, cols, &x, 1);
        h.check("matmul_many", "Q4_K + Q6_K x1", &got, &want, TOL_MATMUL);
    }
}

/// One token through a norm and then matmuls of its output: on the GPU
/// the norm also writes int8 activation blocks that the x8 kernels read
/// instead of quantizing again, reused by consecutive matmuls of one input
/// whatever their type (Q4_K, Q6_K, Q8_0, Q4_0, then F16 on the f32 path),
/// for the plain and the residual-add norm.
pub(crate) fn test_norm_then_matmul(h: &mut Harness, rng: &mut Rng) {
    let (rows, cols) = (256, 4096);
    let kinds = [
        WeightType::Q4_K,
        WeightType::Q6_K,
        WeightType::Q8_0,
        WeightType::Q4_0,
        WeightType::F16,
    ];
    let loaded: Vec<_> = kinds
        .iter()
        .map(|&t| {
            let (m, values) = random_matrix(rng, Ok(t), rows, cols);
            (t, h.b.load_matrix(m).expect("loads"), values)
        })
        .collect();
    let w = uniform(rng, cols);
    let wid = h.b.load_vector(&w).expect("loads");
    for add in [false, true] {
        let (a, b) = (uniform(rng, cols), uniform(rng, cols));
        h.set(Buf::Residual, &a, cols);
        h.set(Buf::BranchOut, &b, cols);
        let normed = if add {
            h.b.add_rms_norm(Buf::Residual, Buf::BranchOut, wid, 1e-5, 1, cols, Buf::Norm);
            let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
            rms_ref(&sum, &w, 1e-5)
        } else {
            h.b.rms_norm(Buf::Residual, wid, 1e-5, 1, cols, Buf::Norm);
            rms_ref(&a, &w, 1e-5)
        };
        let x: Vec<f32> = normed.iter().map(|&v| v as f32).collect();
        let outs = [Buf::Q, Buf::K, Buf::V, Buf::FfnGate, Buf::FfnUp];
        for ((_, id, _), &out) in loaded.iter().zip(&outs) {
            h.b.matmul(*id, Buf::Norm, 1, out);
        }
        for ((t, _, values), &out) in loaded.iter().zip(&outs) {
            let got = h.get(out, 1, rows);
            let want = reference_matmul(values, rows, cols, &x, 1);
            let norm = if add { "add_rms_norm" } else { "rms_norm" };
            h.check(
                "norm then matmul",
                &format!("{norm} then {} {rows}x{cols} x1", t.name()),
                &got,
                &want,
                TOL_MATMUL,
            );
        }
    }
}
