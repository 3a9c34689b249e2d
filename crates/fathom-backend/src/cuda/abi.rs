//! The contract between the launchers and the kernels: every number both
//! sides use and the layout of every struct a kernel takes by value.
//!
//! build.rs includes this file too (`#[path]`) and writes two headers the
//! kernels include: `fathom_abi.h` with each constant below as a
//! `#define` (and the weight type ids and block layouts of `fathom-ggml`),
//! and `fathom_abi_check.cuh` with each struct's size, alignment and field
//! offsets as `static_assert`s against the C definitions. A kernel states
//! no number of its own that this side also knows; a struct that drifts
//! fails the build. So this file depends on nothing but `core` and
//! `fathom-ggml` (a build-dependency as well).

use core::mem::{align_of, offset_of, size_of};

/// One constant of the contract, by the name both sides use.
#[allow(dead_code, reason = "build.rs reads the tables")]
pub struct Constant {
    pub name: &'static str,
    pub value: i64,
}

/// Defines each constant and lists it in [`CONSTANTS`].
macro_rules! constants {
    ($($(#[$doc:meta])* $name:ident: $ty:ty = $value:expr;)*) => {
        $($(#[$doc])* pub const $name: $ty = $value;)*
        /// Every constant of the contract, for the generated header.
        #[allow(dead_code, reason = "build.rs reads the tables")]
        pub const CONSTANTS: &[Constant] = &[$(Constant { name: stringify!($name), value: $name as i64 }),*];
    };
}

constants! {
    /// Tokens a matrix-vector kernel takes at once; more go to the tiled kernel.
    MV_MAX_TOKENS: usize = 8;
    /// Warps of a matrix-vector block.
    MV_WARPS: usize = 4;
    /// Tokens a tensor-core product straight from the stored blocks
    /// (`mq<n>_*`, matmul_mma.cu) takes, at most: more go to the tiled
    /// kernel or cuBLAS.
    MQ_MAX_TOKENS: usize = 64;
    /// Warps of a `mq<n>_*` block: its 16 rows' depth split between them.
    MQ_WARPS: usize = 4;
    /// Matrices one launch of the one-token kernel takes (`Segments`).
    MV_SEGMENTS: usize = 3;
    /// Most rows a block of the balanced one-token kernel takes.
    MV_BALANCED_ROWS: usize = 8;
    /// Bytes of one 32-value block of int8 activations (an f32 scale, the
    /// sum and 32 int8 values, padded to 16-byte loads).
    X8_BLOCK: usize = 48;
    /// Routes a token's experts the routed kernels combine, at most.
    MOE_MAX_ROUTES: usize = 16;
    /// Largest expert count the routing kernel's chosen-set holds.
    MAX_EXPERTS: usize = 256;
    /// Largest head dims the attention kernels hold per lane.
    ATT_MAX_DIM: usize = 512;
    /// Warps of a one-block or split attention block; they split the key
    /// positions of one (row, head).
    ATT_WARPS: usize = 4;
    /// Warps of a split attention block; each takes runs of 32 keys, so a
    /// piece holds at least `32 × ATT_SPLIT_WARPS` keys (the plan's
    /// `ATTENTION_SPLIT_KEYS`, asserted in `attention.rs`).
    ATT_SPLIT_WARPS: usize = 4;
    /// Positions a KV block holds (the plan's `KV_BLOCK_TOKENS`, asserted
    /// in `rope_kv.rs`).
    KV_BLOCK_TOKENS: usize = 16;
    /// Heads a `rope_kv` block takes, a warp each.
    RK_WARPS: usize = 4;
    /// Warps of a tensor-core prefill attention block.
    ATT_MMA_WARPS: usize = 4;
    /// Value dims a lane times query heads a block up to which a split
    /// attention kernel does a decode step's rope itself (beyond, its
    /// registers spill).
    ATT_ROPE_MAX: usize = 32;
    /// Most pieces attention cuts a row's key range into, and what
    /// `attention_merge` combines. The planned partials hold
    /// `ATTENTION_MAX_SPLITS` pieces for each of `ATTENTION_SPLIT_ROWS`
    /// rows, so a step of fewer rows (a decode step of a few sequences) has
    /// room for more: up to this many, as far as they fit
    /// (`attention_splits` picks 33 for a row of an 8B-shaped layer at
    /// 4,097 keys, where 32 left some warps a second run of 32 keys).
    ATT_MAX_SPLITS: usize = 64;
    /// Query heads a tensor-core decode block holds.
    ATT_DEC_GROUP: usize = 8;
    /// Banned ids the greedy-pick kernels take.
    GREEDY_BANNED: usize = 8;
    /// Threads of a greedy scan block, and the values a thread loads at once.
    GREEDY_THREADS: u32 = 256;
    GREEDY_BATCH: usize = 8;
    /// Taps a linear-attention convolution may have (`linear_conv` holds a
    /// channel's taps and its window in registers; Qwen3.5 has 4).
    LIN_MAX_TAPS: usize = 8;
    /// Warps of a `gated_delta_<D>` block, and state rows (value indices)
    /// each warp holds in registers: a block takes `LIN_WARPS × LIN_ROWS`
    /// rows of one (sequence, value head)'s state.
    LIN_WARPS: usize = 4;
    LIN_ROWS: usize = 4;
    /// KV cache dtypes as the kernels number them (`kv_dtype_id`).
    KV_F16: i32 = 0;
    KV_BF16: i32 = 1;
    KV_F32: i32 = 2;
    KV_Q8_0: i32 = 3;
    /// Gated activations as the kernels number them (`glu_value`).
    GLU_SILU: i32 = 0;
    GLU_GELU_TANH: i32 = 1;
    /// gpt-oss's clamped SwiGLU.
    GLU_SWIGLU_OAI: i32 = 2;
    /// MLX affine weights' type ids: this plus the bits (ggml's own ids,
    /// below 100, number the block types). Only the kernels read ids: the
    /// launchers index their tables by `WeightType::ALL` position.
    #[allow(dead_code, reason = "only the kernels read type ids")]
    T_AFFINE: i32 = 100;
}

/// KV dtypes of the split attention kernels, by their `KV_*` id.
pub const ATT_DTYPES: [&str; 4] = ["f16", "bf16", "f32", "q8_0"];
/// Value dims a lane of the split attention kernels holds: value dims up
/// to 32 × each.
pub const ATT_VPL: [usize; 4] = [2, 4, 8, 16];
/// Query heads a block of the split attention kernels takes at once.
pub const ATT_HEADS: [usize; 4] = [1, 2, 4, 8];

/// Head dims of the linear-attention layers' kernels (`gated_delta_<D>`,
/// a lane holding `D / 32` values of each state row; `linear_conv` takes a
/// head a block): the generated `LIN_DELTA_KERNELS` lists them.
pub const LIN_HEAD_DIMS: [usize; 4] = [32, 64, 128, 256];

/// Whether the split attention kernel of `vpl` value dims a lane and
/// `heads` query heads a block is compiled: at 16 value dims a lane only
/// up to two heads (more spill). The kernels' instantiation list is
/// generated from this rule (`ATT_SPLIT_KERNELS` in `fathom_abi.h`).
pub const fn att_split_compiled(vpl: usize, heads: usize) -> bool {
    vpl < 16 || heads <= 2
}

/// A weight matrix as the kernels take it (`struct Weights`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct WeightsArg {
    pub data: u64,
    pub scales: u64,
    pub biases: u64,
    pub row_bytes: u64,
    pub rows: i32,
    pub cols: i32,
    pub group: i32,
    pub bf16: i32,
}

/// Up to `MV_SEGMENTS` matrices for one launch of a one-token
/// matrix-vector kernel (`struct Segments`): segment i's blocks are
/// `first[i] .. first[i + 1]`, unused ones start at the end.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Segments {
    pub w: [WeightsArg; MV_SEGMENTS],
    pub out: [u64; MV_SEGMENTS],
    pub split: [i32; MV_SEGMENTS],
    pub first: [i32; MV_SEGMENTS + 1],
    /// 0: each matrix's rows take their own blocks (`first` counts
    /// blocks); else one wave of blocks of this many rows (`first` counts
    /// rows: `matvec_balanced`).
    pub rows_per_block: i32,
    /// 0: no L2 prefetch before the dependency wait.
    pub prefetch: i32,
}

/// Per-step row and sequence tables (`struct StepDesc`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct StepDesc {
    pub row_seq: u64,
    pub row_pos: u64,
    pub seq_start: u64,
    pub seq_row0: u64,
    pub tables: u64,
    pub table_stride: i32,
    /// The C struct's tail padding, named so the host writes it.
    pub pad: i32,
}

/// One layer's cache (`struct KvDesc`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KvDesc {
    pub base: u64,
    pub block_bytes: u64,
    pub layer_off: u64,
    pub k_row: i32,
    pub v_row: i32,
    pub ring: i32,
    pub dtype: i32,
}

