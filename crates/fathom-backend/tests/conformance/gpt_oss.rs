//! gpt-oss's ops: MXFP4 products (one token, few rows, prefill) and its
//! clamped SwiGLU, YaRN rope, and its MoE (biased router and experts),
//! against f64 references. Its own random stream (`conformance`), so the
//! other cases keep the data they were tuned on.

use super::*;

/// gpt-oss-20b's expert shape: 2880 × 2880, 90 MXFP4 blocks a row (17
/// bytes each: blocks at every byte alignment), at one token, the few-row
/// kernels' counts and prefill.
pub(crate) fn test_gpt_oss_matmul(h: &mut Harness, rng: &mut Rng) {
    let (rows, cols) = (2880, 2880);
    let (m, values) = random_matrix(rng, Ok(WeightType::MXFP4), rows, cols);
    let id = h.b.load_matrix(m).expect("loads");
    for n in [1, 2, 3, 8, 9, 16, 37, 64] {
        let case = format!("MXFP4 gpt-oss expert 2880x2880 x{n}");
        check_matmul(h, rng, (id, &values), (rows, cols), n, &case);
    }
}

/// The clamped SwiGLU alone (gates and ups past its clamps at ±7) and
/// after an MXFP4 gate and up projection (fused on the GPU for one token).
pub(crate) fn test_gpt_oss_glu(h: &mut Harness, rng: &mut Rng) {
    let (rows, width) = (7, 1536);
    let g: Vec<f32> = uniform(rng, rows * width).iter().map(|v| v * 9.0).collect();
    let u: Vec<f32> = uniform(rng, rows * width).iter().map(|v| v * 9.0).collect();
    h.set(Buf::FfnGate, &g, width);
    h.set(Buf::FfnUp, &u, width);
    h.b.glu(Buf::FfnGate, Buf::FfnUp, rows, width, Glu::SwigluOai);
    let got = h.get(Buf::FfnGate, rows, width);
    let want: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(&g, &u)| glu_ref(g as f64, u as f64, Glu::SwigluOai))
        .collect();
    h.check("glu", "swiglu_oai 7x1536", &got, &want, TOL_EXACT);
    let (rows, cols) = (768, 2048);
    let (gm, gv) = random_matrix(rng, Ok(WeightType::MXFP4), rows, cols);
    let (um, uv) = random_matrix(rng, Ok(WeightType::MXFP4), rows, cols);
    let ids = [
        h.b.load_matrix(gm).expect("loads"),
        h.b.load_matrix(um).expect("loads"),
    ];
    for n in [1, 5, 20] {
        let x = uniform(rng, n * cols);
        h.set(Buf::Norm, &x, cols);
        let outs = [Buf::FfnGate, Buf::FfnUp];
        h.b.matmul_glu(ids, Buf::Norm, n, Glu::SwigluOai, outs, rows);
        let got = h.get(Buf::FfnGate, n, rows);
        let want: Vec<f64> = reference_matmul(&gv, rows, cols, &x, n)
            .iter()
            .zip(reference_matmul(&uv, rows, cols, &x, n))
            .map(|(&g, u)| glu_ref(g, u, Glu::SwigluOai))
            .collect();
        h.check(
            "matmul_glu",
            &format!("MXFP4 swiglu_oai 768x2048 x{n}"),
            &got,
            &want,
            TOL_MATMUL,
        );
    }
}

/// gpt-oss's YaRN (factor 32 over 4,096 positions at rope base 150,000 on
/// 64-value heads): the blend ramp from pair 8 to pair 18, cos and sin
/// scaled by 1 + 0.1 ln 32.
pub(crate) const GPT_OSS_YARN: Yarn = Yarn {
    freq_scale: 1.0 / 32.0,
    corr: [8.0, 18.0],
    mscale: 1.346_573_6,
};

