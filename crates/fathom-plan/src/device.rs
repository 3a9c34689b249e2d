//! Device profiles: what each backend adds beyond weights, KV and activations.

use serde::Serialize;

use crate::{rocm, PlanError};

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
/// merge ranks.
pub const RUNTIME_BYTES_PER_VOCAB_ENTRY: u64 = 192;
/// Per worker thread: touched stack and thread-local allocator state.
pub const RUNTIME_BYTES_PER_THREAD: u64 = 128 << 10;

/// CUDA context with lazy module loading, plus cuBLAS's recommended 32 MiB
/// workspace on Hopper. A documented constant until the CUDA backend
/// measures it.
pub const CUDA_CONTEXT_BYTES: u64 = 480 << 20;

/// The runtime term in bytes and its derivation.
pub fn runtime(device: Device, vocab: u64, threads: u64) -> (u64, String) {
    if !device.counts_host_runtime() {
        return (
            0,
            "host-side only on a discrete GPU: not counted against device memory".into(),
        );
    }
    let bytes = RUNTIME_BASE_BYTES
        .saturating_add(vocab.saturating_mul(RUNTIME_BYTES_PER_VOCAB_ENTRY))
        .saturating_add(threads.saturating_mul(RUNTIME_BYTES_PER_THREAD));
    let derivation = format!(
        "{} MiB base + {vocab} vocab entries x {RUNTIME_BYTES_PER_VOCAB_ENTRY} B + {threads} threads x {} KiB",
        RUNTIME_BASE_BYTES >> 20,
        RUNTIME_BYTES_PER_THREAD >> 10
    );
    (bytes, derivation)
}

/// The backend term in bytes, its derivation, and the part of it that is
/// the ROCm in-flight reserve (reported on its own).
pub struct Backend {
    pub fixed_bytes: u64,
    pub fixed_derivation: String,
    pub inflight_bytes: u64,
    pub inflight_derivation: String,
}

pub fn backend(device: Device, rocm_inflight_raw: Option<&[u8]>) -> Backend {
    let (fixed_bytes, fixed_derivation) = match device {
        Device::Cpu => (0, "cpu: no device context".to_string()),
        Device::Metal => (0, "metal: unified memory, no separate context".to_string()),
        Device::Rocm => (
            0,
            "rocm: context not planned; see in-flight reserve".to_string(),
        ),
        Device::Cuda => (
            CUDA_CONTEXT_BYTES,
            "cuda: context + cuBLAS workspace (documented constant)".to_string(),
        ),
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