/// YaRN rope scaling as the rope kernels take it (`struct RopeYarn`):
/// pair i's angle blends its plain one and that times `freq_scale` by a
/// ramp from pair `low` to pair `high`, cos and sin scaled by `mscale`.
/// The default (`freq_scale` 1) is plain rope.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeYarn {
    pub freq_scale: f32,
    pub low: f32,
    pub high: f32,
    pub mscale: f32,
}

impl Default for RopeYarn {
    fn default() -> Self {
        RopeYarn {
            freq_scale: 1.0,
            low: 0.0,
            high: 0.0,
            mscale: 1.0,
        }
    }
}

/// Rope of a decode step done inside split attention (`struct AttRope`);
/// `fused` 0: `rope_kv` ran before.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AttRope {
    /// theta^(-2 / key_dim): pair i's frequency is its i-th power.
    pub ratio: f64,
    pub freqs: u64,
    pub neox: i32,
    pub fused: i32,
    pub yarn: RopeYarn,
}

/// The greedy kernels' banned ids (`struct Banned`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Banned {
    pub n: i32,
    pub ids: [u32; GREEDY_BANNED],
}

/// A struct's layout as the C side must match it.
#[allow(dead_code, reason = "build.rs reads the tables")]
pub struct Layout {
    /// The C struct's name.
    pub name: &'static str,
    pub size: usize,
    pub align: usize,
    /// (C field name, byte offset) of each field the C struct names.
    pub fields: &'static [(&'static str, usize)],
}

