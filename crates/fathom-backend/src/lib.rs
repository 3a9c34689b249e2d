//! The backend seam: one interface of device buffers and ops that the
//! engine's forward pass is written against, and one implementation per
//! device (`cpu`, `cuda`; [`open`] picks one by the plan's device, and
//! [`devices`] says which kinds this build runs).
//!
//! A backend owns every byte the plan lists for its device, allocated once
//! when it is created: the activation arena (one allocation, carved at the
//! plan's offsets, addressed by [`Buf`] ids), the KV block storage (one
//! allocation per layer group), and the weights it was handed. Nothing an
//! op does allocates. The engine keeps everything device-free on the host:
//! KV block bookkeeping (page tables, reference counts, prefix index),
//! sampling, tokenization.
//!
//! Ops work on all rows of a step at once. A buffer holds rows of one
//! width, packed (`row r` starts at element `r × width`); which width is
//! the caller's business, as with the plan's `activation_detail`.

pub mod cpu;
pub mod cuda;
mod error;
mod host;
pub mod hybrid;
pub mod parallel;
mod registry;
mod shard;
mod split_clock;

use fathom_plan::kv::KvGroup;
pub use fathom_plan::placement::Place;
use fathom_plan::recurrent::RecurrentPlan;
use fathom_plan::KvDtype;

pub use error::BackendError;
pub use fathom_kernels::ops::Yarn;
pub use fathom_kernels::WeightType;
pub use fathom_plan::activations::Buf;
pub use host::{HostBytes, HostMatrix, MatrixStorage, MatrixView};
pub use registry::{devices, open, DeviceKind, Features};

/// A greedy sampler's pick from one row of logits, `[plain, with banned]`:
/// the index of the first largest value, NaN skipped (0 when there is
/// none); then that index again unless it is in `banned`, else the first
/// largest with the banned ids counted as −∞ (the sampler's candidate
/// pass).
pub fn greedy_pick(row: &[f32], banned: &[u32]) -> [u32; 2] {
    let plain = fathom_kernels::ops::argmax(row) as u32;
    if !banned.contains(&plain) {
        return [plain, plain];
    }
    let mut best: Option<(u32, f32)> = None;
    for (i, &v) in row.iter().enumerate() {
        let i = i as u32;
        let v = if banned.contains(&i) {
            f32::NEG_INFINITY
        } else {
            v
        };
        if !v.is_nan() && best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    [plain, best.map_or(0, |(i, _)| i)]
}

/// A MoE layer's routed experts as [`Backend::routed_experts`] runs them.
#[derive(Debug, Clone, Copy)]
pub struct RoutedFfn<'a> {
    /// Per expert its gated FFN, `[gate, up, down]`.
    pub experts: &'a [[MatrixId; 3]],
    /// Experts each row is routed to.
    pub k: usize,
    pub act: Glu,
    /// Values of a row of the input and of the output.
    pub width: usize,
    /// Each expert's FFN width.
    pub ffn_width: usize,
    /// Per expert the biases of its gate, up and down projections
    /// (gpt-oss), added before the activation and to the output; only
    /// backends that [`Backend::runs_gpt_oss`] take them.
    pub biases: Option<&'a [[VectorId; 3]]>,
}

