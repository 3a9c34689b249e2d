//! Mixture-of-experts: routing on the device, the one-token routed
//! kernels that read the routes where they lie (`moe.cu`), larger steps
//! grouped by expert on the device, and the expert-by-expert path through
//! the host for what those do not take.

use std::ffi::c_void;

use cudarc::driver::result;

use fathom_plan::cuda::MOE_TILE_MIN;

use super::abi::{MAX_EXPERTS, MOE_MAX_ROUTES, MQ_MAX_TOKENS, MQ_WARPS, MV_WARPS, X8_BLOCK};
use super::kernels::act_id;
use super::{CudaBackend, DevMatrix};
use crate::{Buf, MatrixId, RoutedFfn, VectorId};

impl CudaBackend {
    /// One-token MoE steps on the device's routes (`true`, the default) or
    /// expert by expert through the host (`false`), so tests can compare.
    #[doc(hidden)]
    pub fn use_device_routing(&mut self, on: bool) {
        self.device_routing = on;
    }

    /// How many times routes were read back to the host (tests).
    #[doc(hidden)]
    pub fn routes_read_back(&self) -> u64 {
        self.routes_read
    }

    /// Reads the last route_experts' routes back (once), for the ops that
    /// sort rows by expert on the host: what is recorded goes now, and the
    /// rest of the step launches op by op.
    pub(super) fn routes_to_host(&mut self) {
        if !std::mem::take(&mut self.routes_stale) || !self.ready() {
            return;
        }
        self.go_eager();
        self.routes_read += 1;
        let n = self.routes_rows * self.routes_k * 2;
        let rp = self.buf(Buf::ExpertRoutes, n * 4);
        let mut host = std::mem::take(&mut self.routes);
        if self.error.is_none() {
            // SAFETY: `host` holds n u32 (route_experts checked); the routes
            // buffer holds rows × k pairs; pageable memory: returns when done.
            let r = unsafe { result::memcpy_dtoh_async(&mut host[..n], rp, self.stream) };
            if let Err(e) = r {
                self.fail("reading the expert routes", e);
            }
        }
        self.routes = host;
        self.sync();
    }

    /// `(first, stride)` when matrix `i` of every expert has the first's
    /// kind and shape and lies `stride` bytes past the one before (how the
    /// loader places a layer's experts), so a kernel finds expert e's at
    /// `first.data + e × stride`.
    pub(super) fn evenly_placed(
        &self,
        experts: &[[MatrixId; 3]],
        i: usize,
    ) -> Option<(DevMatrix, u64)> {
        let at = |e: usize| self.matrices[experts[e][i].0 as usize];
        let first = at(0);
        let stride = experts
            .get(1)
            .map_or(0, |_| at(1).arg.data.wrapping_sub(first.arg.data));
        let even = (0..experts.len()).all(|e| {
            let (m, a) = (at(e), at(e).arg);
            m.kind == first.kind
                && (a.rows, a.cols, a.row_bytes)
                    == (first.arg.rows, first.arg.cols, first.arg.row_bytes)
                && a.scales == 0
                && a.data == first.arg.data.wrapping_add(stride.wrapping_mul(e as u64))
        });
        even.then_some((first, stride))
    }

    /// `(first, stride)` of the experts' gate, up and down biases where
    /// each kind lies evenly (`stride` bytes apart, as the loader places a
    /// layer's bias rows), the gate's and up's alike, of `widths` values:
    /// the routed kernels find expert e's at `first + e × stride`. `(0, 0)`
    /// each without biases.
    fn evenly_placed_biases(
        &self,
        biases: Option<&[[VectorId; 3]]>,
        widths: [usize; 3],
    ) -> Option<[(u64, u64); 3]> {
        let Some(b) = biases else {
            return Some([(0, 0); 3]);
        };
        let mut out = [(0, 0); 3];
        for (i, o) in out.iter_mut().enumerate() {
            let at = |e: usize| self.vectors[b[e][i].0 as usize];
            let first = at(0).0;
            let stride = b.get(1).map_or(0, |_| at(1).0.wrapping_sub(first));
            let even = (0..b.len())
                .all(|e| at(e) == (first.wrapping_add(stride.wrapping_mul(e as u64)), widths[i]));
            if !even {
                return None;
            }
            *o = (first, stride);
        }
        (out[0].1 == out[1].1).then_some(out)
    }

