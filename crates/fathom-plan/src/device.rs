//! Device profiles: what each backend adds beyond weights, KV and activations.

use serde::Serialize;

use crate::activations::{ActivationPlan, Buf};
use crate::cuda::{self, DeviceLayout};
use crate::size::format_binary;
use crate::{rocm, HostPlan, PlanError, PlanInputs, Term};
use fathom_spec::{ModelSpec, VocabHeader};

/// A device fathom can plan for. CPU and CUDA run; ROCm and Metal are
/// planning targets until their backends exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Device {
    Cpu,
    Cuda,
    Rocm,
    Metal,
}

impl Device {
    pub const ALL: [Device; 4] = [Device::Cpu, Device::Cuda, Device::Rocm, Device::Metal];

    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
            Device::Rocm => "rocm",
            Device::Metal => "metal",
        }
    }

    pub fn parse(text: &str) -> Result<Self, PlanError> {
        Device::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(text.trim()))
            .ok_or_else(|| PlanError::InvalidChoice {
                what: "device".into(),
                value: text.into(),
                valid: "cpu, cuda, rocm, metal".into(),
            })
    }

    /// Whether the runtime's host-side memory is part of this device's
    /// budget: on a discrete GPU it is not (the budget is device memory).
    fn counts_host_runtime(self) -> bool {
        !matches!(self, Device::Cuda)
    }
}

/// Fixed host-side cost of a running fathom: code, libc, allocator arenas,
/// the parsed GGUF metadata. Checked against measured peaks by the memory
/// grid (docs/benchmark_results/memory-cpu-2026-11-30.md).
pub const RUNTIME_BASE_BYTES: u64 = 16 << 20;
/// Tokenizer tables per vocabulary entry: the token string, its id maps and
/// merge ranks, measured on vocabularies with up to one BPE merge per entry
/// (SmolLM2's 48,900 merges for 49,152 tokens). Each merge beyond one per
/// entry costs as much again (its two strings in the parsed metadata, the
/// parts looked up and its rank): with Gemma 4's 514,906 merges for 262,144
/// tokens a run's peak was 43 MB over the plan without them and 5 MB
/// under it with them.
pub const RUNTIME_BYTES_PER_VOCAB_ENTRY: u64 = 192;
/// Per worker thread: touched stack and thread-local allocator state.
pub const RUNTIME_BYTES_PER_THREAD: u64 = 128 << 10;
/// SmolLM2-135M's embedded tokenizer, the vocabulary the base and the
/// per-entry allowance were measured on (the recorded CPU memory grid).
pub const CALIBRATION_VOCAB: VocabHeader = VocabHeader {
    tokens: 49_152,
    token_bytes: 369_170,
    token_arrays: 2,
    merges: 48_900,
    merge_bytes: 417_477,
    scores_kept: false,
    token_chunks: 1_577_104,
    merge_chunks: 1_569_248,
    merge_part_chunks: 3_132_656,
    tokenizer_json_bytes: 0,
};

/// What a running fathom holds besides its vocabulary's tables (code,
/// libc, the tensor table, the pre-tokenizer, thread stacks): the part of
/// the base and allowance that the calibration vocabulary's tables
/// ([`vocab_heap`] of [`CALIBRATION_VOCAB`], 21,808,114 B) leave, so the
/// two readings agree where the allowance was measured. 4,406,286 B.
pub fn runtime_fixed_bytes() -> u64 {
    RUNTIME_BASE_BYTES
        .saturating_add(
            CALIBRATION_VOCAB
                .tokens
                .saturating_mul(RUNTIME_BYTES_PER_VOCAB_ENTRY),
        )
        .saturating_sub(vocab_heap(&CALIBRATION_VOCAB))
}