/// [`Backend::routed_experts`] an expert at a time: its rows gathered into
/// [`Buf::MoeIn`], its FFN over them into [`Buf::MoeOut`], and those
/// added back to their rows of `out` (zeroed first), weighted.
pub fn experts_by_gather<B: Backend + ?Sized>(
    b: &mut B,
    ffn: &RoutedFfn,
    x: Buf,
    rows: usize,
    out: Buf,
) {
    let (k, width) = (ffn.k, ffn.width);
    b.zero(out, rows, width);
    for (e, &[gate, up, down]) in ffn.experts.iter().enumerate() {
        let n = b.gather_expert_rows(e, rows, k, x, width, Buf::MoeIn);
        if n == 0 {
            continue;
        }
        let f = ffn.ffn_width;
        match ffn.biases.map(|all| all[e]) {
            None => {
                let glu_out = [Buf::FfnGate, Buf::FfnUp];
                b.matmul_glu([gate, up], Buf::MoeIn, n, ffn.act, glu_out, f);
                b.matmul(down, Buf::FfnGate, n, Buf::MoeOut);
            }
            Some([bg, bu, bd]) => {
                b.matmul_many(&[gate, up], Buf::MoeIn, n, &[Buf::FfnGate, Buf::FfnUp]);
                b.add_bias(Buf::FfnGate, bg, n, f);
                b.add_bias(Buf::FfnUp, bu, n, f);
                b.glu(Buf::FfnGate, Buf::FfnUp, n, f, ffn.act);
                b.matmul(down, Buf::FfnGate, n, Buf::MoeOut);
                b.add_bias(Buf::MoeOut, bd, n, width);
            }
        }
        b.scatter_expert_rows(e, rows, k, Buf::MoeOut, width, out);
    }
}

/// [`greedy_pick`] of each `width`-long row of `logits`, into `out`.
pub fn greedy_from_rows(logits: &[f32], width: usize, banned: &[u32], out: &mut [[u32; 2]]) {
    for (row, o) in logits.chunks_exact(width).zip(out) {
        *o = greedy_pick(row, banned);
    }
}

/// The variables the backends, their build and their GPU test scripts
/// read, with their defaults (docs/environment-variables.md has the rules).
pub const ENV_VARS: &[(&str, &str)] = &[
    ("FATHOM_CUDA_LIB_DIR", "unset"),
    ("FATHOM_CUDA_GRAPHS", "1"),
    ("FATHOM_CUDA_MMA_FEW", "1"),
    ("FATHOM_CUDA_PDL", "1"),
    ("FATHOM_CUDA_PREFETCH", "4194304"),
    ("FATHOM_SPLIT_STREAM_ROWS", "32"),
    ("FATHOM_SPLIT_PIN_WEIGHTS", "1"),
    ("FATHOM_SPLIT_PROFILE", "unset"),
    ("FATHOM_NCCL_LIB_DIR", "unset"),
    ("FATHOM_NVCC", "unset"),
    (
        "FATHOM_CUDA_TOOLCHAIN",
        "~/.cache/fathom/cuda-toolchain-13.0",
    ),
    ("FATHOM_REQUIRE_GPU", "unset"),
    ("FATHOM_GPU_CARRY", ".gpu-carry"),
    ("FATHOM_SANITIZE", "unset"),
    ("FATHOM_SANITIZE_S", "240"),
    ("FATHOM_BIN", "the fathom built with the tests"),
];

/// A weight matrix the backend holds (handed out by [`Backend::load_matrix`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatrixId(pub u32);

/// A 1-D f32 weight (norm or bias) the backend holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VectorId(pub u32);

/// What each device of a tensor-parallel group holds of a weight
/// (`fathom_plan::tensor_parallel` says which weight splits which way). A
/// backend of one device holds every weight whole, whatever the split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// The whole weight on every device (norms, embeddings, output head,
    /// router).
    Whole,
    /// By output features, in `parts` equal ranges of rows (q, k, v, FFN
    /// gate and up, their biases). Device `d` of `n` holds range
    /// `d × parts / n`: with fewer KV heads than devices (`parts < n`), a
    /// KV head is held by `n / parts` devices.
    Outputs { parts: usize },
    /// By input features: each device a range of every row's columns
    /// (attention output and FFN down); the devices' partial products are
    /// summed by [`Backend::all_reduce`].
    Inputs,
}

/// Memory of the device a backend runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    pub free: u64,
    pub total: u64,
}

