//! The CUDA backend: the same ops as the CPU one on an NVIDIA GPU.
//!
//! **One allocation.** [`CudaBackend::new`] makes a single `cuMemAlloc`
//! and carves it, in this order: weights (a bump pointer, in load order),
//! the activation arena (at the plan's offsets), the KV storage of every
//! group, a hybrid model's recurrent states, cuBLAS's workspace (handed to cuBLAS with `cublasSetWorkspace`
//! so it allocates none of its own), and a small upload area for what the
//! host sends per op (page tables, positions, token ids, row lists).
//! Nothing is allocated afterwards: no stream-ordered pools, no per-op
//! buffers.
//!
//! **Loading.** Nothing of CUDA is touched until a backend is created (or
//! [`probe`] asks): libcuda is opened at run time by cudarc, cuBLAS by
//! [`blas`] from `FATHOM_CUDA_LIB_DIR`, `/usr/local/cuda/...` or the
//! loader's search. So one binary runs on machines without a GPU.
//!
//! **Kernels** are compiled at build time (build.rs, nvcc 13.0, sm_90 +
//! compute_90 PTX) and embedded; a build without the `cuda` feature has
//! none and refuses to start ([`BUILT`]). Quantized weights stay in their ggml or
//! MLX layout and are decoded inside the matmul kernels; F32 matrices go
//! through cuBLAS SGEMM.
//!
//! **Launches** are recorded and issued when the host needs a result; a
//! decode step that repeats is replayed as a CUDA graph ([`queue`]).
//!
//! **Errors.** Ops are queued on one stream and return nothing; the first
//! failure is kept, later ops are skipped, and [`Backend::take_error`]
//! hands it out. `logits()` synchronizes.

/// The kernel argument array: a pointer to each (local, mutable) argument
/// and its size (the launch queue copies the values).
macro_rules! args {
    ($($a:ident),* $(,)?) => {
        [$((std::ptr::addr_of_mut!($a) as *mut c_void, std::mem::size_of_val(&$a))),*]
    };
}

mod abi;
mod attention;
mod blas;
mod crossing;
mod device;
mod elementwise;
mod greedy;
pub(super) mod kernels;
mod launch;
mod linear;
mod matvec;
mod moe;
pub mod nccl;
mod norm;
pub mod nvml;
mod pinned;
mod queue;
mod rope_kv;
mod startup;
mod upload;
mod weights;

/// Whether this binary carries the CUDA kernels (the `cuda` cargo feature,
/// on by default). Without them `--device auto` picks the CPU and
/// [`CudaBackend::new`] refuses with [`NOT_BUILT`].
pub const BUILT: bool = cfg!(feature = "cuda");

/// Why a CUDA backend cannot start in a build without the `cuda` feature.
pub const NOT_BUILT: &str = "this fathom was built without CUDA (cargo feature `cuda` off, e.g. \
     `cargo build --no-default-features`); rebuild with default features (needs nvcc: \
     scripts/install-cuda-toolchain.sh) to use --device cuda";

pub use device::{device_count, probe, DeviceInfo};
pub use queue::GraphStats;
pub use startup::StartupMemory;

use attention::Readied;
use kernels::{kind_of_type, Kernels};
use upload::Upload;
use weights::DevMatrix;

use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, DriverError};

use fathom_plan::cuda::MoeGrouping;
use fathom_plan::Device;

use crate::{
    AttentionIo, AttentionShape, Backend, BackendError, Buf, DeviceMemory, Features, Glu,
    HostMatrix, KvLayout, LinearIo, LinearShape, LinearWeights, MatrixId, RopeParams, RoutedFfn,
    Step, VectorId,
};

fn device_err(what: &str, e: DriverError) -> BackendError {
    BackendError::Device {
        backend: "cuda",
        message: format!("{what}: {e}"),
    }
}

fn align(v: u64, a: u64) -> u64 {
    v.div_ceil(a).saturating_mul(a)
}