/// Heap bytes of the vocabulary's tables at the tokenizer's build, when
/// all of them are alive at once, from the header's counts and string
/// sizes alone. Each string is its own allocation and counts its malloc
/// chunk ([`fathom_spec::string_heap_bytes`], summed in the header's
/// `*_chunks`); each other size is a Rust layout the crates holding it
/// assert at compile time (`MetaValue`, `String`, the map slots):
/// - token texts: 24 B (`String`) + its string; token attributes 2 B and
///   piece ends 8 B per token; the pieces (one buffer) at most the texts'
///   bytes;
/// - the text-to-id map: a hash table of `(String, u32)` slots (32 B) with
///   a copy of every token string;
/// - the merge table: a hash table of `((u32, u32), (u32, u32))` slots
///   (16 B), built while the merges as read are alive: 48 B
///   (`(String, String)`) + the two parts' strings each;
/// - SentencePiece: an f32 score per token;
/// - GGUF: the parsed metadata, alive throughout: 32 B per array element
///   (`MetaValue`) over the per-token arrays and the merges, plus the token
///   and merge strings;
/// - `tokenizer.json`: the file's bytes (one buffer), alive while the texts,
///   attributes and merges are read from it and dropped before the id map,
///   pieces, piece ends and merge table are built: the larger of the two
///   counts.
pub fn vocab_heap(v: &VocabHeader) -> u64 {
    let n = v.tokens;
    let texts = n.saturating_mul(24).saturating_add(v.token_chunks);
    let attrs = n.saturating_mul(2);
    let piece_ends = n.saturating_mul(8);
    let scores = if v.scores_kept {
        n.saturating_mul(4)
    } else {
        0
    };
    let pieces = v.token_bytes;
    let ids = hash_table_bytes(n, 32).saturating_add(v.token_chunks);
    let (merge_table, merges_read) = if v.merges == 0 {
        (0, 0)
    } else {
        (
            hash_table_bytes(v.merges, 16),
            v.merges
                .saturating_mul(48)
                .saturating_add(v.merge_part_chunks),
        )
    };
    let read = [texts, attrs, scores, merges_read];
    let built = [ids, pieces, piece_ends, merge_table];
    let sum = |parts: &[u64]| parts.iter().fold(0, |a: u64, &b| a.saturating_add(b));
    if v.tokenizer_json_bytes > 0 {
        let file = fathom_spec::string_heap_bytes(v.tokenizer_json_bytes);
        return sum(&read).saturating_add(file.max(sum(&built)));
    }
    let metadata = v
        .token_arrays
        .saturating_mul(n)
        .saturating_add(v.merges)
        .saturating_mul(32)
        .saturating_add(v.token_chunks)
        .saturating_add(v.merge_chunks);
    sum(&read)
        .saturating_add(sum(&built))
        .saturating_add(metadata)
}

/// The allocation of a std `HashMap` made `with_capacity(items)` with
/// `slot`-byte entries (hashbrown's layout): buckets the next power of two
/// of 8/7 the items (4 or 8 below 8 items), their slots rounded up to 16
/// bytes, and a control byte per bucket plus one 16-byte group.
pub fn hash_table_bytes(items: u64, slot: u64) -> u64 {
    if items == 0 {
        return 0;
    }
    let buckets = match items {
        0..=3 => 4,
        4..=7 => 8,
        _ => (items.saturating_mul(8) / 7)
            .checked_next_power_of_two()
            .unwrap_or(u64::MAX),
    };
    buckets
        .saturating_mul(slot)
        .saturating_add(15)
        .saturating_div(16)
        .saturating_mul(16)
        .saturating_add(buckets)
        .saturating_add(16)
}

/// The runtime term in bytes and its derivation: the base and the
/// per-entry allowance, unless the vocabulary's tables counted exactly
/// ([`vocab_heap`]) beside the fixed part come to more.
pub fn runtime(
    device: Device,
    vocab: u64,
    merges: u64,
    header: &VocabHeader,
    threads: u64,
) -> (u64, String) {
    if !device.counts_host_runtime() {
        return (
            0,
            "host-side only on a discrete GPU: not counted against device memory".into(),
        );
    }
    let extra_merges = merges.saturating_sub(vocab);
    let entries = vocab.saturating_add(extra_merges);
    let allowance =
        RUNTIME_BASE_BYTES.saturating_add(entries.saturating_mul(RUNTIME_BYTES_PER_VOCAB_ENTRY));
    let tables = vocab_heap(header);
    let fixed = runtime_fixed_bytes();
    let exact = fixed.saturating_add(tables);
    let thread_bytes = threads.saturating_mul(RUNTIME_BYTES_PER_THREAD);
    let threads_part = format!("{threads} threads x {} KiB", RUNTIME_BYTES_PER_THREAD >> 10);
    if exact > allowance {
        let source = match header.tokenizer_json_bytes {
            0 => format!(
                " in {} arrays, {} merges of {} B: parsed metadata",
                header.token_arrays, header.merges, header.merge_bytes
            ),
            file => format!(
                ", {} merges of {} B, from a {file} B tokenizer.json: the file while read",
                header.merges, header.merge_bytes
            ),
        };
        let derivation = format!(
            "{fixed} B fixed + {tables} B vocabulary tables ({} tokens of {} B{source}, texts, \
             id map, pieces, merge table) + {threads_part}",
            header.tokens, header.token_bytes,
        );
        return (exact.saturating_add(thread_bytes), derivation);
    }
    let merges_part = if extra_merges > 0 {
        format!(" + {extra_merges} merges beyond one per entry x {RUNTIME_BYTES_PER_VOCAB_ENTRY} B")
    } else {
        String::new()
    };
    let derivation = format!(
        "{} MiB base + {vocab} vocab entries x {RUNTIME_BYTES_PER_VOCAB_ENTRY} B{merges_part} + {threads_part}",
        RUNTIME_BASE_BYTES >> 20,
    );
    (allowance.saturating_add(thread_bytes), derivation)
}