/// The gated activation of a GLU feed-forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Glu {
    /// silu(gate) × up (SwiGLU).
    Silu,
    /// gelu_tanh(gate) × up (GeGLU).
    GeluTanh,
    /// gpt-oss's clamped SwiGLU ([`fathom_kernels::ops::swiglu_oai_mul`]);
    /// only backends that [`Backend::runs_gpt_oss`] run it.
    SwigluOai,
}

/// One sequence's part of a step: `tokens` rows at positions
/// `start .. start + tokens`, with the sequence's page tables (one per KV
/// group, block ids in position order).
#[derive(Debug, Clone, Copy)]
pub struct StepSeq<'a> {
    pub start: usize,
    pub tokens: usize,
    pub tables: &'a [Vec<u32>],
}

/// What every op of a step shares: its sequences, in row order.
#[derive(Debug, Clone, Copy)]
pub struct Step<'a> {
    pub seqs: &'a [StepSeq<'a>],
    /// Rows of the step: the sum of the sequences' tokens.
    pub rows: usize,
}

impl Step<'_> {
    /// Position of every row, in row order.
    pub fn positions(&self) -> impl Iterator<Item = usize> + '_ {
        self.seqs.iter().flat_map(|s| s.start..s.start + s.tokens)
    }
}

/// Rope for one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeParams {
    pub theta: f32,
    /// Rotate the two halves of a head (NeoX) rather than adjacent pairs.
    pub neox: bool,
    /// Per-pair frequency divisors (Llama 3), `head_dim / 2` values.
    pub freqs: Option<VectorId>,
    /// Leading values of each head that rotate (NeoX pairs within them,
    /// frequencies over them), the rest passing through (Qwen3.5 rotates a
    /// quarter); `None` rotates the whole head. Only backends that
    /// [`Backend::runs_hybrid`] honour it.
    pub rotated: Option<usize>,
    /// YaRN scaling (gpt-oss); only backends that
    /// [`Backend::runs_gpt_oss`] honour it.
    pub yarn: Option<Yarn>,
}

/// A linear-attention layer (the gated delta rule of Qwen3.5): `key_heads`
/// query/key heads and `value_heads` value heads of `head_dim` values, a
/// causal convolution of `conv_kernel` taps over q, k and v side by side.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearShape {
    pub key_heads: usize,
    pub value_heads: usize,
    pub head_dim: usize,
    pub conv_kernel: usize,
    /// Added to the sum of squares when q and k are scaled to unit length.
    pub eps: f32,
    /// How the value heads are laid out among the key heads.
    pub value_order: ValueOrder,
}

/// Which key head a value head reads, when `value_heads / key_heads` of
/// them share one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueOrder {
    /// Value head h reads key head `h mod key_heads` (llama.cpp's GGUF:
    /// its converter reorders the heads so ggml can broadcast).
    Tiled,
    /// Each key head's value heads are together: value head h reads key
    /// head `h / (value_heads / key_heads)` (Hugging Face's files).
    Grouped,
}

impl LinearShape {
    /// The key head value head `h` reads: `(h / stride) mod key_heads`
    /// with [`Self::key_head_stride`].
    pub fn key_head(&self, h: usize) -> usize {
        (h / self.key_head_stride()) % self.key_heads
    }

    /// How many consecutive value heads share a key head: 1 when tiled.
    pub fn key_head_stride(&self) -> usize {
        match self.value_order {
            ValueOrder::Tiled => 1,
            ValueOrder::Grouped => (self.value_heads / self.key_heads.max(1)).max(1),
        }
    }

    /// Channels of the convolution: q, k, then v.
    pub fn channels(&self) -> usize {
        (2 * self.key_heads + self.value_heads) * self.head_dim
    }
}

/// A linear-attention layer's small weights, as f32 vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearWeights {
    /// The convolution's taps, `conv_kernel` a channel (oldest first).
    pub conv: VectorId,
    /// Added to each value head's decay input before the softplus.
    pub dt_bias: VectorId,
    /// Each value head's decay rate (−exp(A_log), negative).
    pub decay: VectorId,
}

