//! A model split between a device and the host by the plan's placement:
//! one [`Backend`] over the CPU backend (the host's tensors, read in place,
//! the host layers' KV, the host arena) and a device backend (the rest),
//! each allocated from its own side of the plan.
//!
//! The engine says where each group of weights loads and each run of ops
//! goes with [`Backend::switch_to`], carrying the rows that are live at
//! that point (the residual at a layer boundary; a MoE layer's normed
//! input and router logits to its experts and their output back). Every
//! other op runs on the current side; a weight op checks that its weight
//! lives there. Weight ids are this backend's own, mapped to each side's.
//! Like its KV, a linear-attention layer's recurrent state lives on the
//! side that runs the layer: each side holds its own layers' states (the
//! engine numbers them among the side's layers) in slots of the same ids.
//!
//! A step of many rows (a prefill chunk) multiplies the host layers'
//! matrices on the device: each is copied into the device plan's
//! `streamed` room ([`Backend::stream_matrices`]), its input rows cross to
//! the device and its products back. Copying a matrix costs the same at
//! any row count and the host's products grow with the rows, so from
//! [`STREAM_ROWS`] rows (llama.cpp offloads from 32) the copy is the
//! cheaper; the rest of a host layer (norms, attention over its KV) stays
//! on the host.

use crate::cpu::CpuBackend;
use crate::split_clock::{Phase, SplitClock};
use crate::{
    AttentionIo, AttentionShape, Backend, BackendError, Buf, DeviceMemory, Glu, HostMatrix,
    LinearIo, LinearShape, LinearWeights, MatrixId, Place, RopeParams, RoutedFfn, Step, VectorId,
};

/// Rows from which a step multiplies host matrices on the device, unless
/// `FATHOM_SPLIT_STREAM_ROWS` says otherwise (`0`: never).
pub const STREAM_ROWS: usize = 32;

