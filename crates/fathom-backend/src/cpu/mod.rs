//! The CPU backend: today's kernels (AVX-512 VNNI, AVX2 or portable,
//! chosen at run time) on the persistent worker pool, over an arena and a
//! KV store in host memory.

mod arena;
mod attention;
mod experts;
mod kv;
mod linear;

use fathom_kernels::{ops, Pool};
use fathom_plan::activations::ArenaBuffer;
use fathom_plan::available::proc_kib;
use fathom_plan::{Device, KvDtype};

pub use arena::Route;
use arena::{routes, Arena};
use kv::KvStore;
use linear::RecurrentStore;

use crate::parallel::Reduce;
use crate::{
    AttentionIo, AttentionShape, Backend, BackendError, Buf, DeviceMemory, Features, Glu,
    HostMatrix, KvLayout, LinearIo, LinearShape, LinearWeights, MatrixId, MatrixView, RopeParams,
    Step, VectorId,
};

/// The kernel family the CPU backend runs ("portable", "avx2" or
/// "avx512-vnni": the best this CPU has, or what `FATHOM_ISA` forces), or
/// why `FATHOM_ISA` cannot be honoured.
pub fn kernels() -> Result<&'static str, BackendError> {
    fathom_kernels::selected_isa().map_err(|e| BackendError::Device {
        backend: "cpu",
        message: e.to_string(),
    })
}

/// Largest head dimension the per-head norms handle on the stack.
const MAX_HEAD_DIM: usize = 1024;

pub struct CpuBackend {
    pool: Pool,
    arena: Arena,
    kv: KvStore,
    /// A hybrid model's recurrent states (the plan's `recurrent_state`).
    recurrent: Option<RecurrentStore>,
    matrices: Vec<HostMatrix>,
    vectors: Vec<Vec<f32>>,
    /// Standing in for a split's device (tests): the room for streamed
    /// host matrices, and the ids they take.
    stream_room: u64,
    streamed: Vec<usize>,
}

impl CpuBackend {
    /// A backend with `threads` workers, the plan's arena `buffers` and KV
    /// `layout`, each allocated once, here. Refused when `FATHOM_ISA`
    /// names kernels this CPU cannot run.
    pub fn new(
        threads: usize,
        buffers: &[ArenaBuffer],
        layout: KvLayout,
    ) -> Result<Self, BackendError> {
        kernels()?;
        Ok(CpuBackend {
            pool: Pool::new(threads),
            arena: Arena::new(buffers),
            kv: KvStore::new(&layout),
            recurrent: layout.recurrent.as_ref().map(RecurrentStore::new),
            matrices: Vec::new(),
            vectors: Vec::new(),
            stream_room: 0,
            streamed: Vec::new(),
        })
    }

    /// This backend standing in for a split model's device on a machine
    /// without one (tests): `bytes` of room for host matrices streamed to
    /// it, as the device plan's `streamed` region. The CPU reads a
    /// streamed matrix in place, so the split's streamed path runs the
    /// same kernels on the same values as the host would.
    pub fn standing_in_with_stream_room(mut self, bytes: u64) -> Self {
        self.stream_room = bytes;
        self
    }

    /// The arena's address and bytes (a split model page-locks it for the
    /// crossings).
    pub(crate) fn arena_span(&mut self) -> (*mut u8, usize) {
        (self.arena.base(), self.arena.bytes())
    }

    /// The first `n` values of buffer `x`, for a crossing to a device.
    pub(crate) fn rows_mut(&mut self, x: Buf, n: usize) -> &mut [f32] {
        &mut self.arena.f32(x)[..n]
    }

    /// Bytes of the arena and of the KV store: the plan's device-side
    /// activations and its `kv` term.
    pub fn allocated(&self) -> (usize, usize) {
        (self.arena.bytes(), self.kv.bytes())
    }

    /// Bytes of the recurrent states: the plan's `recurrent_state` term.
    pub fn recurrent_bytes(&self) -> usize {
        self.recurrent.as_ref().map_or(0, RecurrentStore::bytes)
    }

    /// out = x · mᵀ for `n` rows of x, with the kernel for m's storage.
    fn mm(pool: &Pool, m: &HostMatrix, x: &[f32], n: usize, out: &mut [f32], q8: &mut [u8]) {
        match m.view() {
            MatrixView::Blocks(w) => fathom_kernels::matmul(pool, &w, x, n, out, q8),
            MatrixView::Affine(w) => fathom_kernels::affine_matmul(pool, &w, x, n, out),
        }
    }
}

