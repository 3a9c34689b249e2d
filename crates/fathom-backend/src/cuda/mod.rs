//! The CUDA backend: the same ops as the CPU one on an NVIDIA GPU.
//!
//! **One allocation.** [`CudaBackend::new`] makes a single `cuMemAlloc`
//! and carves it, in this order: weights (a bump pointer, in load order),
//! the activation arena (at the plan's offsets), the KV storage of every
//! group, cuBLAS's workspace (handed to cuBLAS with `cublasSetWorkspace`
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
//! compute_90 PTX) and embedded. Quantized weights stay in their ggml or
//! MLX layout and are decoded inside the matmul kernels; F32 matrices go
//! through cuBLAS SGEMM.
//!
//! **Launches** are recorded and issued when the host needs a result; a
//! decode step that repeats is replayed as a CUDA graph ([`queue`]).
//!
//! **Errors.** Ops are queued on one stream and return nothing; the first
//! failure is kept, later ops are skipped, and [`Backend::take_error`]
//! hands it out. `logits()` synchronizes.

mod blas;
pub mod nccl;
pub mod nvml;
mod pinned;
mod queue;

pub use queue::GraphStats;

use std::ffi::{c_void, CString};
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, DriverError};
use fathom_plan::activations::ArenaBuffer;
use fathom_plan::kv::KV_BLOCK_TOKENS;
use fathom_plan::KvDtype;

use crate::{
    greedy_from_rows, AttentionIo, AttentionShape, Backend, BackendError, Buf, DeviceMemory, Glu,
    HostMatrix, KvLayout, MatrixId, MatrixStorage, RopeParams, RoutedFfn, Step, VectorId,
    WeightType,
};

/// The kernel argument array: a pointer to each (local, mutable) argument
/// and its size (the launch queue copies the values).
macro_rules! args {
    ($($a:ident),* $(,)?) => {
        [$((std::ptr::addr_of_mut!($a) as *mut c_void, std::mem::size_of_val(&$a))),*]
    };
}

/// The kernels, compiled by build.rs, 8-byte aligned as the driver wants
/// a fatbin (so it is read in place, not copied first).
static FATBIN: &[u8] = &Aligned8(*include_bytes!(concat!(env!("OUT_DIR"), "/fathom.fatbin"))).0;

#[repr(C, align(8))]
struct Aligned8<T: ?Sized>(T);

/// The sizes of the carve's regions are the plan's (fathom_plan::cuda).
use fathom_plan::cuda::{
    DeviceLayout, StepWords, ATTENTION_MAX_SPLITS, ATTENTION_SPLIT_KEYS, BLAS_WORKSPACE,
    WEIGHT_ALIGN, WEIGHT_STAGING as W16_STAGING,
};
/// Tokens a matrix-vector kernel takes at once; more go to the tiled kernel.
const MV_MAX_TOKENS: usize = 8;
/// Routes a token's experts the routed kernels combine, at most
/// (`MOE_MAX_ROUTES` in fathom.cu).
const MOE_MAX_ROUTES: usize = 16;
/// Bytes of one 32-value block of int8 activations (`X8_BLOCK` in fathom.cu).
const X8_BLOCK: usize = 48;
/// Warps of a matrix-vector block (`MV_WARPS` in fathom.cu).
const MV_WARPS: usize = 4;
/// Largest head dims the attention kernel holds per lane.
const ATT_MAX_DIM: usize = 512;
/// Heads a `rope_kv` block takes, a warp each (`RK_WARPS` in fathom.cu).
const ROPE_KV_WARPS: usize = 4;
/// Warps of a tensor-core prefill attention block (`ATT_MMA_WARPS` in
/// fathom.cu), and its threads.
const ATT_MMA_WARPS: usize = 4;
const ATT_MMA_THREADS: u32 = 32 * ATT_MMA_WARPS as u32;
/// Rows a sequence a step needs on average (prefill chunks) to take the
/// tensor-core attention kernel.
const ATT_MMA_MIN_ROWS: usize = 8;

/// Threads of an attention block: `ATT_WARPS` (fathom.cu) warps that split
/// the key positions of one (row, head).
const ATT_THREADS: u32 = 4 * 32;
/// KV dtypes of the split attention kernels, in their `KV_*` order (fathom.cu).
const ATT_DTYPES: [&str; 4] = ["f16", "bf16", "f32", "q8_0"];
/// Value dims a lane of the split attention kernels holds: value dims up
/// to 32 × each.
const ATT_VPL: [usize; 4] = [2, 4, 8, 16];
/// Query heads a block of the split attention kernels takes at once; at
/// 16 value dims a lane only the first two are compiled (more spill).
const ATT_HEADS: [usize; 4] = [1, 2, 4, 8];
/// Value dims a lane times query heads a block up to which a split
/// attention kernel does a decode step's rope itself (`ATT_ROPE_FITS` in
/// fathom.cu; beyond, its registers spill).
const ATT_ROPE_MAX: usize = 32;
/// Most pieces attention cuts a row's key range into. The planned
/// partials hold `ATTENTION_MAX_SPLITS` pieces for each of
/// `ATTENTION_SPLIT_ROWS` rows, so a step of fewer rows (a decode step of a
/// few sequences) has room for more: up to this many, as far as they fit
/// (`attention_splits` picks 33 for a row of an 8B-shaped layer at 4,097
/// keys, where 32 left some warps a second run of 32 keys). Also
/// `ATT_MAX_SPLITS` in fathom.cu (what `attention_merge` combines).
const ATTENTION_ROW_SPLITS: usize = 64;
const _: () = assert!(ATTENTION_MAX_SPLITS as usize <= ATTENTION_ROW_SPLITS);
/// Keys up to which a split attention block takes one query head
/// (`attention`).
const ATTENTION_ONE_HEAD_KEYS: usize = 384;
/// Keys from which decode rows take the tensor-core decode kernel where it
/// applies (`decode_mma_kernel`).
const ATTENTION_DECODE_MMA_KEYS: usize = 1024;
/// Query heads a tensor-core decode block holds (`ATT_DEC_GROUP` in
/// fathom.cu).
const ATT_DEC_GROUP: usize = 8;
/// Banned ids the greedy-pick kernels take (`GREEDY_BANNED` in fathom.cu),
/// the scan's threads and the values a thread loads at once.
const GREEDY_BANNED: usize = 8;
const GREEDY_THREADS: u32 = 256;
const GREEDY_BATCH: usize = 8;
/// Threads of a `greedy_merge` block: one warp a row (`WARP` in fathom.cu).
const GREEDY_MERGE_THREADS: u32 = 32;
/// Most pieces (scan blocks) a logits row is cut into: a 128k vocabulary
/// takes 63, one batch a thread, on half the H200's multiprocessors.
const GREEDY_PIECES: usize = 64;
/// The kernel's `Banned` argument.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Banned {
    n: i32,
    ids: [u32; GREEDY_BANNED],
}
/// Largest expert count the routing kernel's chosen-set holds.
const MAX_EXPERTS: usize = 256;
/// Parts of the step area (`CudaBackend::stage`): rows and sequences,
/// token ids, projected rows, then one per KV group's page tables.
const STAGED_ROWS: usize = 0;
const STAGED_TOKENS: usize = 1;
const STAGED_PROJECTED: usize = 2;
const STAGED_FIXED: usize = 3;

/// A GPU as `--device auto` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    pub free: u64,
    pub total: u64,
}

/// The first CUDA device, or `None` when there is no driver, no device,
/// or any call fails. Never panics. Reading free memory needs a context:
/// this retains the device's primary context and releases it again (on the
/// order of 0.3 s; nothing stays allocated).
pub fn probe() -> Option<DeviceInfo> {
    std::panic::catch_unwind(probe_device).ok().flatten()
}

/// CUDA devices the driver lists (0 without a driver). Never panics.
pub fn device_count() -> usize {
    let count = || {
        // SAFETY: only tries to open libcuda by its names; runs none of it.
        if !unsafe { sys::is_culib_present() } {
            return 0;
        }
        result::init()
            .and_then(|_| result::device::get_count())
            .map_or(0, |n| n.max(0) as usize)
    };
    std::panic::catch_unwind(count).unwrap_or(0)
}

fn probe_device() -> Option<DeviceInfo> {
    // SAFETY: only tries to open libcuda by its names; runs none of it.
    if !unsafe { sys::is_culib_present() } {
        return None;
    }
    result::init().ok()?;
    if result::device::get_count().ok()? < 1 {
        return None;
    }
    let dev = result::device::get(0).ok()?;
    let name = result::device::get_name(dev).ok()?;
    // SAFETY: `dev` is a device handle the driver just returned.
    let total = unsafe { result::device::total_mem(dev) }.ok()? as u64;
    // SAFETY: retain/set-current/release pair on the device's primary
    // context; the context is released before returning.
    let free = unsafe {
        let ctx = result::primary_ctx::retain(dev).ok()?;
        let free = sys::cuCtxSetCurrent(ctx)
            .result()
            .and_then(|_| result::mem_get_info())
            .map(|(f, _)| f as u64);
        let _ = result::primary_ctx::release(dev);
        free.ok()?
    };
    Some(DeviceInfo { name, free, total })
}

fn device_err(what: &str, e: DriverError) -> BackendError {
    BackendError::Device {
        backend: "cuda",
        message: format!("{what}: {e}"),
    }
}

fn align(v: u64, a: u64) -> u64 {
    v.div_ceil(a).saturating_mul(a)
}

/// A weight matrix as the kernels take it (`struct Weights` in fathom.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct WeightsArg {
    data: u64,
    scales: u64,
    biases: u64,
    row_bytes: u64,
    rows: i32,
    cols: i32,
    group: i32,
    bf16: i32,
}

/// Up to `MV_SEGMENTS` matrices for one launch of a one-token
/// matrix-vector kernel (`struct Segments` in fathom.cu): segment i's
/// blocks are `first[i] .. first[i + 1]`, unused ones start at the end.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Segments {
    w: [WeightsArg; MV_SEGMENTS],
    out: [u64; MV_SEGMENTS],
    split: [i32; MV_SEGMENTS],
    first: [i32; MV_SEGMENTS + 1],
    /// 0: each matrix's rows take their own blocks (`first` counts
    /// blocks); else one wave of blocks of this many rows (`first` counts
    /// rows: `matvec_balanced` in fathom.cu).
    rows_per_block: i32,
    /// 0: no L2 prefetch before the dependency wait.
    prefetch: i32,
}

/// Matrices one launch of the one-token kernel takes (`MV_SEGMENTS` in
/// fathom.cu).
const MV_SEGMENTS: usize = 3;
/// Most rows a block of the balanced one-token kernel takes
/// (`MV_BALANCED_ROWS` in fathom.cu).
const MV_BALANCED_ROWS: usize = 8;

/// Per-step row and sequence tables (`struct StepDesc` in fathom.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct StepDesc {
    row_seq: u64,
    row_pos: u64,
    seq_start: u64,
    seq_row0: u64,
    tables: u64,
    table_stride: i32,
    pad: i32,
}

/// One layer's cache (`struct KvDesc` in fathom.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct KvDesc {
    base: u64,
    block_bytes: u64,
    layer_off: u64,
    k_row: i32,
    v_row: i32,
    ring: i32,
    dtype: i32,
}

/// Rope of a decode step done inside split attention (`struct AttRope`
/// in fathom.cu); `fused` 0: `rope_kv` ran before.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct AttRope {
    /// theta^(-2 / key_dim): pair i's frequency is its i-th power.
    ratio: f64,
    freqs: u64,
    neox: i32,
    fused: i32,
}

/// An attention kernel for rows where the split kernels apply
/// (`CudaBackend::row_kernel`).
#[derive(Debug, Clone, Copy, PartialEq)]
struct RowKernel {
    f: sys::CUfunction,
    /// Blocks a row: one a KV head and chunk of its query heads (the
    /// splits multiply them).
    row_blocks: usize,
    /// It ropes, rounds and stores a decode step's own rows itself (its
    /// registers allow: `ATT_ROPE_FITS` in fathom.cu).
    ropes: bool,
}

/// What made a step's q, k and v ready for attention (roped, rounded to
/// the cache's precision, K and V stored).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Readied {
    /// Nothing: `attention` (no rope) rounds them first.
    No,
    ByRopeKv,
    /// The split attention kernel does it (a decode step): the kernel
    /// `row_kernel` chose, which `attend` asked whether it ropes.
    InAttention(AttRope, RowKernel),
}

/// Kernel name suffixes by weight kind: the 13 ggml types in
/// `WeightType::ALL` order, then MLX affine 2, 4 and 8 bits.
const KINDS: [&str; 16] = [
    "f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k",
    "q6_k", "a2", "a4", "a8",
];

/// A gated activation as the kernels number it (`glu_act` in fathom.cu).
fn act_id(act: Glu) -> i32 {
    match act {
        Glu::Silu => 0,
        Glu::GeluTanh => 1,
    }
}