    /// Where a layer's experts lie, when the routed kernels can find each
    /// expert's matrices and biases from the first's: every matrix and
    /// bias kind lying evenly ([`Self::evenly_placed`],
    /// [`Self::evenly_placed_biases`]).
    fn experts_placed(&self, ffn: &RoutedFfn) -> Option<ExpertsPlaced> {
        let widths = [ffn.ffn_width, ffn.ffn_width, ffn.width];
        Some(ExpertsPlaced {
            gate: self.evenly_placed(ffn.experts, 0)?,
            up: self.evenly_placed(ffn.experts, 1)?,
            down: self.evenly_placed(ffn.experts, 2)?,
            biases: self.evenly_placed_biases(ffn.biases, widths)?,
        })
    }

    /// A one-token MoE FFN on the routes route_experts left on the device:
    /// gate and up of the k routed experts in one launch, down in another,
    /// their weighted sum in a third; nothing is read back, so the step
    /// stays one graph. Per-expert biases (gpt-oss) are added in the
    /// kernels. `false`, with nothing launched, where the experts (or
    /// their biases) do not lie evenly, their kinds have no routed kernels,
    /// or k rows do not fit the planned buffers.
    pub(super) fn routed_on_device(&mut self, ffn: &RoutedFfn, x: Buf, out: Buf) -> bool {
        let RoutedFfn {
            k,
            act,
            width,
            ffn_width,
            ..
        } = *ffn;
        let Some(ExpertsPlaced {
            gate: (g, gs),
            up: (u, us),
            down: (d, ds),
            biases: [(mut gb, mut bs), (mut ub, _), (mut db, mut dbs)],
        }) = self.experts_placed(ffn)
        else {
            return false;
        };
        let (gate_x8, down_x8) = (
            !self.k.mv1x8[g.kind].is_null(),
            !self.k.mv1x8[d.kind].is_null(),
        );
        let staging = self.upload.x16_cols * self.upload.tokens * 2;
        let x8_fits =
            |values: usize| values.is_multiple_of(32) && values / 32 * X8_BLOCK <= staging;
        let holds = |b: Buf, bytes: usize| {
            self.arena[b as usize].is_some_and(|(_, size)| bytes as u64 <= size)
        };
        let fits = k <= MOE_MAX_ROUTES
            && k == self.routes_k
            && g.kind == u.kind
            && !self.k.moe_gate_up[g.kind].is_null()
            && !self.k.moe_down[d.kind].is_null()
            && (g.arg.rows, g.arg.cols, d.arg.rows, d.arg.cols)
                == (
                    ffn_width as i32,
                    width as i32,
                    width as i32,
                    ffn_width as i32,
                )
            && (u.arg.rows, u.arg.cols) == (g.arg.rows, g.arg.cols)
            && (!gate_x8 || (x8_fits(width) && width <= self.upload.x16_cols))
            && (!down_x8 || x8_fits(k * ffn_width))
            && holds(Buf::FfnGate, k * ffn_width * 4)
            && holds(Buf::MoeOut, k * width * 4);
        if !fits {
            return false;
        }
        let mut xp = self.buf(x, width * 4);
        let mut gate_out = self.buf(Buf::FfnGate, k * ffn_width * 4);
        let mut down_out = self.buf(Buf::MoeOut, k * width * 4);
        let mut op = self.buf(out, width * 4);
        let mut routes = self.buf(Buf::ExpertRoutes, k * 8);
        if !self.ready() {
            return true;
        }
        let ky = k as u32;
        if gate_x8 {
            xp = self
                .x8_input(g.kind, width, xp)
                .expect("checked: x fits the x8 staging");
        }
        let split = Self::matvec_split(ffn_width, width / Self::matvec_chunk(g.kind, 1));
        let (mut ga, mut ua, mut gs, mut us, mut sp) = (g.arg, u.arg, gs, us, split as i32);
        let mut a = act_id(act);
        let grid = ffn_width.div_ceil(MV_WARPS / split) as u32;
        let f = self.k.moe_gate_up[g.kind];
        self.launch(
            f,
            (grid, ky, 1),
            32 * MV_WARPS as u32,
            &mut args![ga, ua, gs, us, routes, xp, gate_out, sp, a, gb, ub, bs],
        );
        let mut dx = gate_out;
        if down_x8 {
            // The k rows' blocks one after another: each row's own blocks.
            let (mut n, mut staged) = ((k * ffn_width) as i32, self.upload.x16);
            let f = self.k.quantize_x8;
            let grid = (k * ffn_width / 32).div_ceil(8) as u32;
            self.launch(f, (grid, 1, 1), 256, &mut args![dx, n, staged]);
            dx = staged;
        }
        let split = Self::matvec_split(width, ffn_width / Self::matvec_chunk(d.kind, 1));
        let (mut da, mut ds, mut sp) = (d.arg, ds, split as i32);
        let grid = width.div_ceil(MV_WARPS / split) as u32;
        let f = self.k.moe_down[d.kind];
        self.launch(
            f,
            (grid, ky, 1),
            32 * MV_WARPS as u32,
            &mut args![da, ds, routes, dx, down_out, sp, db, dbs],
        );
        let (mut kk, mut w) = (k as i32, width as i32);
        let f = self.k.moe_combine;
        self.launch(
            f,
            (width.div_ceil(256) as u32, 1, 1),
            256,
            &mut args![down_out, routes, kk, w, op],
        );
        true
    }

