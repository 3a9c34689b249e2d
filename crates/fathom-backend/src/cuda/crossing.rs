//! A split model's crossings: activation rows copied between the device
//! arena and the CPU backend's arena (host memory), where the plan's
//! placement moves a step from one side to the other.
//!
//! The copies read and write the host arena directly, which the split
//! page-locks at start-up ([`CudaBackend::pin_host`]: no memory is added,
//! the arena's pages are locked where they are), so they run at the bus's
//! speed rather than through the driver's staging buffer: a prefill chunk
//! whose host layers' products run on the device crosses ~80 MB a layer of
//! an 8B model. Where locking fails the copies stay pageable.

use std::ffi::c_void;

use cudarc::driver::{result, sys};

use super::CudaBackend;
use crate::Buf;

impl CudaBackend {
    /// Issues what is recorded, then reads `rows × width` values of `x`
    /// into `out`; the rest of the step launches op by op, as after any
    /// mid-step read-back.
    pub(super) fn read_rows(&mut self, x: Buf, rows: usize, width: usize, out: &mut [f32]) {
        let n = rows * width;
        assert!(out.len() >= n, "read_rows: {n} values into {}", out.len());
        let src = self.buf(x, n * 4);
        if n == 0 || !self.ready() {
            return;
        }
        self.go_eager();
        // SAFETY: `out` holds n f32 (asserted), `x` n × 4 bytes (checked
        // by `buf`); pageable memory, and the stream is synchronized before
        // `out` is read.
        let r = unsafe { result::memcpy_dtoh_async(&mut out[..n], src, self.stream) };
        if let Err(e) = r {
            self.fail("reading activation rows for the host", e);
        }
        self.sync();
    }

    /// Page-locks `len` bytes at `ptr` for the crossings or the streamed
    /// host matrices; false (and the copies stay pageable) where the
    /// driver refuses.
    ///
    /// # Safety
    /// The memory stays allocated until [`Self::unpin_host`].
    pub(super) unsafe fn pin_host(&mut self, ptr: *mut u8, len: usize) -> bool {
        // Flags: this context's, not mapped into the device; read-only
        // memory (a mapped file) needs the read-only flag.
        if self.ctx.bind_to_thread().is_err() {
            return false;
        }
        [0, sys::CU_MEMHOSTREGISTER_READ_ONLY]
            .into_iter()
            .any(|flags| {
                // SAFETY: `ptr .. ptr + len` is allocated host memory (the
                // caller's promise).
                let r = unsafe { sys::cuMemHostRegister_v2(ptr as *mut c_void, len, flags) };
                r == sys::CUresult::CUDA_SUCCESS
            })
    }

    /// Undoes [`Self::pin_host`].
    ///
    /// # Safety
    /// `ptr` was pinned by [`Self::pin_host`] and is still allocated.
    pub(super) unsafe fn unpin_host(&mut self, ptr: *mut u8) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: as the caller promises. A failure leaves nothing to do.
            let _ = unsafe { sys::cuMemHostUnregister(ptr as *mut c_void) };
        }
    }

    /// Writes `rows × width` values into `x`; at the step's first op on
    /// the device the step's recording begins here (graphs as usual),
    /// otherwise what is recorded goes first.
    pub(super) fn write_rows(
        &mut self,
        x: Buf,
        rows: usize,
        width: usize,
        values: &[f32],
        step_start: bool,
    ) {
        let n = rows * width;
        assert!(
            values.len() >= n,
            "write_rows: {n} values from {}",
            values.len()
        );
        let dst = self.buf(x, n * 4);
        if n == 0 || !self.ready() {
            return;
        }
        if step_start {
            self.begin_step();
        } else {
            self.issue(false);
        }
        self.htod(dst, &values[..n]);
    }
}
