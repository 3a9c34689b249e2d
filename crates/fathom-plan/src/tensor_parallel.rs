//! Tensor parallelism over N CUDA devices, Megatron style: what each
//! device holds.
//!
//! Each layer's q, k, v, FFN gate and up projections are split by output
//! (column split: each device computes its own heads and FFN columns), the
//! attention output and FFN down projections by input (row split: each
//! device holds the matching slice of their rows), and one all-reduce after
//! each of those two sums the partial outputs. A MoE layer splits every
//! expert's FFN columns the same way, so routing is unchanged and every
//! device runs every chosen expert on its slice. Embeddings, the output
//! head, the router and every norm stay whole on each device.
//!
//! A device's plan is the ordinary plan of a *sharded spec*: the model with
//! `heads / N` query heads, `max(1, kv_heads / N)` KV heads (a KV head is
//! held by `N / kv_heads` devices when there are fewer KV heads than
//! devices), `ffn / N` and `expert_ffn / N`, and each tensor's share of the
//! real tensor table. Every device holds the same share, so one plan
//! describes each of them; NCCL's buffers are added as one more term.

use fathom_ggml::GgmlType;
use fathom_spec::{Attention, ModelSpec, TensorEntry};
use serde::Serialize;

use crate::size::format_binary;
use crate::{MemoryPlan, PlanError, Term};

/// The sizes the "which N fits" table tries (those dividing the heads).
pub const TABLE_SIZES: [u64; 4] = [1, 2, 4, 8];

/// NCCL's LL protocol buffer per connection: `NCCL_LL_LINES_PER_THREAD`
/// (8) × `NCCL_LL_MAX_NTHREADS` (512) × `NCCL_STEPS` (8) × a 16-byte line
/// (`DEFAULT_LL_BUFFSIZE` in NCCL's `src/init.cc`).
pub const NCCL_LL_BYTES: u64 = 8 * 512 * 8 * 16;
/// LL128: 120 elements per thread × 640 threads × 8 steps × 8 bytes
/// (`DEFAULT_LL128_BUFFSIZE`).
pub const NCCL_LL128_BYTES: u64 = 120 * 640 * 8 * 8;
/// Simple: `NCCL_BUFFSIZE`'s default, 4 MiB (`DEFAULT_BUFFSIZE`).
pub const NCCL_SIMPLE_BYTES: u64 = 4 << 20;
/// NCCL maps its buffers with `cuMem*` in whole 2 MiB pages: the three
/// protocols' 9,633,792 bytes take 10 MiB (NCCL's allocation log shows
/// 10,485,760-byte buffers per channel and peer: NVIDIA/nccl issue 1685).
pub const NCCL_GRANULE: u64 = 2 << 20;
/// Channels an all-reduce over NVLink uses on Hopper: NCCL opens up to
/// 32 per pair of GPUs there (`NCCL_MAX_NCHANNELS` caps it).
pub const NCCL_CHANNELS: u64 = 32;
/// NCCL's device memory for a communicator before any peer buffers: its
/// kernels, work queues and channel state. Measured on the H200 machine
/// (`tests/nccl.rs` of fathom-backend: `cuMemGetInfo` around
/// `ncclCommInitAll` of a one-GPU communicator, NCCL 2.28.3,
/// `NCCL_NVLS_ENABLE=0`): 608,174,080 bytes; the first all-reduces added 0.
pub const NCCL_FIXED_BYTES: u64 = 608_174_080;
/// Host memory of libnccl once loaded and initialized (its code, the
/// proxy thread's state): an estimate until measured.
pub const NCCL_HOST_BYTES: u64 = 256 << 20;
/// Host memory each device's context and cuBLAS handle keep beyond the
/// first device's (the libraries themselves load once): an estimate until
/// measured.
pub const HOST_BYTES_PER_EXTRA_DEVICE: u64 = 64 << 20;