/// The backend term in bytes, its derivation, and the part of it that is
/// the ROCm in-flight reserve (reported on its own).
pub struct Backend {
    pub fixed_bytes: u64,
    pub fixed_derivation: String,
    pub inflight_bytes: u64,
    pub inflight_derivation: String,
}

/// The backend term; `layout` is the CUDA allocation's carve and the
/// weights it holds (cuda only).
pub fn backend(
    device: Device,
    rocm_inflight_raw: Option<&[u8]>,
    layout: Option<(&DeviceLayout, u64)>,
) -> Backend {
    let (fixed_bytes, fixed_derivation) = match device {
        Device::Cpu => (0, "cpu: no device context".to_string()),
        Device::Metal => (0, "metal: unified memory, no separate context".to_string()),
        Device::Rocm => (
            0,
            "rocm: context not planned; see in-flight reserve".to_string(),
        ),
        Device::Cuda => match layout {
            Some((l, weights)) => cuda_backend(l, weights),
            None => (0, "cuda: no layout".to_string()),
        },
    };
    let (inflight_bytes, inflight_derivation) = match device {
        Device::Rocm => {
            let bytes = rocm::rocm_inflight_reserve_bytes(rocm_inflight_raw);
            let how = match rocm_inflight_raw {
                None => "unset: the backend's default".to_string(),
                Some(raw) => format!(
                    "{}={:?}",
                    rocm::ROCM_INFLIGHT_VAR,
                    String::from_utf8_lossy(raw)
                ),
            };
            (
                bytes,
                format!("{} MiB in-flight command reserve ({how})", bytes >> 20),
            )
        }
        _ => (0, format!("{}: no in-flight reserve", device.name())),
    };
    Backend {
        fixed_bytes,
        fixed_derivation,
        inflight_bytes,
        inflight_derivation,
    }
}

/// The CUDA backend term: what the device holds besides weights, KV, the
/// recurrent state (their own terms) and the arena — the context, the kernels, cuBLAS's handle and workspace,
/// the decode-step graphs,
/// the upload area, prefill staging, split attention's partials, a MoE
/// model's expert grouping, a split model's streamed host matrix, and the
/// allocation's alignment padding.
fn cuda_backend(l: &DeviceLayout, weights: u64) -> (u64, String) {
    let kv: u64 = l.kv.iter().map(|r| r.bytes).sum();
    let upload = l.upload.step.bytes + l.upload.index.bytes + l.upload.weights.bytes;
    // Everything of the allocation that is not weights, arena, KV or
    // recurrent state.
    let in_allocation = l
        .size
        .saturating_sub(weights)
        .saturating_sub(l.arena.bytes)
        .saturating_sub(kv)
        .saturating_sub(l.recurrent.bytes);
    let staging = l.activation_staging.bytes + l.weight_staging.bytes;
    let partials = l.attention_partials.bytes;
    let grouping = l.moe_grouping.bytes;
    let streamed = l.streamed.bytes;
    let padding = in_allocation
        .saturating_sub(l.blas_workspace.bytes)
        .saturating_sub(upload)
        .saturating_sub(staging)
        .saturating_sub(partials)
        .saturating_sub(grouping)
        .saturating_sub(streamed);
    let bytes = DeviceLayout::outside_allocation().saturating_add(in_allocation);
    let derivation = format!(
        "cuda: context {} + kernels {} + cuBLAS handle {} (measured on an H200) + {} decode graphs × {} + cuBLAS workspace {} + per-step upload {} + prefill staging {} + attention partials {} + MoE grouping {}{} + weight slack and alignment {}",
        format_binary(cuda::CONTEXT_BYTES),
        format_binary(cuda::MODULE_BYTES),
        format_binary(cuda::BLAS_HANDLE_BYTES),
        cuda::MAX_GRAPHS,
        format_binary(cuda::GRAPH_BYTES),
        format_binary(l.blas_workspace.bytes),
        format_binary(upload),
        format_binary(staging),
        format_binary(partials),
        format_binary(grouping),
        // Only a split model streams: other plans read as before.
        if streamed > 0 {
            format!(" + streamed host matrices {}", format_binary(streamed))
        } else {
            String::new()
        },
        format_binary(padding),
    );
    (bytes, derivation)
}

