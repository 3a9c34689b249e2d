//! Start-up: the context, stream, module and cuBLAS, and the one
//! allocation carved at the plan's offsets, each step's device memory
//! measured (`cuMemGetInfo` deltas).

use std::ffi::c_void;

use cudarc::driver::{result, sys, CudaContext};
use fathom_plan::activations::ArenaBuffer;
use fathom_plan::cuda::{DeviceLayout, StepWords, BLAS_WORKSPACE};

use super::kernels::{prefetch_bytes, set_prefetch, FATBIN};
use super::upload::STAGED_FIXED;
use super::{blas, device_err, pinned, queue, CudaBackend, Kernels, Upload};
use crate::{BackendError, Buf, KvLayout};

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

impl CudaBackend {
    /// Creates the context on device `ordinal`, loads the kernels and
    /// cuBLAS, and makes the one allocation `layout` carves (the plan's
    /// `device_layout`: weights, the device side of `arena`, the KV groups
    /// and recurrent state of `kv`, cuBLAS's workspace, the upload area and
    /// staging).
    pub fn new(
        ordinal: usize,
        arena: &[ArenaBuffer],
        kv: KvLayout,
        layout: &DeviceLayout,
    ) -> Result<Self, BackendError> {
        if !super::BUILT {
            return Err(BackendError::Device {
                backend: "cuda",
                message: super::NOT_BUILT.to_string(),
            });
        }
        if layout.kv.len() != kv.groups.len() {
            return Err(BackendError::Device {
                backend: "cuda",
                message: format!(
                    "the device layout carves {} KV regions for {} KV groups: it was not \
                     computed from this plan",
                    layout.kv.len(),
                    kv.groups.len()
                ),
            });
        }
        let states = kv.recurrent.as_ref().map_or(0, |r| r.bytes);
        if layout.recurrent.bytes != states {
            return Err(BackendError::Device {
                backend: "cuda",
                message: format!(
                    "the device layout carves {} bytes of recurrent state for the plan's {states} \
                     (recurrent_state): it was not computed from this plan",
                    layout.recurrent.bytes
                ),
            });
        }
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

        // The carve is the plan's, so the allocation is the plan's device
        // total less what the driver and libraries take.
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
            slots: up.slots,
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
            recurrent: base + layout.recurrent.offset,
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
            mma_few: super::queue::switch("FATHOM_CUDA_MMA_FEW"),
            mma_kgroups: None,
            partials: (
                base + layout.attention_partials.offset,
                layout.attention_partials.bytes,
            ),
            moe: (base + layout.moe_grouping.offset, layout.moe),
            streamed: (base + layout.streamed.offset, layout.streamed.bytes),
            streamed_next: 0,
            streamed_ids: Vec::new(),
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

    /// Where cuBLAS was loaded from.
    pub fn blas_path(&self) -> &str {
        &self.blas.path
    }
}