/// The CUDA backend (see the module docs).
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: sys::CUstream,
    module: sys::CUmodule,
    k: Kernels,
    blas: blas::Blas,
    blas_handle: blas::Handle,
    /// The one allocation.
    base: u64,
    size: u64,
    weights_next: u64,
    weights_end: u64,
    /// (offset, bytes) of each arena buffer, indexed like `Buf::ALL`.
    arena: [Option<(u64, u64)>; Buf::ALL.len()],
    kv: KvLayout,
    kv_base: Vec<u64>,
    /// Device address of a hybrid model's recurrent states
    /// (`kv.recurrent`'s slots; `linear`).
    recurrent: u64,
    slots: Vec<Option<(usize, usize)>>,
    upload: Upload,
    matrices: Vec<DevMatrix>,
    vectors: Vec<(u64, usize)>,
    /// Host side: logits read-back, routes read-back, upload staging.
    logits: pinned::PinnedF32,
    /// Values of `logits` read back since the last op (the engine reads
    /// them once after a step, then the sampler reads them again).
    logits_held: usize,
    routes: Vec<u32>,
    /// Greedy picks read back (two a logits row).
    greedy_host: Vec<u32>,
    routes_k: usize,
    routes_rows: usize,
    /// `routes` is older than the last route_experts (read back on the
    /// first op that needs them on the host).
    routes_stale: bool,
    /// One-token MoE steps run their routes on the device (tests turn
    /// this off to compare with the gather path).
    device_routing: bool,
    /// Route read-backs so far (tests: the device path makes none).
    routes_read: u64,
    /// Launches recorded since the last issue.
    queue: queue::LaunchQueue,
    /// The queue holds the step from its first op, or from where its head
    /// was issued (a graph candidate).
    whole_step: bool,
    /// Which part of the step the queue holds: its head (0, up to the
    /// second layer's attention) or the rest (1); each is a graph of its
    /// own (`issue_step_head`).
    step_part: usize,
    /// Launch at once for the rest of the step (after a read-back or a
    /// cuBLAS call, which need the work before them issued).
    eager: bool,
    /// The host copy of the step area; `staged` holds each part's word
    /// range written since the last issue (a different value within it
    /// issues the queue first), `dirty` the word range not yet copied.
    step_host: Vec<u32>,
    staged: Vec<Option<(usize, usize)>>,
    dirty: Option<(usize, usize)>,
    host_u32: Vec<u32>,
    host_f32: Vec<f32>,
    error: Option<BackendError>,
    startup: StartupMemory,
    /// Prefill through the tiled f32 kernel instead of cuBLAS (tests).
    tiled_prefill: bool,
    /// 2 to `MQ_MAX_TOKENS` rows on the tensor-core kernels (`use_mma_few`).
    mma_few: bool,
    mma_kgroups: Option<usize>,
    /// Split attention's partials (address, bytes): the plan's
    /// `attention_partials`.
    partials: (u64, u64),
    /// A MoE model's expert grouping: its address and layout (the plan's
    /// `moe_grouping`).
    moe: (u64, MoeGrouping),
    /// A split model's room for a host matrix a step multiplies here
    /// (address, bytes: the plan's `streamed`), the next free byte in it
    /// while matrices are copied, and the ids streamed matrices take.
    streamed: (u64, u64),
    streamed_next: u64,
    streamed_ids: Vec<usize>,
    /// Multiprocessors of the device: split attention aims for 4 blocks each.
    sm_count: usize,
    /// Pieces attention cuts key ranges into, when a test sets it.
    forced_splits: Option<usize>,
    /// The split attention kernels (and their merge) were the last launch:
    /// the next one-token matrix-vector kernel does not prefetch
    /// (`matvec_one`).
    attention_last: bool,
    /// Whether decode rows take the tensor-core kernel wherever it applies
    /// (true) or never (false), when a test sets it; else from
    /// `ATTENTION_DECODE_MMA_KEYS` keys.
    forced_decode_mma: Option<bool>,
    /// What the f16 staging of x holds since the last kernel launch:
    /// (address of x, values, bf16). A layer's q, k and v (and gate and
    /// up) products of one input convert it once.
    x16_holds: Option<(u64, i64, i32)>,
    /// Whether a loaded matrix has int8-activation kernels: only then do
    /// norms and attention write their one-token output as x8 blocks too.
    emits_x8: bool,
    /// The staging holds, as x8 blocks, the `values` f32 activations at
    /// this address (written by the last launch, or read since by x8
    /// matmuls, which write neither x nor the staging): (address, values).
    x8_holds: Option<(u64, usize)>,
}

// SAFETY: the raw handles (stream, module, functions, cuBLAS handle) belong
// to one context and are only used through `&mut self`, after binding the
// context to the calling thread; moving the backend to another thread is
// what CUDA's context model allows.
unsafe impl Send for CudaBackend {}

impl CudaBackend {
    fn fail(&mut self, what: &str, e: DriverError) {
        if self.error.is_none() {
            self.error = Some(device_err(what, e));
        }
    }

    fn fail_with(&mut self, e: BackendError) {
        if self.error.is_none() {
            self.error = Some(e);
        }
    }

