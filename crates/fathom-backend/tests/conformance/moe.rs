//! MoE: routing, routed experts and tensor-parallel shards.

use super::*;

pub(crate) fn test_moe(h: &mut Harness, rng: &mut Rng) {
    // Qwen3-30B-A3B: 128 experts, 8 active, hidden 2048.
    let (rows, ne, k, d) = (6, 128, 8, 2048);
    for normalize in [true, false] {
        let logits: Vec<f32> = uniform(rng, rows * ne).iter().map(|v| v * 4.0).collect();
        h.set(Buf::RouterLogits, &logits, ne);
        h.b.route_experts(Buf::RouterLogits, rows, ne, k, normalize);
        // Reference routes.
        let mut routes = Vec::new();
        for r in 0..rows {
            let l = &logits[r * ne..(r + 1) * ne];
            let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
            let e: Vec<f64> = l.iter().map(|&x| (x as f64 - m).exp()).collect();
            let sum: f64 = e.iter().sum();
            let mut idx: Vec<usize> = (0..ne).collect();
            idx.sort_by(|&a, &b| e[b].total_cmp(&e[a]));
            let mut chosen: Vec<(usize, f64)> = idx[..k].iter().map(|&i| (i, e[i] / sum)).collect();
            if normalize {
                let t: f64 = chosen.iter().map(|c| c.1).sum();
                chosen.iter_mut().for_each(|c| c.1 /= t);
            }
            routes.push(chosen);
        }
        let x = uniform(rng, rows * d);
        h.set(Buf::Norm, &x, d);
        h.b.zero(Buf::BranchOut, rows, d);
        let mut want_out = vec![0f64; rows * d];
        let mut count_fail = None;
        for e in 0..ne {
            let want_rows: Vec<usize> = (0..rows)
                .filter(|&r| routes[r].iter().any(|c| c.0 == e))
                .collect();
            let n = h.b.gather_expert_rows(e, rows, k, Buf::Norm, d, Buf::MoeIn);
            if n != want_rows.len() {
                count_fail = Some(format!(
                    "expert {e}: {n} rows gathered, {} expected",
                    want_rows.len()
                ));
                break;
            }
            if n == 0 {
                continue;
            }
            if e % 17 == 0 {
                let got = h.get(Buf::MoeIn, n, d);
                let want: Vec<f64> = want_rows
                    .iter()
                    .flat_map(|&r| x[r * d..(r + 1) * d].iter().map(|&v| v as f64))
                    .collect();
                h.check(
                    "gather_expert_rows",
                    &format!("expert {e} 6x2048 norm={normalize}"),
                    &got,
                    &want,
                    TOL_EXACT,
                );
            }
            // The expert's "output": its own random rows.
            let y = uniform(rng, n * d);
            h.set(Buf::MoeOut, &y, d);
            h.b.scatter_expert_rows(e, rows, k, Buf::MoeOut, d, Buf::BranchOut);
            for (i, &r) in want_rows.iter().enumerate() {
                let w = routes[r]
                    .iter()
                    .find(|c| c.0 == e)
                    .map(|c| c.1)
                    .unwrap_or(0.0);
                for c in 0..d {
                    want_out[r * d + c] += w * y[i * d + c] as f64;
                }
            }
        }
        if let Some(msg) = count_fail {
            let line = format!("{:5} route_experts      {msg} FAIL", h.b.name());
            println!("{line}");
            h.failures.push(line);
            continue;
        }
        let got = h.get(Buf::BranchOut, rows, d);
        h.check(
            "route+scatter",
            &format!("128 experts top-8 norm={normalize}"),
            &got,
            &want_out,
            1e-9,
        );
    }
}

/// A layer's experts for [`test_routed_experts`]: gate and up of one kind,
/// down of another, loaded expert by expert (gate, up, down) as the engine
/// loads them; with their values.
pub(crate) struct Experts {
    pub(crate) ids: Vec<[MatrixId; 3]>,
    pub(crate) values: Vec<[Vec<f32>; 3]>,
    pub(crate) label: String,
}