    /// A MoE FFN over `rows` rows on the routes route_experts left on the
    /// device, nothing read back (so the step may stay a graph): the
    /// (row, route) pairs grouped by expert (`moe_group`), the rows
    /// gathered in that order as f16, every expert's gate and up over its
    /// rows in one launch each of the tensor-core kernels (tiles of 64
    /// rows where both kinds have the 64-token kernel, else 16), act(gate)
    /// × up (with gpt-oss's biases) as f16, the down products likewise,
    /// and each row's routes weighted and summed in expert order. `false`,
    /// with nothing launched, where the experts (or their biases) do not
    /// lie evenly, a kind has no tensor-core kernel, the tensor-core
    /// kernels are off (`FATHOM_CUDA_MMA_FEW=0`), or the step does not fit
    /// the plan's grouping.
    pub(super) fn routed_grouped(
        &mut self,
        ffn: &RoutedFfn,
        x: Buf,
        rows: usize,
        out: Buf,
    ) -> bool {
        let RoutedFfn {
            experts,
            k,
            act,
            width,
            ffn_width,
            ..
        } = *ffn;
        let Some(ExpertsPlaced {
            gate: (g, gs),
            up: (u, us),
            down: (d, ds),
            biases: [(mut gb, mut bs), (mut ub, _), (mut db, mut dbs)],
        }) = self.experts_placed(ffn)
        else {
            return false;
        };
        let (base, m) = self.moe;
        let routed = rows * k;
        // A tile both kernels take: `mqg_*` takes 64 rows for the kinds
        // with a 64-token `mq` kernel (the K-quants), else the plan's
        // smallest tile, which sizes its tile list.
        let tile_of = |kind: usize| {
            if self.k.mq[1][kind].is_null() {
                MOE_TILE_MIN as usize
            } else {
                MQ_MAX_TOKENS
            }
        };
        let tile = tile_of(g.kind).min(tile_of(d.kind));
        let (fg, fd) = (self.k.mqg[g.kind], self.k.mqg[d.kind]);
        let fits = self.mma_few
            && k <= MOE_MAX_ROUTES
            && k == self.routes_k
            && rows <= self.routes_rows
            && experts.len() <= MAX_EXPERTS
            && g.kind == u.kind
            && !fg.is_null()
            && !fd.is_null()
            && (g.arg.rows, g.arg.cols, d.arg.rows, d.arg.cols)
                == (
                    ffn_width as i32,
                    width as i32,
                    width as i32,
                    ffn_width as i32,
                )
            && (u.arg.rows, u.arg.cols) == (g.arg.rows, g.arg.cols)
            && width.is_multiple_of(32)
            && ffn_width.is_multiple_of(32)
            && routed as u64 <= m.routed
            && experts.len() as u64 <= m.experts
            && width as u64 <= m.width
            && ffn_width as u64 <= m.ffn;
        if !fits {
            return false;
        }
        let mut routes = self.buf(Buf::ExpertRoutes, routed * 8);
        let mut xp = self.buf(x, rows * width * 4);
        let mut op = self.buf(out, rows * width * 4);
        if rows == 0 || !self.ready() {
            return true;
        }
        let at = |offset: u64| base + offset;
        let (mut token_of, mut expert_of, mut position, mut tiles) =
            (at(m.token_of), at(m.expert_of), at(m.position), at(m.tiles));
        let (mut x16, mut x_unscale, mut gate, mut up) =
            (at(m.x16), at(m.x_unscale), at(m.gate), at(m.up));
        let (mut h16, mut h_unscale, mut down) = (at(m.h16), at(m.h_unscale), at(m.down));
        let (mut n, mut kk, mut ne, mut tl) =
            (rows as i32, k as i32, experts.len() as i32, tile as i32);
        let f = self.k.moe_group;
        self.launch(
            f,
            (1, 1, 1),
            1024,
            &mut args![routes, n, kk, ne, tl, token_of, expert_of, position, tiles],
        );
        let mut w = width as i32;
        let f = self.k.moe_rows_to_half;
        self.launch(
            f,
            (routed as u32, 1, 1),
            256,
            &mut args![xp, token_of, w, x16, x_unscale],
        );
        // Every tile a launch row; rows past the step's tiles return.
        let most_tiles = (routed.div_ceil(tile) + experts.len().min(routed)) as u32;
        let kgroups = self.mma_kgroups.unwrap_or(MQ_WARPS);
        let mut kg = kgroups as i32;
        for (mut arg, mut stride, mut dst) in [(g.arg, gs, gate), (u.arg, us, up)] {
            let grid = ffn_width.div_ceil(16 * MQ_WARPS / kgroups) as u32;
            self.launch(
                fg,
                (grid, most_tiles, 1),
                32 * MQ_WARPS as u32,
                &mut args![arg, x16, x_unscale, dst, kg, tiles, stride],
            );
        }
        let (mut fw, mut a) = (ffn_width as i32, act_id(act));
        let f = self.k.moe_glu_half;
        self.launch(
            f,
            (routed as u32, 1, 1),
            256,
            &mut args![gate, up, expert_of, fw, a, gb, ub, bs, h16, h_unscale],
        );
        let (mut da, mut stride) = (d.arg, ds);
        let grid = width.div_ceil(16 * MQ_WARPS / kgroups) as u32;
        self.launch(
            fd,
            (grid, most_tiles, 1),
            32 * MQ_WARPS as u32,
            &mut args![da, h16, h_unscale, down, kg, tiles, stride],
        );
        let f = self.k.moe_combine_rows;
        self.launch(
            f,
            (width.div_ceil(256) as u32, rows as u32, 1),
            256,
            &mut args![down, position, routes, kk, w, db, dbs, op],
        );
        true
    }

