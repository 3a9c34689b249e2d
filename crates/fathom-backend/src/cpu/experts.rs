//! A MoE layer's routed experts over a few rows (decode): all of the
//! routed experts' products in two hand-offs to the worker pool, the gates
//! and ups together, then the downs ([`fathom_kernels::matmul_group`]).
//!
//! Why: an expert's matrices are small (Qwen3-30B-A3B's are 768 × 2048),
//! so at one token a step each product is a few microseconds of work for
//! the pool while waking its workers costs about as much; an expert at a
//! time, a decoded token's eight experts were 24 hand-offs a layer. The
//! same kernels run on the same rows and the weighted sums are added in
//! the order [`crate::experts_by_gather`] adds them, so the output is the
//! same to the bit.

use fathom_kernels::{activation_row_bytes, matmul_group, ops, GroupedMatmul, Weights, MAX_GROUP};

use super::arena::{self, routes};
use super::{add_to_rows, glu_rows, CpuBackend};
use crate::{Buf, MatrixId, MatrixView, RoutedFfn};

/// Most routes (rows × experts a row) one grouped pass takes; a larger
/// step gives each expert enough rows to run it alone.
const MAX_ROUTES: usize = 256;

/// Most experts one grouped pass runs: two products each (gate, up) in a
/// group.
const MAX_RUNS: usize = MAX_GROUP / 2;

/// The scratch buffers a grouped pass writes.
const SCRATCH: [Buf; 5] = [
    Buf::MoeIn,
    Buf::FfnGate,
    Buf::FfnUp,
    Buf::MoeOut,
    Buf::Q8Rows,
];

