//! Page-locked host memory for the logits read back after every step: the
//! copy engine writes it directly, where a pageable copy is staged through
//! a driver buffer (64 rows of a 128k vocabulary are 33 MB a step).

use std::ffi::c_void;

use cudarc::driver::{result, DriverError};

/// `len` f32s of page-locked host memory of the current context.
pub struct PinnedF32 {
    ptr: *mut f32,
    len: usize,
}

impl PinnedF32 {
    /// Allocates and zeroes `len` values; the context must be current.
    pub fn new(len: usize) -> Result<PinnedF32, DriverError> {
        if len == 0 {
            return Ok(PinnedF32 {
                ptr: std::ptr::NonNull::dangling().as_ptr(),
                len: 0,
            });
        }
        // SAFETY: a plain allocation of len × 4 bytes (flags 0: this
        // context's, not mapped); zeroed before any read.
        let ptr = unsafe {
            let p = result::malloc_host(len * 4, 0)? as *mut f32;
            std::ptr::write_bytes(p, 0, len);
            p
        };
        Ok(PinnedF32 { ptr, len })
    }

    /// Frees the memory now (while its context is alive); a no-op after.
    pub fn free(&mut self) {
        if self.len > 0 {
            // SAFETY: `ptr` came from malloc_host and is freed once.
            let _ = unsafe { result::free_host(self.ptr as *mut c_void) };
            self.len = 0;
        }
    }
}

impl std::ops::Deref for PinnedF32 {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: `len` initialized values at `ptr` (or none).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for PinnedF32 {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `deref`, borrowed exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedF32 {
    fn drop(&mut self) {
        self.free();
    }
}