    pub(super) fn route_experts(
        &mut self,
        logits: Buf,
        rows: usize,
        n_experts: usize,
        k: usize,
        normalize: bool,
    ) {
        assert!(
            n_experts <= MAX_EXPERTS && k <= n_experts,
            "route_experts: {k} of {n_experts} experts ({MAX_EXPERTS} at most)"
        );
        let mut lp = self.buf(logits, rows * n_experts * 4);
        let mut rp = self.buf(Buf::ExpertRoutes, rows * k * 8);
        assert!(
            rows * k * 2 <= self.routes.len(),
            "route_experts: more routes than planned"
        );
        self.routes_k = k;
        self.routes_rows = rows;
        self.routes_stale = true;
        if rows == 0 || !self.ready() {
            return;
        }
        let (mut ne, mut kk, mut norm) = (n_experts as i32, k as i32, normalize as i32);
        let f = self.k.route_experts;
        self.launch(f, (rows as u32, 1, 1), 32, &mut args![lp, ne, kk, norm, rp]);
    }

    pub(super) fn gather_expert_rows(
        &mut self,
        expert: usize,
        rows: usize,
        k: usize,
        src: Buf,
        width: usize,
        dst: Buf,
    ) -> usize {
        assert!(
            k == self.routes_k && rows <= self.routes_rows,
            "gather_expert_rows: routes are for {} rows x {}",
            self.routes_rows,
            self.routes_k
        );
        self.routes_to_host();
        let mut list = std::mem::take(&mut self.host_u32);
        list.clear();
        for t in 0..rows {
            if (0..k).any(|j| self.routes[2 * (t * k + j)] as usize == expert) {
                list.push(t as u32);
            }
        }
        let n = list.len();
        let mut s = self.buf(src, rows * width * 4);
        let mut d = self.buf(dst, n * width * 4);
        if n > 0 && self.ready() {
            let (mut idx, _) = self.upload_idx(&list, None);
            let mut w = width as i32;
            let f = self.k.gather_rows;
            self.launch(f, (n as u32, 1, 1), 128, &mut args![s, idx, w, d]);
        }
        self.host_u32 = list;
        n
    }

