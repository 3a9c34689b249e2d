//! Recording and issuing work: kernel launches and cuBLAS calls go to the
//! launch queue ([`super::queue`]) and out as a graph per step part, or one
//! by one in eager mode; copies and synchronization on the one stream.

use std::ffi::c_void;

use cudarc::driver::{result, sys};

use super::{blas, CudaBackend, GraphStats};

impl CudaBackend {
    /// Records a launch (or, in eager mode, launches it). `f` is a kernel
    /// of our module whose parameter list `args` matches (types and order
    /// as in the kernel); every pointer argument addresses the one
    /// allocation within the extents the op checked.
    pub(super) fn launch(
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
    pub(super) fn issue(&mut self, end_of_step: bool) {
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
    pub(super) fn gemm(&mut self, g: blas::Gemm) {
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
    pub(super) fn go_eager(&mut self) {
        self.issue(false);
        self.eager = true;
    }

    /// A new step begins: what an earlier step left recorded is issued.
    pub(super) fn begin_step(&mut self) {
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
    pub(super) fn issue_step_head(&mut self) {
        if !self.whole_step || self.eager || self.step_part != 0 {
            return;
        }
        self.issue(true);
        self.whole_step = self.error.is_none();
        self.step_part = 1;
    }

    pub(super) fn htod<T>(&mut self, dst: u64, src: &[T]) {
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

    pub(super) fn sync(&mut self) {
        if self.error.is_some() {
            return;
        }
        // SAFETY: our own stream.
        if let Err(e) = unsafe { result::stream::synchronize(self.stream) } {
            self.fail("stream synchronize", e);
        }
    }

    /// How the recorded launches went out: graphs captured and replayed,
    /// launches issued one by one.
    pub fn graph_stats(&self) -> GraphStats {
        self.queue.stats
    }
}