/// A discrete GPU's host budget: the runtime, the CUDA libraries, the
/// host side of the arena and the read-backs, and the weights' file pages
/// mapped while they are copied to the device (released after loading).
pub fn host_plan(spec: &ModelSpec, inputs: &PlanInputs, activations: &ActivationPlan) -> HostPlan {
    let (runtime, runtime_derivation) = runtime(
        Device::Cpu,
        spec.vocab,
        spec.tokenizer_merges,
        &spec.vocab_header,
        inputs.threads,
    );
    let rows = |id: Buf| {
        activations
            .buffer(id)
            .map_or(0, |b| b.rows.saturating_mul(b.width))
    };
    // Logits and MoE routes come back to the host; per row of a step, a
    // token id, a row index and a weight go out.
    let readback = rows(Buf::Logits)
        .saturating_mul(4)
        .saturating_add(rows(Buf::ExpertRoutes).saturating_mul(8))
        .saturating_add(
            activations
                .buffer(Buf::Residual)
                .map_or(0, |b| b.rows.saturating_mul(12)),
        );
    let host_arena = activations.arena_bytes(true);
    let terms = vec![
        Term {
            name: "runtime",
            bytes: runtime,
            derivation: runtime_derivation,
        },
        Term {
            name: "cuda_libraries",
            bytes: cuda::HOST_LIBRARIES_BYTES,
            derivation: "libcuda, cuBLAS and cuBLASLt resident once initialized (measured on an H200 host)".into(),
        },
        Term {
            name: "cuda_kernels_and_graphs",
            bytes: cuda::KERNELS_HOST_BYTES
                .saturating_add(cuda::MAX_GRAPHS as u64 * cuda::GRAPH_HOST_BYTES),
            derivation: format!(
                "the embedded kernels {} + {} graphs x {} (measured on an H200 host)",
                format_binary(cuda::KERNELS_HOST_BYTES),
                cuda::MAX_GRAPHS,
                format_binary(cuda::GRAPH_HOST_BYTES)
            ),
        },
        Term {
            name: "host_buffers",
            bytes: host_arena.saturating_add(readback),
            derivation: format!(
                "sampler candidates and token ids {} + logits and routes read-back and step uploads {}",
                format_binary(host_arena),
                format_binary(readback)
            ),
        },
        Term {
            name: "weights_staging",
            bytes: spec.weights_bytes(),
            derivation: "the checkpoint's pages, mapped while copied to the device and released after loading".into(),
        },
    ];
    HostPlan::of(terms, inputs)
}

impl HostPlan {
    /// The budget of `terms` against the host memory in `inputs`.
    fn of(terms: Vec<Term>, inputs: &PlanInputs) -> HostPlan {
        let total_bytes = terms.iter().fold(0u64, |t, x| t.saturating_add(x.bytes));
        let (available_bytes, available_source) = match &inputs.host_available {
            Some(a) => (a.bytes, a.source.clone()),
            None => (0, "unchecked".to_string()),
        };
        HostPlan {
            fits: inputs.host_available.is_none() || total_bytes <= available_bytes,
            terms,
            total_bytes,
            available_bytes,
            available_source,
        }
    }

    /// This budget with `extra` terms added.
    pub(crate) fn with_terms(mut self, extra: Vec<Term>, inputs: &PlanInputs) -> HostPlan {
        self.terms.extend(extra);
        HostPlan::of(self.terms, inputs)
    }
}
