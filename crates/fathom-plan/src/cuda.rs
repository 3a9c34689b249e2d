//! The CUDA device's memory, region by region: the one allocation the CUDA
//! backend makes (weights, the activation arena, KV storage, cuBLAS's
//! workspace, the per-step upload area) at the offsets computed here, and
//! what the driver and libraries take besides it. The backend carves its
//! allocation with [`DeviceLayout`], so the plan and the allocation are the
//! same arithmetic.

use serde::Serialize;

use crate::activations::{ArenaBuffer, Buf};
use crate::kv::KvGroup;

/// Start of every carved region: enough for any vector load and for cuBLAS.
pub const ALIGN: u64 = 256;
/// `cuMemAlloc` hands out whole 2 MiB pages (measured on the H200: 1,517,056
/// bytes more than asked), so the allocation is planned at that size.
pub const ALLOCATION_GRANULE: u64 = 2 << 20;
/// Start of every weight tensor: 16 bytes serves float4 loads and cuBLAS.
pub const WEIGHT_ALIGN: u64 = 16;
/// Room for the padding `WEIGHT_ALIGN` adds between tensors (at most 15
/// bytes each: 1 MiB covers 69,905 tensors; a 48-layer, 128-expert MoE
/// has about 19,000).
pub const WEIGHT_SLACK: u64 = 1 << 20;
/// cuBLAS's workspace, handed over with `cublasSetWorkspace` so it
/// allocates none of its own; NVIDIA recommends 32 MiB on Hopper.
pub const BLAS_WORKSPACE: u64 = 32 << 20;
/// Prefill dequantizes quantized weight rows to f16 for cuBLAS through
/// this much staging, a slice of rows at a time.
pub const WEIGHT_STAGING: u64 = 32 << 20;
/// Most pieces attention cuts one (row, query head)'s key range into
/// (flash-decoding): each piece is one block of the split kernel, and
/// writes its (max, sum, unnormalized output) to
/// [`DeviceLayout::attention_partials`] for a merge kernel.
pub const ATTENTION_MAX_SPLITS: u64 = 32;
/// Fewest keys a piece takes (one pass of the split kernel's four warps,
/// 32 keys each): a cache of `tokens` positions is cut into at most
/// `ceil(tokens / ATTENTION_SPLIT_KEYS)` pieces.
pub const ATTENTION_SPLIT_KEYS: u64 = 128;
/// Rows of a step whose every piece the partials hold: decode steps
/// (1..16 rows) split fully; a larger step splits its key ranges into
/// proportionally fewer pieces (its rows already give the GPU work).
pub const ATTENTION_SPLIT_ROWS: u64 = 16;

/// Device memory the primary context takes on creation (`cuMemGetInfo`
/// before and after `cuDevicePrimaryCtxRetain`, device idle before):
/// measured on an H200, driver 580.159, CUDA 13.0 (docs/cuda.md).
pub const CONTEXT_BYTES: u64 = 552_402_944;
/// The embedded kernel module once loaded (measured the same way): the
/// driver keeps more than its sm_90 machine code, in 2 MiB steps (a 0.7 MB
/// fatbin took 2 MiB, a 6.7 MB image 8 MiB, an 8.1 MB image 10 MiB). A
/// backend test holds the embedded image plus 1 MiB under this, so kernels
/// that outgrow it fail CI.
pub const MODULE_BYTES: u64 = 10 << 20;
/// A cuBLAS handle's own device memory, workspace excluded (measured the
/// same way).
pub const BLAS_HANDLE_BYTES: u64 = 71_303_168;

/// CUDA graphs the backend keeps (see its launch queue; a decode step is
/// two, its head and the rest): the least recently used beyond this is
/// destroyed.
pub const MAX_GRAPHS: usize = 4;
/// Device memory one instantiated graph of at most [`GRAPH_MAX_NODES`]
/// nodes takes (`cuMemGetInfo` around `cuGraphInstantiate`: the driver
/// grows graph memory by 2 MiB; a 774-node MoE decode step took one such
/// step, a 1,318-launch prefill chunk with cuBLAS calls two or three).
pub const GRAPH_BYTES: u64 = 2 << 20;
/// Nodes of the largest step the backend keeps as a graph: a larger one
/// (prefill chunks, batched steps of many dequantize + GEMM slices, whose
/// GPU time hides their launches anyway) runs launch by launch, so the
/// graphs stay within `MAX_GRAPHS` × [`GRAPH_BYTES`].
pub const GRAPH_MAX_NODES: usize = 800;