/// (gate/up kind, down kind) pairs: each kind with routed kernels on the
/// GPU (int8 activations, f32 activations, a Q4_K_M-like mix) and one
/// without (Q4_1: the gather path everywhere).
pub(crate) fn routed_kinds() -> Vec<(WeightType, WeightType)> {
    use WeightType::*;
    vec![
        (Q4_0, Q4_0),
        (Q8_0, Q8_0),
        (Q4_K, Q6_K),
        (F16, F16),
        (Q5_K, Q5_K),
        (Q4_1, Q4_1),
    ]
}

/// Experts the routed tests use: 16 of them, 4 active, hidden 512, FFN 256.
pub(crate) const ROUTED: (usize, usize, usize, usize) = (16, 4, 512, 256);

pub(crate) fn load_experts<B: Backend + ?Sized>(
    h: &mut Harness<B>,
    rng: &mut Rng,
    (gate_kind, down_kind): (WeightType, WeightType),
) -> Experts {
    let (ne, _, d, f) = ROUTED;
    let (mut ids, mut values) = (Vec::new(), Vec::new());
    for _ in 0..ne {
        let (g, gv) = random_matrix(rng, Ok(gate_kind), f, d);
        let (u, uv) = random_matrix(rng, Ok(gate_kind), f, d);
        let (dn, dv) = random_matrix(rng, Ok(down_kind), d, f);
        let load = |h: &mut Harness<B>, m| h.b.load_matrix(m).expect("loads");
        ids.push([load(h, g), load(h, u), load(h, dn)]);
        values.push([gv, uv, dv]);
    }
    Experts {
        ids,
        values,
        label: format!("{}/{}", gate_kind.name(), down_kind.name()),
    }
}

/// gpt-oss's additions to a MoE layer: per-expert biases, and the
/// router's bias (loaded, and its values).
pub(crate) struct MoeBiases<'a> {
    pub(crate) experts: &'a ExpertBiases,
    pub(crate) router: VectorId,
    pub(crate) router_values: &'a [f32],
}

/// Routes `rows` random rows (random router logits, plus the router's bias
/// with `biases`), then runs the routed experts over them into BranchOut
/// through `act` (with the experts' biases where given); returns x and the
/// router logits used.
pub(crate) fn route_and_run<B: Backend + ?Sized>(
    h: &mut Harness<B>,
    rng: &mut Rng,
    experts: &Experts,
    act: Glu,
    biases: Option<&MoeBiases>,
    rows: usize,
) -> (Vec<f32>, Vec<f32>) {
    let (ne, k, d, _) = ROUTED;
    let mut logits: Vec<f32> = uniform(rng, rows * ne).iter().map(|v| v * 4.0).collect();
    h.set(Buf::RouterLogits, &logits, ne);
    if let Some(b) = biases {
        h.b.add_bias(Buf::RouterLogits, b.router, rows, ne);
        for row in logits.chunks_mut(ne) {
            row.iter_mut()
                .zip(b.router_values)
                .for_each(|(l, b)| *l += b);
        }
    }
    let x = uniform(rng, rows * d);
    h.set(Buf::Norm, &x, d);
    h.b.route_experts(Buf::RouterLogits, rows, ne, k, true);
    h.b.routed_experts(
        &routed_ffn(experts, act, biases),
        Buf::Norm,
        rows,
        Buf::BranchOut,
    );
    (x, logits)
}

/// The layer [`route_and_run`] runs: `experts` through `act`, with the
/// experts' biases where given.
pub(crate) fn routed_ffn<'a>(
    experts: &'a Experts,
    act: Glu,
    biases: Option<&'a MoeBiases>,
) -> RoutedFfn<'a> {
    let (_, k, d, f) = ROUTED;
    RoutedFfn {
        experts: &experts.ids,
        k,
        act,
        width: d,
        ffn_width: f,
        biases: biases.map(|b| b.experts.ids.as_slice()),
    }
}