/// How a tensor is divided over the devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// By output features: each device holds its heads' or columns' rows.
    Column,
    /// By input features: each device holds a slice of every row.
    Row,
    /// Whole on every device.
    Replicated,
}

/// What a tensor is, as far as splitting it goes: the one rule both the
/// plan's shares ([`shard`]) and the engine's loading read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Query,
    KeyValue,
    AttnOutput,
    FfnIn,
    FfnDown,
    ExpertsIn,
    ExpertsDown,
    Embedding,
    OutputHead,
    Router,
    Norm,
    Other,
}

impl Role {
    const ALL: [Role; 12] = [
        Role::Query,
        Role::KeyValue,
        Role::AttnOutput,
        Role::FfnIn,
        Role::FfnDown,
        Role::ExpertsIn,
        Role::ExpertsDown,
        Role::Embedding,
        Role::OutputHead,
        Role::Router,
        Role::Norm,
        Role::Other,
    ];

    fn name(self) -> &'static str {
        match self {
            Role::Query => "attention q",
            Role::KeyValue => "attention k/v",
            Role::AttnOutput => "attention output",
            Role::FfnIn => "ffn gate/up",
            Role::FfnDown => "ffn down",
            Role::ExpertsIn => "experts gate/up",
            Role::ExpertsDown => "experts down",
            Role::Embedding => "embeddings",
            Role::OutputHead => "output head",
            Role::Router => "router",
            Role::Norm => "norms and biases",
            Role::Other => "other",
        }
    }

    pub fn split(self) -> Split {
        match self {
            Role::Query | Role::KeyValue | Role::FfnIn | Role::ExpertsIn => Split::Column,
            Role::AttnOutput | Role::FfnDown | Role::ExpertsDown => Split::Row,
            _ => Split::Replicated,
        }
    }

    /// The parts `devices` divide a tensor of this role into: 1 when it
    /// stays whole; for k and v one part a KV head when a layer has fewer
    /// (`kv_heads`) than devices, each then held by several devices.
    pub fn parts(self, devices: u64, kv_heads: u64) -> u64 {
        match self {
            _ if self.split() == Split::Replicated => 1,
            Role::KeyValue => devices.min(kv_heads.max(1)),
            _ => devices,
        }
    }
}

/// One tensor's role, its layer, and whether its name is llama.cpp's
/// (GGUF: ggml dimension order, row length first) or Hugging Face's (row
/// length last).
pub(crate) struct Classified {
    pub(crate) role: Role,
    pub(crate) layer: Option<usize>,
    gguf: bool,
}

