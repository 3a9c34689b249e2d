//! Element-wise ops and row gathers (`elementwise.cu`), with the gates of
//! hybrid models' attention and shared expert.

use std::ffi::c_void;

use cudarc::driver::sys;

use super::kernels::act_id;
use super::CudaBackend;
use crate::{Buf, Glu, VectorId};

impl CudaBackend {
    pub(super) fn add_bias(&mut self, x: Buf, b: VectorId, rows: usize, width: usize) {
        let (mut bp, bl) = self.vectors[b.0 as usize];
        assert!(bl >= width, "add_bias: {bl} values for {width}");
        let mut xp = self.buf(x, rows * width * 4);
        let n = rows * width;
        if n == 0 || !self.ready() {
            return;
        }
        let (mut w, mut n) = (width as i32, n as i64);
        let f = self.k.add_bias;
        self.launch_values(f, n as usize, &mut args![xp, bp, w, n]);
    }

    pub(super) fn add(&mut self, dst: Buf, src: Buf, rows: usize, width: usize) {
        let mut d = self.buf(dst, rows * width * 4);
        let mut s = self.buf(src, rows * width * 4);
        let n = rows * width;
        if n == 0 || !self.ready() {
            return;
        }
        let mut n = n as i64;
        let f = self.k.add;
        self.launch_values(f, n as usize, &mut args![d, s, n]);
    }

    pub(super) fn gather_rows(&mut self, src: Buf, src_rows: &[usize], width: usize, dst: Buf) {
        let max = src_rows.iter().copied().max().unwrap_or(0);
        let mut s = self.buf(src, (max + 1) * width * 4);
        let mut d = self.buf(dst, src_rows.len() * width * 4);
        if src_rows.is_empty() || !self.ready() {
            return;
        }
        let mut h = std::mem::take(&mut self.host_u32);
        h.clear();
        h.extend(src_rows.iter().map(|&r| r as u32));
        let mut idx = self.stage_rows(&h, true);
        self.host_u32 = h;
        let mut w = width as i32;
        let f = self.k.gather_rows;
        self.launch(
            f,
            (src_rows.len() as u32, 1, 1),
            128,
            &mut args![s, idx, w, d],
        );
    }

    pub(super) fn glu(&mut self, gate: Buf, up: Buf, rows: usize, width: usize, act: Glu) {
        let mut g = self.buf(gate, rows * width * 4);
        let mut u = self.buf(up, rows * width * 4);
        let n = rows * width;
        if n == 0 || !self.ready() {
            return;
        }
        let (mut n, mut a) = (n as i64, act_id(act));
        let f = self.k.glu;
        self.launch_values(f, n as usize, &mut args![g, u, n, a]);
    }

    /// `x[r] *= factor` (Gemma 4's layer output scale).
    pub(super) fn scale(&mut self, x: Buf, factor: f32, rows: usize, width: usize) {
        let f = self.k.scale;
        self.map_values(f, x, factor, rows * width);
    }

    /// `x[r] = cap × tanh(x[r] / cap)` (Gemma 4's logit softcap).
    pub(super) fn softcap(&mut self, x: Buf, cap: f32, rows: usize, width: usize) {
        let f = self.k.softcap;
        self.map_values(f, x, cap, rows * width);
    }

    /// One launch of an in-place kernel `f(x, a, n)` over the first `n`
    /// values of `x`.
    fn map_values(&mut self, f: sys::CUfunction, x: Buf, a: f32, n: usize) {
        let mut xp = self.buf(x, n * 4);
        if n == 0 || !self.ready() {
            return;
        }
        let (mut a, mut n) = (a, n as i64);
        self.launch_values(f, n as usize, &mut args![xp, a, n]);
    }

    pub(super) fn zero(&mut self, x: Buf, rows: usize, width: usize) {
        let mut xp = self.buf(x, rows * width * 4);
        let n = rows * width;
        if n == 0 || !self.ready() {
            return;
        }
        let mut n = n as i64;
        let f = self.k.fill_zero;
        self.launch_values(f, n as usize, &mut args![xp, n]);
    }

    /// One launch of an element-wise kernel over `n` values (a grid-stride
    /// loop in each).
    fn launch_values(&mut self, f: sys::CUfunction, n: usize, args: &mut [(*mut c_void, usize)]) {
        let grid = Self::grid_for(n, 256).min(4096);
        self.launch(f, (grid, 1, 1), 256, args);
    }

    pub(super) fn split_gated_heads(
        &mut self,
        x: Buf,
        rows: usize,
        heads: usize,
        head_dim: usize,
        [a, b]: [Buf; 2],
    ) {
        let n = rows * heads * head_dim;
        let mut xp = self.buf(x, 2 * n * 4);
        let (mut ap, mut bp) = (self.buf(a, n * 4), self.buf(b, n * 4));
        if n == 0 || !self.ready() {
            return;
        }
        let (mut hd, mut n) = (head_dim as i32, n as i64);
        let f = self.k.split_heads;
        self.launch_values(f, n as usize, &mut args![xp, ap, bp, hd, n]);
    }

    pub(super) fn add_gated_rows(
        &mut self,
        dst: Buf,
        src: Buf,
        gate: Buf,
        rows: usize,
        width: usize,
    ) {
        let n = rows * width;
        let (mut d, mut s) = (self.buf(dst, n * 4), self.buf(src, n * 4));
        let mut g = self.buf(gate, rows * 4);
        if n == 0 || !self.ready() {
            return;
        }
        let (mut w, mut n) = (width as i32, n as i64);
        let f = self.k.add_gated_rows;
        self.launch_values(f, n as usize, &mut args![d, s, g, w, n]);
    }

    pub(super) fn sigmoid_gate(&mut self, gate: Buf, x: Buf, rows: usize, width: usize) {
        let n = rows * width;
        let (mut g, mut xp) = (self.buf(gate, n * 4), self.buf(x, n * 4));
        if n == 0 || !self.ready() {
            return;
        }
        let mut n = n as i64;
        let f = self.k.sigmoid_gate;
        self.launch_values(f, n as usize, &mut args![g, xp, n]);
    }
}