/// Per expert its gate, up and down biases (gpt-oss), as loaded vectors and
/// their values.
pub(crate) struct ExpertBiases {
    pub(crate) ids: Vec<[VectorId; 3]>,
    pub(crate) values: Vec<[Vec<f32>; 3]>,
}

/// The f64 reference of routed experts: per row the `k` experts of highest
/// logit (`logits` with the router's bias already added), weighted by a
/// softmax over those k, each expert's FFN through `act` with its biases
/// (if any) added to its gate, up and down projections.
pub(crate) fn routed_ref(
    experts: &Experts,
    biases: Option<&ExpertBiases>,
    act: Glu,
    x: &[f32],
    logits: &[f32],
    rows: usize,
) -> Vec<f64> {
    let (ne, k, d, f) = ROUTED;
    let mut want = vec![0f64; rows * d];
    for r in 0..rows {
        let l = &logits[r * ne..(r + 1) * ne];
        let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let p: Vec<f64> = l.iter().map(|&v| (v as f64 - m).exp()).collect();
        let mut idx: Vec<usize> = (0..ne).collect();
        idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
        let total: f64 = idx[..k].iter().map(|&e| p[e]).sum();
        let xr = &x[r * d..(r + 1) * d];
        for &e in &idx[..k] {
            let [gv, uv, dv] = &experts.values[e];
            let bias = |i: usize, j: usize| biases.map_or(0.0, |b| b.values[e][i][j] as f64);
            let hidden: Vec<f32> = reference_matmul(gv, f, d, xr, 1)
                .iter()
                .zip(reference_matmul(uv, f, d, xr, 1))
                .enumerate()
                .map(|(j, (&g, u))| glu_ref(g + bias(0, j), u + bias(1, j), act) as f32)
                .collect();
            let y = reference_matmul(dv, d, f, &hidden, 1);
            for (j, (o, v)) in want[r * d..(r + 1) * d].iter_mut().zip(y).enumerate() {
                *o += p[e] / total * (v + bias(2, j));
            }
        }
    }
    want
}

/// routed_experts (after route_experts, normalized top-k) of one row (the
/// GPU's one-token routed kernels), of 3 and 37 rows, and of 256 (some
/// experts past a 64-row tile; on the GPU these are grouped by expert on
/// the device), for each kind pair, against the f64 FFN of each row's
/// experts weighted by its f64 routes. Two matmuls deep on quantized
/// activations: twice the matmul tolerance.
pub(crate) fn test_routed_experts(h: &mut Harness, rng: &mut Rng) {
    let d = ROUTED.2;
    // The larger steps draw from a stream of their own, so that the cases
    // after them keep their random values.
    let mut larger = Rng::xorshift64_star(0x3e7_0003);
    for kinds in routed_kinds() {
        let experts = load_experts(h, rng, kinds);
        for rows in [1, 3, 37, 256] {
            let rng = if rows > 3 { &mut larger } else { &mut *rng };
            let (x, logits) = route_and_run(h, rng, &experts, Glu::Silu, None, rows);
            let got = h.get(Buf::BranchOut, rows, d);
            let want = routed_ref(&experts, None, Glu::Silu, &x, &logits, rows);
            h.check(
                "routed_experts",
                &format!("{} 16 experts top-4 x{rows}", experts.label),
                &got,
                &want,
                2.0 * TOL_MATMUL,
            );
        }
    }
}