/// Reads a tensor's role from its name, in either format's naming.
pub(crate) fn classify(t: &TensorEntry) -> Classified {
    let vector = t.shape.len() <= 1;
    let (gguf, layer_rest) = if let Some(rest) = t.name.strip_prefix("blk.") {
        (true, Some(rest))
    } else if t.name.starts_with("mtp.") {
        // A Hugging Face multi-token-prediction layer (`mtp.layers.0.*`,
        // counted, never run) is no layer of the decoder's, as GGUF's
        // `blk.N` after the last decoder layer is none.
        (false, None)
    } else {
        (
            false,
            t.name
                .find("layers.")
                .map(|at| &t.name[at + "layers.".len()..]),
        )
    };
    let Some(rest) = layer_rest else {
        // Model-wide tensors all stay whole: the axis order never matters.
        let n = t.name.as_str();
        let role = if n == "token_embd.weight" || n.ends_with("embed_tokens.weight") {
            Role::Embedding
        } else if n == "output.weight" || n.ends_with("lm_head.weight") {
            Role::OutputHead
        } else if vector && !n.starts_with("rope_freqs") {
            Role::Norm
        } else {
            Role::Other
        };
        return Classified {
            role,
            layer: None,
            gguf,
        };
    };
    let Some((index, module)) = rest.split_once('.') else {
        return Classified {
            role: Role::Other,
            layer: None,
            gguf,
        };
    };
    let layer = index.parse::<usize>().ok();
    let (module, kind) = module.rsplit_once('.').unwrap_or((module, ""));
    let expert = module
        .strip_prefix("mlp.experts.")
        .and_then(|e| e.split_once('.'))
        .map(|(_, proj)| proj);
    let role = match (module, expert) {
        (_, Some("gate_proj" | "up_proj")) => Role::ExpertsIn,
        (_, Some("down_proj")) => Role::ExpertsDown,
        // A layer's experts stacked in one tensor each (Qwen3.5 MoE's HF
        // files: `[experts, 2 × width, hidden]` and `[experts, hidden,
        // width]`).
        ("mlp.experts", _) if kind == "gate_up_proj" => Role::ExpertsIn,
        ("mlp.experts", _) if kind == "down_proj" => Role::ExpertsDown,
        ("attn_q" | "self_attn.q_proj", _) => Role::Query,
        ("attn_k" | "attn_v" | "self_attn.k_proj" | "self_attn.v_proj", _) => Role::KeyValue,
        ("attn_output" | "self_attn.o_proj", _) => Role::AttnOutput,
        ("ffn_gate" | "ffn_up" | "mlp.gate_proj" | "mlp.up_proj", _) => Role::FfnIn,
        ("ffn_down" | "mlp.down_proj", _) => Role::FfnDown,
        ("ffn_gate_exps" | "ffn_up_exps", _) => Role::ExpertsIn,
        ("ffn_down_exps", _) => Role::ExpertsDown,
        ("ffn_gate_inp" | "mlp.gate", _) => Role::Router,
        _ if vector => Role::Norm,
        _ => Role::Other,
    };
    // A row-split projection's bias is added once, after the all-reduce:
    // it stays whole.
    let role = if role.split() == Split::Row && kind == "bias" {
        Role::Norm
    } else {
        role
    };
    Classified { role, layer, gguf }
}

/// One group of tensors and what each device holds of it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WeightShare {
    /// `attention q`, `attention k/v`, `attention output`, `ffn gate/up`,
    /// `ffn down`, `experts gate/up`, `experts down`, `embeddings`,
    /// `output head`, `router`, `norms and biases`, `other`.
    pub name: &'static str,
    pub split: Split,
    pub tensors: u64,
    /// The whole model's bytes of these tensors.
    pub bytes: u64,
    /// What one device holds of them.
    pub device_bytes: u64,
}

/// The model as one of `size` devices holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Shard {
    pub size: u64,
    /// The sharded spec: heads, KV heads, FFN widths and tensors per device.
    pub spec: ModelSpec,
    /// How many devices hold each KV head (1 unless there are fewer KV
    /// heads than devices).
    pub kv_replicas: u64,
    pub weights: Vec<WeightShare>,
    /// The largest one-device share of a row-split tensor (name, bytes):
    /// a row split takes a range of every row, which is copied on the host
    /// (one share at a time) while it is loaded onto its device.
    pub largest_row_share: (String, u64),
}

fn invalid(size: u64, expected: String) -> PlanError {
    PlanError::InvalidInput {
        what: "--tensor-parallel".into(),
        value: size.to_string(),
        expected,
    }
}

/// The divisors of `n` up to 64, as `1, 2, 4, 8`.
fn divisors(n: u64) -> String {
    let list: Vec<String> = (1..=n.min(64))
        .filter(|d| n.is_multiple_of(*d))
        .map(|d| d.to_string())
        .collect();
    list.join(", ")
}

/// KV heads per device: a share of them, or one held by several devices.
fn local_kv(kv: u64, size: u64) -> u64 {
    (kv / size).max(1)
}