/// The buffers of [`Backend::gated_delta_rule`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearIo {
    /// Rows of q, k and v before the convolution ([`LinearShape::channels`]
    /// wide); overwritten with the convolution's output.
    pub qkv: Buf,
    /// Each value head's decay input (`value_heads` a row).
    pub alpha: Buf,
    /// Each value head's update-rate input, before its sigmoid.
    pub beta: Buf,
    /// The recurrence's output, `value_heads × head_dim` a row.
    pub out: Buf,
}

/// One layer's attention shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
    /// Sliding window, or `None` for full attention.
    pub window: Option<usize>,
    /// Logit scale (1/√key_dim unless the model says otherwise).
    pub scale: f32,
    /// One learned logit per query head that joins each softmax's
    /// denominator and weights no value (gpt-oss's attention sinks); only
    /// backends that [`Backend::runs_gpt_oss`] honour it.
    pub sinks: Option<VectorId>,
}

/// The buffers of one attention op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionIo {
    pub q: Buf,
    pub k: Buf,
    pub v: Buf,
    pub out: Buf,
}

/// Where each model layer's KV lives: the plan's groups, the KV dtype, and
/// each layer's group (`None` for a layer without KV), as
/// `fathom_plan::kv::layer_groups` forms them; and a hybrid model's
/// recurrent-state slots, as the plan sized them.
#[derive(Debug, Clone)]
pub struct KvLayout {
    pub groups: Vec<KvGroup>,
    pub dtype: KvDtype,
    pub layer_groups: Vec<Option<usize>>,
    pub recurrent: Option<RecurrentPlan>,
}

impl KvLayout {
    /// Each layer's (group, index within the group).
    pub fn layer_slots(&self) -> Vec<Option<(usize, usize)>> {
        let mut seen = vec![0usize; self.groups.len()];
        self.layer_groups
            .iter()
            .map(|g| {
                g.map(|group| {
                    let index = seen[group];
                    seen[group] += 1;
                    (group, index)
                })
            })
            .collect()
    }
}

/// The device side of a forward pass.
///
/// Buffers are the plan's activation buffers ([`Buf`]); widths and row
/// counts are the caller's, and an op never reads or writes past
/// `rows × width` of a buffer. Implementations check bounds and panic on a
/// caller's mistake (the engine sizes every call from the same plan).
pub trait Backend: Send {
    /// `cpu`, `cuda`, ...
    fn name(&self) -> &'static str;

    /// Free and total memory of the device.
    fn memory(&self) -> DeviceMemory;

    /// Whether the backend reads weights in host memory while it runs
    /// (the CPU, in place through the mmap). A GPU copies them at load, so
    /// the engine lets the mapped pages go once the model is loaded.
    fn reads_host_weights(&self) -> bool {
        true
    }

    /// Takes a weight matrix in its stored format (on a GPU: copies it
    /// into the device allocation).
    fn load_matrix(&mut self, matrix: HostMatrix) -> Result<MatrixId, BackendError>;

    /// Takes a 1-D f32 weight (norm, bias, rope factors).
    fn load_vector(&mut self, values: &[f32]) -> Result<VectorId, BackendError>;

    /// Bytes of the room for a host matrix copied here to multiply
    /// ([`Backend::stream_matrices`]): a split model's device plan's
    /// `streamed` region; 0 where the backend streams none.
    fn stream_room(&self) -> u64 {
        0
    }

    /// Copies `matrices`, which stay on the host, one after another into
    /// the room (replacing what the last call copied) and puts their ids
    /// in `ids`, in order, good until the next call: matrices of one
    /// shape and type lie evenly there, as a layer's experts must. A split
    /// model's large steps multiply the host layers' matrices on the GPU
    /// this way, as a copy costs less than the host's products.
    fn stream_matrices(
        &mut self,
        _matrices: &mut dyn Iterator<Item = &HostMatrix>,
        _ids: &mut [MatrixId],
    ) -> Result<(), BackendError> {
        Err(BackendError::Device {
            backend: self.name(),
            message: "this backend has no room for host matrices".into(),
        })
    }