/// Tensor-parallel shards of a matrix (`HostMatrix::rows_range`,
/// `cols_range`) on one backend: a column-split (rows range) product is
/// the whole product's rows; row-split (cols range) partial products of
/// the matching slices of x, summed on the host where NCCL's all-reduce
/// would sum them across GPUs, equal the whole product. Two and four
/// shards, every weight kind.
pub(crate) fn test_shards(h: &mut Harness, rng: &mut Rng) {
    let (rows, cols, n) = (512, 2048, 3);
    for kind in all_kinds() {
        let (m, values) = random_matrix(rng, kind, rows, cols);
        let x = uniform(rng, n * cols);
        let want = reference_matmul(&values, rows, cols, &x, n);
        for size in [2, 4] {
            let (r, c) = (rows / size, cols / size);
            let mut summed = vec![0f64; n * rows];
            let mut stacked = vec![0f64; n * rows];
            for rank in 0..size {
                let id =
                    h.b.load_matrix(m.rows_range(rank * r, (rank + 1) * r).expect("rows"))
                        .expect("loads");
                h.set(Buf::FfnGate, &x, cols);
                h.b.matmul(id, Buf::FfnGate, n, Buf::FfnUp);
                for (t, row) in h.get(Buf::FfnUp, n, r).chunks(r).enumerate() {
                    for (i, &v) in row.iter().enumerate() {
                        stacked[t * rows + rank * r + i] = v as f64;
                    }
                }
                let id =
                    h.b.load_matrix(m.cols_range(rank * c, (rank + 1) * c).expect("cols"))
                        .expect("loads");
                let xs: Vec<f32> = x
                    .chunks(cols)
                    .flat_map(|row| row[rank * c..(rank + 1) * c].to_vec())
                    .collect();
                h.set(Buf::FfnGate, &xs, c);
                h.b.matmul(id, Buf::FfnGate, n, Buf::FfnUp);
                for (s, &v) in summed.iter_mut().zip(&h.get(Buf::FfnUp, n, rows)) {
                    *s += v as f64;
                }
            }
            let case = format!("{} 512x2048 x{n} / {size}", kind_name(kind));
            let f32s = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
            h.check("shard rows", &case, &f32s(&stacked), &want, TOL_MATMUL);
            h.check("shard cols + sum", &case, &f32s(&summed), &want, TOL_MATMUL);
        }
    }
}

/// The CPU runs a step of few routes with every routed expert's products
/// in two grouped hand-offs to its pool; more routes go an expert at a
/// time ([`fathom_backend::experts_by_gather`]). The two must agree to the
/// bit (same kernels on the same rows, sums in the same order): every kind
/// pair and gpt-oss's biased MXFP4 experts, at 1, 3 and 37 rows (4 to 148
/// routes of 16 experts), and 70 rows (280 routes: the gather path on
/// both sides, a control).
pub(crate) fn test_grouped_experts_match_the_gather_path(h: &mut Harness, rng: &mut Rng) {
    if h.b.name() != "cpu" {
        return;
    }
    for kinds in routed_kinds() {
        let experts = load_experts(h, rng, kinds);
        grouped_against_gather(h, rng, &experts, Glu::Silu, None);
    }
    let moe = load_gpt_oss_moe(h, rng);
    grouped_against_gather(h, rng, &moe.experts, Glu::SwigluOai, Some(&moe.biases()));
}

fn grouped_against_gather(
    h: &mut Harness,
    rng: &mut Rng,
    experts: &Experts,
    act: Glu,
    biases: Option<&MoeBiases>,
) {
    let d = ROUTED.2;
    for rows in [1, 3, 37, 70] {
        route_and_run(h, rng, experts, act, biases, rows);
        let grouped = h.get(Buf::BranchOut, rows, d);
        let ffn = routed_ffn(experts, act, biases);
        fathom_backend::experts_by_gather(&mut *h.b, &ffn, Buf::Norm, rows, Buf::Residual);
        let by_gather = h.get(Buf::Residual, rows, d);
        let differ = grouped
            .iter()
            .zip(&by_gather)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        let line = format!(
            "{:5} grouped_experts    {:34} {differ} of {} values differ {}",
            h.b.name(),
            format!("{} x{rows}", experts.label),
            grouped.len(),
            if differ == 0 { "ok" } else { "FAIL" }
        );
        println!("{line}");
        if differ != 0 {
            h.failures.push(line);
        }
    }
}
