//! A split model's crossings: activation rows copied between the device
//! arena and the CPU backend's arena (host memory), where the plan's
//! placement moves a step from one side to the other.
//!
//! The copies read and write the host arena directly (pageable memory, the
//! driver stages them): a decode step crosses a few rows of the hidden
//! width (32 KiB at one row of 8,192), and a prefill chunk's crossing is
//! small beside the host layers' own time, so no pinned buffer is planned
//! for them.

use cudarc::driver::result;

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
