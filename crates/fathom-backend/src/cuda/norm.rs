//! RMS norms of rows and of heads (`norm.cu`).

use std::ffi::c_void;

use super::CudaBackend;
use crate::{Buf, VectorId};

impl CudaBackend {
    /// Threads of a norm block for rows of `width`: about four values a
    /// thread, whole warps, at most 1024 (the kernel holds eight a thread
    /// in registers and loops beyond).
    pub(super) fn norm_threads(width: usize) -> u32 {
        width.div_ceil(4).next_multiple_of(32).clamp(32, 1024) as u32
    }

    /// The norm of `rows` rows of `x` (with `add` added into `x` first,
    /// when given) into `out`, one launch of `rms_norm`; its output also as
    /// x8 blocks when a loaded matrix reads them (`x8_out`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn norm_rows(
        &mut self,
        x: Buf,
        add: Option<Buf>,
        w: VectorId,
        eps: f32,
        rows: usize,
        width: usize,
        out: Buf,
    ) {
        let (mut wp, wl) = self.vectors[w.0 as usize];
        assert!(wl >= width, "rms_norm: {wl} weights for {width} values");
        let bytes = rows * width * 4;
        let mut xp = self.buf(x, bytes);
        let mut ap = add.map_or(0, |a| self.buf(a, bytes));
        let mut op = self.buf(out, bytes);
        if rows == 0 || !self.ready() {
            return;
        }
        let (mut eps, mut w) = (eps, width as i32);
        let mut x8 = self.x8_out(rows, width);
        let f = self.k.rms_norm;
        self.launch(
            f,
            (rows as u32, 1, 1),
            Self::norm_threads(width),
            &mut args![xp, ap, wp, eps, w, op, x8],
        );
        if x8 != 0 {
            self.x8_holds = Some((op, width));
        }
    }

    /// RMS norm of every `head_dim` values of `rows × width` in place,
    /// with one weight of `head_dim` values, or none (`w` `None`: the
    /// kernel takes a null weight as all ones, Gemma 4's values).
    pub(super) fn head_norm(
        &mut self,
        x: Buf,
        w: Option<VectorId>,
        eps: f32,
        rows: usize,
        width: usize,
        head_dim: usize,
    ) {
        let (mut wp, wl) = w.map_or((0, head_dim), |w| self.vectors[w.0 as usize]);
        assert!(
            wl >= head_dim && head_dim > 0 && width.is_multiple_of(head_dim),
            "head_norm: {wl} weights, heads of {head_dim} in rows of {width}"
        );
        let mut xp = self.buf(x, rows * width * 4);
        let heads = rows * width / head_dim;
        if heads == 0 || !self.ready() {
            return;
        }
        let mut op = xp;
        let (mut eps, mut hd, mut no_add, mut no_x8) = (eps, head_dim as i32, 0u64, 0u64);
        let f = self.k.rms_norm;
        // Every head is a row of head_dim values; in place is allowed.
        self.launch(
            f,
            (heads as u32, 1, 1),
            Self::norm_threads(head_dim),
            &mut args![xp, no_add, wp, eps, hd, op, no_x8],
        );
    }
}