    /// Room for the ids of up to `matrices` matrices streamed by one
    /// [`Backend::stream_matrices`] call, made at load so that no step's
    /// call grows a list.
    fn reserve_streamed(&mut self, _matrices: usize) {}

    /// Every weight is loaded: what a backend deferred until the whole
    /// set is known happens here (a split model page-locks its streamed
    /// host matrices).
    fn finish_load(&mut self) {}

    /// Page-locks the `len` bytes at `ptr` (host memory this backend's
    /// copies read and write: a split model's host arena, or its host
    /// matrices, which may be mapped read-only) so that they copy at the
    /// bus's speed, not through a driver buffer; false where the backend
    /// does not (or cannot), which changes nothing else.
    ///
    /// # Safety
    /// The memory stays allocated until [`Backend::unpin_host`] is called
    /// with `ptr`, which must be before this backend is dropped.
    unsafe fn pin_host(&mut self, _ptr: *mut u8, _len: usize) -> bool {
        false
    }

    /// Undoes [`Backend::pin_host`] of `ptr`.
    ///
    /// # Safety
    /// `ptr` was pinned by this backend and is still allocated.
    unsafe fn unpin_host(&mut self, _ptr: *mut u8) {}

    /// Host matrices multiplied on the device so far (a split model's
    /// large steps; 0 for a backend that is not split).
    fn streamed_matrices(&self) -> u64 {
        0
    }

    /// Devices the backend spreads a model over (tensor parallelism); the
    /// engine runs each layer on a `1 / devices()` share of the heads and
    /// FFN columns.
    fn devices(&self) -> usize {
        1
    }

    /// Takes a weight matrix split over the devices as `split` says; one
    /// device takes it whole.
    fn load_split_matrix(
        &mut self,
        matrix: HostMatrix,
        _split: Split,
    ) -> Result<MatrixId, BackendError> {
        self.load_matrix(matrix)
    }

    /// Takes a 1-D weight split like its matrix (a column-split bias).
    fn load_split_vector(
        &mut self,
        values: &[f32],
        _split: Split,
    ) -> Result<VectorId, BackendError> {
        self.load_vector(values)
    }

    /// Sums `rows × width` values of `x` over the devices, leaving the sum
    /// on each (after a row-split projection); nothing to do on one device.
    fn all_reduce(&mut self, _x: Buf, _rows: usize, _width: usize) {}

    /// `out[r] = scale × table[tokens[r]]` (rows of `table.cols` values).
    /// Token ids are below the table's rows (the engine checks).
    fn embed(&mut self, table: MatrixId, tokens: &[u32], scale: f32, out: Buf);

    /// `out = x · wᵀ` for `rows` rows of `x` (w's `cols` wide) into rows of
    /// w's `rows` values.
    fn matmul(&mut self, w: MatrixId, x: Buf, rows: usize, out: Buf);

    /// Row-wise RMS norm: `out[r] = x[r] / rms(x[r]) × w`, `width` values
    /// a row.
    fn rms_norm(&mut self, x: Buf, w: VectorId, eps: f32, rows: usize, width: usize, out: Buf);

    /// RMS norm of every `head_dim` values of `rows × width` in place (q/k
    /// norms), with one weight of `head_dim` values.
    fn head_norm(
        &mut self,
        x: Buf,
        w: VectorId,
        eps: f32,
        rows: usize,
        width: usize,
        head_dim: usize,
    );

    /// `x[r] += b` for every row (`b` is `width` values).
    fn add_bias(&mut self, x: Buf, b: VectorId, rows: usize, width: usize);

    /// `dst[r] += src[r]` (residual add), `width` values a row.
    fn add(&mut self, dst: Buf, src: Buf, rows: usize, width: usize);