/// The all-reduce of CPU ranks (tensor parallelism on one host's memory,
/// which the engine's tests run on any machine): rank 0's buffer takes the
/// others' values in rank order, then every rank gets a copy, so all hold
/// the same sum.
pub struct HostSum;

impl Reduce<CpuBackend> for HostSum {
    fn all_reduce(&mut self, ranks: &mut [CpuBackend], x: Buf, rows: usize, width: usize) {
        let n = rows * width;
        let Some((first, rest)) = ranks.split_first_mut() else {
            return;
        };
        let sum = &mut first.arena.f32(x)[..n];
        for r in rest.iter_mut() {
            sum.iter_mut()
                .zip(&r.arena.f32(x)[..n])
                .for_each(|(s, v)| *s += v);
        }
        for r in rest {
            r.arena.f32(x)[..n].copy_from_slice(sum);
        }
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn memory(&self) -> DeviceMemory {
        let (free, total) = host_memory();
        DeviceMemory { free, total }
    }

    fn load_matrix(&mut self, matrix: HostMatrix) -> Result<MatrixId, BackendError> {
        // Read in place: the matrix keeps the mapped file alive.
        self.matrices.push(matrix);
        Ok(MatrixId(self.matrices.len() as u32 - 1))
    }

    fn load_vector(&mut self, values: &[f32]) -> Result<VectorId, BackendError> {
        self.vectors.push(values.to_vec());
        Ok(VectorId(self.vectors.len() as u32 - 1))
    }

    fn stream_room(&self) -> u64 {
        self.stream_room
    }

    fn reserve_streamed(&mut self, matrices: usize) {
        let more = matrices.saturating_sub(self.streamed.len());
        self.matrices.reserve(more);
        self.streamed.reserve(more);
    }

    /// Names each matrix in a slot kept for streamed ones (nothing is
    /// copied), refusing what the room would not hold.
    fn stream_matrices(
        &mut self,
        matrices: &mut dyn Iterator<Item = &HostMatrix>,
        ids: &mut [MatrixId],
    ) -> Result<(), BackendError> {
        let mut used = 0u64;
        for (n, (m, id)) in matrices.zip(ids.iter_mut()).enumerate() {
            used += m.ranges().map(|r| r.len() as u64).sum::<u64>();
            if used > self.stream_room {
                return Err(BackendError::OverPlan {
                    what: "cpu streamed host matrices".into(),
                    needed: used,
                    available: self.stream_room,
                });
            }
            if n == self.streamed.len() {
                self.matrices.push(m.clone());
                self.streamed.push(self.matrices.len() - 1);
            }
            let at = self.streamed[n];
            self.matrices[at] = m.clone();
            *id = MatrixId(at as u32);
        }
        Ok(())
    }

    fn read_rows(&mut self, x: Buf, rows: usize, width: usize, out: &mut [f32]) {
        let n = rows * width;
        out[..n].copy_from_slice(&self.arena.f32(x)[..n]);
    }

    fn write_rows(&mut self, x: Buf, rows: usize, width: usize, values: &[f32], _: bool) {
        let n = rows * width;
        self.arena.f32(x)[..n].copy_from_slice(&values[..n]);
    }

    fn embed(&mut self, table: MatrixId, tokens: &[u32], scale: f32, out: Buf) {
        let m = &self.matrices[table.0 as usize];
        let d = m.cols;
        let out = self.arena.f32(out);
        for (t, &tok) in tokens.iter().enumerate() {
            let dst = &mut out[t * d..(t + 1) * d];
            match m.view() {
                MatrixView::Blocks(w) => {
                    let row_bytes = w.ty.row_bytes(d);
                    let row = &w.data[tok as usize * row_bytes..(tok as usize + 1) * row_bytes];
                    fathom_kernels::dequantize_row(w.ty, row, dst);
                }
                MatrixView::Affine(w) => {
                    fathom_kernels::affine_dequantize_row(&w, tok as usize, dst)
                }
            }
            if scale != 1.0 {
                ops::scale(dst, scale);
            }
        }
    }

    fn matmul(&mut self, w: MatrixId, x: Buf, rows: usize, out: Buf) {
        let m = &self.matrices[w.0 as usize];
        let [x, out, q8] = self.arena.get([x, out, Buf::Q8Rows]);
        let (x, out) = (arena::f32s(x), arena::f32s(out));
        Self::mm(
            &self.pool,
            m,
            &x[..rows * m.cols],
            rows,
            &mut out[..rows * m.rows],
            q8,
        );
    }

    fn rms_norm(&mut self, x: Buf, w: VectorId, eps: f32, rows: usize, width: usize, out: Buf) {
        let w = &self.vectors[w.0 as usize];
        let [x, out] = self.arena.f32s([x, out]);
        for t in 0..rows {
            let r = t * width..(t + 1) * width;
            ops::rms_norm(&x[r.clone()], w, eps, &mut out[r]);
        }
    }

    fn head_norm(
        &mut self,
        x: Buf,
        w: VectorId,
        eps: f32,
        rows: usize,
        width: usize,
        head_dim: usize,
    ) {
        assert!(head_dim <= MAX_HEAD_DIM, "head dim {head_dim}");
        let w = &self.vectors[w.0 as usize];
        let mut tmp = [0f32; MAX_HEAD_DIM];
        for head in self.arena.f32(x)[..rows * width].chunks_exact_mut(head_dim) {
            tmp[..head_dim].copy_from_slice(head);
            ops::rms_norm(&tmp[..head_dim], w, eps, head);
        }
    }

    fn add_bias(&mut self, x: Buf, b: VectorId, rows: usize, width: usize) {
        add_to_rows(
            &mut self.arena.f32(x)[..rows * width],
            &self.vectors[b.0 as usize],
            width,
        );
    }

    fn add(&mut self, dst: Buf, src: Buf, rows: usize, width: usize) {
        let [dst, src] = self.arena.f32s([dst, src]);
        for t in 0..rows {
            let r = t * width..(t + 1) * width;
            ops::add(&mut dst[r.clone()], &src[r]);
        }
    }

    fn gather_rows(&mut self, src: Buf, src_rows: &[usize], width: usize, dst: Buf) {
        let [src, dst] = self.arena.f32s([src, dst]);
        for (i, &r) in src_rows.iter().enumerate() {
            dst[i * width..(i + 1) * width].copy_from_slice(&src[r * width..(r + 1) * width]);
        }
    }

    fn rope(&mut self, x: Buf, step: &Step, n_heads: usize, head_dim: usize, rope: &RopeParams) {
        let freqs = rope.freqs.map(|f| self.vectors[f.0 as usize].as_slice());
        let x = self.arena.f32(x);
        let width = n_heads * head_dim;
        let rotated = rope.rotated.unwrap_or(head_dim);
        for (t, pos) in step.positions().enumerate() {
            let row = &mut x[t * width..(t + 1) * width];
            if let Some(yarn) = &rope.yarn {
                assert!(
                    rotated == head_dim && freqs.is_none(),
                    "YaRN rotates whole heads"
                );
                ops::rope_yarn(row, n_heads, head_dim, pos, rope.theta, rope.neox, yarn);
                continue;
            }
            if rotated == head_dim {
                ops::rope(row, n_heads, head_dim, pos, rope.theta, rope.neox, freqs);
                continue;
            }
            // Partial rope: the leading values of each head rotate among
            // themselves, with frequencies over their own width.
            for head in row.chunks_exact_mut(head_dim) {
                ops::rope(
                    &mut head[..rotated],
                    1,
                    rotated,
                    pos,
                    rope.theta,
                    rope.neox,
                    freqs,
                );
            }
        }
    }

    fn glu(&mut self, gate: Buf, up: Buf, rows: usize, width: usize, act: Glu) {
        let [gate, up] = self.arena.f32s([gate, up]);
        glu_rows(&mut gate[..rows * width], &up[..rows * width], act);
    }

    fn attention(&mut self, layer: usize, shape: &AttentionShape, step: &Step, io: AttentionIo) {
        let s = shape;
        let t_n = step.rows;
        let (qw, kw, vw) = (
            s.n_heads * s.key_dim,
            s.n_kv_heads * s.key_dim,
            s.n_kv_heads * s.value_dim,
        );
        let dtype = self.kv.dtype();
        let sinks = s.sinks.map(|id| self.vectors[id.0 as usize].as_slice());
        let [q, k, v, out, scratch] = self
            .arena
            .f32s([io.q, io.k, io.v, io.out, Buf::AttnScratch]);
        kv::round_to(dtype, &mut k[..t_n * kw], s.key_dim);
        kv::round_to(dtype, &mut v[..t_n * vw], s.value_dim);
        if dtype == KvDtype::F16 {
            // As llama.cpp multiplies q with an f16 K cache: in f16.
            kv::round_to(KvDtype::F16, &mut q[..t_n * qw], s.key_dim);
        }
        attention::attend(
            &self.pool,
            s,
            step,
            &self.kv,
            layer,
            attention::Buffers {
                q: &q[..t_n * qw],
                k: &k[..t_n * kw],
                v: &v[..t_n * vw],
                out: &mut out[..t_n * s.n_heads * s.value_dim],
                scratch,
                sinks,
            },
        );
    }

    fn kv_write(&mut self, layer: usize, step: &Step, k: Buf, v: Buf, shape: &AttentionShape) {
        let (kw, vw) = (
            shape.n_kv_heads * shape.key_dim,
            shape.n_kv_heads * shape.value_dim,
        );
        let [k, v] = self.arena.f32s([k, v]);
        let mut row = 0;
        for seq in step.seqs {
            for i in 0..seq.tokens {
                let t = row + i;
                self.kv.write(
                    seq.tables,
                    layer,
                    seq.start + i,
                    &k[t * kw..(t + 1) * kw],
                    &v[t * vw..(t + 1) * vw],
                );
            }
            row += seq.tokens;
        }
    }

    fn route_experts(
        &mut self,
        logits: Buf,
        rows: usize,
        n_experts: usize,
        k: usize,
        normalize: bool,
    ) {
        let [logits, all] = self.arena.get([logits, Buf::ExpertRoutes]);
        let (logits, all) = (arena::f32s(logits), routes(all));
        for t in 0..rows {
            let logits = &mut logits[t * n_experts..(t + 1) * n_experts];
            ops::softmax(logits);
            let chosen = &mut all[t * k..(t + 1) * k];
            for slot in chosen.iter_mut() {
                let (best, &p) = logits
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .expect("experts exist");
                *slot = Route {
                    expert: best as u32,
                    weight: p,
                };
                logits[best] = f32::NEG_INFINITY;
            }
            if normalize {
                let total: f32 = chosen.iter().map(|r| r.weight).sum();
                chosen.iter_mut().for_each(|r| r.weight /= total);
            }
        }
    }

    fn routed_experts(&mut self, ffn: &crate::RoutedFfn, x: Buf, rows: usize, out: Buf) {
        if !self.grouped_experts(ffn, x, rows, out) {
            crate::experts_by_gather(self, ffn, x, rows, out);
        }
    }

    fn gather_expert_rows(
        &mut self,
        expert: usize,
        rows: usize,
        k: usize,
        src: Buf,
        width: usize,
        dst: Buf,
    ) -> usize {
        let [all, src, dst] = self.arena.get([Buf::ExpertRoutes, src, dst]);
        let (all, src, dst) = (routes(all), arena::f32s(src), arena::f32s(dst));
        let mut n = 0;
        for (i, (t, _)) in routed_rows(all, rows, k, expert).enumerate() {
            dst[i * width..(i + 1) * width].copy_from_slice(&src[t * width..(t + 1) * width]);
            n = i + 1;
        }
        n
    }

    fn scatter_expert_rows(
        &mut self,
        expert: usize,
        rows: usize,
        k: usize,
        src: Buf,
        width: usize,
        dst: Buf,
    ) {
        let [all, src, dst] = self.arena.get([Buf::ExpertRoutes, src, dst]);
        let (all, src, dst) = (routes(all), arena::f32s(src), arena::f32s(dst));
        for (i, (t, weight)) in routed_rows(all, rows, k, expert).enumerate() {
            ops::axpy(
                &mut dst[t * width..(t + 1) * width],
                weight,
                &src[i * width..(i + 1) * width],
            );
        }
    }

    fn zero(&mut self, x: Buf, rows: usize, width: usize) {
        self.arena.f32(x)[..rows * width].fill(0.0);
    }

    fn runs_hybrid(&self) -> bool {
        Features::of(Device::Cpu, 1).hybrid
    }

    fn runs_gpt_oss(&self) -> bool {
        Features::of(Device::Cpu, 1).gpt_oss
    }

    fn gated_delta_rule(
        &mut self,
        linear_layer: usize,
        shape: &LinearShape,
        weights: &LinearWeights,
        step: &Step,
        states: &[usize],
        io: LinearIo,
    ) {
        let store = self
            .recurrent
            .as_mut()
            .expect("a hybrid model's plan has a recurrent_state term");
        let v = |id: VectorId| self.vectors[id.0 as usize].as_slice();
        let w = linear::Weights {
            conv: v(weights.conv),
            dt_bias: v(weights.dt_bias),
            decay: v(weights.decay),
        };
        let [qkv, alpha, beta, out] = self.arena.f32s([io.qkv, io.alpha, io.beta, io.out]);
        let rows = linear::Rows {
            qkv,
            alpha,
            beta,
            out,
        };
        linear::run(
            &self.pool,
            store,
            linear_layer,
            shape,
            &w,
            step.seqs,
            states,
            rows,
        );
    }

    fn split_heads(&mut self, x: Buf, rows: usize, heads: usize, head_dim: usize, a: Buf, b: Buf) {
        let [x, a, b] = self.arena.f32s([x, a, b]);
        let n = rows * heads;
        let pairs = x[..n * 2 * head_dim].chunks_exact(2 * head_dim);
        let outs = a[..n * head_dim]
            .chunks_exact_mut(head_dim)
            .zip(b[..n * head_dim].chunks_exact_mut(head_dim));
        for (pair, (a, b)) in pairs.zip(outs) {
            a.copy_from_slice(&pair[..head_dim]);
            b.copy_from_slice(&pair[head_dim..]);
        }
    }

    fn add_gated_rows(&mut self, dst: Buf, src: Buf, gate: Buf, rows: usize, width: usize) {
        let [dst, src, gate] = self.arena.f32s([dst, src, gate]);
        let n = rows * width;
        let pairs = dst[..n]
            .chunks_exact_mut(width)
            .zip(src[..n].chunks_exact(width));
        for ((d, s), &g) in pairs.zip(&gate[..rows]) {
            ops::axpy(d, 1.0 / (1.0 + (-g).exp()), s);
        }
    }

    fn sigmoid_gate(&mut self, gate: Buf, x: Buf, rows: usize, width: usize) {
        let [gate, x] = self.arena.f32s([gate, x]);
        for (g, &v) in gate[..rows * width].iter_mut().zip(&x[..rows * width]) {
            *g = v / (1.0 + (-*g).exp());
        }
    }

    fn runs_scaled_rows(&self) -> bool {
        Features::of(Device::Cpu, 1).scaled_rows
    }

    fn head_norm_unweighted(
        &mut self,
        x: Buf,
        eps: f32,
        rows: usize,
        width: usize,
        head_dim: usize,
    ) {
        assert!(head_dim <= MAX_HEAD_DIM, "head dim {head_dim}");
        const ONES: [f32; MAX_HEAD_DIM] = [1.0; MAX_HEAD_DIM];
        let mut tmp = [0f32; MAX_HEAD_DIM];
        for head in self.arena.f32(x)[..rows * width].chunks_exact_mut(head_dim) {
            tmp[..head_dim].copy_from_slice(head);
            ops::rms_norm(&tmp[..head_dim], &ONES[..head_dim], eps, head);
        }
    }

    fn scale(&mut self, x: Buf, factor: f32, rows: usize, width: usize) {
        ops::scale(&mut self.arena.f32(x)[..rows * width], factor);
    }

    fn softcap(&mut self, x: Buf, cap: f32, rows: usize, width: usize) {
        for v in &mut self.arena.f32(x)[..rows * width] {
            *v = cap * (*v / cap).tanh();
        }
    }

    fn logits(&mut self, rows: usize, width: usize) -> &mut [f32] {
        // Host memory already: the arena's own buffer.
        &mut self.arena.f32(Buf::Logits)[..rows * width]
    }
}

/// The rows of a step routed to `expert` (in row order, the order its
/// gathered rows take) and each one's route weight.
/// `gate = act(gate) × up`, value by value.
fn glu_rows(gate: &mut [f32], up: &[f32], act: Glu) {
    match act {
        Glu::Silu => ops::silu_mul(gate, up),
        Glu::GeluTanh => ops::gelu_tanh_mul(gate, up),
        Glu::SwigluOai => ops::swiglu_oai_mul(gate, up),
    }
}

/// Adds `b` to each of `x`'s rows of `width` values.
fn add_to_rows(x: &mut [f32], b: &[f32], width: usize) {
    for row in x.chunks_exact_mut(width) {
        ops::add(row, b);
    }
}

fn routed_rows(
    routes: &[Route],
    rows: usize,
    k: usize,
    expert: usize,
) -> impl Iterator<Item = (usize, f32)> + '_ {
    (0..rows).filter_map(move |t| {
        routes[t * k..(t + 1) * k]
            .iter()
            .find(|r| r.expert as usize == expert)
            .map(|r| (t, r.weight))
    })
}

/// `MemAvailable` and `MemTotal` from /proc/meminfo (0 where unreadable).
fn host_memory() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let bytes = |key| proc_kib(&text, key).map_or(0, |kib| kib.saturating_mul(1024));
    (bytes("MemAvailable"), bytes("MemTotal"))
}