    /// Binds the context to this thread; false when the backend has failed.
    fn ready(&mut self) -> bool {
        // An op is about to run: the host's copy of the logits is stale.
        self.logits_held = 0;
        if self.error.is_some() {
            return false;
        }
        if let Err(e) = self.ctx.bind_to_thread() {
            self.fail("binding the CUDA context", e);
            return false;
        }
        true
    }

    /// Device address of `b`, checked to hold `bytes`.
    fn buf(&self, b: Buf, bytes: usize) -> u64 {
        let (addr, size) = self.arena[b as usize]
            .unwrap_or_else(|| panic!("the plan has no device buffer {}", b.name()));
        assert!(
            bytes as u64 <= size,
            "{bytes} bytes of {} needed, {size} planned",
            b.name()
        );
        addr
    }

    fn grid_for(n: usize, block: usize) -> u32 {
        n.div_ceil(block).clamp(1, 65_535) as u32
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Errors here have nowhere to go; the context's release frees all.
        let _ = self.ctx.bind_to_thread();
        self.issue(false);
        self.queue.release();
        self.logits.free();
        // SAFETY: each handle was created in `new` and is released once,
        // the work on the stream first.
        unsafe {
            let _ = result::stream::synchronize(self.stream);
            self.blas.destroy(self.blas_handle);
            let _ = result::free_sync(self.base);
            let _ = result::module::unload(self.module);
            let _ = result::stream::destroy(self.stream);
        }
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn memory(&self) -> DeviceMemory {
        let _ = self.ctx.bind_to_thread();
        match result::mem_get_info() {
            Ok((free, total)) => DeviceMemory {
                free: free as u64,
                total: total as u64,
            },
            Err(_) => DeviceMemory { free: 0, total: 0 },
        }
    }

    fn reads_host_weights(&self) -> bool {
        false
    }

    fn load_matrix(&mut self, m: HostMatrix) -> Result<MatrixId, BackendError> {
        CudaBackend::load_matrix(self, m)
    }

    fn load_vector(&mut self, values: &[f32]) -> Result<VectorId, BackendError> {
        CudaBackend::load_vector(self, values)
    }

    fn embed(&mut self, table: MatrixId, tokens: &[u32], scale: f32, out: Buf) {
        CudaBackend::embed(self, table, tokens, scale, out)
    }

    fn matmul(&mut self, w: MatrixId, x: Buf, rows: usize, out: Buf) {
        CudaBackend::matmul(self, w, x, rows, out)
    }

    fn rms_norm(&mut self, x: Buf, w: VectorId, eps: f32, rows: usize, width: usize, out: Buf) {
        self.norm_rows(x, None, w, eps, rows, width, out);
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
        CudaBackend::head_norm(self, x, Some(w), eps, rows, width, head_dim)
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
        self.norm_rows(dst, Some(src), w, eps, rows, width, out);
    }

    fn matmul_many(&mut self, ws: &[MatrixId], x: Buf, rows: usize, outs: &[Buf]) {
        CudaBackend::matmul_many(self, ws, x, rows, outs)
    }

    fn matmul_glu(
        &mut self,
        [gate, up]: [MatrixId; 2],
        x: Buf,
        rows: usize,
        act: Glu,
        [out, up_out]: [Buf; 2],
        width: usize,
    ) {
        CudaBackend::matmul_glu(self, [gate, up], x, rows, act, [out, up_out], width)
    }

    fn add_bias(&mut self, x: Buf, b: VectorId, rows: usize, width: usize) {
        CudaBackend::add_bias(self, x, b, rows, width)
    }

    fn add(&mut self, dst: Buf, src: Buf, rows: usize, width: usize) {
        CudaBackend::add(self, dst, src, rows, width)
    }

    fn gather_rows(&mut self, src: Buf, src_rows: &[usize], width: usize, dst: Buf) {
        CudaBackend::gather_rows(self, src, src_rows, width, dst)
    }

    fn rope(&mut self, x: Buf, step: &Step, n_heads: usize, head_dim: usize, rope: &RopeParams) {
        CudaBackend::rope(self, x, step, n_heads, head_dim, rope)
    }

    fn glu(&mut self, gate: Buf, up: Buf, rows: usize, width: usize, act: Glu) {
        CudaBackend::glu(self, gate, up, rows, width, act)
    }

    fn attention(&mut self, layer: usize, shape: &AttentionShape, step: &Step, io: AttentionIo) {
        self.attention_of(layer, shape, step, io, Readied::No);
    }

    fn attend(
        &mut self,
        layer: usize,
        shape: &AttentionShape,
        step: &Step,
        io: AttentionIo,
        rope: &RopeParams,
    ) {
        CudaBackend::attend(self, layer, shape, step, io, rope)
    }

    fn kv_write(&mut self, layer: usize, step: &Step, k: Buf, v: Buf, shape: &AttentionShape) {
        CudaBackend::kv_write(self, layer, step, k, v, shape)
    }

    fn route_experts(
        &mut self,
        logits: Buf,
        rows: usize,
        n_experts: usize,
        k: usize,
        normalize: bool,
    ) {
        CudaBackend::route_experts(self, logits, rows, n_experts, k, normalize)
    }

    fn routed_experts(&mut self, ffn: &RoutedFfn, x: Buf, rows: usize, out: Buf) {
        let on_device = self.device_routing
            && if rows == 1 {
                self.routed_on_device(ffn, x, out)
            } else {
                self.routed_grouped(ffn, x, rows, out)
            };
        if !on_device {
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
        CudaBackend::gather_expert_rows(self, expert, rows, k, src, width, dst)
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
        CudaBackend::scatter_expert_rows(self, expert, rows, k, src, width, dst)
    }

    fn zero(&mut self, x: Buf, rows: usize, width: usize) {
        CudaBackend::zero(self, x, rows, width)
    }

    fn runs_gpt_oss(&self) -> bool {
        Features::of(Device::Cuda, 1).gpt_oss
    }

    fn runs_scaled_rows(&self) -> bool {
        Features::of(Device::Cuda, 1).scaled_rows
    }

    fn head_norm_unweighted(
        &mut self,
        x: Buf,
        eps: f32,
        rows: usize,
        width: usize,
        head_dim: usize,
    ) {
        CudaBackend::head_norm(self, x, None, eps, rows, width, head_dim)
    }

    fn scale(&mut self, x: Buf, factor: f32, rows: usize, width: usize) {
        CudaBackend::scale(self, x, factor, rows, width)
    }

    fn softcap(&mut self, x: Buf, cap: f32, rows: usize, width: usize) {
        CudaBackend::softcap(self, x, cap, rows, width)
    }

    fn runs_hybrid(&self) -> bool {
        Features::of(Device::Cuda, 1).hybrid
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
        CudaBackend::gated_delta_rule(self, linear_layer, shape, weights, step, states, io)
    }

    fn split_heads(&mut self, x: Buf, rows: usize, heads: usize, head_dim: usize, a: Buf, b: Buf) {
        self.split_gated_heads(x, rows, heads, head_dim, [a, b])
    }

    fn add_gated_rows(&mut self, dst: Buf, src: Buf, gate: Buf, rows: usize, width: usize) {
        CudaBackend::add_gated_rows(self, dst, src, gate, rows, width)
    }

    fn sigmoid_gate(&mut self, gate: Buf, x: Buf, rows: usize, width: usize) {
        CudaBackend::sigmoid_gate(self, gate, x, rows, width)
    }

    fn logits(&mut self, rows: usize, width: usize) -> &mut [f32] {
        CudaBackend::logits(self, rows, width)
    }

    fn reserve_streamed(&mut self, matrices: usize) {
        let more = matrices.saturating_sub(self.streamed_ids.len());
        self.matrices.reserve(more);
        self.streamed_ids.reserve(more);
    }

    unsafe fn pin_host(&mut self, ptr: *mut u8, len: usize) -> bool {
        // SAFETY: the caller keeps the memory allocated until unpinned.
        len > 0 && self.ready() && unsafe { CudaBackend::pin_host(self, ptr, len) }
    }

    unsafe fn unpin_host(&mut self, ptr: *mut u8) {
        // SAFETY: as the caller promises, `ptr` was pinned here.
        unsafe { CudaBackend::unpin_host(self, ptr) }
    }

    fn stream_room(&self) -> u64 {
        self.streamed.1
    }

    fn stream_matrices(
        &mut self,
        matrices: &mut dyn Iterator<Item = &HostMatrix>,
        ids: &mut [MatrixId],
    ) -> Result<(), BackendError> {
        CudaBackend::stream_matrices(self, matrices, ids)
    }

    fn read_rows(&mut self, x: Buf, rows: usize, width: usize, out: &mut [f32]) {
        CudaBackend::read_rows(self, x, rows, width, out)
    }

    fn write_rows(&mut self, x: Buf, rows: usize, width: usize, values: &[f32], step_start: bool) {
        CudaBackend::write_rows(self, x, rows, width, values, step_start)
    }

    fn greedy(&mut self, rows: usize, width: usize, banned: &[u32], out: &mut [[u32; 2]]) {
        CudaBackend::greedy(self, rows, width, banned, out)
    }

    fn take_error(&mut self) -> Option<BackendError> {
        self.error.take()
    }
}