    /// Copies rows `src_rows[i]` of `src` to row `i` of `dst`.
    fn gather_rows(&mut self, src: Buf, src_rows: &[usize], width: usize, dst: Buf);

    /// Rotates every head of every row by its row's position in `step`.
    fn rope(&mut self, x: Buf, step: &Step, n_heads: usize, head_dim: usize, rope: &RopeParams);

    /// `gate[r] = act(gate[r]) × up[r]`, `width` values a row.
    fn glu(&mut self, gate: Buf, up: Buf, rows: usize, width: usize, act: Glu);

    /// Several projections of the same input (a layer's q, k and v):
    /// `outs[i] = x · ws[i]ᵀ`. A backend may run them in one pass; the
    /// default is one matmul each.
    fn matmul_many(&mut self, ws: &[MatrixId], x: Buf, rows: usize, outs: &[Buf]) {
        for (&w, &out) in ws.iter().zip(outs) {
            self.matmul(w, x, rows, out);
        }
    }

    /// A gated FFN's input side: `out = act(x · gateᵀ) × (x · upᵀ)`, with
    /// `up_out` as room for the up projection. A backend may fuse the two
    /// matmuls and the activation (one pass over both weights, no
    /// `up_out` traffic); the default is the three ops.
    fn matmul_glu(
        &mut self,
        [gate, up]: [MatrixId; 2],
        x: Buf,
        rows: usize,
        act: Glu,
        [out, up_out]: [Buf; 2],
        width: usize,
    ) {
        self.matmul(gate, x, rows, out);
        self.matmul(up, x, rows, up_out);
        self.glu(out, up_out, rows, width, act);
    }