    pub(super) fn scatter_expert_rows(
        &mut self,
        expert: usize,
        rows: usize,
        k: usize,
        src: Buf,
        width: usize,
        dst: Buf,
    ) {
        assert!(
            k == self.routes_k && rows <= self.routes_rows,
            "scatter_expert_rows: routes are for {} rows x {}",
            self.routes_rows,
            self.routes_k
        );
        self.routes_to_host();
        let mut list = std::mem::take(&mut self.host_u32);
        let mut wts = std::mem::take(&mut self.host_f32);
        list.clear();
        wts.clear();
        for t in 0..rows {
            if let Some(j) = (0..k).find(|j| self.routes[2 * (t * k + j)] as usize == expert) {
                list.push(t as u32);
                wts.push(f32::from_bits(self.routes[2 * (t * k + j) + 1]));
            }
        }
        let n = list.len();
        let mut s = self.buf(src, n * width * 4);
        let mut d = self.buf(dst, rows * width * 4);
        if n > 0 && self.ready() {
            let (mut idx, mut wp) = self.upload_idx(&list, Some(&wts));
            let mut w = width as i32;
            let f = self.k.scatter_rows;
            self.launch(f, (n as u32, 1, 1), 128, &mut args![s, idx, wp, w, d]);
        }
        self.host_u32 = list;
        self.host_f32 = wts;
    }
}

/// A layer's experts as the routed kernels find them: per matrix kind the
/// first expert's matrix and the stride to the next, per bias kind (gate,
/// up, down) the first's address and stride (`(0, 0)` without biases).
struct ExpertsPlaced {
    gate: (DevMatrix, u64),
    up: (DevMatrix, u64),
    down: (DevMatrix, u64),
    biases: [(u64, u64); 3],
}