/// `FATHOM_SPLIT_STREAM_ROWS` as a row count (unset or unreadable: the
/// default; `0`: never stream).
fn stream_rows() -> usize {
    std::env::var("FATHOM_SPLIT_STREAM_ROWS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(STREAM_ROWS)
}

/// Whether the streamed host matrices are page-locked at load
/// (`FATHOM_SPLIT_PIN_WEIGHTS`, `0`: left pageable).
fn pin_weights() -> bool {
    std::env::var("FATHOM_SPLIT_PIN_WEIGHTS").map_or(true, |v| v.trim() != "0")
}

/// Page granularity of the pinned runs of host matrices.
const PAGE: usize = 4096;

/// The page-aligned address ranges `[start, end)` that cover `spans`
/// (address, length), in address order, spans whose pages overlap or
/// touch joined into one run (a layer's matrices, a file's host layers
/// share one). Each span lies wholly inside one run: the driver refuses a
/// copy from memory that is page-locked in part, and the matrices come in
/// id order, which is not the file's.
fn weight_runs(spans: impl Iterator<Item = (usize, usize)>) -> Vec<(usize, usize)> {
    let mut pages: Vec<(usize, usize)> = spans
        .filter(|&(_, len)| len > 0)
        .map(|(at, len)| (at / PAGE * PAGE, (at + len).div_ceil(PAGE) * PAGE))
        .collect();
    pages.sort_unstable();
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (start, end) in pages {
        match runs.last_mut() {
            Some(run) if start <= run.1 => run.1 = run.1.max(end),
            _ => runs.push((start, end)),
        }
    }
    runs
}

/// The host's CPU backend and a device backend driven as one.
pub struct Hybrid<D: Backend> {
    host: CpuBackend,
    device: D,
    /// Where the next op runs.
    side: Place,
    /// Each matrix id's side and id there.
    matrices: Vec<(Place, MatrixId)>,
    vectors: Vec<(Place, VectorId)>,
    /// Whether the device has run an op since the step's embedding.
    device_in_step: bool,
    /// Room for a MoE layer's expert ids (and gpt-oss's expert biases) as
    /// its side knows them (sized at load, reused each step).
    experts: Vec<[MatrixId; 3]>,
    expert_biases: Vec<[VectorId; 3]>,
    /// Each host matrix that fits the device's streamed room, by this
    /// backend's id (`None` for the rest).
    streamable: Vec<Option<HostMatrix>>,
    /// Steps of at least this many rows stream host matrices (0: none).
    stream_rows: usize,
    /// The buffer whose rows the device holds as the host does, since the
    /// last op that ran on the host (a streamed product's output, which
    /// the next streamed product may read).
    device_holds: Option<(Buf, usize)>,
    /// Host matrices streamed so far.
    streamed: u64,
    /// A failed copy of a host matrix (ops return nothing).
    error: Option<BackendError>,
    /// (rows, experts) of the host's last routing when the device routed
    /// the same logits too, for a large step's experts to run there
    /// streamed.
    route: Option<(usize, usize)>,
    /// Room for the device's ids of a layer's streamed experts (sized at
    /// load, reused each step).
    streamed_ids: Vec<MatrixId>,
    /// The starts of the runs of streamed host matrices the device
    /// page-locked at [`Backend::finish_load`] (unpinned on drop).
    pinned_runs: Vec<usize>,
    /// The host arena's address, when the device page-locked it for the
    /// crossings (kept as a number: only the device's unpin reads it).
    pinned: Option<usize>,
    /// Where the time goes (`FATHOM_SPLIT_PROFILE`).
    clock: SplitClock,
}

impl<D: Backend> Drop for Hybrid<D> {
    fn drop(&mut self) {
        if let Some(report) = self.clock.report() {
            eprint!("{report}");
        }
        // Before the fields drop: the arena is still allocated.
        if let Some(p) = self.pinned.take() {
            // SAFETY: `p` is the host arena, pinned by `device` in `new`;
            // `host`, which owns it, has not been dropped.
            unsafe { self.device.unpin_host(p as *mut u8) }
        }
        for p in self.pinned_runs.drain(..) {
            // SAFETY: `p` starts a run of host matrices pinned by `device`
            // in `finish_load`; `host` and `streamable`, whose matrices
            // keep the mapped files, have not been dropped.
            unsafe { self.device.unpin_host(p as *mut u8) }
        }
    }
}

impl<D: Backend> Hybrid<D> {
    /// `host` runs what the placement puts on the host, `device` the rest;
    /// the device side is current until the engine switches.
    pub fn new(mut host: CpuBackend, mut device: D) -> Self {
        let (arena, bytes) = host.arena_span();
        // SAFETY: the arena lives as long as `host`, which this backend
        // owns; `drop` unpins it first.
        let pinned = unsafe { device.pin_host(arena, bytes) }.then_some(arena as usize);
        let stream_rows = stream_rows();
        Hybrid {
            host,
            device,
            side: Place::Cuda,
            matrices: Vec::new(),
            vectors: Vec::new(),
            device_in_step: false,
            experts: Vec::new(),
            expert_biases: Vec::new(),
            streamable: Vec::new(),
            stream_rows,
            device_holds: None,
            streamed: 0,
            error: None,
            route: None,
            streamed_ids: Vec::new(),
            pinned_runs: Vec::new(),
            pinned,
            clock: SplitClock::from_env(if stream_rows > 0 {
                stream_rows
            } else {
                STREAM_ROWS
            }),
        }
    }

    /// The side that runs the next op.
    fn here(&mut self) -> &mut dyn Backend {
        match self.side {
            Place::Cpu => {
                // The host may write any buffer.
                self.device_holds = None;
                &mut self.host
            }
            Place::Cuda => {
                self.device_in_step = true;
                &mut self.device
            }
        }
    }

    /// Runs `f`, its time charged to `phase` when the host side runs it
    /// (`FATHOM_SPLIT_PROFILE`).
    fn on_host<R>(&mut self, phase: Phase, rows: usize, f: impl FnOnce(&mut Self) -> R) -> R {
        if self.side != Place::Cpu {
            return f(self);
        }
        let previous = self.clock.enter(phase, rows);
        let r = f(self);
        self.clock.leave(previous);
        r
    }

    fn matrix(&self, id: MatrixId) -> MatrixId {
        let (at, inner) = self.matrices[id.0 as usize];
        assert_eq!(
            at,
            self.side,
            "matrix {} lives on {} but the step is on {}",
            id.0,
            at.name(),
            self.side.name()
        );
        inner
    }

    fn vector(&self, id: VectorId) -> VectorId {
        let (at, inner) = self.vectors[id.0 as usize];
        assert_eq!(
            at,
            self.side,
            "vector {} lives on {} but the step is on {}",
            id.0,
            at.name(),
            self.side.name()
        );
        inner
    }

    /// `shape` with its sinks as the current side holds them.
    fn shape_here(&self, shape: &AttentionShape) -> AttentionShape {
        AttentionShape {
            sinks: shape.sinks.map(|s| self.vector(s)),
            ..*shape
        }
    }

    /// `rope` with its factors as the current side holds them.
    fn rope_here(&self, rope: &RopeParams) -> RopeParams {
        RopeParams {
            freqs: rope.freqs.map(|f| self.vector(f)),
            ..*rope
        }
    }

    /// Copies the first `rows × width` values of `x` from the current side
    /// to the other.
    fn carry(&mut self, x: Buf, rows: usize, width: usize) {
        match self.side {
            Place::Cpu => self.send_to_device(x, rows, width),
            Place::Cuda => self.send_to_host(x, rows, width),
        }
    }

    fn send_to_device(&mut self, x: Buf, rows: usize, width: usize) {
        let start = !self.device_in_step;
        self.device
            .write_rows(x, rows, width, self.host.rows_mut(x, rows * width), start);
        self.device_in_step = true;
    }

    fn send_to_host(&mut self, x: Buf, rows: usize, width: usize) {
        self.device
            .read_rows(x, rows, width, self.host.rows_mut(x, rows * width));
    }

    /// Whether `w` is a host matrix the current step multiplies on the
    /// device: the host side runs it, the step has enough rows, and the
    /// matrix fits the device's room.
    fn streams(&self, w: MatrixId, rows: usize) -> bool {
        self.side == Place::Cpu
            && self.stream_rows > 0
            && rows >= self.stream_rows
            && self
                .streamable
                .get(w.0 as usize)
                .is_some_and(Option::is_some)
    }

    /// Whether a step's routed experts run on the device, streamed: the
    /// host side runs them, the step has enough rows, the host routed
    /// them for this step, they carry no biases (gpt-oss's stay on the
    /// host) and all of them fit the device's room together.
    fn streams_experts(&self, ffn: &RoutedFfn, rows: usize) -> bool {
        let all = ffn.experts.iter().flatten();
        self.side == Place::Cpu
            && self.stream_rows > 0
            && rows >= self.stream_rows
            && ffn.biases.is_none()
            && self.route == Some((rows, ffn.experts.len()))
            && all.clone().all(|w| self.streams(*w, rows))
            && all
                .filter_map(|w| self.streamable[w.0 as usize].as_ref())
                .flat_map(HostMatrix::ranges)
                .map(|r| r.len() as u64)
                .sum::<u64>()
                <= self.device.stream_room()
    }

    /// A layer's routed experts on the device, which routed them with the
    /// host ([`Backend::route_experts`]): its input rows cross, every
    /// expert's matrices are copied into the room (the gates, then the
    /// ups, then the downs, so each projection's experts lie evenly), and
    /// the weighted sum crosses back.
    fn streamed_experts(&mut self, ffn: &RoutedFfn, x: Buf, rows: usize, out: Buf) {
        let n = ffn.experts.len();
        self.send_to_device(x, rows, ffn.width);
        let mut ids = std::mem::take(&mut self.streamed_ids);
        let streamable = &self.streamable;
        let mut matrices = (0..3)
            .flat_map(|j| ffn.experts.iter().map(move |e| e[j]))
            .filter_map(|w| streamable[w.0 as usize].as_ref());
        let copied = self
            .device
            .stream_matrices(&mut matrices, &mut ids[..3 * n]);
        if let Err(e) = copied {
            self.error.get_or_insert(e);
            self.streamed_ids = ids;
            return;
        }
        let mut experts = std::mem::take(&mut self.experts);
        experts.clear();
        experts.extend((0..n).map(|e| [ids[e], ids[n + e], ids[2 * n + e]]));
        let on_device = RoutedFfn {
            experts: &experts,
            ..*ffn
        };
        self.device.routed_experts(&on_device, x, rows, out);
        self.experts = experts;
        self.streamed_ids = ids;
        self.streamed += 3 * n as u64;
        self.send_to_host(out, rows, ffn.width);
        self.device_holds = Some((out, rows));
    }

    /// `outs[i] = x · ws[i]ᵀ` on the device, each host matrix copied
    /// there: `x`'s rows cross once (unless the device holds them) and,
    /// when `back`, each product's rows cross back (the device keeps the
    /// last).
    fn streamed_matmuls(&mut self, ws: &[MatrixId], x: Buf, rows: usize, outs: &[Buf], back: bool) {
        let Some(Some(first)) = self.streamable.get(ws[0].0 as usize) else {
            return;
        };
        if self.device_holds != Some((x, rows)) {
            let cols = first.cols;
            self.send_to_device(x, rows, cols);
        }
        for (&w, &out) in ws.iter().zip(outs) {
            let Some(m) = self.streamable[w.0 as usize].as_ref() else {
                continue;
            };
            let width = m.rows;
            let mut on_device = [MatrixId(0)];
            match self
                .device
                .stream_matrices(&mut std::iter::once(m), &mut on_device)
            {
                Ok(()) => self.device.matmul(on_device[0], x, rows, out),
                Err(e) => {
                    self.error.get_or_insert(e);
                    return;
                }
            }
            self.streamed += 1;
            if back {
                self.send_to_host(out, rows, width);
                self.device_holds = Some((out, rows));
            }
        }
    }
}

impl<D: Backend> Backend for Hybrid<D> {
    fn name(&self) -> &'static str {
        self.device.name()
    }

    /// The device's: the host's memory is the host plan's business.
    fn memory(&self) -> DeviceMemory {
        self.device.memory()
    }

    /// The host side reads its weights in place (they stay mapped); the
    /// device copies its own.
    fn reads_host_weights(&self) -> bool {
        self.side == Place::Cpu
    }

    fn load_matrix(&mut self, matrix: HostMatrix) -> Result<MatrixId, BackendError> {
        let side = self.side;
        let room = self.device.stream_room();
        let inner = match side {
            Place::Cpu => {
                let fits = matrix.ranges().map(|r| r.len() as u64).sum::<u64>() <= room;
                self.streamable.push(fits.then(|| matrix.clone()));
                self.host.load_matrix(matrix)?
            }
            Place::Cuda => {
                self.streamable.push(None);
                self.device.load_matrix(matrix)?
            }
        };
        self.matrices.push((side, inner));
        // A MoE layer's experts are three matrices each: room for all of
        // a layer's ids is there before the first step.
        let room = self.matrices.len().div_ceil(3);
        if self.experts.capacity() < room {
            self.experts.reserve(room);
        }
        if side == Place::Cpu && self.streamed_ids.len() < self.matrices.len() {
            self.streamed_ids.resize(self.matrices.len(), MatrixId(0));
        }
        Ok(MatrixId(self.matrices.len() as u32 - 1))
    }

    fn streamed_matrices(&self) -> u64 {
        self.streamed
    }

    /// Reserves the device's ids for streamed matrices, and page-locks
    /// the streamed host matrices (unless
    /// `FATHOM_SPLIT_PIN_WEIGHTS=0`): a mapped file's pages copy through
    /// the driver's staging buffer otherwise, at a fraction of the bus's
    /// speed. Their pages are locked where they are (resident, as the host
    /// reads them anyway); where the driver refuses a run, it stays
    /// pageable.
    fn finish_load(&mut self) {
        self.host.finish_load();
        self.device.finish_load();
        self.clock.restart();
        if self.stream_rows == 0 {
            return;
        }
        // As many as the room holds of the smallest (a MoE layer's experts
        // are the most one call streams), at most every streamable one.
        let streamable = || self.streamable.iter().flatten();
        let fit = streamable()
            .map(|m| m.ranges().map(|r| r.len() as u64).sum::<u64>().max(1))
            .min()
            .map_or(0, |smallest| self.device.stream_room() / smallest);
        self.device
            .reserve_streamed((fit as usize).min(streamable().count()));
        if !pin_weights() {
            return;
        }
        let spans = streamable()
            .flat_map(HostMatrix::ranges)
            .map(|r| (r.bytes().as_ptr() as usize, r.len()));
        for (start, end) in weight_runs(spans) {
            // SAFETY: the run's pages belong to mapped files that the
            // host's matrices keep until this backend drops, which
            // unpins the run first.
            if unsafe { self.device.pin_host(start as *mut u8, end - start) } {
                self.pinned_runs.push(start);
            }
        }
    }

    fn load_vector(&mut self, values: &[f32]) -> Result<VectorId, BackendError> {
        let side = self.side;
        let inner = match side {
            Place::Cpu => self.host.load_vector(values)?,
            Place::Cuda => self.device.load_vector(values)?,
        };
        self.vectors.push((side, inner));
        // gpt-oss's expert biases are three vectors an expert.
        let room = self.vectors.len().div_ceil(3);
        if self.expert_biases.capacity() < room {
            self.expert_biases.reserve(room);
        }
        Ok(VectorId(self.vectors.len() as u32 - 1))
    }

    fn switch_to(&mut self, to: Place, carry: &[(Buf, usize)], rows: usize) {
        if to == self.side {
            return;
        }
        self.device_holds = None;
        self.clock.enter(Phase::Crossing, rows);
        for &(x, width) in carry {
            self.carry(x, rows, width);
        }
        self.side = to;
        let next = match to {
            Place::Cpu => Phase::HostOther,
            Place::Cuda => Phase::DeviceSide,
        };
        self.clock.enter(next, rows);
    }

    fn read_rows(&mut self, x: Buf, rows: usize, width: usize, out: &mut [f32]) {
        self.here().read_rows(x, rows, width, out)
    }

    fn write_rows(&mut self, x: Buf, rows: usize, width: usize, values: &[f32], start: bool) {
        self.here().write_rows(x, rows, width, values, start)
    }

    fn embed(&mut self, table: MatrixId, tokens: &[u32], scale: f32, out: Buf) {
        // A step begins: the device has run nothing of it yet.
        self.device_in_step = false;
        let table = self.matrix(table);
        self.here().embed(table, tokens, scale, out)
    }

    fn matmul(&mut self, w: MatrixId, x: Buf, rows: usize, out: Buf) {
        if self.streams(w, rows) {
            return self.on_host(Phase::Streamed, rows, |s| {
                s.streamed_matmuls(&[w], x, rows, &[out], true)
            });
        }
        let w = self.matrix(w);
        self.on_host(Phase::HostProducts, rows, |s| {
            s.here().matmul(w, x, rows, out)
        })
    }

    fn matmul_many(&mut self, ws: &[MatrixId], x: Buf, rows: usize, outs: &[Buf]) {
        if ws.iter().all(|&w| self.streams(w, rows)) {
            return self.on_host(Phase::Streamed, rows, |s| {
                s.streamed_matmuls(ws, x, rows, outs, true)
            });
        }
        match *ws {
            [a, b, c] => {
                let inner = [self.matrix(a), self.matrix(b), self.matrix(c)];
                self.on_host(Phase::HostProducts, rows, |s| {
                    s.here().matmul_many(&inner, x, rows, outs)
                })
            }
            _ => {
                for (&w, &out) in ws.iter().zip(outs) {
                    self.matmul(w, x, rows, out);
                }
            }
        }
    }

    fn matmul_glu(
        &mut self,
        [gate, up]: [MatrixId; 2],
        x: Buf,
        rows: usize,
        act: Glu,
        out: [Buf; 2],
        width: usize,
    ) {
        if self.streams(gate, rows) && self.streams(up, rows) {
            // The activation on the device too: only its result crosses back.
            return self.on_host(Phase::Streamed, rows, |s| {
                s.streamed_matmuls(&[gate, up], x, rows, &out, false);
                s.device.glu(out[0], out[1], rows, width, act);
                s.send_to_host(out[0], rows, width);
                s.device_holds = Some((out[0], rows));
            });
        }
        let w = [self.matrix(gate), self.matrix(up)];
        self.on_host(Phase::HostProducts, rows, |s| {
            s.here().matmul_glu(w, x, rows, act, out, width)
        })
    }

    fn rms_norm(&mut self, x: Buf, w: VectorId, eps: f32, rows: usize, width: usize, out: Buf) {
        let w = self.vector(w);
        self.here().rms_norm(x, w, eps, rows, width, out)
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
        let w = self.vector(w);
        self.here().head_norm(x, w, eps, rows, width, head_dim)
    }

    fn add_bias(&mut self, x: Buf, b: VectorId, rows: usize, width: usize) {
        let b = self.vector(b);
        self.here().add_bias(x, b, rows, width)
    }

    fn add(&mut self, dst: Buf, src: Buf, rows: usize, width: usize) {
        self.here().add(dst, src, rows, width)
    }

    fn add_rms_norm(
        &mut self,
        dst: Buf,
        src: Buf,
        w: VectorId,
        eps: f32,
        rows: usize,
        width: usize,
        out: Buf,
    ) {
        let w = self.vector(w);
        self.here().add_rms_norm(dst, src, w, eps, rows, width, out)
    }

    fn gather_rows(&mut self, src: Buf, src_rows: &[usize], width: usize, dst: Buf) {
        self.here().gather_rows(src, src_rows, width, dst)
    }

    fn rope(&mut self, x: Buf, step: &Step, n_heads: usize, head_dim: usize, rope: &RopeParams) {
        let rope = self.rope_here(rope);
        self.here().rope(x, step, n_heads, head_dim, &rope)
    }

    fn glu(&mut self, gate: Buf, up: Buf, rows: usize, width: usize, act: Glu) {
        self.here().glu(gate, up, rows, width, act)
    }

    fn attention(&mut self, layer: usize, shape: &AttentionShape, step: &Step, io: AttentionIo) {
        let shape = self.shape_here(shape);
        self.on_host(Phase::HostAttention, step.rows, |s| {
            s.here().attention(layer, &shape, step, io)
        })
    }

    fn kv_write(&mut self, layer: usize, step: &Step, k: Buf, v: Buf, shape: &AttentionShape) {
        let shape = self.shape_here(shape);
        self.on_host(Phase::HostAttention, step.rows, |s| {
            s.here().kv_write(layer, step, k, v, &shape)
        })
    }

    fn attend(
        &mut self,
        layer: usize,
        shape: &AttentionShape,
        step: &Step,
        io: AttentionIo,
        rope: &RopeParams,
    ) {
        let (shape, rope) = (self.shape_here(shape), self.rope_here(rope));
        self.on_host(Phase::HostAttention, step.rows, |s| {
            s.here().attend(layer, &shape, step, io, &rope)
        })
    }

    fn route_experts(
        &mut self,
        logits: Buf,
        rows: usize,
        n_experts: usize,
        k: usize,
        normalize: bool,
    ) {
        // A large step's experts may run on the device: it routes the
        // logits too, before the host's routing overwrites them (it ranks
        // in place).
        self.route = None;
        let large = self.stream_rows > 0 && rows >= self.stream_rows;
        if self.side == Place::Cpu && large && self.device.stream_room() > 0 {
            self.send_to_device(logits, rows, n_experts);
            self.device
                .route_experts(logits, rows, n_experts, k, normalize);
            self.route = Some((rows, n_experts));
        }
        self.here()
            .route_experts(logits, rows, n_experts, k, normalize)
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
        self.here()
            .gather_expert_rows(expert, rows, k, src, width, dst)
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
        self.here()
            .scatter_expert_rows(expert, rows, k, src, width, dst)
    }

    fn routed_experts(&mut self, ffn: &RoutedFfn, x: Buf, rows: usize, out: Buf) {
        if self.streams_experts(ffn, rows) {
            return self.on_host(Phase::Streamed, rows, |s| {
                s.streamed_experts(ffn, x, rows, out)
            });
        }
        let mut experts = std::mem::take(&mut self.experts);
        experts.clear();
        experts.extend(ffn.experts.iter().map(|e| e.map(|m| self.matrix(m))));
        let mut biases = std::mem::take(&mut self.expert_biases);
        biases.clear();
        if let Some(all) = ffn.biases {
            biases.extend(all.iter().map(|b| b.map(|v| self.vector(v))));
        }
        let inner = RoutedFfn {
            experts: &experts,
            biases: ffn.biases.map(|_| biases.as_slice()),
            ..*ffn
        };
        self.on_host(Phase::HostProducts, rows, |s| {
            s.here().routed_experts(&inner, x, rows, out)
        });
        self.experts = experts;
        self.expert_biases = biases;
    }

    fn zero(&mut self, x: Buf, rows: usize, width: usize) {
        self.here().zero(x, rows, width)
    }

    /// What both sides run: a layer may run on either.
    fn runs_gpt_oss(&self) -> bool {
        self.host.runs_gpt_oss() && self.device.runs_gpt_oss()
    }

    fn runs_hybrid(&self) -> bool {
        self.host.runs_hybrid() && self.device.runs_hybrid()
    }

    /// Each side holds the states of its own layers, in slots of the same
    /// ids (the engine numbers `linear_layer` among the side's layers).
    fn gated_delta_rule(
        &mut self,
        linear_layer: usize,
        shape: &LinearShape,
        weights: &LinearWeights,
        step: &Step,
        states: &[usize],
        io: LinearIo,
    ) {
        let weights = LinearWeights {
            conv: self.vector(weights.conv),
            dt_bias: self.vector(weights.dt_bias),
            decay: self.vector(weights.decay),
        };
        self.on_host(Phase::HostAttention, step.rows, |s| {
            s.here()
                .gated_delta_rule(linear_layer, shape, &weights, step, states, io)
        })
    }

    fn split_heads(&mut self, x: Buf, rows: usize, heads: usize, head_dim: usize, a: Buf, b: Buf) {
        self.here().split_heads(x, rows, heads, head_dim, a, b)
    }

    fn add_gated_rows(&mut self, dst: Buf, src: Buf, gate: Buf, rows: usize, width: usize) {
        self.here().add_gated_rows(dst, src, gate, rows, width)
    }

    fn sigmoid_gate(&mut self, gate: Buf, x: Buf, rows: usize, width: usize) {
        self.here().sigmoid_gate(gate, x, rows, width)
    }

    fn runs_scaled_rows(&self) -> bool {
        self.host.runs_scaled_rows() && self.device.runs_scaled_rows()
    }

    fn head_norm_unweighted(
        &mut self,
        x: Buf,
        eps: f32,
        rows: usize,
        width: usize,
        head_dim: usize,
    ) {
        self.here()
            .head_norm_unweighted(x, eps, rows, width, head_dim)
    }

    fn scale(&mut self, x: Buf, factor: f32, rows: usize, width: usize) {
        self.here().scale(x, factor, rows, width)
    }

    fn softcap(&mut self, x: Buf, cap: f32, rows: usize, width: usize) {
        self.here().softcap(x, cap, rows, width)
    }

    fn logits(&mut self, rows: usize, width: usize) -> &mut [f32] {
        self.here().logits(rows, width)
    }

    fn greedy(&mut self, rows: usize, width: usize, banned: &[u32], out: &mut [[u32; 2]]) {
        self.here().greedy(rows, width, banned, out)
    }

    fn take_error(&mut self) -> Option<BackendError> {
        let device = self.device.take_error();
        let host = self.host.take_error();
        device.or(host).or(self.error.take())
    }
}

#[cfg(test)]
mod tests {
    use super::{weight_runs, PAGE};

    /// Spans out of address order, sharing pages and not: the runs are
    /// disjoint, in order, page-aligned, and each span lies inside one.
    #[test]
    fn weight_runs_are_disjoint_and_hold_each_span_whole() {
        let spans = [
            (5000, 100),
            (100, 200),
            (4200, 900),
            (40_000, 10),
            (9000, 0),
            (3 * PAGE - 8, 16),
        ];
        let runs = weight_runs(spans.into_iter());
        assert_eq!(runs, [(0, 4 * PAGE), (9 * PAGE, 10 * PAGE)]);
        for w in runs.windows(2) {
            assert!(w[0].1 <= w[1].0, "{runs:?}");
        }
        for (at, len) in spans.into_iter().filter(|s| s.1 > 0) {
            let holding = runs.iter().filter(|r| r.0 <= at && at + len <= r.1).count();
            assert_eq!(holding, 1, "span {at}+{len} in {runs:?}");
        }
    }
}