/// Host memory of one kept graph (the driver's copy of its nodes and their
/// arguments): `fathom generate --parallel 16` on a SmolLM2-shaped file,
/// with five graphs of ~700 nodes live at once, peaked 24 MB above the run
/// with three (docs/benchmark_results/memory-cuda-2026-12-01.md).
pub const GRAPH_HOST_BYTES: u64 = 8 << 20;
/// The embedded kernels (sm_90 image and compressed PTX, 10.5 MB today),
/// resident in the process once the driver has read them; a backend test
/// holds the fatbin under this. 12 MiB since 2026-12-07 (10 MiB before, with
/// 5.7 KB left): room for the kernels still to come; the recorded CUDA grids'
/// plans were re-derived with it (their .md files say why the peaks stand).
pub const KERNELS_HOST_BYTES: u64 = 12 << 20;

/// Host memory the CUDA user-space libraries (libcuda, cuBLAS, cuBLASLt)
/// keep resident once loaded and initialized: their code and tables.
/// Measured on the H200 machine as peak RSS less every other host term in
/// `fathom generate --device cuda` runs of three models (262, 265 and
/// 270 MiB; docs/benchmark_results/memory-cuda-2026-12-01.md), rounded up.
pub const HOST_LIBRARIES_BYTES: u64 = 288 << 20;

/// Host memory the CUDA side takes while the device runs its first steps
/// (cuBLAS kernels loaded as their shapes first appear, cuBLASLt's caches,
/// the driver's launch resources). A run on the GPU alone has released the
/// checkpoint's pages by then, so this stays under its load-time peak (where
/// [`HOST_LIBRARIES_BYTES`] was measured); a split keeps the host's pages
/// mapped for the whole run, and this comes on top of them. Measured on an
/// H100 host (2026-12-06) as the peak RSS above the plan without it, with
/// what a run on the host alone left spare: a dense 8B Q4_K at 16 and 8 of
/// 32 layers 29–36 MB above (46 MB spare at 0 layers, the GPU running only
/// the output head), the 16-layer Qwen3-30B-A3B shape with the experts of 8
/// to 14 layers on the host 90–95 MB above; rounded up.
pub const SPLIT_RUN_HOST_BYTES: u64 = 128 << 20;

fn align(v: u64, a: u64) -> u64 {
    v.div_ceil(a).saturating_mul(a)
}

/// Bytes of [`DeviceLayout::attention_partials`] for a step of `tokens`
/// rows (see there).
fn attention_partials_bytes(arena: &[ArenaBuffer], kv: &[KvGroup], tokens: u64) -> u64 {
    let Some(width) = arena.iter().find(|b| b.id == Buf::AttnOut).map(|b| b.width) else {
        return 0;
    };
    let keys = kv.iter().map(|g| g.tokens).max().unwrap_or(0);
    let splits = keys
        .div_ceil(ATTENTION_SPLIT_KEYS)
        .min(ATTENTION_MAX_SPLITS);
    let Some(min_dim) = kv.iter().map(|g| g.value_dim).filter(|&d| d > 0).min() else {
        return 0;
    };
    if splits <= 1 {
        return 0;
    }
    let n_heads = width / min_dim;
    tokens
        .min(ATTENTION_SPLIT_ROWS)
        .saturating_mul(splits)
        .saturating_mul(width.saturating_add(n_heads.saturating_mul(2)))
        .saturating_mul(4)
}

/// A region of the allocation: its offset and length in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Region {
    pub offset: u64,
    pub bytes: u64,
}