fn kind_of_type(ty: WeightType) -> usize {
    WeightType::ALL
        .iter()
        .position(|t| *t == ty)
        .expect("every weight type is in ALL")
}

struct Kernels {
    /// Matrix-vector products of one token (deeper unrolled) and of up to
    /// MV_MAX_TOKENS.
    mv1: [sys::CUfunction; 16],
    mv: [sys::CUfunction; 16],
    /// The same over a gate and an up matrix, writing act(gate) × up.
    mvglu1: [sys::CUfunction; 16],
    mvglu: [sys::CUfunction; 16],
    /// One token on int8 activations (`quantize_x8`): Q8_0, Q4_0, Q4_K and Q6_K
    /// only (null for the other kinds).
    mv1x8: [sys::CUfunction; 16],
    mvglu1x8: [sys::CUfunction; 16],
    quantize_x8: sys::CUfunction,
    /// MoE, one token, routes read on the device: `moe_gate_up`,
    /// `moe_down` (on int8 activations where the kind has them), null
    /// for kinds without (`FATHOM_ROUTED_KERNELS` in fathom.cu).
    moe_gate_up: [sys::CUfunction; 16],
    moe_down: [sys::CUfunction; 16],
    moe_combine: sys::CUfunction,
    mm: [sys::CUfunction; 16],
    embed: [sys::CUfunction; 16],
    dequant: [sys::CUfunction; 16],
    to_half: sys::CUfunction,
    rms_norm: sys::CUfunction,
    add_bias: sys::CUfunction,
    add: sys::CUfunction,
    fill_zero: sys::CUfunction,
    glu: sys::CUfunction,
    gather_rows: sys::CUfunction,
    scatter_rows: sys::CUfunction,
    rope: sys::CUfunction,
    rope_kv: sys::CUfunction,
    round_to_kv: sys::CUfunction,
    attention: sys::CUfunction,
    /// `attention_split_<dtype>_<vpl>_<heads>`, indexed by
    /// (dtype, ATT_VPL index, ATT_HEADS index); null where not compiled.
    attention_split: [[[sys::CUfunction; 4]; 4]; 4],
    attention_merge: sys::CUfunction,
    /// `attention_mma_<D>` for head dims 64 and 128 (f16 cache, prefill).
    attention_mma: [sys::CUfunction; 2],
    /// `attention_decode_mma_<D>` for head dims 64 and 128 (f16 cache,
    /// decode rows at long contexts).
    attention_decode_mma: [sys::CUfunction; 2],
    kv_write: sys::CUfunction,
    route_experts: sys::CUfunction,
    greedy_scan: sys::CUfunction,
    greedy_merge: sys::CUfunction,
}

/// Weight bytes a matrix-vector kernel asks L2 for before it waits for the
/// kernel ahead of it (fathom.cu's `fathom_prefetch_bytes`): the first 4 KiB
/// of the rows of its first blocks. The weight stream then starts while a
/// norm or attention still runs. On the H200, 2 to 6 MiB measured alike and
/// best (8B F16 decode 2% faster than with 16 MiB, from empty and at depth
/// 4,096; 8B Q4_0 2.3%): a larger budget asks for more than a kernel's
/// start needs while the kernel ahead of it still loads its own bytes.
const PREFETCH_BYTES: u64 = 4 << 20;

/// `FATHOM_CUDA_PREFETCH` (bytes; 0 turns the weight and KV prefetch off),
/// else [`PREFETCH_BYTES`].
fn prefetch_bytes() -> Result<u64, BackendError> {
    match std::env::var("FATHOM_CUDA_PREFETCH") {
        Err(_) => Ok(PREFETCH_BYTES),
        Ok(v) => v.trim().parse().map_err(|_| BackendError::Device {
            backend: "cuda",
            message: format!(
                "FATHOM_CUDA_PREFETCH={v:?} is not a byte count (weight bytes a kernel \
                 prefetches, e.g. {PREFETCH_BYTES}; 0 turns the prefetch off)"
            ),
        }),
    }
}

/// Writes the prefetch budget into the loaded module's global.
fn set_prefetch(module: sys::CUmodule, bytes: u64) -> Result<(), BackendError> {
    let name = CString::new("fathom_prefetch_bytes").expect("no NUL");
    // SAFETY: the module is loaded; the global is an 8-byte unsigned long
    // long (checked by size below) that no kernel runs against yet.
    unsafe {
        let (ptr, size) = result::module::get_global(module, name)
            .map_err(|e| device_err("finding fathom_prefetch_bytes in the kernels", e))?;
        assert_eq!(size, 8, "fathom_prefetch_bytes is an unsigned long long");
        result::memcpy_htod_sync(ptr, &[bytes])
            .map_err(|e| device_err("setting fathom_prefetch_bytes", e))
    }
}

impl Kernels {
    fn load(module: sys::CUmodule) -> Result<Kernels, BackendError> {
        let get = |name: &str| -> Result<sys::CUfunction, BackendError> {
            let c = CString::new(name).expect("kernel names have no NUL");
            // SAFETY: `module` is loaded and outlives the functions (both
            // are released together on drop).
            unsafe { result::module::get_function(module, c) }
                .map_err(|e| device_err(&format!("kernel {name} missing from the fatbin"), e))
        };
        let table = |prefix: &str| -> Result<[sys::CUfunction; 16], BackendError> {
            let mut out = [std::ptr::null_mut(); 16];
            for (o, k) in out.iter_mut().zip(KINDS) {
                *o = get(&format!("{prefix}_{k}"))?;
            }
            Ok(out)
        };
        // Kinds with int8-activation kernels (`HasX8` in fathom.cu).
        let x8_table = |prefix: &str| -> Result<[sys::CUfunction; 16], BackendError> {
            let mut out = [std::ptr::null_mut(); 16];
            for ty in [
                WeightType::Q8_0,
                WeightType::Q4_0,
                WeightType::Q4_K,
                WeightType::Q6_K,
            ] {
                let kind = kind_of_type(ty);
                out[kind] = get(&format!("{prefix}_{}", KINDS[kind]))?;
            }
            Ok(out)
        };
        // Kinds with routed-expert kernels: the int8-activation ones, and
        // these on f32 activations.
        let routed_table = |prefix: &str| -> Result<[sys::CUfunction; 16], BackendError> {
            let mut out = x8_table(&format!("{prefix}x8"))?;
            for ty in [WeightType::F16, WeightType::BF16, WeightType::Q5_K] {
                let kind = kind_of_type(ty);
                out[kind] = get(&format!("{prefix}_{}", KINDS[kind]))?;
            }
            Ok(out)
        };
        Ok(Kernels {
            mv1: table("mv1")?,
            mv: table("mv")?,
            mvglu1: table("mvglu1")?,
            mvglu: table("mvglu")?,
            mv1x8: x8_table("mv1x8")?,
            mvglu1x8: x8_table("mvglu1x8")?,
            quantize_x8: get("quantize_x8")?,
            moe_gate_up: routed_table("moe_gate_up")?,
            moe_down: routed_table("moe_down")?,
            moe_combine: get("moe_combine")?,
            mm: table("mm")?,
            embed: table("embed")?,
            dequant: table("dequant")?,
            to_half: get("to_half")?,
            rms_norm: get("rms_norm")?,
            add_bias: get("add_bias")?,
            add: get("add")?,
            fill_zero: get("fill_zero")?,
            glu: get("glu")?,
            gather_rows: get("gather_rows")?,
            scatter_rows: get("scatter_rows")?,
            rope: get("rope")?,
            rope_kv: get("rope_kv")?,
            round_to_kv: get("round_to_kv")?,
            attention: get("attention")?,
            attention_split: {
                let mut t = [[[std::ptr::null_mut(); 4]; 4]; 4];
                for (d, dt) in ATT_DTYPES.iter().enumerate() {
                    for (v, vpl) in ATT_VPL.iter().enumerate() {
                        for (h, heads) in ATT_HEADS.iter().enumerate() {
                            if *vpl < 16 || *heads <= 2 {
                                t[d][v][h] = get(&format!("attention_split_{dt}_{vpl}_{heads}"))?;
                            }
                        }
                    }
                }
                t
            },
            attention_merge: get("attention_merge")?,
            attention_mma: [get("attention_mma_64")?, get("attention_mma_128")?],
            attention_decode_mma: [
                get("attention_decode_mma_64")?,
                get("attention_decode_mma_128")?,
            ],
            kv_write: get("kv_write")?,
            route_experts: get("route_experts")?,
            greedy_scan: get("greedy_scan")?,
            greedy_merge: get("greedy_merge")?,
        })
    }
}

/// A matrix the backend holds.
#[derive(Debug, Clone, Copy)]
struct DevMatrix {
    kind: usize,
    arg: WeightsArg,
}

/// Where the uploads go (device addresses), sized for `tokens` rows and
/// `seqs` sequences of `table_stride` blocks.
#[derive(Debug, Clone, Copy)]
struct Upload {
    /// The step area (`StepWords` says what lies where).
    step: u64,
    words: StepWords,
    /// MoE row lists and weights, written op by op.
    idx: u64,
    weights: u64,
    tokens: usize,
    seqs: usize,
    table_stride: usize,
    /// Activations as f16/bf16 for a GEMM: `tokens × x16_cols`.
    x16: u64,
    x16_cols: usize,
    /// Dequantized weight rows (f16), `W16_STAGING` bytes.
    w16: u64,
}