/// Checks that `size` devices can share `spec`'s heads and FFN columns.
fn check_dimensions(spec: &ModelSpec, size: u64) -> Result<(), PlanError> {
    if size == 0 {
        return Err(invalid(
            size,
            "expected at least 1 device (1 plans one device as without the flag)".into(),
        ));
    }
    if !spec.is_known_family() || spec.layers.is_empty() || spec.n_heads == 0 {
        return Err(invalid(
            size,
            format!(
                "tensor parallelism needs a family fathom runs (llama, qwen2, qwen3, qwen3_moe, gemma3) with known heads; this model is {:?}",
                spec.family.name()
            ),
        ));
    }
    if spec.linear.is_some() && size > 1 {
        return Err(invalid(
            size,
            format!(
                "tensor parallelism does not split {}'s linear-attention layers yet; expected 1",
                spec.family.name()
            ),
        ));
    }
    if !spec.n_heads.is_multiple_of(size) {
        return Err(invalid(
            size,
            format!(
                "the model's {} attention heads do not split over {size} devices; expected a size dividing them: {}",
                spec.n_heads,
                divisors(spec.n_heads)
            ),
        ));
    }
    for layer in spec
        .layers
        .iter()
        .filter(|l| l.attention != Attention::None)
    {
        let kv = layer.n_kv_heads;
        if kv == 0 || !(kv.is_multiple_of(size) || size.is_multiple_of(kv)) {
            return Err(invalid(
                size,
                format!(
                    "{kv} KV heads neither split over {size} devices nor divide them (each device holds whole KV heads); expected a divisor or a multiple of {kv} that divides the {} heads",
                    spec.n_heads
                ),
            ));
        }
    }
    for (what, width) in [
        ("FFN width", spec.ffn),
        ("expert FFN width", spec.expert_ffn),
    ] {
        if width > 0 && !width.is_multiple_of(size) {
            return Err(invalid(
                size,
                format!(
                    "the {what} {width} does not split over {size} devices; expected a size dividing it: {}",
                    divisors(width)
                ),
            ));
        }
    }
    Ok(())
}

/// The axis a split divides: column splits divide the output features
/// (GGUF's second dimension, Hugging Face's second to last), row splits
/// the row (GGUF's first dimension, Hugging Face's last).
fn split_axis(split: Split, shape: &[u64], gguf: bool) -> usize {
    let last = shape.len().saturating_sub(1);
    match (split, gguf) {
        _ if shape.len() <= 1 => 0,
        (Split::Row, true) => 0,
        (Split::Row, false) => last,
        (_, true) => 1,
        (_, false) => last - 1,
    }
}

/// `t`'s share when divided `parts` ways along `axis`; a row of a block
/// format must split on a block boundary.
fn split_tensor(
    t: &TensorEntry,
    axis: usize,
    parts: u64,
    size: u64,
    row_axis: bool,
) -> Result<TensorEntry, PlanError> {
    let dim = t.shape.get(axis).copied().unwrap_or(0);
    let block = GgmlType::ALL
        .into_iter()
        .find(|g| g.name() == t.dtype)
        .map_or(1, GgmlType::block_elems);
    if row_axis && block > 1 && !(dim / parts.max(1)).is_multiple_of(block) {
        let valid: Vec<String> = (1..=dim / block)
            .filter(|d| dim.is_multiple_of(*d) && (dim / d).is_multiple_of(block))
            .take(16)
            .map(|d| d.to_string())
            .collect();
        return Err(invalid(
            size,
            format!(
                "tensor {} is {} in blocks of {block} values with rows of {dim}; split {parts} ways a row would be {} values, not whole blocks; sizes that split it on block boundaries: {}",
                t.name,
                t.dtype,
                dim / parts,
                valid.join(", ")
            ),
        ));
    }
    if dim == 0
        || !dim.is_multiple_of(parts)
        || !t.bytes.is_multiple_of(parts)
        || !t.params.is_multiple_of(parts)
    {
        return Err(invalid(
            size,
            format!(
                "tensor {} (shape {:?}, {} bytes) does not split {parts} ways along dimension {axis}",
                t.name, t.shape, t.bytes
            ),
        ));
    }
    let mut shape = t.shape.clone();
    shape[axis] = dim / parts;
    Ok(TensorEntry {
        shape,
        params: t.params / parts,
        row_len: if row_axis {
            t.row_len / parts
        } else {
            t.row_len
        },
        bytes: t.bytes / parts,
        ..t.clone()
    })
}