/// What the backend uploads each step: per row its sequence and position,
/// per sequence its start and first row and its page tables (`u32`s), and
/// per row an index and a weight (MoE gathers).
///
/// The step area holds everything of a step at once (the kernels of a step
/// are issued together, or replayed as a graph, after one copy): per row
/// its sequence and position, per sequence its start and first row, per KV
/// group and sequence its page table, the step's token ids, and the rows
/// whose logits are projected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct UploadLayout {
    /// `4 × tokens + 2 × seqs + groups × seqs × table_stride + slots`
    /// u32s (see [`StepWords`]).
    pub step: Region,
    /// `tokens` u32 row indices.
    pub index: Region,
    /// `tokens` f32 weights.
    pub weights: Region,
    pub tokens: u64,
    pub seqs: u64,
    /// Page-table entries per sequence: the most blocks any group holds.
    pub table_stride: u64,
    /// Recurrent-state slot words: one per sequence of a step for a hybrid
    /// model, none otherwise.
    pub slots: u64,
}

/// Where each part of a step's upload lies in the step area, in u32 words
/// from its start: the backend writes them, the kernels read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepWords {
    pub tokens: u64,
    pub seqs: u64,
    pub groups: u64,
    pub table_stride: u64,
    /// [`UploadLayout::slots`].
    pub slots: u64,
}

impl StepWords {
    /// Per row its sequence, per row its position, per sequence its start,
    /// per sequence its first row: `2 × tokens + 2 × seqs` words at 0.
    pub fn rows(&self) -> u64 {
        2 * self.tokens + 2 * self.seqs
    }
    /// KV group `g`'s page tables, `seqs × table_stride` words.
    pub fn tables(&self, g: u64) -> u64 {
        self.rows() + g * self.seqs * self.table_stride
    }
    /// The step's token ids, `tokens` words.
    pub fn token_ids(&self) -> u64 {
        self.tables(self.groups)
    }
    /// The rows to project to logits, `tokens` words.
    pub fn projected(&self) -> u64 {
        self.token_ids() + self.tokens
    }
    /// Each sequence's recurrent-state slot (hybrid models), `slots`
    /// words: a linear-attention kernel finds its sequences' states
    /// through them, so a replayed step reads this step's slots.
    pub fn state_slots(&self) -> u64 {
        self.projected() + self.tokens
    }
    pub fn total(&self) -> u64 {
        self.state_slots() + self.slots
    }
}

/// The CUDA backend's one allocation, carved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceLayout {
    /// Weights in load order, each at a `WEIGHT_ALIGN` boundary.
    pub weights: Region,
    /// The device side of the activation arena (buffers at their plan
    /// offsets from here).
    pub arena: Region,
    /// One region per KV group.
    pub kv: Vec<Region>,
    /// A hybrid model's recurrent states (the plan's `recurrent_state`
    /// term, f32 slots as `RecurrentPlan` lays them out); empty otherwise.
    pub recurrent: Region,
    pub blas_workspace: Region,
    pub upload: UploadLayout,
    /// Prefill's f16 (or bf16) copy of a matmul's input rows: the step's
    /// rows × the widest matmul input × 2 bytes.
    pub activation_staging: Region,
    /// Prefill's dequantized weight rows ([`WEIGHT_STAGING`]).
    pub weight_staging: Region,
    /// Split attention's partial results: per (row, query head, piece) a
    /// max, a sum and `value_dim` output values, f32. Sized for
    /// `min(rows, ATTENTION_SPLIT_ROWS) × splits × (attn_out width +
    /// 2 × n_heads)` values, where splits = `min(ATTENTION_MAX_SPLITS,
    /// ceil(largest KV group tokens / ATTENTION_SPLIT_KEYS))` and n_heads =
    /// attn_out width / the smallest value dim of a KV group; empty when
    /// splits ≤ 1 (nothing to merge).
    pub attention_partials: Region,
    /// A MoE model's grouped expert products ([`MoeGrouping`]); empty for
    /// other models.
    pub moe_grouping: Region,
    /// What lies where in `moe_grouping`.
    pub moe: MoeGrouping,
    /// A split model's host-layer matrix copied here for a large step to
    /// multiply (the device spec's `streamed_weights`); empty when no
    /// layer's matrices are on the host.
    pub streamed: Region,
    /// Bytes of the allocation.
    pub size: u64,
}