    /// The residual add followed by the next norm: `dst[r] += src[r]`, then
    /// `out[r] = rms_norm(dst[r]) × w`. A backend may do both in one pass;
    /// the default is the two ops.
    #[allow(clippy::too_many_arguments)]
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
        self.add(dst, src, rows, width);
        self.rms_norm(dst, w, eps, rows, width, out);
    }

    /// Causal attention of `io.q` (rows × heads × key_dim) over layer
    /// `layer`'s cached positions before each sequence's `start` and the
    /// step's own `io.k` and `io.v` rows, into `io.out` (rows × heads ×
    /// value_dim). May round `q`, `k` and `v` in place to the cache's
    /// precision, so the step's rows read the same values the cache will
    /// hold.
    fn attention(&mut self, layer: usize, shape: &AttentionShape, step: &Step, io: AttentionIo);

    /// Stores the step's `k` and `v` rows in layer `layer`'s cache at their
    /// positions (after [`Backend::attention`] read them: a sliding
    /// window's ring may overwrite positions the step's first rows still
    /// attend to). The sequences' blocks are reserved.
    fn kv_write(&mut self, layer: usize, step: &Step, k: Buf, v: Buf, shape: &AttentionShape);

    /// A layer's attention from its projected rows: rope of `io.q` and
    /// `io.k`, [`Backend::attention`], then [`Backend::kv_write`] of the
    /// step's K and V. One call so that a GPU can run the rope, the
    /// rounding to the cache's precision and the cache store as one launch
    /// (at one token a step, launches are a fifth of a small model's time);
    /// the default is the four ops.
    fn attend(
        &mut self,
        layer: usize,
        shape: &AttentionShape,
        step: &Step,
        io: AttentionIo,
        rope: &RopeParams,
    ) {
        self.rope(io.q, step, shape.n_heads, shape.key_dim, rope);
        self.rope(io.k, step, shape.n_kv_heads, shape.key_dim, rope);
        self.attention(layer, shape, step, io);
        self.kv_write(layer, step, io.k, io.v, shape);
    }

    /// MoE routing: per row, the `k` experts of highest softmax(logits)
    /// (`n_experts` logits a row), with their probabilities (renormalized
    /// to sum to one when `normalize`), into [`Buf::ExpertRoutes`].
    fn route_experts(
        &mut self,
        logits: Buf,
        rows: usize,
        n_experts: usize,
        k: usize,
        normalize: bool,
    );

    /// Copies the rows routed to `expert` (by the last [`Backend::route_experts`])
    /// from `src` into consecutive rows of `dst`; returns how many.
    fn gather_expert_rows(
        &mut self,
        expert: usize,
        rows: usize,
        k: usize,
        src: Buf,
        width: usize,
        dst: Buf,
    ) -> usize;

    /// Adds each of `expert`'s output rows (`src`, in gathered order),
    /// weighted by its route probability, to its row of `dst`.
    fn scatter_expert_rows(
        &mut self,
        expert: usize,
        rows: usize,
        k: usize,
        src: Buf,
        width: usize,
        dst: Buf,
    );

    /// A MoE layer's routed experts, after [`Backend::route_experts`]: each
    /// of `rows` rows of `x` through its experts, the outputs weighted by
    /// the route probabilities and summed into `out`. A GPU may run the
    /// routes where they lie, without reading them back; the default runs
    /// each expert once over the rows routed to it ([`experts_by_gather`]).
    fn routed_experts(&mut self, ffn: &RoutedFfn, x: Buf, rows: usize, out: Buf) {
        experts_by_gather(self, ffn, x, rows, out);
    }

    /// Sets `rows × width` values of `x` to zero.
    fn zero(&mut self, x: Buf, rows: usize, width: usize);

    /// Whether the backend runs gpt-oss: attention sinks
    /// ([`AttentionShape::sinks`]), YaRN rope ([`RopeParams::yarn`]),
    /// [`Glu::SwigluOai`] and per-expert biases ([`RoutedFfn::biases`]).
    /// The engine refuses such a model on a backend that does not.
    fn runs_gpt_oss(&self) -> bool {
        false
    }

    /// Whether the backend runs hybrid models (Qwen3.5): the three ops
    /// below and partial rope ([`RopeParams::rotated`]). The engine refuses
    /// such a model on a backend that does not, so the defaults below are
    /// never reached.
    fn runs_hybrid(&self) -> bool {
        false
    }

    /// A linear-attention layer's recurrence for every row of the step,
    /// each sequence from its state slot (`states[i]` for `step.seqs[i]`;
    /// a sequence at position 0 starts from zero states): the causal
    /// convolution of `io.qkv` (rewritten with its SiLU'd output), q and k
    /// scaled to unit length, then per value head and token the gated
    /// delta rule — `S ← exp(g)·S`, `S ← S + β·(v − S·k)·kᵀ`,
    /// `out = S·q/√head_dim` with `g = decay·softplus(alpha + dt_bias)`
    /// and `β = sigmoid(beta)` — into `io.out`. Value head h reads key
    /// head [`LinearShape::key_head`]`(h)`.
    fn gated_delta_rule(
        &mut self,
        _linear_layer: usize,
        _shape: &LinearShape,
        _weights: &LinearWeights,
        _step: &Step,
        _states: &[usize],
        _io: LinearIo,
    ) {
        unreachable!("{} does not run hybrid models", self.name())
    }

    /// Splits each of `rows × heads` pieces of `x` (`2 × head_dim` values:
    /// a query, then its output gate) into `a` and `b`, `heads × head_dim`
    /// a row each.
    fn split_heads(
        &mut self,
        _x: Buf,
        _rows: usize,
        _heads: usize,
        _head_dim: usize,
        _a: Buf,
        _b: Buf,
    ) {
        unreachable!("{} does not run hybrid models", self.name())
    }

    /// `dst[r] += sigmoid(gate[r]) × src[r]`, `width` values a row of `dst`
    /// and `src` and one of `gate` (Qwen3.5 MoE's shared expert).
    fn add_gated_rows(&mut self, _dst: Buf, _src: Buf, _gate: Buf, _rows: usize, _width: usize) {
        unreachable!("{} does not run hybrid models", self.name())
    }

    /// `gate[r] = sigmoid(gate[r]) × x[r]`, `width` values a row (gated
    /// attention's output).
    fn sigmoid_gate(&mut self, _gate: Buf, _x: Buf, _rows: usize, _width: usize) {
        unreachable!("{} does not run hybrid models", self.name())
    }

    /// Whether the backend runs the three ops below (Gemma 4's block:
    /// values normed without a weight, a scalar on each layer's output, a
    /// softcap on the logits). The engine refuses a model that needs them
    /// on a backend that does not, so the defaults are never reached.
    fn runs_scaled_rows(&self) -> bool {
        false
    }

    /// RMS norm of every `head_dim` values of `rows × width` in place,
    /// without a weight.
    fn head_norm_unweighted(
        &mut self,
        _x: Buf,
        _eps: f32,
        _rows: usize,
        _width: usize,
        _head_dim: usize,
    ) {
        unreachable!("{} does not run unweighted head norms", self.name())
    }

    /// `x[r] *= factor`, `width` values a row.
    fn scale(&mut self, _x: Buf, _factor: f32, _rows: usize, _width: usize) {
        unreachable!("{} does not scale rows", self.name())
    }

    /// `x[r] = cap × tanh(x[r] / cap)`, `width` values a row.
    fn softcap(&mut self, _x: Buf, _cap: f32, _rows: usize, _width: usize) {
        unreachable!("{} does not softcap rows", self.name())
    }

    /// The first `rows × width` values of [`Buf::Logits`], on the host (a
    /// GPU copies them back into planned host memory), for the sampler to
    /// read and modify.
    fn logits(&mut self, rows: usize, width: usize) -> &mut [f32];

    /// Greedy picks from the first `rows` rows of [`Buf::Logits`] (`width`
    /// each), into `out`: per row the index of the first largest value, NaN
    /// skipped, and the pick with the `banned` ids — what the sampler's
    /// greedy path gives without and with `ignore_eos`
    /// ([`greedy_pick`]). A GPU computes them on the device and reads back 8
    /// bytes a row instead of the row's logits (at 64 rows of a 128k
    /// vocabulary, 33 MB and a host scan each step); the logits stay
    /// readable through [`Backend::logits`].
    fn greedy(&mut self, rows: usize, width: usize, banned: &[u32], out: &mut [[u32; 2]]) {
        greedy_from_rows(self.logits(rows, width), width, banned, out);
    }

    /// Makes `to` the side the next weights load on and the next ops run
    /// on, carrying the first `rows` rows of each `(buffer, width)` there
    /// from the side before: a backend over the host and a device (a model
    /// the plan's placement splits, [`hybrid::Hybrid`]); a backend of one
    /// device has one side and ignores it.
    fn switch_to(&mut self, _to: Place, _carry: &[(Buf, usize)], _rows: usize) {}

    /// Copies the first `rows × width` values of `x` into `out` (host
    /// memory): one side of a crossing between a device and the host.
    fn read_rows(&mut self, x: Buf, rows: usize, width: usize, out: &mut [f32]);

    /// Copies `values` (`rows × width`, host memory) into the first rows
    /// of `x`: the other side of a crossing. `step_start`: this is the
    /// step's first op on this backend (the host ran the ones before).
    fn write_rows(&mut self, x: Buf, rows: usize, width: usize, values: &[f32], step_start: bool);

    /// The first device error since the last call, if any. Ops return
    /// nothing (a GPU queues them), so a backend whose device can fail
    /// records the first failure, skips the ops after it, and hands the
    /// error out here; the engine asks after each step's
    /// [`Backend::greedy`] (and after [`Backend::logits`]), whose values are
    /// not to be trusted when this returns an error.
    fn take_error(&mut self) -> Option<BackendError> {
        None
    }
}