/// The model as each of `size` devices holds it.
pub fn shard(spec: &ModelSpec, size: u64) -> Result<Shard, PlanError> {
    check_dimensions(spec, size)?;
    let mut weights: Vec<WeightShare> = Role::ALL
        .iter()
        .map(|&r| WeightShare {
            name: r.name(),
            split: r.split(),
            tensors: 0,
            bytes: 0,
            device_bytes: 0,
        })
        .collect();
    let mut tensors = Vec::with_capacity(spec.tensors.len());
    let mut largest_row_share = (String::new(), 0);
    for t in &spec.tensors {
        let c = classify(t);
        let kv_heads = c
            .layer
            .and_then(|i| spec.layers.get(i))
            .map_or(spec.n_kv_heads, |l| l.n_kv_heads);
        let parts = c.role.parts(size, kv_heads);
        let share = if parts == 1 {
            t.clone()
        } else {
            let axis = split_axis(c.role.split(), &t.shape, c.gguf);
            let row_axis = c.role.split() == Split::Row && t.shape.len() > 1;
            // Only GGUF rows hold blocks; a safetensors row of MLX words
            // splits where its scales do (checked as their own tensors).
            split_tensor(t, axis, parts, size, row_axis && c.gguf)?
        };
        if c.role.split() == Split::Row && parts > 1 && share.bytes > largest_row_share.1 {
            largest_row_share = (t.name.clone(), share.bytes);
        }
        let group = &mut weights[Role::ALL.iter().position(|&r| r == c.role).unwrap_or(0)];
        group.tensors += 1;
        group.bytes = group.bytes.saturating_add(t.bytes);
        group.device_bytes = group.device_bytes.saturating_add(share.bytes);
        tensors.push(share);
    }
    weights.retain(|w| w.tensors > 0);
    let mut sharded = spec.clone();
    sharded.n_heads = spec.n_heads / size;
    sharded.n_kv_heads = local_kv(spec.n_kv_heads, size);
    for layer in &mut sharded.layers {
        if layer.attention != Attention::None {
            layer.n_kv_heads = local_kv(layer.n_kv_heads, size);
        }
    }
    sharded.ffn = spec.ffn / size;
    sharded.expert_ffn = spec.expert_ffn / size;
    sharded.tensors = tensors;
    Ok(Shard {
        size,
        kv_replicas: (size / spec.n_kv_heads.max(1)).max(1),
        spec: sharded,
        weights,
        largest_row_share,
    })
}

impl Shard {
    /// The weights term's derivation: the whole model's (`whole`), and
    /// what of it each device holds split and whole.
    pub fn derivation(&self, whole: &str) -> String {
        let list = |split: Split| {
            let parts: Vec<String> = self
                .weights
                .iter()
                .filter(|w| w.split == split)
                .map(|w| format!("{} {}", w.name, format_binary(w.device_bytes)))
                .collect();
            if parts.is_empty() {
                "none".to_string()
            } else {
                parts.join(", ")
            }
        };
        let kv = if self.kv_replicas > 1 {
            format!(
                "; each KV head held by {} devices (fewer KV heads than devices)",
                self.kv_replicas
            )
        } else {
            String::new()
        };
        format!(
            "{whole}; each of {} devices holds: column-split {}; row-split {}; whole {}{kv}",
            self.size,
            list(Split::Column),
            list(Split::Row),
            list(Split::Replicated),
        )
    }
}

/// Connections each device receives on per channel: one for the ring, and
/// the tree's parent and child (one of them at the tree's ends, which is
/// every device when there are two).
fn nccl_connections(size: u64) -> u64 {
    1 + size.saturating_sub(1).min(2)
}