/// Smallest number of routed rows a tile of the grouped expert products
/// takes (the tensor-core kernels' 16-token size; the K-quants take 64):
/// an expert's rows are cut into tiles of that many, and a step holds at
/// most `routed rows / MOE_TILE_MIN + experts` tiles.
pub const MOE_TILE_MIN: u64 = 16;

/// The device buffers of a MoE step whose routed rows are grouped by
/// expert on the device and run through every expert's FFN in one launch
/// per projection, nothing read back (issue 36): offsets in bytes from the
/// region's start, each `ALIGN`ed. `routed` is the step's rows × the
/// experts a row is routed to, `width` the model's, `ffn` an expert's FFN
/// width.
///
/// - `token_of`, `expert_of`: per routed row in expert order, its row of
///   the step and its expert (u32 each);
/// - `position`: per (row, route) where its routed row lies (u32);
/// - `tiles`: a count, then per tile its expert, first routed row and rows
///   (u32; at most `routed / MOE_TILE_MIN + experts` tiles);
/// - `x16`, `x_unscale`: the routed rows' inputs as f16, each scaled into
///   f16's range, and the scale's inverse (f32);
/// - `gate`, `up`: their gate and up products (f32), the gate's turned into
///   act(gate) x up in place;
/// - `h16`, `h_unscale`: that as f16 for the down product, scaled likewise;
/// - `down`: the down products (f32), summed per row by its routes' weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct MoeGrouping {
    /// What it holds at most: routed rows, experts, row width, FFN width.
    pub routed: u64,
    pub experts: u64,
    pub width: u64,
    pub ffn: u64,
    pub token_of: u64,
    pub expert_of: u64,
    pub position: u64,
    pub tiles: u64,
    pub x16: u64,
    pub x_unscale: u64,
    pub gate: u64,
    pub up: u64,
    pub h16: u64,
    pub h_unscale: u64,
    pub down: u64,
    pub bytes: u64,
}

impl MoeGrouping {
    /// The layout for a step of `rows` rows, `k` routes a row, `experts`
    /// experts of `ffn` values each over rows of `width` values; all zero
    /// without experts.
    pub fn new(rows: u64, k: u64, experts: u64, width: u64, ffn: u64) -> Self {
        let routed = rows.saturating_mul(k);
        if routed == 0 || experts == 0 {
            return Self::default();
        }
        let mut at = 0u64;
        let mut next = |bytes: u64| {
            let o = at;
            at = align(at.saturating_add(bytes), ALIGN);
            o
        };
        let tiles = routed.div_ceil(MOE_TILE_MIN).saturating_add(experts);
        let l = MoeGrouping {
            routed,
            experts,
            width,
            ffn,
            token_of: next(routed * 4),
            expert_of: next(routed * 4),
            position: next(routed * 4),
            tiles: next((1 + 3 * tiles) * 4),
            x16: next(routed.saturating_mul(width).saturating_mul(2)),
            x_unscale: next(routed * 4),
            gate: next(routed.saturating_mul(ffn).saturating_mul(4)),
            up: next(routed.saturating_mul(ffn).saturating_mul(4)),
            h16: next(routed.saturating_mul(ffn).saturating_mul(2)),
            h_unscale: next(routed * 4),
            down: next(routed.saturating_mul(width).saturating_mul(4)),
            bytes: 0,
        };
        MoeGrouping { bytes: at, ..l }
    }

    /// The layout for a step of the arena's rows: the activation plan's
    /// `expert_routes` (rows, routes a row), `router_logits` (experts) and
    /// `moe_in` (width) buffers, and each expert's FFN width, which the
    /// arena does not hold (its `ffn_gate` is the widest of several uses).
    pub fn of_arena(arena: &[ArenaBuffer], expert_ffn: u64) -> Self {
        let find = |id: Buf| arena.iter().find(|b| b.id == id);
        match (
            find(Buf::ExpertRoutes),
            find(Buf::RouterLogits),
            find(Buf::MoeIn),
        ) {
            (Some(r), Some(l), Some(x)) => Self::new(r.rows, r.width, l.width, x.width, expert_ffn),
            _ => Self::default(),
        }
    }
}