impl CpuBackend {
    /// [`crate::Backend::routed_experts`] grouped, after
    /// [`crate::Backend::route_experts`]; false (nothing written) where the
    /// step has too many routes or experts for it, its experts are MLX
    /// matrices, or the plan's buffers are too small: then the caller runs
    /// the experts one at a time.
    pub(super) fn grouped_experts(
        &mut self,
        ffn: &RoutedFfn,
        x: Buf,
        rows: usize,
        out: Buf,
    ) -> bool {
        let (k, d, f) = (ffn.k, ffn.width, ffn.ffn_width);
        let n = rows * k;
        if n == 0 || n > MAX_ROUTES || SCRATCH.contains(&x) || SCRATCH.contains(&out) {
            return false;
        }
        // Each route as (expert, row, weight), by expert and then row: the
        // order the expert-at-a-time path adds them in.
        let mut order = [(0u32, 0u32, 0f32); MAX_ROUTES];
        let all = routes(self.arena.get([Buf::ExpertRoutes])[0]);
        if all.len() < n {
            return false;
        }
        for (i, r) in all[..n].iter().enumerate() {
            order[i] = (r.expert, (i / k) as u32, r.weight);
        }
        let order = &mut order[..n];
        order.sort_unstable_by_key(|&(e, t, _)| (e, t));
        // Runs of one expert's routes: (expert, first route, routes).
        let mut runs = [(0usize, 0usize, 0usize); MAX_RUNS];
        let mut n_runs = 0;
        for (i, &(e, _, _)) in order.iter().enumerate() {
            let e = e as usize;
            if n_runs > 0 && runs[n_runs - 1].0 == e {
                runs[n_runs - 1].2 += 1;
            } else if n_runs == MAX_RUNS || e >= ffn.experts.len() {
                return false;
            } else {
                runs[n_runs] = (e, i, 1);
                n_runs += 1;
            }
        }
        let runs = &runs[..n_runs];
        let matrices = &self.matrices;
        let blocks = |id: MatrixId| match matrices[id.0 as usize].view() {
            MatrixView::Blocks(w) => Some(w),
            MatrixView::Affine(_) => None,
        };
        // The quantized rows the two groups need (an expert's up reuses its
        // gate's where their types agree).
        let mut q8_need = 0;
        for &(e, _, count) in runs {
            let [Some(g), Some(u), Some(dn)] = ffn.experts[e].map(blocks) else {
                return false;
            };
            let up_own = if u.ty.activation() == g.ty.activation() {
                0
            } else {
                activation_row_bytes(u.ty, d)
            };
            q8_need +=
                count * (activation_row_bytes(g.ty, d) + up_own + activation_row_bytes(dn.ty, f));
        }
        let [xs, out, moe_in, gate, up, moe_out, q8] = self.arena.get([
            x,
            out,
            Buf::MoeIn,
            Buf::FfnGate,
            Buf::FfnUp,
            Buf::MoeOut,
            Buf::Q8Rows,
        ]);
        let [xs, out, moe_in, gate, up, moe_out] =
            [xs, out, moe_in, gate, up, moe_out].map(arena::f32s);
        if moe_in.len() < n * d
            || moe_out.len() < n * d
            || gate.len() < n * f
            || up.len() < n * f
            || xs.len() < rows * d
            || out.len() < rows * d
            || q8.len() < q8_need
        {
            return false;
        }
        for (i, &(_, t, _)) in order.iter().enumerate() {
            let t = t as usize;
            moe_in[i * d..(i + 1) * d].copy_from_slice(&xs[t * d..(t + 1) * d]);
        }
        let (gate, up, moe_in, moe_out) = (
            &mut gate[..n * f],
            &mut up[..n * f],
            &moe_in[..n * d],
            &mut moe_out[..n * d],
        );

        let (mut gates, mut ups) = (&mut *gate, &mut *up);
        let gate_ups = runs.iter().flat_map(|&(e, first, count)| {
            let [g, u, _] = ffn.experts[e];
            let x = &moe_in[first * d..(first + count) * d];
            let (g_out, rest) = std::mem::take(&mut gates).split_at_mut(count * f);
            gates = rest;
            let (u_out, rest) = std::mem::take(&mut ups).split_at_mut(count * f);
            ups = rest;
            [
                product(blocks(g), x, count, g_out),
                product(blocks(u), x, count, u_out),
            ]
        });
        matmul_group(&self.pool, gate_ups, q8);

        let vector = |id: crate::VectorId| self.vectors[id.0 as usize].as_slice();
        if let Some(biases) = ffn.biases {
            for &(e, first, count) in runs {
                let [bg, bu, _] = biases[e];
                let span = first * f..(first + count) * f;
                add_to_rows(&mut gate[span.clone()], vector(bg), f);
                add_to_rows(&mut up[span], vector(bu), f);
            }
        }
        // An expert's rows at a time, as the expert-at-a-time path calls it
        // (a vector kernel's tail falls where it did there).
        for &(_, first, count) in runs {
            let span = first * f..(first + count) * f;
            let (gate, up) = (&mut gate[span.clone()], &up[span]);
            glu_rows(gate, up, ffn.act);
        }

        let gate = &*gate;
        let mut outs = &mut *moe_out;
        let downs = runs.iter().map(|&(e, first, count)| {
            let (o, rest) = std::mem::take(&mut outs).split_at_mut(count * d);
            outs = rest;
            let x = &gate[first * f..(first + count) * f];
            product(blocks(ffn.experts[e][2]), x, count, o)
        });
        matmul_group(&self.pool, downs, q8);

        if let Some(biases) = ffn.biases {
            for &(e, first, count) in runs {
                add_to_rows(
                    &mut moe_out[first * d..(first + count) * d],
                    vector(biases[e][2]),
                    d,
                );
            }
        }
        out[..rows * d].fill(0.0);
        for (i, &(_, t, weight)) in order.iter().enumerate() {
            let t = t as usize;
            ops::axpy(
                &mut out[t * d..(t + 1) * d],
                weight,
                &moe_out[i * d..(i + 1) * d],
            );
        }
        true
    }
}

/// One expert product of a group (its matrices were checked to be blocks).
fn product<'a>(
    w: Option<Weights<'a>>,
    x: &'a [f32],
    n_tokens: usize,
    out: &'a mut [f32],
) -> GroupedMatmul<'a> {
    GroupedMatmul {
        w: w.expect("checked: every routed expert's matrices are blocks"),
        x,
        n_tokens,
        out,
    }
}