/// NCCL's device memory per device for a communicator of `size` devices:
/// per channel and connection, one buffer of each protocol, in whole
/// `NCCL_GRANULE` pages; 0 for one device (no communicator).
pub fn nccl(size: u64) -> (u64, String) {
    if size <= 1 {
        return (0, "one device: no communicator".into());
    }
    let per_connection = (NCCL_LL_BYTES + NCCL_LL128_BYTES + NCCL_SIMPLE_BYTES)
        .div_ceil(NCCL_GRANULE)
        * NCCL_GRANULE;
    let connections = nccl_connections(size);
    let bytes = NCCL_CHANNELS
        .saturating_mul(connections)
        .saturating_mul(per_connection)
        .saturating_add(NCCL_FIXED_BYTES);
    let derivation = format!(
        "NCCL, {size} devices: {NCCL_CHANNELS} channels x {connections} connections (ring 1 + tree {}) x {} (LL {} + LL128 {} + Simple {}, in 2 MiB pages) + kernels and communicator state {} (measured: a one-GPU communicator on an H200); NVLink multicast off; the all-reduces run in place on branch_out (no scratch); the channel buffers are NCCL's defaults, to be measured on the 2-GPU machine",
        connections - 1,
        format_binary(per_connection),
        format_binary(NCCL_LL_BYTES),
        format_binary(NCCL_LL128_BYTES),
        format_binary(NCCL_SIMPLE_BYTES),
        format_binary(NCCL_FIXED_BYTES),
    );
    (bytes, derivation)
}

/// One row of the "which N fits" table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SizeOption {
    pub size: u64,
    /// Per device; all 0 when `error` says why this size cannot split the
    /// model.
    pub weights_bytes: u64,
    pub kv_bytes: u64,
    pub total_bytes: u64,
    pub fits: bool,
    pub max_context_that_fits: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl SizeOption {
    /// The row for `size` devices from its plan, or why there is none.
    pub(crate) fn of(size: u64, plan: Result<MemoryPlan, PlanError>) -> Self {
        match plan {
            Ok(p) => SizeOption {
                size,
                weights_bytes: p.weights_bytes,
                kv_bytes: p.kv_bytes,
                total_bytes: p.total_bytes,
                fits: p.fits,
                max_context_that_fits: p.max_context_that_fits,
                error: None,
            },
            Err(e) => SizeOption {
                size,
                weights_bytes: 0,
                kv_bytes: 0,
                total_bytes: 0,
                fits: false,
                max_context_that_fits: 0,
                error: Some(e.to_string()),
            },
        }
    }
}

/// What one process driving `shard.size` devices adds to the host budget.
pub fn host_terms(shard: &Shard) -> Vec<Term> {
    let size = shard.size;
    let (name, bytes) = &shard.largest_row_share;
    vec![
        Term {
            name: "nccl_library",
            bytes: NCCL_HOST_BYTES,
            derivation: "libnccl resident once initialized, with its proxy thread (an estimate until measured on the 2-GPU machine)".into(),
        },
        Term {
            name: "device_contexts",
            bytes: size.saturating_sub(1).saturating_mul(HOST_BYTES_PER_EXTRA_DEVICE),
            derivation: format!(
                "one process, {size} contexts: the libraries load once; each device after the first keeps a context and a cuBLAS handle, {} each (an estimate until measured)",
                format_binary(HOST_BYTES_PER_EXTRA_DEVICE)
            ),
        },
        Term {
            name: "row_split_copy",
            bytes: *bytes,
            derivation: format!(
                "a row-split tensor's share is a range of every row, copied on the host while loaded onto its device, one at a time: the largest, {name}"
            ),
        },
    ]
}