impl DeviceLayout {
    /// The carve for `weights_bytes` of resident weights (as stored, plus
    /// what is converted at load), the device side of `arena`, `kv`, a
    /// hybrid model's `recurrent_bytes` of state (0 for other models), a
    /// MoE model's expert grouping (`MoeGrouping::default()` for others)
    /// and `streamed_bytes` of room for host matrices (0 unless split).
    pub fn new(
        weights_bytes: u64,
        arena: &[ArenaBuffer],
        kv: &[KvGroup],
        recurrent_bytes: u64,
        moe: MoeGrouping,
        streamed_bytes: u64,
    ) -> Self {
        let weights = Region {
            offset: 0,
            bytes: align(weights_bytes.saturating_add(WEIGHT_SLACK), ALIGN),
        };
        let arena_bytes = arena
            .iter()
            .filter(|b| !b.id.host_side())
            .map(|b| b.offset.saturating_add(b.bytes))
            .max()
            .unwrap_or(0);
        let mut at = weights.bytes;
        let mut region = |bytes: u64| {
            let r = Region { offset: at, bytes };
            at = align(at.saturating_add(bytes), ALIGN);
            r
        };
        let arena_region = region(arena_bytes);
        let kv_regions: Vec<Region> = kv.iter().map(|g| region(g.bytes)).collect();
        let recurrent = region(recurrent_bytes);
        let blas_workspace = region(BLAS_WORKSPACE);
        let rows_of = |id: Buf| arena.iter().find(|b| b.id == id).map(|b| b.rows);
        let tokens = rows_of(Buf::Residual).unwrap_or(1).max(1);
        // One logits row per sequence of a step.
        let seqs = rows_of(Buf::Logits).unwrap_or(tokens).clamp(1, tokens);
        let table_stride = kv.iter().map(|g| g.blocks_per_sequence).max().unwrap_or(0);
        let slots = if recurrent_bytes > 0 { seqs } else { 0 };
        let words = StepWords {
            tokens,
            seqs,
            groups: kv.len() as u64,
            table_stride,
            slots,
        };
        let upload = UploadLayout {
            step: region(words.total().saturating_mul(4)),
            index: region(tokens.saturating_mul(4)),
            weights: region(tokens.saturating_mul(4)),
            tokens,
            seqs,
            table_stride,
            slots,
        };
        // The widest input a matmul of the step reads.
        let widest_input = arena
            .iter()
            .filter(|b| {
                matches!(
                    b.id,
                    Buf::Residual | Buf::Norm | Buf::Q | Buf::AttnOut | Buf::FfnGate | Buf::MoeIn
                )
            })
            .map(|b| b.width)
            .max()
            .unwrap_or(0);
        let activation_staging = region(tokens.saturating_mul(widest_input).saturating_mul(2));
        let weight_staging = region(WEIGHT_STAGING);
        let attention_partials = region(attention_partials_bytes(arena, kv, tokens));
        let moe_grouping = region(moe.bytes);
        let streamed = region(streamed_bytes);
        DeviceLayout {
            weights,
            arena: arena_region,
            kv: kv_regions,
            recurrent,
            blas_workspace,
            upload,
            activation_staging,
            weight_staging,
            attention_partials,
            moe_grouping,
            moe,
            streamed,
            size: align(at, ALLOCATION_GRANULE),
        }
    }

    /// Device bytes besides the allocation: the context, the kernels,
    /// cuBLAS's handle and the decode-step graphs.
    pub fn outside_allocation() -> u64 {
        CONTEXT_BYTES + MODULE_BYTES + BLAS_HANDLE_BYTES + MAX_GRAPHS as u64 * GRAPH_BYTES
    }
}