/// The device memory each start-up step took (`cuMemGetInfo` deltas).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartupMemory {
    /// `total − free` right after the context was created: the context's
    /// own cost when the device was idle before (other processes' use
    /// counts here too).
    pub context: u64,
    pub stream: u64,
    pub module: u64,
    pub allocation: u64,
    pub allocation_requested: u64,
    pub blas_handle: u64,
    /// Carved from the allocation, so not in any delta above.
    pub blas_workspace: u64,
    /// Prefill staging carved from the allocation (f16 activations and
    /// dequantized weight rows): a term the plan does not list yet.
    pub gemm_staging: u64,
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
    /// Split attention's partials (address, bytes): the plan's
    /// `attention_partials`.
    partials: (u64, u64),
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
    /// Creates the context on device `ordinal`, loads the kernels and
    /// cuBLAS, and makes the one allocation for `weights_bytes` of weights
    /// (plus [`WEIGHT_SLACK`] for tensor alignment), the device side of
    /// `arena`, the KV groups of `kv`, cuBLAS's workspace and the upload
    /// area.
    pub fn new(
        ordinal: usize,
        arena: &[ArenaBuffer],
        kv: KvLayout,
        weights_bytes: u64,
    ) -> Result<Self, BackendError> {
        // SAFETY: only tries to open libcuda by its names.
        if !unsafe { sys::is_culib_present() } {
            return Err(BackendError::Device {
                backend: "cuda",
                message: format!(
                    "the CUDA driver library is not loadable (tried {:?} through the dynamic \
                     loader); install the NVIDIA driver or add its folder to LD_LIBRARY_PATH",
                    cudarc::get_lib_name_candidates("cuda")
                ),
            });
        }
        let blas = blas::Blas::load()?;
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| device_err(&format!("creating a context on CUDA device {ordinal}"), e))?;
        let info = |what: &str| result::mem_get_info().map_err(|e| device_err(what, e));
        let (free0, total) = info("cuMemGetInfo")?;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| device_err("reading the multiprocessor count", e))?
            .max(1) as usize;
        let mut startup = StartupMemory {
            context: (total - free0) as u64,
            stream: 0,
            module: 0,
            allocation: 0,
            allocation_requested: 0,
            blas_handle: 0,
            blas_workspace: BLAS_WORKSPACE,
            gemm_staging: 0,
        };
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| device_err("creating a stream", e))?;
        let (free1, _) = info("cuMemGetInfo")?;
        startup.stream = free0.saturating_sub(free1) as u64;

        // SAFETY: FATBIN is a complete fatbin (build.rs made it), 8-byte
        // aligned and static; the driver copies what it keeps.
        let module = unsafe { result::module::load_data(FATBIN.as_ptr() as *const c_void) }
            .map_err(|e| device_err("loading the kernels (sm_90 / compute_90 fatbin)", e))?;
        let k = Kernels::load(module)?;
        set_prefetch(module, prefetch_bytes()?)?;
        let (free2, _) = info("cuMemGetInfo")?;
        startup.module = free1.saturating_sub(free2) as u64;

        // The carve: the plan's own arithmetic, so the allocation is the
        // plan's device total less what the driver and libraries take.
        let layout = DeviceLayout::new(weights_bytes, arena, &kv.groups);
        let mut slots = [None; Buf::ALL.len()];
        for b in arena.iter().filter(|b| !b.id.host_side()) {
            slots[b.id as usize] = Some((b.offset, b.bytes));
        }
        let arena_base = layout.arena.offset;
        let kv_offsets: Vec<u64> = layout.kv.iter().map(|r| r.offset).collect();
        let workspace = layout.blas_workspace.offset;
        let up = &layout.upload;
        let (tokens, seqs, table_stride) = (
            up.tokens as usize,
            up.seqs as usize,
            up.table_stride as usize,
        );
        let n_groups = kv.groups.len();
        let words = StepWords {
            tokens: up.tokens,
            seqs: up.seqs,
            groups: n_groups as u64,
            table_stride: up.table_stride,
        };
        let (step_off, idx_off, wts_off) = (up.step.offset, up.index.offset, up.weights.offset);
        let (x16_off, w16_off) = (
            layout.activation_staging.offset,
            layout.weight_staging.offset,
        );
        let size = layout.size;
        startup.gemm_staging = layout.activation_staging.bytes + layout.weight_staging.bytes;

        // SAFETY: a plain device allocation of `size` bytes, freed on drop.
        let base = unsafe { result::malloc_sync(size as usize) }.map_err(|e| {
            device_err(
                &format!("allocating {size} bytes (the plan's device total)"),
                e,
            )
        })?;
        let (free3, _) = info("cuMemGetInfo")?;
        startup.allocation = free2.saturating_sub(free3) as u64;
        startup.allocation_requested = size;
        let blas_handle = blas.create(
            stream as *mut c_void,
            base + workspace,
            BLAS_WORKSPACE as usize,
        )?;
        let (free4, _) = info("cuMemGetInfo")?;
        startup.blas_handle = free3.saturating_sub(free4) as u64;

        let slots_of_layers = kv.layer_slots();
        let mut arena_abs = [None; Buf::ALL.len()];
        for (i, s) in slots.iter().enumerate() {
            arena_abs[i] = s.map(|(o, b)| (base + arena_base + o, b));
        }
        let (logits_rows, logits_len) = arena
            .iter()
            .find(|b| b.id == Buf::Logits)
            .map(|b| (b.rows as usize, (b.rows * b.width) as usize))
            .unwrap_or((0, 0));
        // The host plan's logits, page-locked (host memory, not the device's).
        let logits = pinned::PinnedF32::new(logits_len)
            .map_err(|e| device_err("allocating page-locked host memory for the logits", e))?;
        let routes_len = arena
            .iter()
            .find(|b| b.id == Buf::ExpertRoutes)
            .map(|b| (b.rows * b.width * 2) as usize)
            .unwrap_or(0);
        Ok(CudaBackend {
            ctx,
            stream,
            module,
            k,
            blas,
            blas_handle,
            base,
            size,
            weights_next: 0,
            weights_end: layout.weights.bytes,
            arena: arena_abs,
            kv_base: kv_offsets.iter().map(|o| base + o).collect(),
            kv,
            slots: slots_of_layers,
            upload: Upload {
                step: base + step_off,
                words,
                idx: base + idx_off,
                weights: base + wts_off,
                tokens,
                seqs,
                table_stride,
                x16: base + x16_off,
                x16_cols: (layout.activation_staging.bytes / 2 / up.tokens.max(1)) as usize,
                w16: base + w16_off,
            },
            matrices: Vec::new(),
            vectors: Vec::new(),
            logits,
            logits_held: 0,
            routes: vec![0; routes_len],
            greedy_host: vec![0; 2 * logits_rows],
            routes_k: 0,
            routes_rows: 0,
            routes_stale: false,
            device_routing: true,
            routes_read: 0,
            queue: queue::LaunchQueue::new(),
            whole_step: false,
            step_part: 0,
            eager: false,
            step_host: vec![0; words.total() as usize],
            staged: vec![None; STAGED_FIXED + n_groups],
            dirty: None,
            host_u32: Vec::with_capacity(tokens),
            host_f32: Vec::with_capacity(tokens),
            error: None,
            startup,
            tiled_prefill: false,
            partials: (
                base + layout.attention_partials.offset,
                layout.attention_partials.bytes,
            ),
            sm_count,
            forced_splits: None,
            attention_last: false,
            forced_decode_mma: None,
            x16_holds: None,
            emits_x8: false,
            x8_holds: None,
        })
    }

    /// What each start-up step cost on the device.
    pub fn startup_memory(&self) -> &StartupMemory {
        &self.startup
    }

    /// Bytes of the one allocation.
    pub fn allocation_bytes(&self) -> u64 {
        self.size
    }

    /// The bytes of KV group `group`, for tests that check the cache
    /// layout byte for byte (synchronizes).
    #[doc(hidden)]
    pub fn kv_bytes(&mut self, group: usize) -> Result<Vec<u8>, BackendError> {
        let len = self.kv.groups[group].bytes as usize;
        let mut out = vec![0u8; len];
        if self.ready() {
            self.issue(false);
            // SAFETY: the group's storage holds `len` bytes at kv_base[group].
            let r =
                unsafe { result::memcpy_dtoh_async(&mut out, self.kv_base[group], self.stream) };
            if let Err(e) = r {
                self.fail("reading the KV cache", e);
            }
            self.sync();
        }
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Prefill (more than 8 rows) of non-F32 matrices through the tiled
    /// f32 kernel (`true`) or cuBLAS on f16/bf16 (`false`, the default), so
    /// tests can check both.
    #[doc(hidden)]
    pub fn use_tiled_prefill(&mut self, on: bool) {
        self.tiled_prefill = on;
    }

    /// One-token MoE steps on the device's routes (`true`, the default) or
    /// expert by expert through the host (`false`), so tests can compare.
    #[doc(hidden)]
    pub fn use_device_routing(&mut self, on: bool) {
        self.device_routing = on;
    }

    /// How many times routes were read back to the host (tests).
    #[doc(hidden)]
    pub fn routes_read_back(&self) -> u64 {
        self.routes_read
    }

    /// Cuts attention's key ranges into `n` pieces (as far as the planned
    /// partials hold them) instead of the backend's choice, so tests can
    /// check the split and merge kernels at small contexts; `None` restores
    /// the choice.
    #[doc(hidden)]
    pub fn force_attention_splits(&mut self, n: Option<usize>) {
        self.forced_splits = n;
    }

    /// Sends decode rows to the tensor-core decode kernel wherever it
    /// applies (`Some(true)`) or never (`Some(false)`) instead of by their
    /// keys, so tests can check both kernels at small contexts; `None`
    /// restores the choice.
    #[doc(hidden)]
    pub fn force_decode_mma(&mut self, on: Option<bool>) {
        self.forced_decode_mma = on;
    }

    /// How the recorded launches went out: graphs captured and replayed,
    /// launches issued one by one.
    pub fn graph_stats(&self) -> GraphStats {
        self.queue.stats
    }

    /// Where cuBLAS was loaded from.
    pub fn blas_path(&self) -> &str {
        &self.blas.path
    }

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

    /// The norm of `rows` rows of `x` (with `add` added into `x` first,
    /// when given) into `out`, one launch of `rms_norm`; its output also as
    /// x8 blocks when a loaded matrix reads them (`x8_out`).
    #[allow(clippy::too_many_arguments)]
    fn norm_rows(
        &mut self,
        x: Buf,
        add: Option<Buf>,
        w: VectorId,
        eps: f32,
        rows: usize,
        width: usize,
        out: Buf,
    ) {
        let (mut wp, wl) = self.vectors[w.0 as usize];
        assert!(wl >= width, "rms_norm: {wl} weights for {width} values");
        let bytes = rows * width * 4;
        let mut xp = self.buf(x, bytes);
        let mut ap = add.map_or(0, |a| self.buf(a, bytes));
        let mut op = self.buf(out, bytes);
        if rows == 0 || !self.ready() {
            return;
        }
        let (mut eps, mut w) = (eps, width as i32);
        let mut x8 = self.x8_out(rows, width);
        let f = self.k.rms_norm;
        self.launch(
            f,
            (rows as u32, 1, 1),
            Self::norm_threads(width),
            &mut args![xp, ap, wp, eps, w, op, x8],
        );
        if x8 != 0 {
            self.x8_holds = Some((op, width));
        }
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

    /// Records a launch (or, in eager mode, launches it). `f` is a kernel
    /// of our module whose parameter list `args` matches (types and order
    /// as in fathom.cu); every pointer argument addresses the one
    /// allocation within the extents the op checked.
    fn launch(
        &mut self,
        f: sys::CUfunction,
        grid: (u32, u32, u32),
        block: u32,
        args: &mut [(*mut c_void, usize)],
    ) {
        if self.error.is_some() {
            return;
        }
        // Any kernel may write the buffer the staging was converted from.
        self.x16_holds = None;
        self.x8_holds = None;
        self.attention_last = false;
        self.queue.push(f, grid, block, args);
        if self.eager {
            self.issue(false);
        }
    }

    /// Copies the step area's unsent words, then issues the recorded
    /// launches (as a graph when `end_of_step` closes a whole step).
    fn issue(&mut self, end_of_step: bool) {
        if let Some((lo, hi)) = self.dirty.take() {
            let (at, words) = (self.upload.step + 4 * lo as u64, &self.step_host[lo..hi]);
            if self.error.is_none() {
                // SAFETY: [lo, hi) lies in the step area (sized by the
                // plan's StepWords); pageable memory is read before the
                // call returns.
                let r = unsafe { result::memcpy_htod_async(at, words, self.stream) };
                if let Err(e) = r {
                    self.fail("copying the step's upload", e);
                }
            }
        }
        self.staged.iter_mut().for_each(|s| *s = None);
        let whole = end_of_step && self.whole_step;
        self.whole_step = false;
        if self.error.is_some() {
            self.queue.discard();
            return;
        }
        let (blas, handle) = (&self.blas, self.blas_handle);
        let part = whole.then_some(self.step_part);
        if let Err(e) = self
            .queue
            .issue(self.stream, part, &mut |g| blas.gemm(handle, g))
        {
            self.fail_with(e);
        }
    }

    /// Records a cuBLAS call (or, in eager mode, makes it).
    fn gemm(&mut self, g: blas::Gemm) {
        self.x8_holds = None;
        if self.error.is_some() {
            return;
        }
        self.queue.push_gemm(g);
        if self.eager {
            self.issue(false);
        }
    }

    /// Issues what is recorded and launches at once until the next step:
    /// before a read-back the host waits for mid-step (MoE routes), or a
    /// collective queued straight onto the stream.
    fn go_eager(&mut self) {
        self.issue(false);
        self.eager = true;
    }

    /// A new step begins: what an earlier step left recorded is issued.
    fn begin_step(&mut self) {
        self.issue(false);
        self.eager = false;
        self.whole_step = true;
        self.step_part = 0;
    }

    /// Issues a whole step's head (the embedding up to the second layer's
    /// attention) as a graph of its own, so that the GPU runs the first
    /// layer while the host records the rest of the step: recording takes
    /// the host ~2 µs a layer (the H200 machine's), and a decode step
    /// recorded whole before its one graph launch had left the GPU idle
    /// all that time.
    fn issue_step_head(&mut self) {
        if !self.whole_step || self.eager || self.step_part != 0 {
            return;
        }
        self.issue(true);
        self.whole_step = self.error.is_none();
        self.step_part = 1;
    }

    /// Writes `words` into part `part` of the step area at word `at`, and
    /// returns their device address. Rewriting words of a part already
    /// written since the last issue with other values issues the queue
    /// first, so recorded launches read what was there when they were
    /// recorded; words of the part not yet written are just added.
    fn stage(&mut self, part: usize, at: usize, words: &[u32]) -> u64 {
        let end = at + words.len();
        if let Some((lo, hi)) = self.staged[part] {
            if at < hi && lo < end && self.step_host[at..end] != *words {
                self.issue(false);
            }
        }
        self.step_host[at..end].copy_from_slice(words);
        self.staged[part] = Some(widened(self.staged[part], at, end));
        self.dirty = Some(widened(self.dirty, at, end));
        if self.eager {
            self.issue(false);
        }
        self.upload.step + 4 * at as u64
    }

    fn htod<T>(&mut self, dst: u64, src: &[T]) {
        // The copy may land in the buffer the f16 staging came from.
        self.x16_holds = None;
        self.x8_holds = None;
        if self.error.is_some() || src.is_empty() {
            return;
        }
        // SAFETY: `dst` lies in the allocation with room for `src` (the
        // upload area is sized for the largest step; weights are checked
        // against the bump end). Pageable host memory: the call returns once
        // `src` has been read.
        let r = unsafe { result::memcpy_htod_async(dst, src, self.stream) };
        if let Err(e) = r {
            self.fail("host-to-device copy", e);
        }
    }

    fn sync(&mut self) {
        if self.error.is_some() {
            return;
        }
        // SAFETY: our own stream.
        if let Err(e) = unsafe { result::stream::synchronize(self.stream) } {
            self.fail("stream synchronize", e);
        }
    }

    /// Threads of a norm block for rows of `width`: about four values a
    /// thread, whole warps, at most 1024 (the kernel holds eight a thread
    /// in registers and loops beyond).
    fn norm_threads(width: usize) -> u32 {
        width.div_ceil(4).next_multiple_of(32).clamp(32, 1024) as u32
    }

    /// One token of x (at `xp`) through each matrix into its output
    /// address, in one launch of the one-token kernel: each matrix's rows
    /// take their own blocks (and warps a row). All of one type and width.
    fn matvec_one(&mut self, parts: &[(DevMatrix, u64)], mut xp: u64) {
        let kind = parts[0].0.kind;
        let mut s = Segments {
            w: [parts[0].0.arg; MV_SEGMENTS],
            out: [0; MV_SEGMENTS],
            split: [1; MV_SEGMENTS],
            first: [0; MV_SEGMENTS + 1],
            rows_per_block: 0,
            prefetch: 1,
        };
        // After attention, no prefetch: its latency-bound loads (and the
        // merge's) would wait in DRAM queues behind the prefetch of the
        // output projection's rows, which then read at DRAM speed anyway.
        if std::mem::take(&mut self.attention_last) {
            s.prefetch = 0;
        }
        let mut blocks = 0;
        for (i, (m, out)) in parts.iter().enumerate() {
            let (wr, wc) = (m.arg.rows as usize, m.arg.cols as usize);
            let split = Self::matvec_split(wr, wc / Self::matvec_chunk(kind, 1));
            (s.w[i], s.out[i], s.split[i]) = (m.arg, *out, split as i32);
            s.first[i] = blocks as i32;
            blocks += wr.div_ceil(MV_WARPS / split);
        }
        for f in &mut s.first[parts.len()..] {
            *f = blocks as i32;
        }
        let mut n = 1i32;
        let (x, cols) = (xp, parts[0].0.arg.cols as usize);
        let x8 = self.x8_input(kind, cols, xp);
        let rows: usize = parts.iter().map(|(m, _)| m.arg.rows as usize).sum();
        if let (None, Some(r)) = (
            x8,
            Self::balanced_rows(kind, rows, cols, blocks, self.sm_count),
        ) {
            let mut at = 0;
            for (i, f) in s.first.iter_mut().enumerate() {
                *f = at as i32;
                at += parts.get(i).map_or(0, |(m, _)| m.arg.rows as usize);
            }
            s.rows_per_block = r as i32;
            blocks = rows.div_ceil(r);
        }
        let f = if let Some(x8p) = x8 {
            xp = x8p;
            self.k.mv1x8[kind]
        } else {
            self.k.mv1[kind]
        };
        self.launch(
            f,
            (blocks as u32, 1, 1),
            32 * MV_WARPS as u32,
            &mut args![s, xp, n],
        );
        if x8.is_some() && parts.iter().all(|&(_, out)| out != x) {
            self.x8_holds = Some((x, cols));
        }
    }

    /// Rows a block of the balanced one-token kernel takes for `rows`
    /// rows of `cols` values of `kind`, where the plain layout's `blocks`
    /// need more than one wave (8 blocks a multiprocessor): f32, f16 and
    /// bf16 rows whose warps' runs (R × chunks / 4) fall on whole groups of
    /// 4 × 32 chunks, 4 to `MV_BALANCED_ROWS` rows a block; else `None`.
    fn balanced_rows(
        kind: usize,
        rows: usize,
        cols: usize,
        blocks: usize,
        sms: usize,
    ) -> Option<usize> {
        use WeightType::{BF16, F16, F32};
        let float = matches!(WeightType::ALL.get(kind), Some(F32 | F16 | BF16));
        let (wave, chunks) = (8 * sms, cols / 8);
        if !float || blocks <= wave || !cols.is_multiple_of(8) || !chunks.is_multiple_of(128) {
            return None;
        }
        (rows.div_ceil(wave).max(4)..=MV_BALANCED_ROWS)
            .find(|r| (r * chunks).is_multiple_of(4 * 128))
    }

    /// Where a one-token norm or attention writing `values` outputs also
    /// writes them as x8 blocks (the staging), or 0: only when a loaded
    /// matrix reads x8 and the values fit and fill whole blocks.
    fn x8_out(&self, rows: usize, values: usize) -> u64 {
        if rows == 1 && self.emits_x8 && values.is_multiple_of(32) && values <= self.upload.x16_cols
        {
            self.upload.x16
        } else {
            0
        }
    }

    /// One token of x (`cols` values at `xp`) for weights of `kind`: on
    /// the int8-activation kernels where the kind has them, quantized into
    /// the f16 staging (1.5 bytes a value, where 2 are planned), whose
    /// address it returns; else `None`, and the f32 kernels read x itself.
    fn x8_input(&mut self, kind: usize, cols: usize, xp: u64) -> Option<u64> {
        if self.k.mv1x8[kind].is_null() || !cols.is_multiple_of(32) || cols > self.upload.x16_cols {
            return None;
        }
        let (mut x, mut n, mut out) = (xp, cols as i32, self.upload.x16);
        if self.x8_holds == Some((xp, cols)) {
            return Some(out);
        }
        // A warp a 32-value block, 8 a launch block.
        let f = self.k.quantize_x8;
        let grid = (cols / 32).div_ceil(8) as u32;
        self.launch(f, (grid, 1, 1), 256, &mut args![x, n, out]);
        self.x8_holds = Some((xp, cols));
        Some(out)
    }

    /// Warps a matrix-vector kernel gives a weight row whose walk takes
    /// `chunks` steps of a lane: on more than 2,048 rows one warp reading a
    /// whole row measured faster (H200: 4096 rows, 12 µs against 13.8 µs
    /// split four ways); a matrix of fewer rows (K and V projections) takes
    /// up to four, for loads enough in flight, but no warp whose lanes would
    /// all be idle (a 2048-wide row is 64 chunks of 32 values: two warps).
    fn matvec_split(rows: usize, chunks: usize) -> usize {
        if rows <= 2048 {
            chunks.div_ceil(32).next_power_of_two().min(MV_WARPS)
        } else {
            1
        }
    }

    /// Values a matrix-vector lane decodes per step for `rows` rows of x on
    /// weights of `kind`: the one-token kernels of these types take 32 at
    /// once (`Chunk<T>` in fathom.cu; Q8_0 and Q4_0 a block on int8
    /// activations) or 64 (Q4_K and Q6_K on int8 activations), the rest 8. A mismatch
    /// with the kernels would only cost speed (`matvec_split`), never
    /// correctness.
    fn matvec_chunk(kind: usize, rows: usize) -> usize {
        use WeightType::{Q4_0, Q4_K, Q5_K, Q6_K, Q8_0};
        match WeightType::ALL.get(kind) {
            Some(Q4_K | Q6_K) if rows == 1 => 64,
            Some(Q5_K | Q8_0 | Q4_0) if rows == 1 => 32,
            _ => 8,
        }
    }

    fn grid_for(n: usize, block: usize) -> u32 {
        n.div_ceil(block).clamp(1, 65_535) as u32
    }

    /// Bump-allocates room in the weights region and copies `bytes` there.
    fn place(&mut self, what: &str, bytes: &[u8]) -> Result<u64, BackendError> {
        let start = align(self.weights_next, WEIGHT_ALIGN);
        let end = start.saturating_add(bytes.len() as u64);
        if end > self.weights_end {
            return Err(BackendError::OverPlan {
                what: format!("cuda weights ({what})"),
                needed: end,
                available: self.weights_end,
            });
        }
        if !self.ready() {
            return Err(self.error.take().unwrap_or(BackendError::Device {
                backend: "cuda",
                message: "backend failed earlier".into(),
            }));
        }
        // On our stream, so the kernels after it see the bytes (a plain
        // synchronous copy runs on the legacy stream, which a non-blocking
        // stream does not wait for). From pageable memory the call returns
        // once `bytes` has been read, so the mmap may go away after.
        // SAFETY: [start, end) lies in the weights region of the allocation.
        unsafe { result::memcpy_htod_async(self.base + start, bytes, self.stream) }
            .map_err(|e| device_err(&format!("copying {what} to the device"), e))?;
        self.weights_next = end;
        Ok(self.base + start)
    }

    /// Stages the step's rows (sequence, position), sequences (start, first
    /// row) and, for `group`, each sequence's page table.
    fn upload_step(&mut self, step: &Step, group: Option<usize>) -> StepDesc {
        let (t, s, stride) = (
            self.upload.tokens,
            self.upload.seqs,
            self.upload.table_stride,
        );
        let words = self.upload.words;
        let n_seqs = step.seqs.len();
        assert!(
            step.rows <= t && n_seqs <= s,
            "a step of {} rows in {n_seqs} sequences; {t} rows and {s} sequences planned",
            step.rows
        );
        // The step's own rows and sequences, packed: each layer's attention
        // stages them again (the same values, so nothing is issued), and
        // the planned lengths (the largest step's: a thousand words for a
        // 512-token chunk) had been filled, compared and copied each time,
        // host time in which the GPU waits for the step.
        let (rows, seq_at) = (step.rows, 2 * step.rows);
        let mut h = std::mem::take(&mut self.host_u32);
        h.clear();
        h.resize(seq_at + 2 * n_seqs, 0);
        let mut row = 0usize;
        for (i, seq) in step.seqs.iter().enumerate() {
            assert!(
                row + seq.tokens <= rows,
                "the step's sequences hold more than its {rows} rows"
            );
            for j in 0..seq.tokens {
                h[row + j] = i as u32;
                h[rows + row + j] = (seq.start + j) as u32;
            }
            h[seq_at + i] = seq.start as u32;
            h[seq_at + n_seqs + i] = row as u32;
            row += seq.tokens;
        }
        assert_eq!(
            row, rows,
            "the step's sequences hold {row} rows, not {rows}"
        );
        let base = self.stage(STAGED_ROWS, 0, &h);
        self.host_u32 = h;
        // Each sequence's page table at its planned stride, the rest of the
        // stride left as it was (only blocks of the sequence's positions are
        // read).
        let mut tables = 0;
        if let Some(g) = group {
            let at = words.tables(g as u64) as usize;
            tables = self.upload.step + 4 * at as u64;
            for (i, seq) in step.seqs.iter().enumerate() {
                let table = &seq.tables[g];
                assert!(
                    table.len() <= stride,
                    "a page table of {} blocks; {stride} planned per sequence",
                    table.len()
                );
                self.stage(STAGED_FIXED + g, at + i * stride, table);
            }
        }
        let word = |k: usize| base + 4 * k as u64;
        StepDesc {
            row_seq: base,
            row_pos: word(rows),
            seq_start: word(seq_at),
            seq_row0: word(seq_at + n_seqs),
            tables,
            table_stride: stride as i32,
            pad: 0,
        }
    }

    /// Stages the row list of a gather (`projected`) or the token ids of
    /// an embedding (`!projected`).
    fn stage_rows(&mut self, rows: &[u32], projected: bool) -> u64 {
        assert!(
            rows.len() <= self.upload.tokens,
            "{} rows; {} planned",
            rows.len(),
            self.upload.tokens
        );
        let w = self.upload.words;
        if projected {
            self.stage(STAGED_PROJECTED, w.projected() as usize, rows)
        } else {
            self.stage(STAGED_TOKENS, w.token_ids() as usize, rows)
        }
    }

    /// Reads the last route_experts' routes back (once), for the ops that
    /// sort rows by expert on the host: what is recorded goes now, and the
    /// rest of the step launches op by op.
    fn routes_to_host(&mut self) {
        if !std::mem::take(&mut self.routes_stale) || !self.ready() {
            return;
        }
        self.go_eager();
        self.routes_read += 1;
        let n = self.routes_rows * self.routes_k * 2;
        let rp = self.buf(Buf::ExpertRoutes, n * 4);
        let mut host = std::mem::take(&mut self.routes);
        if self.error.is_none() {
            // SAFETY: `host` holds n u32 (route_experts checked); the routes
            // buffer holds rows × k pairs; pageable memory: returns when done.
            let r = unsafe { result::memcpy_dtoh_async(&mut host[..n], rp, self.stream) };
            if let Err(e) = r {
                self.fail("reading the expert routes", e);
            }
        }
        self.routes = host;
        self.sync();
    }

    /// `(first, stride)` when matrix `i` of every expert has the first's
    /// kind and shape and lies `stride` bytes past the one before (how the
    /// loader places a layer's experts), so a kernel finds expert e's at
    /// `first.data + e × stride`.
    fn evenly_placed(&self, experts: &[[MatrixId; 3]], i: usize) -> Option<(DevMatrix, u64)> {
        let at = |e: usize| self.matrices[experts[e][i].0 as usize];
        let first = at(0);
        let stride = experts
            .get(1)
            .map_or(0, |_| at(1).arg.data.wrapping_sub(first.arg.data));
        let even = (0..experts.len()).all(|e| {
            let (m, a) = (at(e), at(e).arg);
            m.kind == first.kind
                && (a.rows, a.cols, a.row_bytes)
                    == (first.arg.rows, first.arg.cols, first.arg.row_bytes)
                && a.scales == 0
                && a.data == first.arg.data.wrapping_add(stride.wrapping_mul(e as u64))
        });
        even.then_some((first, stride))
    }

    /// A one-token MoE FFN on the routes route_experts left on the device:
    /// gate and up of the k routed experts in one launch, down in another,
    /// their weighted sum in a third; nothing is read back, so the step
    /// stays one graph. `false`, with nothing launched, where the experts
    /// do not lie evenly, their kinds have no routed kernels, or k rows do
    /// not fit the planned buffers.
    fn routed_on_device(&mut self, ffn: &RoutedFfn, x: Buf, out: Buf) -> bool {
        let RoutedFfn {
            experts,
            k,
            act,
            width,
            ffn_width,
        } = *ffn;
        let (Some((g, gs)), Some((u, us)), Some((d, ds))) = (
            self.evenly_placed(experts, 0),
            self.evenly_placed(experts, 1),
            self.evenly_placed(experts, 2),
        ) else {
            return false;
        };
        let (gate_x8, down_x8) = (
            !self.k.mv1x8[g.kind].is_null(),
            !self.k.mv1x8[d.kind].is_null(),
        );
        let staging = self.upload.x16_cols * self.upload.tokens * 2;
        let x8_fits =
            |values: usize| values.is_multiple_of(32) && values / 32 * X8_BLOCK <= staging;
        let holds = |b: Buf, bytes: usize| {
            self.arena[b as usize].is_some_and(|(_, size)| bytes as u64 <= size)
        };
        let fits = k <= MOE_MAX_ROUTES
            && k == self.routes_k
            && g.kind == u.kind
            && !self.k.moe_gate_up[g.kind].is_null()
            && !self.k.moe_down[d.kind].is_null()
            && (g.arg.rows, g.arg.cols, d.arg.rows, d.arg.cols)
                == (
                    ffn_width as i32,
                    width as i32,
                    width as i32,
                    ffn_width as i32,
                )
            && (u.arg.rows, u.arg.cols) == (g.arg.rows, g.arg.cols)
            && (!gate_x8 || (x8_fits(width) && width <= self.upload.x16_cols))
            && (!down_x8 || x8_fits(k * ffn_width))
            && holds(Buf::FfnGate, k * ffn_width * 4)
            && holds(Buf::MoeOut, k * width * 4);
        if !fits {
            return false;
        }
        let mut xp = self.buf(x, width * 4);
        let mut gate_out = self.buf(Buf::FfnGate, k * ffn_width * 4);
        let mut down_out = self.buf(Buf::MoeOut, k * width * 4);
        let mut op = self.buf(out, width * 4);
        let mut routes = self.buf(Buf::ExpertRoutes, k * 8);
        if !self.ready() {
            return true;
        }
        let ky = k as u32;
        if gate_x8 {
            xp = self
                .x8_input(g.kind, width, xp)
                .expect("checked: x fits the x8 staging");
        }
        let split = Self::matvec_split(ffn_width, width / Self::matvec_chunk(g.kind, 1));
        let (mut ga, mut ua, mut gs, mut us, mut sp) = (g.arg, u.arg, gs, us, split as i32);
        let mut a = act_id(act);
        let grid = ffn_width.div_ceil(MV_WARPS / split) as u32;
        let f = self.k.moe_gate_up[g.kind];
        self.launch(
            f,
            (grid, ky, 1),
            32 * MV_WARPS as u32,
            &mut args![ga, ua, gs, us, routes, xp, gate_out, sp, a],
        );
        let mut dx = gate_out;
        if down_x8 {
            // The k rows' blocks one after another: each row's own blocks.
            let (mut n, mut staged) = ((k * ffn_width) as i32, self.upload.x16);
            let f = self.k.quantize_x8;
            let grid = (k * ffn_width / 32).div_ceil(8) as u32;
            self.launch(f, (grid, 1, 1), 256, &mut args![dx, n, staged]);
            dx = staged;
        }
        let split = Self::matvec_split(width, ffn_width / Self::matvec_chunk(d.kind, 1));
        let (mut da, mut ds, mut sp) = (d.arg, ds, split as i32);
        let grid = width.div_ceil(MV_WARPS / split) as u32;
        let f = self.k.moe_down[d.kind];
        self.launch(
            f,
            (grid, ky, 1),
            32 * MV_WARPS as u32,
            &mut args![da, ds, routes, dx, down_out, sp],
        );
        let (mut kk, mut w) = (k as i32, width as i32);
        let f = self.k.moe_combine;
        self.launch(
            f,
            (width.div_ceil(256) as u32, 1, 1),
            256,
            &mut args![down_out, routes, kk, w, op],
        );
        true
    }

    /// Uploads an expert's row indices (and weights) for its gather /
    /// scatter. Written op by op into one area, so what is recorded (which
    /// may read the previous list) is issued first.
    fn upload_idx(&mut self, idx: &[u32], weights: Option<&[f32]>) -> (u64, u64) {
        self.issue(false);
        assert!(
            idx.len() <= self.upload.tokens,
            "{} rows; {} planned",
            idx.len(),
            self.upload.tokens
        );
        let (i, w) = (self.upload.idx, self.upload.weights);
        self.htod(i, idx);
        if let Some(wts) = weights {
            self.htod(w, wts);
        }
        (i, w)
    }

    fn kv_desc(&self, layer: usize, shape: &AttentionShape) -> KvDesc {
        let (group, l) =
            self.slots[layer].unwrap_or_else(|| panic!("layer {layer} has no KV (no attention)"));
        let g = &self.kv.groups[group];
        assert!(
            g.n_kv_heads as usize == shape.n_kv_heads
                && g.key_dim as usize == shape.key_dim
                && g.value_dim as usize == shape.value_dim,
            "layer {layer}'s shape differs from its KV group's"
        );
        let dtype = self.kv.dtype;
        let k_row = dtype.row_bytes(g.n_kv_heads * g.key_dim);
        let v_row = dtype.row_bytes(g.n_kv_heads * g.value_dim);
        KvDesc {
            base: self.kv_base[group],
            block_bytes: g.block_bytes(),
            layer_off: l as u64 * KV_BLOCK_TOKENS * (k_row + v_row),
            k_row: k_row as i32,
            v_row: v_row as i32,
            ring: if g.window.is_some() {
                (g.blocks_per_sequence * KV_BLOCK_TOKENS) as i32
            } else {
                0
            },
            dtype: match dtype {
                KvDtype::F16 => 0,
                KvDtype::Bf16 => 1,
                KvDtype::F32 => 2,
                KvDtype::Q8_0 => 3,
            },
        }
    }

    /// Prefill matmul on tensor cores: x to f16 (bf16 for BF16 weights),
    /// then cuBLAS GemmEx with f32 accumulation, straight on F16/BF16
    /// weights, on W16_STAGING-sized chunks of dequantized rows otherwise.
    fn gemm_prefill(&mut self, m: DevMatrix, x: u64, rows: usize, out: u64) {
        let (wr, wc) = (m.arg.rows as usize, m.arg.cols as usize);
        let bf16 = m.kind == kind_of_type(WeightType::BF16);
        let ty = if bf16 { blas::R_16BF } else { blas::R_16F };
        let (mut xp, mut n, mut bf, mut x16) =
            (x, (rows * wc) as i64, bf16 as i32, self.upload.x16);
        let holds = Some((xp, n, bf));
        if self.x16_holds != holds {
            let f = self.k.to_half;
            let grid = Self::grid_for(n as usize, 256).min(4096);
            self.launch(f, (grid, 1, 1), 256, &mut args![xp, n, bf, x16]);
        }
        let gemm = |s: &mut Self, a: u64, m_rows: usize, c: u64| {
            // Column-major: out' (wr × rows, ldc wr) = W' (wc × m)ᵀ · x' (wc × rows).
            s.gemm(blas::Gemm {
                ops: (blas::OP_T, blas::OP_N),
                mnk: (m_rows, rows, wc),
                ab_type: ty,
                a,
                lda: wc,
                b: s.upload.x16,
                ldb: wc,
                c,
                ldc: wr,
            });
        };
        if bf16 || m.kind == kind_of_type(WeightType::F16) {
            gemm(self, m.arg.data, wr, out);
            self.x16_holds = holds;
            return;
        }
        let chunk =
            ((W16_STAGING as usize / (2 * wc)) / 64 * 64).clamp(64, wr.next_multiple_of(64));
        let f = self.k.dequant[m.kind];
        let mut r0 = 0;
        while r0 < wr {
            let nr = chunk.min(wr - r0);
            let (mut arg, mut row0, mut w16) = (m.arg, r0 as i32, self.upload.w16);
            self.launch(f, (nr as u32, 1, 1), 128, &mut args![arg, row0, w16]);
            gemm(self, self.upload.w16, nr, out + 4 * r0 as u64);
            r0 += nr;
        }
        // The dequant launches write only the weight staging.
        self.x16_holds = holds;
    }

    /// Attention of the step's rows; `rounded`: q, k and v already hold
    /// the cache's precision (rope_kv did it).
    fn attention_of(
        &mut self,
        layer: usize,
        shape: &AttentionShape,
        step: &Step,
        io: AttentionIo,
        readied: Readied,
    ) {
        let AttentionIo { q, k, v, out } = io;
        let s = *shape;
        assert!(
            s.key_dim <= ATT_MAX_DIM && s.value_dim <= ATT_MAX_DIM,
            "attention: head dims {}/{} above {ATT_MAX_DIM}",
            s.key_dim,
            s.value_dim
        );
        assert!(s.n_kv_heads > 0 && s.n_heads.is_multiple_of(s.n_kv_heads));
        let rows = step.rows;
        let mut qp = self.buf(q, rows * s.n_heads * s.key_dim * 4);
        let mut kp = self.buf(k, rows * s.n_kv_heads * s.key_dim * 4);
        let mut vp = self.buf(v, rows * s.n_kv_heads * s.value_dim * 4);
        let mut op = self.buf(out, rows * s.n_heads * s.value_dim * 4);
        let mut kv = self.kv_desc(layer, shape);
        if rows == 0 || !self.ready() {
            return;
        }
        // The step's own rows read what the cache will hold, as on the CPU:
        // K and V in the cache's precision, q in f16 against an f16 cache.
        let q_values = if self.kv.dtype == KvDtype::F16 {
            rows * s.n_heads * s.key_dim
        } else {
            0
        };
        if readied == Readied::No {
            self.round_to_kv(
                [
                    (kp, rows * s.n_kv_heads * s.key_dim),
                    (vp, rows * s.n_kv_heads * s.value_dim),
                    (qp, q_values),
                ],
                kv.dtype,
            );
        }
        let group = self.slots[layer].map(|(g, _)| g);
        let mut st = self.upload_step(step, group);
        let (mut nh, mut nkv, mut dk, mut dv) = (
            s.n_heads as i32,
            s.n_kv_heads as i32,
            s.key_dim as i32,
            s.value_dim as i32,
        );
        let mut window = s.window.map(|w| w as i32).unwrap_or(0);
        let mut scale = s.scale;
        let in_attention = matches!(readied, Readied::InAttention(..));
        if let Some((f, gp, tiles)) = self.attention_mma_plan(shape, step) {
            assert!(!in_attention, "a decode step on the prefill kernel");
            let (mut n_seqs, mut rows, mut gp) = (step.seqs.len() as i32, rows as i32, gp as i32);
            self.launch(
                f,
                (tiles as u32, s.n_kv_heads as u32, 1),
                ATT_MMA_THREADS,
                &mut args![st, kv, qp, kp, vp, op, n_seqs, rows, nh, nkv, gp, window, scale],
            );
            return;
        }
        let keys = Self::attended_keys(&s, step);
        let (mut rope, kernel) = match readied {
            Readied::InAttention(rope, kernel) => (rope, Some(kernel)),
            _ => (AttRope::default(), self.row_kernel(&s, keys, kv.dtype)),
        };
        let Some(RowKernel { f, row_blocks, .. }) = kernel else {
            assert!(
                !in_attention,
                "rope inside attention without the split kernels"
            );
            let f = self.k.attention;
            self.launch(
                f,
                (rows as u32, s.n_heads as u32, 1),
                ATT_THREADS,
                &mut args![st, kv, qp, kp, vp, op, nh, nkv, dk, dv, window, scale],
            );
            return;
        };
        let blocks = rows * row_blocks;
        let want = self
            .forced_splits
            .unwrap_or_else(|| Self::attention_splits(keys, blocks, self.sm_count));
        let per_split = rows * s.n_heads * (s.value_dim + 2) * 4;
        let fit = (self.partials.1 / per_split as u64) as usize;
        let splits = want.min(ATTENTION_ROW_SPLITS).min(fit).max(1);
        let mut part = self.partials.0;
        // The output as x8 blocks too, by whichever kernel writes it last.
        let x8 = if s.value_dim.is_multiple_of(32) {
            self.x8_out(rows, s.n_heads * s.value_dim)
        } else {
            0
        };
        let (mut x8_split, mut x8_merge) = if splits > 1 { (0, x8) } else { (x8, 0) };
        self.launch(
            f,
            (rows as u32, row_blocks as u32, splits as u32),
            ATT_THREADS,
            &mut args![
                st, kv, qp, kp, vp, op, part, x8_split, nh, nkv, dk, dv, window, scale, rope
            ],
        );
        if splits > 1 {
            let mut n = splits as i32;
            let f = self.k.attention_merge;
            self.launch(
                f,
                (rows as u32, s.n_heads as u32, 1),
                128,
                &mut args![part, n, nh, dv, op, x8_merge],
            );
        }
        if x8 != 0 {
            self.x8_holds = Some((op, s.n_heads * s.value_dim));
        }
        self.attention_last = true;
    }

    /// The kernel that attends rows of shape `s` over `keys` keys against a
    /// cache of KV dtype `dtype` (`KV_*` in fathom.cu) where the split
    /// kernels apply (`None`: the one-block kernel): the tensor-core decode
    /// kernel or the split kernel of the shape's value dims a lane and
    /// query heads a block. `attend` asks it whether a decode step's rope
    /// can go inside attention, `attention_of` which kernel to launch.
    fn row_kernel(&self, s: &AttentionShape, keys: usize, dtype: i32) -> Option<RowKernel> {
        let vpl = Self::split_vpl(s)?;
        if let Some(f) = self.decode_mma_kernel(s, keys) {
            return Some(RowKernel {
                f,
                row_blocks: s.n_kv_heads,
                ropes: true,
            });
        }
        let heads = Self::split_heads(s, keys, vpl);
        let hi = ATT_HEADS
            .iter()
            .position(|&h| h == heads)
            .expect("a power of two up to 8");
        let chunks = (s.n_heads / s.n_kv_heads).div_ceil(heads);
        Some(RowKernel {
            f: self.k.attention_split[dtype as usize][vpl][hi],
            row_blocks: s.n_kv_heads * chunks,
            ropes: ATT_VPL[vpl] * heads <= ATT_ROPE_MAX,
        })
    }

    /// Pieces to cut a row's `keys` into when a row takes `blocks` blocks:
    /// as many as one wave of blocks holds (2 a multiprocessor: the split
    /// and decode kernels' registers allow 2 blocks of 128 threads), in as
    /// few rounds of 32 keys a warp as that allows, the rounds even across
    /// the block's 4 warps (a piece of 4 × rounds runs of 32 keys, at least
    /// `ATTENTION_SPLIT_KEYS` keys). On the H200 at an 8B-shaped layer's 8
    /// KV heads: 33 pieces at 4,097 to 4,224 keys (one run a warp) rather
    /// than 32 (some warps two); 32 at 8,192 (two runs a warp) rather than
    /// 64 (two waves).
    fn attention_splits(keys: usize, blocks: usize, sm_count: usize) -> usize {
        const RUN: usize = 32;
        const WARPS: usize = ATTENTION_SPLIT_KEYS as usize / RUN;
        let most = (2 * sm_count / blocks.max(1)).max(1);
        let runs = keys.div_ceil(RUN);
        let rounds = runs.div_ceil(WARPS * most).max(1);
        runs.div_ceil(WARPS * rounds)
    }

    /// The split kernels' `ATT_VPL` index for this shape, or `None` where
    /// they do not apply: they read 8 key values and 2..16 value dims at a
    /// time (aligned vector loads); other head dims take the one-block
    /// kernel.
    fn split_vpl(s: &AttentionShape) -> Option<usize> {
        let vpl = ATT_VPL.iter().position(|&n| 32 * n >= s.value_dim)?;
        (s.key_dim.is_multiple_of(8)
            && s.value_dim.is_multiple_of(8)
            && s.value_dim.is_multiple_of(ATT_VPL[vpl]))
        .then_some(vpl)
    }

    /// Keys the longest row of the step attends to.
    fn attended_keys(s: &AttentionShape, step: &Step) -> usize {
        let keys = step
            .seqs
            .iter()
            .map(|q| q.start + q.tokens)
            .max()
            .unwrap_or(0);
        s.window.map_or(keys, |w| keys.min(w))
    }

    /// Query heads a split attention block takes: the GQA group, in chunks
    /// of a power of two, so that a K/V row is read once for them all; up
    /// to ATTENTION_ONE_HEAD_KEYS keys, one head a block (the chain of a
    /// head's dots and softmax sums is then the kernel's time, not the K/V
    /// bytes: measured on the H200, decode at short context 3-4% faster
    /// for an 8B-shaped Q4_0 and SmolLM2, 8B F16 1% slower from 512 keys).
    fn split_heads(s: &AttentionShape, keys: usize, vpl: usize) -> usize {
        if keys <= ATTENTION_ONE_HEAD_KEYS {
            return 1;
        }
        let most = if ATT_VPL[vpl] == 16 { 2 } else { 8 };
        (s.n_heads / s.n_kv_heads).next_power_of_two().min(most)
    }

    /// The tensor-core decode kernel (`attention_decode_mma_<D>`) where it
    /// applies: an f16 cache, equal key and value dims of 64 or 128, GQA
    /// groups of up to `ATT_DEC_GROUP` query heads, and at least
    /// `ATTENTION_DECODE_MMA_KEYS` keys (or as a test forces). Rows of the
    /// same shape with fewer keys take the split kernels (one query head a
    /// block up to `ATTENTION_ONE_HEAD_KEYS`).
    fn decode_mma_kernel(&self, s: &AttentionShape, keys: usize) -> Option<sys::CUfunction> {
        let f = match (s.key_dim, s.value_dim) {
            (64, 64) => self.k.attention_decode_mma[0],
            (128, 128) => self.k.attention_decode_mma[1],
            _ => return None,
        };
        let fits = self.kv.dtype == KvDtype::F16 && s.n_heads / s.n_kv_heads <= ATT_DEC_GROUP;
        let wanted = self
            .forced_decode_mma
            .unwrap_or(keys >= ATTENTION_DECODE_MMA_KEYS);
        (fits && wanted).then_some(f)
    }

    /// The tensor-core prefill kernel for this step, when it applies: an
    /// f16 cache, equal key and value dims of 64 or 128, GQA groups of up to
    /// 16 query heads, and at least `ATT_MMA_MIN_ROWS` rows a sequence on
    /// average (decode rows alone go to the split kernels, which also cut
    /// long contexts across blocks). Returns the kernel, the group padded to
    /// a power of two, and the grid's tiles (each sequence's rows in runs of
    /// a block's `4 × 16 / padded group` rows).
    fn attention_mma_plan(
        &self,
        shape: &AttentionShape,
        step: &Step,
    ) -> Option<(sys::CUfunction, usize, usize)> {
        let group = shape.n_heads / shape.n_kv_heads;
        let gp = group.next_power_of_two();
        let f = match shape.key_dim {
            64 => self.k.attention_mma[0],
            128 => self.k.attention_mma[1],
            _ => return None,
        };
        let fits = self.kv.dtype == KvDtype::F16
            && shape.value_dim == shape.key_dim
            && gp <= 16
            && step.rows >= ATT_MMA_MIN_ROWS * step.seqs.len();
        if !fits || self.forced_splits.is_some() {
            return None;
        }
        let block_rows = ATT_MMA_WARPS * (16 / gp);
        let tiles = step
            .seqs
            .iter()
            .map(|q| q.tokens.div_ceil(block_rows))
            .sum();
        Some((f, gp, tiles))
    }

    /// Device address of a rope's frequency factors (0 for none), checked
    /// to cover a head's pairs.
    fn rope_freqs(&self, rope: &RopeParams, head_dim: usize) -> u64 {
        rope.freqs.map_or(0, |v| {
            let (p, l) = self.vectors[v.0 as usize];
            assert!(
                l >= head_dim / 2,
                "rope: {l} frequency factors for {} pairs",
                head_dim / 2
            );
            p
        })
    }

    /// Rounds three runs of values (address, count) to the KV dtype's
    /// precision in one launch.
    fn round_to_kv(&mut self, runs: [(u64, usize); 3], dtype: i32) {
        let [(mut a, na), (mut b, nb), (mut c, nc)] = runs;
        let (mut na, mut nb, mut nc, mut dtype) = (na as i64, nb as i64, nc as i64, dtype);
        let values = runs.iter().map(|r| r.1).sum::<usize>();
        let f = self.k.round_to_kv;
        let grid = Self::grid_for(values, 256);
        self.launch(f, (grid, 1, 1), 256, &mut args![a, na, b, nb, c, nc, dtype]);
    }
}

/// The word range `range` (if any) grown to take in `at .. end`.
fn widened(range: Option<(usize, usize)>, at: usize, end: usize) -> (usize, usize) {
    match range {
        Some((lo, hi)) => (lo.min(at), hi.max(end)),
        None => (at, end),
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
        let unsupported = |why: String| BackendError::Device {
            backend: "cuda",
            message: why,
        };
        if !m.cols.is_multiple_of(8) {
            return Err(unsupported(format!(
                "a {}x{} matrix: the CUDA kernels need a multiple of 8 columns",
                m.rows, m.cols
            )));
        }
        let rows = i32::try_from(m.rows).map_err(|_| unsupported(format!("{} rows", m.rows)))?;
        let cols = i32::try_from(m.cols).map_err(|_| unsupported(format!("{} cols", m.cols)))?;
        let dev = match &m.storage {
            MatrixStorage::Blocks(ty) => {
                let row_bytes = ty.row_bytes(m.cols);
                let need = row_bytes * m.rows;
                if m.data.len() < need || !m.cols.is_multiple_of(ty.block_elems()) {
                    return Err(BackendError::OutOfRange {
                        offset: 0,
                        len: need,
                        size: m.data.len(),
                    });
                }
                let data = self.place(ty.name(), &m.data.bytes()[..need])?;
                DevMatrix {
                    kind: kind_of_type(*ty),
                    arg: WeightsArg {
                        data,
                        scales: 0,
                        biases: 0,
                        row_bytes: row_bytes as u64,
                        rows,
                        cols,
                        group: 0,
                        bf16: 0,
                    },
                }
            }
            MatrixStorage::Affine {
                bits,
                group,
                scales,
                biases,
                bf16,
            } => {
                let kind = match bits {
                    2 => 13,
                    4 => 14,
                    8 => 15,
                    b => {
                        return Err(unsupported(format!(
                            "MLX affine {b}-bit: 2, 4 or 8 are valid"
                        )))
                    }
                };
                if *group == 0 || !group.is_multiple_of(8) || !m.cols.is_multiple_of(*group) {
                    return Err(unsupported(format!(
                        "MLX affine group {group} for {} columns: a multiple of 8 dividing them",
                        m.cols
                    )));
                }
                let row_bytes = m.cols * *bits as usize / 8;
                let halves = m.rows * (m.cols / group) * 2;
                let need = row_bytes * m.rows;
                if m.data.len() < need || scales.len() < halves || biases.len() < halves {
                    return Err(BackendError::OutOfRange {
                        offset: 0,
                        len: need,
                        size: m.data.len(),
                    });
                }
                let data = self.place("affine weights", &m.data.bytes()[..need])?;
                let s = self.place("affine scales", &scales.bytes()[..halves])?;
                let b = self.place("affine biases", &biases.bytes()[..halves])?;
                DevMatrix {
                    kind,
                    arg: WeightsArg {
                        data,
                        scales: s,
                        biases: b,
                        row_bytes: row_bytes as u64,
                        rows,
                        cols,
                        group: *group as i32,
                        bf16: *bf16 as i32,
                    },
                }
            }
        };
        self.emits_x8 |= !self.k.mv1x8[dev.kind].is_null();
        self.matrices.push(dev);
        Ok(MatrixId(self.matrices.len() as u32 - 1))
    }

    fn load_vector(&mut self, values: &[f32]) -> Result<VectorId, BackendError> {
        // SAFETY: f32 has no padding; the byte view covers exactly `values`.
        let bytes = unsafe {
            std::slice::from_raw_parts(values.as_ptr() as *const u8, std::mem::size_of_val(values))
        };
        let at = self.place("vector", bytes)?;
        self.vectors.push((at, values.len()));
        Ok(VectorId(self.vectors.len() as u32 - 1))
    }

    fn embed(&mut self, table: MatrixId, tokens: &[u32], scale: f32, out: Buf) {
        let m = self.matrices[table.0 as usize];
        let cols = m.arg.cols as usize;
        let mut o = self.buf(out, tokens.len() * cols * 4);
        if tokens.is_empty() || !self.ready() {
            return;
        }
        // The embedding is a forward's first op.
        self.begin_step();
        let mut idx = self.stage_rows(tokens, false);
        let (mut w, mut scale) = (m.arg, scale);
        let f = self.k.embed[m.kind];
        self.launch(
            f,
            (tokens.len() as u32, 1, 1),
            128,
            &mut args![w, idx, scale, o],
        );
    }

    fn matmul(&mut self, w: MatrixId, x: Buf, rows: usize, out: Buf) {
        let m = self.matrices[w.0 as usize];
        let (wr, wc) = (m.arg.rows as usize, m.arg.cols as usize);
        let mut xp = self.buf(x, rows * wc * 4);
        let mut op = self.buf(out, rows * wr * 4);
        if rows == 0 || !self.ready() {
            return;
        }
        if m.kind == kind_of_type(WeightType::F32) {
            // Row-major out (rows × wr) = x (rows × wc) · Wᵀ is, column-major,
            // out' (wr × rows) = W' (wc × wr)ᵀ · x' (wc × rows).
            self.gemm(blas::Gemm {
                ops: (blas::OP_T, blas::OP_N),
                mnk: (wr, rows, wc),
                ab_type: blas::R_32F,
                a: m.arg.data,
                lda: wc,
                b: xp,
                ldb: wc,
                c: op,
                ldc: wr,
            });
            return;
        }
        let mut arg = m.arg;
        if rows == 1 {
            self.matvec_one(&[(m, op)], xp);
        } else if rows <= MV_MAX_TOKENS {
            let mut n = rows as i32;
            let f = self.k.mv[m.kind];
            let split = Self::matvec_split(wr, wc / Self::matvec_chunk(m.kind, rows));
            let mut sp = split as i32;
            let grid = wr.div_ceil(MV_WARPS / split) as u32;
            self.launch(
                f,
                (grid, 1, 1),
                32 * MV_WARPS as u32,
                &mut args![arg, xp, op, n, sp],
            );
        } else if self.tiled_prefill
            || wc > self.upload.x16_cols
            || rows > self.upload.tokens
            || 64 * 2 * wc > W16_STAGING as usize
        {
            let f = self.k.mm[m.kind];
            // The tiled kernel covers up to 65,535 × 64 tokens a launch.
            let mut done = 0;
            while done < rows {
                let n = (rows - done).min(65_535 * 64);
                let mut xn = xp + (done * wc * 4) as u64;
                let mut on = op + (done * wr * 4) as u64;
                let mut nn = n as i32;
                let grid = (wr.div_ceil(64) as u32, n.div_ceil(64) as u32, 1);
                self.launch(f, grid, 256, &mut args![arg, xn, on, nn]);
                done += n;
            }
        } else {
            self.gemm_prefill(m, xp, rows, op);
        }
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
        let (mut wp, wl) = self.vectors[w.0 as usize];
        assert!(wl >= head_dim && head_dim > 0 && width.is_multiple_of(head_dim));
        let mut xp = self.buf(x, rows * width * 4);
        let heads = rows * width / head_dim;
        if heads == 0 || !self.ready() {
            return;
        }
        let mut op = xp;
        let (mut eps, mut hd, mut no_add, mut no_x8) = (eps, head_dim as i32, 0u64, 0u64);
        let f = self.k.rms_norm;
        // Every head is a row of head_dim values; in place is allowed.
        self.launch(
            f,
            (heads as u32, 1, 1),
            Self::norm_threads(head_dim),
            &mut args![xp, no_add, wp, eps, hd, op, no_x8],
        );
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

    /// One launch for one token through matrices of one type and width
    /// (q, k and v, as `matvec_one` takes them); otherwise one matmul each.
    fn matmul_many(&mut self, ws: &[MatrixId], x: Buf, rows: usize, outs: &[Buf]) {
        let first = self.matrices[ws[0].0 as usize];
        let fused = rows == 1
            && ws.len() <= MV_SEGMENTS
            && first.kind != kind_of_type(WeightType::F32)
            && ws.iter().all(|w| {
                let m = self.matrices[w.0 as usize];
                m.kind == first.kind && m.arg.cols == first.arg.cols
            });
        if !fused {
            for (&w, &out) in ws.iter().zip(outs) {
                self.matmul(w, x, rows, out);
            }
            return;
        }
        let xp = self.buf(x, first.arg.cols as usize * 4);
        let mut parts = [(first, 0u64); MV_SEGMENTS];
        for (i, (&w, &out)) in ws.iter().zip(outs).enumerate() {
            let m = self.matrices[w.0 as usize];
            parts[i] = (m, self.buf(out, m.arg.rows as usize * 4));
        }
        if self.ready() {
            self.matvec_one(&parts[..ws.len()], xp);
        }
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
        let (g, u) = (self.matrices[gate.0 as usize], self.matrices[up.0 as usize]);
        let fused = rows <= MV_MAX_TOKENS
            && g.kind == u.kind
            && g.kind != kind_of_type(WeightType::F32)
            && (g.arg.rows, g.arg.cols) == (u.arg.rows, u.arg.cols)
            && g.arg.rows as usize == width;
        if !fused {
            // Prefill (cuBLAS), F32 weights, or a mixed-type pair (Q4_K_M
            // keeps some up projections in another type than their gates).
            self.matmul(gate, x, rows, out);
            self.matmul(up, x, rows, up_out);
            self.glu(out, up_out, rows, width, act);
            return;
        }
        let (wr, wc) = (g.arg.rows as usize, g.arg.cols as usize);
        let mut xp = self.buf(x, rows * wc * 4);
        let mut op = self.buf(out, rows * wr * 4);
        if rows == 0 || !self.ready() {
            return;
        }
        let x = xp;
        let x8 = if rows == 1 {
            self.x8_input(g.kind, wc, xp)
        } else {
            None
        };
        let f = if let Some(x8p) = x8 {
            xp = x8p;
            self.k.mvglu1x8[g.kind]
        } else if rows == 1 {
            self.k.mvglu1[g.kind]
        } else {
            self.k.mvglu[g.kind]
        };
        let split = Self::matvec_split(wr, wc / Self::matvec_chunk(g.kind, rows));
        let (mut ga, mut ua, mut n, mut sp) = (g.arg, u.arg, rows as i32, split as i32);
        let mut a = act_id(act);
        let grid = wr.div_ceil(MV_WARPS / split) as u32;
        self.launch(
            f,
            (grid, 1, 1),
            32 * MV_WARPS as u32,
            &mut args![ga, ua, xp, op, n, sp, a],
        );
        if x8.is_some() && op != x {
            self.x8_holds = Some((x, wc));
        }
    }

    fn add_bias(&mut self, x: Buf, b: VectorId, rows: usize, width: usize) {
        let (mut bp, bl) = self.vectors[b.0 as usize];
        assert!(bl >= width, "add_bias: {bl} values for {width}");
        let mut xp = self.buf(x, rows * width * 4);
        let n = rows * width;
        if n == 0 || !self.ready() {
            return;
        }
        let (mut w, mut n) = (width as i32, n as i64);
        let f = self.k.add_bias;
        let grid = Self::grid_for(n as usize, 256).min(4096);
        self.launch(f, (grid, 1, 1), 256, &mut args![xp, bp, w, n]);
    }

    fn add(&mut self, dst: Buf, src: Buf, rows: usize, width: usize) {
        let mut d = self.buf(dst, rows * width * 4);
        let mut s = self.buf(src, rows * width * 4);
        let n = rows * width;
        if n == 0 || !self.ready() {
            return;
        }
        let mut n = n as i64;
        let f = self.k.add;
        let grid = Self::grid_for(n as usize, 256).min(4096);
        self.launch(f, (grid, 1, 1), 256, &mut args![d, s, n]);
    }

    fn gather_rows(&mut self, src: Buf, src_rows: &[usize], width: usize, dst: Buf) {
        let max = src_rows.iter().copied().max().unwrap_or(0);
        let mut s = self.buf(src, (max + 1) * width * 4);
        let mut d = self.buf(dst, src_rows.len() * width * 4);
        if src_rows.is_empty() || !self.ready() {
            return;
        }
        let mut h = std::mem::take(&mut self.host_u32);
        h.clear();
        h.extend(src_rows.iter().map(|&r| r as u32));
        let mut idx = self.stage_rows(&h, true);
        self.host_u32 = h;
        let mut w = width as i32;
        let f = self.k.gather_rows;
        self.launch(
            f,
            (src_rows.len() as u32, 1, 1),
            128,
            &mut args![s, idx, w, d],
        );
    }

    fn rope(&mut self, x: Buf, step: &Step, n_heads: usize, head_dim: usize, rope: &RopeParams) {
        assert!(
            head_dim.is_multiple_of(2),
            "rope: head_dim {head_dim} is odd"
        );
        let mut xp = self.buf(x, step.rows * n_heads * head_dim * 4);
        let mut freqs = self.rope_freqs(rope, head_dim);
        if step.rows == 0 || !self.ready() {
            return;
        }
        let d = self.upload_step(step, None);
        let mut pos = d.row_pos;
        let (mut nh, mut hd, mut theta, mut neox) = (
            n_heads as i32,
            head_dim as i32,
            rope.theta as f64,
            rope.neox as i32,
        );
        let f = self.k.rope;
        let threads = (head_dim / 2).next_multiple_of(32).min(1024) as u32;
        self.launch(
            f,
            (step.rows as u32, n_heads as u32, 1),
            threads,
            &mut args![xp, pos, nh, hd, theta, neox, freqs],
        );
    }

    fn glu(&mut self, gate: Buf, up: Buf, rows: usize, width: usize, act: Glu) {
        let mut g = self.buf(gate, rows * width * 4);
        let mut u = self.buf(up, rows * width * 4);
        let n = rows * width;
        if n == 0 || !self.ready() {
            return;
        }
        let (mut n, mut a) = (n as i64, act_id(act));
        let f = self.k.glu;
        let grid = Self::grid_for(n as usize, 256).min(4096);
        self.launch(f, (grid, 1, 1), 256, &mut args![g, u, n, a]);
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
        let s = *shape;
        assert!(
            s.key_dim.max(s.value_dim) <= ATT_MAX_DIM && s.key_dim.is_multiple_of(2),
            "attend: head dims {}/{} (even key dims up to {ATT_MAX_DIM})",
            s.key_dim,
            s.value_dim
        );
        let rows = step.rows;
        let mut qp = self.buf(io.q, rows * s.n_heads * s.key_dim * 4);
        let mut kp = self.buf(io.k, rows * s.n_kv_heads * s.key_dim * 4);
        let mut vp = self.buf(io.v, rows * s.n_kv_heads * s.value_dim * 4);
        let mut freqs = self.rope_freqs(rope, s.key_dim);
        let mut kv = self.kv_desc(layer, shape);
        if rows == 0 || !self.ready() {
            return;
        }
        if layer == 1 {
            self.issue_step_head();
        }
        let group = self.slots[layer].map(|(g, _)| g);
        let mut st = self.upload_step(step, group);
        // A ring's slots may hold positions this step still attends to:
        // there the store waits for attention (kv_write).
        let early = kv.ring == 0;
        let (mut nh, mut nkv, mut dk, mut dv) = (
            s.n_heads as i32,
            s.n_kv_heads as i32,
            s.key_dim as i32,
            s.value_dim as i32,
        );
        let (mut theta, mut neox, mut store) = (rope.theta as f64, rope.neox as i32, early as i32);
        // A decode step (a token a sequence) on the split kernels, without
        // a ring: attention ropes, rounds and stores what it reads itself
        // (where its registers allow: `ATT_ROPE_FITS` in fathom.cu).
        let kernel = self
            .row_kernel(&s, Self::attended_keys(&s, step), kv.dtype)
            .filter(|k| k.ropes);
        if let (true, true, Some(kernel)) = (early, step.seqs.iter().all(|q| q.tokens == 1), kernel)
        {
            let rope = AttRope {
                ratio: theta.powf(-2.0 / s.key_dim as f64),
                freqs,
                neox,
                fused: 1,
            };
            let readied = Readied::InAttention(rope, kernel);
            self.attention_of(layer, shape, step, io, readied);
            return;
        }
        let f = self.k.rope_kv;
        self.launch(
            f,
            (
                rows as u32,
                (s.n_heads + 2 * s.n_kv_heads).div_ceil(ROPE_KV_WARPS) as u32,
                1,
            ),
            32 * ROPE_KV_WARPS as u32,
            &mut args![st, kv, qp, kp, vp, nh, nkv, dk, dv, theta, neox, freqs, store],
        );
        self.attention_of(layer, shape, step, io, Readied::ByRopeKv);
        if !early {
            self.kv_write(layer, step, io.k, io.v, shape);
        }
    }

    fn kv_write(&mut self, layer: usize, step: &Step, k: Buf, v: Buf, shape: &AttentionShape) {
        let rows = step.rows;
        let kw = shape.n_kv_heads * shape.key_dim;
        let vw = shape.n_kv_heads * shape.value_dim;
        let mut kp = self.buf(k, rows * kw * 4);
        let mut vp = self.buf(v, rows * vw * 4);
        let mut kv = self.kv_desc(layer, shape);
        if rows == 0 || !self.ready() {
            return;
        }
        let group = self.slots[layer].map(|(g, _)| g);
        let mut st = self.upload_step(step, group);
        let pieces = kw.max(vw).div_ceil(256) as u32;
        let (mut kw, mut vw) = (kw as i32, vw as i32);
        let f = self.k.kv_write;
        self.launch(
            f,
            (rows as u32, 2, pieces),
            256,
            &mut args![st, kv, kp, vp, kw, vw],
        );
    }

    fn route_experts(
        &mut self,
        logits: Buf,
        rows: usize,
        n_experts: usize,
        k: usize,
        normalize: bool,
    ) {
        assert!(
            n_experts <= MAX_EXPERTS && k <= n_experts,
            "route_experts: {k} of {n_experts} experts ({MAX_EXPERTS} at most)"
        );
        let mut lp = self.buf(logits, rows * n_experts * 4);
        let mut rp = self.buf(Buf::ExpertRoutes, rows * k * 8);
        assert!(
            rows * k * 2 <= self.routes.len(),
            "route_experts: more routes than planned"
        );
        self.routes_k = k;
        self.routes_rows = rows;
        self.routes_stale = true;
        if rows == 0 || !self.ready() {
            return;
        }
        let (mut ne, mut kk, mut norm) = (n_experts as i32, k as i32, normalize as i32);
        let f = self.k.route_experts;
        self.launch(f, (rows as u32, 1, 1), 32, &mut args![lp, ne, kk, norm, rp]);
    }

    fn routed_experts(&mut self, ffn: &RoutedFfn, x: Buf, rows: usize, out: Buf) {
        if !(rows == 1 && self.device_routing && self.routed_on_device(ffn, x, out)) {
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
        assert!(
            k == self.routes_k && rows <= self.routes_rows,
            "gather_expert_rows: routes are for {} rows x {}",
            self.routes_rows,
            self.routes_k
        );
        self.routes_to_host();
        let mut list = std::mem::take(&mut self.host_u32);
        list.clear();
        for t in 0..rows {
            if (0..k).any(|j| self.routes[2 * (t * k + j)] as usize == expert) {
                list.push(t as u32);
            }
        }
        let n = list.len();
        let mut s = self.buf(src, rows * width * 4);
        let mut d = self.buf(dst, n * width * 4);
        if n > 0 && self.ready() {
            let (mut idx, _) = self.upload_idx(&list, None);
            let mut w = width as i32;
            let f = self.k.gather_rows;
            self.launch(f, (n as u32, 1, 1), 128, &mut args![s, idx, w, d]);
        }
        self.host_u32 = list;
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
        assert!(
            k == self.routes_k && rows <= self.routes_rows,
            "scatter_expert_rows: routes are for {} rows x {}",
            self.routes_rows,
            self.routes_k
        );
        self.routes_to_host();
        let mut list = std::mem::take(&mut self.host_u32);
        let mut wts = std::mem::take(&mut self.host_f32);
        list.clear();
        wts.clear();
        for t in 0..rows {
            if let Some(j) = (0..k).find(|j| self.routes[2 * (t * k + j)] as usize == expert) {
                list.push(t as u32);
                wts.push(f32::from_bits(self.routes[2 * (t * k + j) + 1]));
            }
        }
        let n = list.len();
        let mut s = self.buf(src, n * width * 4);
        let mut d = self.buf(dst, rows * width * 4);
        if n > 0 && self.ready() {
            let (mut idx, mut wp) = self.upload_idx(&list, Some(&wts));
            let mut w = width as i32;
            let f = self.k.scatter_rows;
            self.launch(f, (n as u32, 1, 1), 128, &mut args![s, idx, wp, w, d]);
        }
        self.host_u32 = list;
        self.host_f32 = wts;
    }

    fn zero(&mut self, x: Buf, rows: usize, width: usize) {
        let mut xp = self.buf(x, rows * width * 4);
        let n = rows * width;
        if n == 0 || !self.ready() {
            return;
        }
        let mut n = n as i64;
        let f = self.k.fill_zero;
        let grid = Self::grid_for(n as usize, 256).min(4096);
        self.launch(f, (grid, 1, 1), 256, &mut args![xp, n]);
    }

    fn logits(&mut self, rows: usize, width: usize) -> &mut [f32] {
        let n = rows * width;
        assert!(
            n <= self.logits.len(),
            "logits: {n} values; {} planned",
            self.logits.len()
        );
        if n <= self.logits_held {
            // Read back already, and no op has run since.
            return &mut self.logits[..n];
        }
        let src = self.buf(Buf::Logits, n * 4);
        if n > 0 && self.ready() {
            self.issue(true);
            // SAFETY: the host buffer holds at least n f32 (asserted), the
            // logits buffer n × 4 bytes (checked by `buf`).
            let r = unsafe { result::memcpy_dtoh_async(&mut self.logits[..n], src, self.stream) };
            if let Err(e) = r {
                self.fail("reading the logits", e);
            }
            self.sync();
            self.logits_held = n;
        }
        &mut self.logits[..n]
    }

    fn greedy(&mut self, rows: usize, width: usize, banned: &[u32], out: &mut [[u32; 2]]) {
        // The picks, and the scan's pieces after them, go to the attention
        // output, idle after the last layer's output projection (the
        // partials, used before, are not planned for short contexts).
        let at = (8 * rows).next_multiple_of(16);
        let pieces = width
            .div_ceil(GREEDY_THREADS as usize * GREEDY_BATCH)
            .min(GREEDY_PIECES);
        let room = self.arena[Buf::AttnOut as usize]
            .filter(|&(_, size)| (at + 16 * rows * pieces) as u64 <= size);
        let on_device = banned.len() <= GREEDY_BANNED && 2 * rows <= self.greedy_host.len();
        let (true, Some((picks, _))) = (on_device, room) else {
            greedy_from_rows(self.logits(rows, width), width, banned, out);
            return;
        };
        let mut src = self.buf(Buf::Logits, rows * width * 4);
        if rows == 0 || !self.ready() {
            return;
        }
        let mut b = Banned {
            n: banned.len() as i32,
            ids: [0; GREEDY_BANNED],
        };
        b.ids[..banned.len()].copy_from_slice(banned);
        let (mut w, mut dst, mut part, mut n) =
            (width as i32, picks, picks + at as u64, pieces as i32);
        let (scan, merge) = (self.k.greedy_scan, self.k.greedy_merge);
        self.launch(
            scan,
            (rows as u32, pieces as u32, 1),
            GREEDY_THREADS,
            &mut args![src, w, b, part],
        );
        self.launch(
            merge,
            (rows as u32, 1, 1),
            GREEDY_MERGE_THREADS,
            &mut args![part, n, b, dst],
        );
        self.issue(true);
        let mut host = std::mem::take(&mut self.greedy_host);
        if self.error.is_none() {
            // SAFETY: `host` holds 2 × rows u32 and the attention output
            // at least 8 × rows bytes (both checked above); pageable memory
            // is read once the stream reaches the copy (synchronized below).
            let r = unsafe { result::memcpy_dtoh_async(&mut host[..2 * rows], dst, self.stream) };
            if let Err(e) = r {
                self.fail("reading the greedy picks", e);
            }
            self.sync();
        }
        for (o, p) in out.iter_mut().zip(host.chunks_exact(2)) {
            *o = [p[0], p[1]];
        }
        self.greedy_host = host;
    }

    fn take_error(&mut self) -> Option<BackendError> {
        self.error.take()
    }
}

#[cfg(test)]
mod tests {
    use super::{CudaBackend, FATBIN};
    use fathom_plan::cuda::{KERNELS_HOST_BYTES, MODULE_BYTES};

    /// The machine-code (ELF) images in a fatbin, as byte slices: a fatbin
    /// is a 16-byte header (magic 0xBA55ED50, version, header size, size of
    /// the entries) and entries of a header (kind u16: 1 PTX, 2 ELF; its
    /// header size u32 at 4; payload size u64 at 8) and a payload.
    fn elf_images(fatbin: &[u8]) -> Vec<&[u8]> {
        let u16_at = |o: usize| u16::from_le_bytes([fatbin[o], fatbin[o + 1]]) as usize;
        let u32_at = |o: usize| u32::from_le_bytes(fatbin[o..o + 4].try_into().unwrap()) as usize;
        let u64_at = |o: usize| u64::from_le_bytes(fatbin[o..o + 8].try_into().unwrap()) as usize;
        assert_eq!(u32_at(0), 0xBA55_ED50, "not a fatbin");
        let end = u16_at(6) + u64_at(8);
        let mut at = u16_at(6);
        let mut out = Vec::new();
        while at < end {
            let (kind, header, size) = (u16_at(at), u32_at(at + 4), u64_at(at + 8));
            if kind == 2 {
                out.push(&fatbin[at + header..at + header + size]);
            }
            at += header + size;
        }
        out
    }

    /// Attention's pieces on an H200 (132 multiprocessors): one wave of
    /// blocks at most (2 a multiprocessor), a warp's rounds of 32 keys the
    /// fewest that allows, more than 128 keys a piece but the last.
    #[test]
    fn attention_splits_fill_one_wave_with_even_rounds() {
        let splits = |keys, blocks| CudaBackend::attention_splits(keys, blocks, 132);
        // An 8B-shaped decode row (8 KV heads, a block each).
        assert_eq!(splits(100, 8), 1);
        assert_eq!(splits(1024, 8), 8);
        assert_eq!(splits(4097, 8), 33);
        assert_eq!(splits(8192, 8), 32);
        assert_eq!(splits(32768, 8), 32);
        for keys in [1, 77, 129, 1000, 4097, 5000, 8192, 20000] {
            for blocks in [1, 8, 32, 128, 264, 1000] {
                let n = splits(keys, blocks);
                let runs = keys.div_ceil(32);
                let most = (264 / blocks).max(1);
                assert!(
                    n >= 1 && n <= most,
                    "{keys} keys, {blocks} blocks: {n} pieces"
                );
                // A warp's rounds: the fewest one wave allows.
                let rounds = runs.div_ceil(n).div_ceil(4);
                assert_eq!(
                    rounds,
                    runs.div_ceil(4 * most),
                    "{keys} keys, {blocks} blocks"
                );
                assert!(n == 1 || keys > 128 * (n - 1), "{keys} keys in {n} pieces");
            }
        }
    }

    /// The fatbin stays resident in the process once the driver has read
    /// it: the plan's host term for it must hold it.
    #[test]
    fn fatbin_fits_the_planned_host_term() {
        assert_eq!(
            FATBIN.as_ptr() as usize % 8,
            0,
            "the driver wants 8-byte alignment"
        );
        assert!(
            FATBIN.len() as u64 <= KERNELS_HOST_BYTES,
            "the fatbin is {} bytes, past the plan's KERNELS_HOST_BYTES ({KERNELS_HOST_BYTES})",
            FATBIN.len()
        );
    }

    /// The driver keeps more than a loaded module's machine code, in 2 MiB
    /// steps (measured: a 0.7 MB fatbin took 2 MiB, a 6.7 MB sm_90 image 8
    /// MiB, an 8.1 MB one 10 MiB — 0.25 MB short of 8 MiB; docs/cuda.md),
    /// so the embedded image plus `MODULE_SLACK` bounds the plan's module
    /// term: a kernel change that outgrows `MODULE_BYTES` fails here, not
    /// on a user's GPU.
    #[test]
    fn kernel_image_fits_the_planned_module_term() {
        let images = elf_images(FATBIN);
        assert_eq!(images.len(), 1, "one sm_90 image in the fatbin");
        let image = images[0];
        // Stored whole (nvcc compresses only the PTX here): a compressed
        // image's stored size would understate what the driver keeps.
        assert_eq!(
            &image[..4],
            b"\x7fELF",
            "the sm_90 image is stored uncompressed"
        );
        /// What the driver keeps beyond the image, at most (seen: more
        /// than 0.24 MB).
        const MODULE_SLACK: u64 = 1 << 20;
        let loaded = (image.len() as u64 + MODULE_SLACK).next_multiple_of(2 << 20);
        assert!(
            loaded <= MODULE_BYTES,
            "the kernels' sm_90 image is {} bytes, {loaded} once loaded, past the plan's \
             MODULE_BYTES ({MODULE_BYTES}): raise fathom_plan::cuda::MODULE_BYTES and \
             re-record the CUDA memory grid",
            image.len()
        );
    }
}