/// A tensor-parallel plan's own part: the split, NCCL, and the table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TensorParallel {
    pub size: u64,
    pub heads_per_device: u64,
    pub kv_heads_per_device: u64,
    pub kv_replicas: u64,
    pub ffn_per_device: u64,
    pub expert_ffn_per_device: u64,
    pub nccl_bytes: u64,
    pub weights: Vec<WeightShare>,
    /// Sizes 1, 2, 4 and 8 that divide the heads, each planned with the
    /// same inputs.
    pub sizes: Vec<SizeOption>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, dtype: &str, shape: &[u64]) -> TensorEntry {
        let params: u64 = shape.iter().product();
        TensorEntry {
            name: name.into(),
            dtype: dtype.into(),
            shape: shape.to_vec(),
            params,
            row_len: shape[0],
            bytes: params * 2,
        }
    }

    #[test]
    fn names_of_both_formats_classify_alike() {
        let cases = [
            ("blk.3.attn_q.weight", Role::Query, true),
            ("model.layers.3.self_attn.q_proj.weight", Role::Query, false),
            ("blk.3.attn_v.bias", Role::KeyValue, true),
            (
                "model.layers.3.self_attn.o_proj.weight",
                Role::AttnOutput,
                false,
            ),
            ("model.layers.3.self_attn.o_proj.bias", Role::Norm, false),
            ("blk.3.ffn_down_exps.weight", Role::ExpertsDown, true),
            (
                "model.layers.3.mlp.experts.17.up_proj.weight",
                Role::ExpertsIn,
                false,
            ),
            ("model.layers.3.mlp.gate.weight", Role::Router, false),
            (
                "model.language_model.layers.3.mlp.experts.gate_up_proj",
                Role::ExpertsIn,
                false,
            ),
            (
                "model.language_model.layers.3.mlp.experts.down_proj",
                Role::ExpertsDown,
                false,
            ),
            ("blk.3.ffn_gate_inp.weight", Role::Router, true),
            ("model.layers.3.mlp.gate_proj.scales", Role::FfnIn, false),
            ("token_embd.weight", Role::Embedding, true),
            ("lm_head.weight", Role::OutputHead, false),
            ("model.norm.weight", Role::Norm, false),
            ("rope_freqs.weight", Role::Other, true),
            ("mtp.layers.0.self_attn.q_proj.weight", Role::Other, false),
            ("mtp.layers.0.input_layernorm.weight", Role::Norm, false),
        ];
        for (name, role, gguf) in cases {
            let shape: &[u64] = if name.ends_with("bias") || name.contains("norm") {
                &[64]
            } else {
                &[64, 64]
            };
            let c = classify(&entry(name, "F16", shape));
            assert_eq!(c.role, role, "{name}");
            // Layer 3's tensors are layer 3's; an MTP layer is none.
            let layer = (name.contains(".3.") && !name.starts_with("mtp.")).then_some(3);
            assert_eq!(c.layer, layer, "{name}");
            // Only a layer's tensors split, so only theirs need an axis order.
            if c.layer.is_some() {
                assert_eq!(c.gguf, gguf, "{name}");
            }
        }
    }

    #[test]
    fn axes_follow_each_format_s_dimension_order() {
        // GGUF [row, out, experts]; Hugging Face [out, in].
        assert_eq!(split_axis(Split::Column, &[2048, 768, 128], true), 1);
        assert_eq!(split_axis(Split::Row, &[768, 2048, 128], true), 0);
        assert_eq!(split_axis(Split::Column, &[768, 2048], false), 0);
        assert_eq!(split_axis(Split::Row, &[2048, 768], false), 1);
        assert_eq!(split_axis(Split::Column, &[512], false), 0);
    }

    #[test]
    fn nccl_term_by_hand() {
        // 524,288 + 4,915,200 + 4,194,304 = 9,633,792 bytes -> 10 MiB.
        assert_eq!(nccl(1).0, 0);
        assert_eq!(nccl(2).0, 32 * 2 * (10 << 20) + 608_174_080); // 1,220 MiB
        assert_eq!(nccl(4).0, 32 * 3 * (10 << 20) + 608_174_080); // 1,540 MiB
        assert_eq!(nccl(8).0, nccl(4).0);
    }
}