macro_rules! layout {
    ($c:literal, $t:ty, [$($f:ident),*]) => {
        Layout {
            name: $c,
            size: size_of::<$t>(),
            align: align_of::<$t>(),
            fields: &[$((stringify!($f), offset_of!($t, $f))),*],
        }
    };
}

/// Every struct a kernel takes by value (`pad` is C's tail padding).
#[allow(dead_code, reason = "build.rs reads the tables")]
pub const LAYOUTS: &[Layout] = &[
    layout!(
        "Weights",
        WeightsArg,
        [data, scales, biases, row_bytes, rows, cols, group, bf16]
    ),
    layout!(
        "Segments",
        Segments,
        [w, out, split, first, rows_per_block, prefetch]
    ),
    layout!(
        "StepDesc",
        StepDesc,
        [row_seq, row_pos, seq_start, seq_row0, tables, table_stride]
    ),
    layout!(
        "KvDesc",
        KvDesc,
        [base, block_bytes, layer_off, k_row, v_row, ring, dtype]
    ),
    layout!("RopeYarn", RopeYarn, [freq_scale, low, high, mscale]),
    layout!("AttRope", AttRope, [ratio, freqs, neox, fused, yarn]),
    layout!("Banned", Banned, [n, ids]),
];

// The sizes the kernels were written for: a change here is a change of
// the contract, made on both sides (the C side is checked by the build).
const _: () = assert!(size_of::<WeightsArg>() == 48);
const _: () = assert!(size_of::<Segments>() == 208);
const _: () = assert!(size_of::<StepDesc>() == 48);
const _: () = assert!(size_of::<KvDesc>() == 40);
const _: () = assert!(size_of::<RopeYarn>() == 16);
const _: () = assert!(size_of::<AttRope>() == 40);
const _: () = assert!(size_of::<Banned>() == 36);