/// NeoX rope of `heads` heads of `hd` values with YaRN scaling: pair i's
/// angle p·θ^(−2i/hd) scaled by 1 − r + r·freq_scale, r rising linearly
/// from 0 at pair corr[0] to 1 at corr[1], cos and sin times mscale.
pub(crate) fn rope_yarn_ref(
    x: &[f32],
    heads: usize,
    hd: usize,
    pos: usize,
    theta: f32,
    y: &Yarn,
) -> Vec<f64> {
    let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let half = hd / 2;
    let (low, high) = (y.corr[0] as f64, y.corr[1] as f64);
    for i in 0..half {
        let freq = (theta as f64).powf(-2.0 * i as f64 / hd as f64);
        let r = ((i as f64 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
        let angle = pos as f64 * freq * (1.0 - r + r * y.freq_scale as f64);
        let (s, c) = angle.sin_cos();
        let (s, c) = (s * y.mscale as f64, c * y.mscale as f64);
        for h in 0..heads {
            let (x0, x1) = (x[h * hd + i] as f64, x[h * hd + i + half] as f64);
            out[h * hd + i] = x0 * c - x1 * s;
            out[h * hd + i + half] = x0 * s + x1 * c;
        }
    }
    out
}

/// YaRN rope of gpt-oss's 64 heads of 64 values, rows at positions from 0
/// to 40,001.
pub(crate) fn test_gpt_oss_rope(h: &mut Harness, rng: &mut Rng) {
    let tables: Vec<Vec<u32>> = Vec::new();
    let seq = |start, tokens| StepSeq {
        start,
        tokens,
        tables: &tables,
    };
    let seqs = [seq(0, 3), seq(40_000, 2), seq(17, 1)];
    let step = Step {
        seqs: &seqs,
        rows: 6,
    };
    let positions: Vec<usize> = step.positions().collect();
    let (heads, hd, theta) = (64, 64, 150_000.0);
    let width = heads * hd;
    let x = uniform(rng, step.rows * width);
    h.set(Buf::Q, &x, width);
    let rope = attention_rope("gpt-oss");
    h.b.rope(Buf::Q, &step, heads, hd, &rope);
    let got = h.get(Buf::Q, step.rows, width);
    let want: Vec<f64> = x
        .chunks(width)
        .zip(&positions)
        .flat_map(|(r, &p)| rope_yarn_ref(r, heads, hd, p, theta, &GPT_OSS_YARN))
        .collect();
    h.check("rope", "gpt-oss 64x64 yarn", &got, &want, TOL_ROPE);
}

/// A gpt-oss MoE layer for the tests: MXFP4 experts ([`ROUTED`]'s shape),
/// per expert its gate, up and down biases, and the router's bias.
pub(crate) struct GptOssMoe {
    pub(crate) experts: Experts,
    pub(crate) biases: ExpertBiases,
    pub(crate) router_bias: Vec<f32>,
    pub(crate) router: VectorId,
}

pub(crate) fn load_gpt_oss_moe<B: Backend + ?Sized>(
    h: &mut Harness<B>,
    rng: &mut Rng,
) -> GptOssMoe {
    let (ne, _, d, f) = ROUTED;
    let experts = load_experts(h, rng, (WeightType::MXFP4, WeightType::MXFP4));
    let mut biases = ExpertBiases {
        ids: Vec::new(),
        values: Vec::new(),
    };
    for _ in 0..ne {
        let v = [uniform(rng, f), uniform(rng, f), uniform(rng, d)];
        let mut id = |v: &[f32]| h.b.load_vector(v).expect("loads");
        biases.ids.push([id(&v[0]), id(&v[1]), id(&v[2])]);
        biases.values.push(v);
    }
    let router_bias = uniform(rng, ne);
    let router = h.b.load_vector(&router_bias).expect("loads");
    GptOssMoe {
        experts,
        biases,
        router_bias,
        router,
    }
}

impl GptOssMoe {
    /// Its biases as [`route_and_run`] takes them.
    pub(crate) fn biases(&self) -> MoeBiases<'_> {
        MoeBiases {
            experts: &self.biases,
            router: self.router,
            router_values: &self.router_bias,
        }
    }
}

/// gpt-oss's MoE as its layer runs it ([`route_and_run`] with the biases,
/// the routes normalized: a softmax over the chosen k; the clamped SwiGLU)
/// — one row (on CUDA the device's routes), a few, more than the few-row
/// kernels take, and more than a 16-row tile of an expert (CUDA groups the
/// rows by expert on the device) — against [`routed_ref`].
pub(crate) fn test_gpt_oss_experts(h: &mut Harness, rng: &mut Rng) {
    let d = ROUTED.2;
    let moe = load_gpt_oss_moe(h, rng);
    // 150 rows from a stream of its own: the cases after keep their values.
    let mut larger = Rng::xorshift64_star(0x3e7_0004);
    for rows in [1, 3, 20, 150] {
        let rng = if rows > 20 { &mut larger } else { &mut *rng };
        let biases = moe.biases();
        let (x, logits) = route_and_run(h, rng, &moe.experts, Glu::SwigluOai, Some(&biases), rows);
        let got = h.get(Buf::BranchOut, rows, d);
        let want = routed_ref(
            &moe.experts,
            Some(&moe.biases),
            Glu::SwigluOai,
            &x,
            &logits,
            rows,
        );
        h.check(
            "routed_experts",
            &format!("gpt-oss MXFP4 16 experts top-4 biased x{rows}"),
            &got,
            &want,
            2.0 * TOL_MATMUL,
        );
    }
}
