//! Matrix products: one token (`matvec.cu`: segments, balanced rows, int8
//! activations), a few tokens, the tiled kernel (`matmat.cu`) and prefill
//! through cuBLAS on f16 staging (`convert.cu`).

use std::ffi::c_void;

use cudarc::driver::sys;

use fathom_plan::cuda::WEIGHT_STAGING as W16_STAGING;

use super::abi::{
    Segments, MQ_MAX_TOKENS, MQ_WARPS, MV_BALANCED_ROWS, MV_MAX_TOKENS, MV_SEGMENTS, MV_WARPS,
};
use super::kernels::act_id;
use super::kernels::type_of_kind;
use super::{blas, kind_of_type, CudaBackend, DevMatrix};
use crate::{Buf, Glu, MatrixId, WeightType};

/// `x16_holds`'s conversion marker for rows scaled by `to_half_rows` (to_half
/// marks f16 0 and bf16 1).
const ROWS_SCALED: i32 = 2;

impl CudaBackend {
    /// Prefill (more than 8 rows) of non-F32 matrices through the tiled
    /// f32 kernel (`true`) or cuBLAS on f16/bf16 (`false`, the default), so
    /// tests can check both.
    #[doc(hidden)]
    pub fn use_tiled_prefill(&mut self, on: bool) {
        self.tiled_prefill = on;
    }

    /// Steps of 2 to `MQ_MAX_TOKENS` rows on the tensor-core kernels
    /// straight from the stored blocks (`true`, the default unless
    /// `FATHOM_CUDA_MMA_FEW=0`) or on the paths before them (cuBLAS on
    /// dequantized f16; f16 and bf16 up to 8 rows on the f32 few-token
    /// kernel), so tests and benchmarks can hold one against the other;
    /// `kgroups` (1, 2 or 4) overrides the warps a row's depth is split
    /// between.
    #[doc(hidden)]
    pub fn use_mma_few(&mut self, on: bool, kgroups: Option<usize>) {
        self.mma_few = on;
        self.mma_kgroups = kgroups;
    }

    /// The tensor-core kernel (matmul_mma.cu) `rows` rows through `m` take,
    /// if any: up to 16 rows for every kind but f32 (f16 and bf16 only up
    /// to `MV_MAX_TOKENS`: beyond, cuBLAS reads them as stored), up to
    /// `MQ_MAX_TOKENS` for the K-quants, when the activations and their
    /// row scales fit the f16 staging and the depth is whole 32-value
    /// steps.
    fn mma_few_kernel(&self, m: &DevMatrix, rows: usize) -> Option<sys::CUfunction> {
        use WeightType::{BF16, F16};
        let cols = m.arg.cols as usize;
        let most = if matches!(type_of_kind(m.kind), Some(F16 | BF16)) {
            MV_MAX_TOKENS
        } else {
            MQ_MAX_TOKENS
        };
        let f = self.k.mq[usize::from(rows > 16)][m.kind];
        (self.mma_few
            && !f.is_null()
            && (2..=most).contains(&rows)
            && cols.is_multiple_of(32)
            && self.upload.x16 + (rows * cols * 2) as u64 <= self.mma_unscale())
        .then_some(f)
    }

    /// `rows` rows of x (at `xp`) through `m` into `out` on tensor-core
    /// kernel `f` (`mma_few_kernel`). Four warps a row by default (the
    /// fastest measured for every type and token count: matmul_mma.cu).
    fn matmul_mma(&mut self, f: sys::CUfunction, m: DevMatrix, xp: u64, rows: usize, out: u64) {
        let (wr, wc) = (m.arg.rows as usize, m.arg.cols as usize);
        let (mut x16, mut unscale) = (self.upload.x16, self.mma_unscale());
        // The rows scaled into f16's range (to_half_rows), not to_half's
        // conversion: their own entry in what the staging holds.
        let holds = Some((xp, (rows * wc) as i64, ROWS_SCALED));
        if self.x16_holds != holds {
            let (mut x, mut cols) = (xp, wc as i32);
            let g = self.k.to_half_rows;
            self.launch(
                g,
                (rows as u32, 1, 1),
                256,
                &mut args![x, cols, x16, unscale],
            );
        }
        let kgroups = self.mma_kgroups.unwrap_or(MQ_WARPS);
        let (mut arg, mut op) = (m.arg, out);
        let (mut n, mut kg) = (rows as i32, kgroups as i32);
        let grid = wr.div_ceil(16 * MQ_WARPS / kgroups) as u32;
        self.launch(
            f,
            (grid, 1, 1),
            32 * MQ_WARPS as u32,
            &mut args![arg, x16, unscale, op, n, kg],
        );
        self.x16_holds = holds;
    }

    /// Where the tensor-core kernels' per-row unscale factors lie: the last
    /// `MQ_MAX_TOKENS` floats of the f16 staging, 16-byte aligned
    /// (`mma_few_kernel` keeps the rows' f16 values below them).
    fn mma_unscale(&self) -> u64 {
        let end = self.upload.x16 + (self.upload.x16_cols * self.upload.tokens * 2) as u64;
        end.saturating_sub(4 * MQ_MAX_TOKENS as u64) & !15
    }

    /// x (`n` f32 values at `xp`) as f16 (bf16 where `bf16`) in the
    /// activation staging, unless it holds them already; returns what it
    /// holds, for the caller to record once its own launches are out (any
    /// launch forgets it).
    fn x_to_half(&mut self, xp: u64, n: usize, bf16: bool) -> Option<(u64, i64, i32)> {
        let (mut xp, mut n, mut bf, mut x16) = (xp, n as i64, bf16 as i32, self.upload.x16);
        let holds = Some((xp, n, bf));
        if self.x16_holds != holds {
            let f = self.k.to_half;
            let grid = Self::grid_for(n as usize, 256).min(4096);
            self.launch(f, (grid, 1, 1), 256, &mut args![xp, n, bf, x16]);
        }
        holds
    }

    /// One token of x (at `xp`) through each matrix into its output
    /// address, in one launch of the one-token kernel: each matrix's rows
    /// take their own blocks (and warps a row). All of one type and width.
    pub(super) fn matvec_one(&mut self, parts: &[(DevMatrix, u64)], mut xp: u64) {
        let kind = parts[0].0.kind;
        let mut s = Segments {
            w: [parts[0].0.arg; MV_SEGMENTS],
            out: [0; MV_SEGMENTS],
            split: [1; MV_SEGMENTS],
            first: [0; MV_SEGMENTS + 1],
            rows_per_block: 0,
            prefetch: 1,
        };
        // After attention, no prefetch: its latency-bound loads (and the
        // merge's) would wait in DRAM queues behind the prefetch of the
        // output projection's rows, which then read at DRAM speed anyway.
        if std::mem::take(&mut self.attention_last) {
            s.prefetch = 0;
        }
        let mut blocks = 0;
        for (i, (m, out)) in parts.iter().enumerate() {
            let (wr, wc) = (m.arg.rows as usize, m.arg.cols as usize);
            let split = Self::matvec_split(wr, wc / Self::matvec_chunk(kind, 1));
            (s.w[i], s.out[i], s.split[i]) = (m.arg, *out, split as i32);
            s.first[i] = blocks as i32;
            blocks += wr.div_ceil(MV_WARPS / split);
        }
        for f in &mut s.first[parts.len()..] {
            *f = blocks as i32;
        }
        let mut n = 1i32;
        let (x, cols) = (xp, parts[0].0.arg.cols as usize);
        let x8 = self.x8_input(kind, cols, xp);
        let rows: usize = parts.iter().map(|(m, _)| m.arg.rows as usize).sum();
        if let (None, Some(r)) = (
            x8,
            Self::balanced_rows(kind, rows, cols, blocks, self.sm_count),
        ) {
            let mut at = 0;
            for (i, f) in s.first.iter_mut().enumerate() {
                *f = at as i32;
                at += parts.get(i).map_or(0, |(m, _)| m.arg.rows as usize);
            }
            s.rows_per_block = r as i32;
            blocks = rows.div_ceil(r);
        }
        let f = if let Some(x8p) = x8 {
            xp = x8p;
            self.k.mv1x8[kind]
        } else {
            self.k.mv1[kind]
        };
        self.launch(
            f,
            (blocks as u32, 1, 1),
            32 * MV_WARPS as u32,
            &mut args![s, xp, n],
        );
        if x8.is_some() && parts.iter().all(|&(_, out)| out != x) {
            self.x8_holds = Some((x, cols));
        }
    }

    /// Rows a block of the balanced one-token kernel takes for `rows`
    /// rows of `cols` values of `kind`, where the plain layout's `blocks`
    /// need more than one wave (8 blocks a multiprocessor): f32, f16 and
    /// bf16 rows whose warps' runs (R × chunks / 4) fall on whole groups of
    /// 4 × 32 chunks, 4 to `MV_BALANCED_ROWS` rows a block; else `None`.
    pub(super) fn balanced_rows(
        kind: usize,
        rows: usize,
        cols: usize,
        blocks: usize,
        sms: usize,
    ) -> Option<usize> {
        use WeightType::{BF16, F16, F32};
        let float = matches!(type_of_kind(kind), Some(F32 | F16 | BF16));
        let (wave, chunks) = (8 * sms, cols / 8);
        if !float || blocks <= wave || !cols.is_multiple_of(8) || !chunks.is_multiple_of(128) {
            return None;
        }
        (rows.div_ceil(wave).max(4)..=MV_BALANCED_ROWS)
            .find(|r| (r * chunks).is_multiple_of(4 * 128))
    }

    /// Where a one-token norm or attention writing `values` outputs also
    /// writes them as x8 blocks (the staging), or 0: only when a loaded
    /// matrix reads x8 and the values fit and fill whole blocks.
    pub(super) fn x8_out(&self, rows: usize, values: usize) -> u64 {
        if rows == 1 && self.emits_x8 && values.is_multiple_of(32) && values <= self.upload.x16_cols
        {
            self.upload.x16
        } else {
            0
        }
    }

    /// One token of x (`cols` values at `xp`) for weights of `kind`: on
    /// the int8-activation kernels where the kind has them, quantized into
    /// the f16 staging (1.5 bytes a value, where 2 are planned), whose
    /// address it returns; else `None`, and the f32 kernels read x itself.
    pub(super) fn x8_input(&mut self, kind: usize, cols: usize, xp: u64) -> Option<u64> {
        if self.k.mv1x8[kind].is_null() || !cols.is_multiple_of(32) || cols > self.upload.x16_cols {
            return None;
        }
        let (mut x, mut n, mut out) = (xp, cols as i32, self.upload.x16);
        if self.x8_holds == Some((xp, cols)) {
            return Some(out);
        }
        // A warp a 32-value block, 8 a launch block.
        let f = self.k.quantize_x8;
        let grid = (cols / 32).div_ceil(8) as u32;
        self.launch(f, (grid, 1, 1), 256, &mut args![x, n, out]);
        self.x8_holds = Some((xp, cols));
        Some(out)
    }

    /// Warps a matrix-vector kernel gives a weight row whose walk takes
    /// `chunks` steps of a lane: on more than 2,048 rows one warp reading a
    /// whole row measured faster (H200: 4096 rows, 12 µs against 13.8 µs
    /// split four ways); a matrix of fewer rows (K and V projections) takes
    /// up to four, for loads enough in flight, but no warp whose lanes would
    /// all be idle (a 2048-wide row is 64 chunks of 32 values: two warps).
    pub(super) fn matvec_split(rows: usize, chunks: usize) -> usize {
        if rows <= 2048 {
            chunks.div_ceil(32).next_power_of_two().min(MV_WARPS)
        } else {
            1
        }
    }

    /// Values a matrix-vector lane decodes per step for `rows` rows of x on
    /// weights of `kind`: the one-token kernels of these types take 32 at
    /// once (`Chunk<T>` in quant.cuh; Q8_0, Q4_0 and MXFP4 a block on int8
    /// activations) or 64 (Q4_K and Q6_K on int8 activations), the rest 8. A mismatch
    /// with the kernels would only cost speed (`matvec_split`), never
    /// correctness.
    pub(super) fn matvec_chunk(kind: usize, rows: usize) -> usize {
        use WeightType::{MXFP4, Q4_0, Q4_K, Q5_K, Q6_K, Q8_0};
        match type_of_kind(kind) {
            Some(Q4_K | Q6_K) if rows == 1 => 64,
            Some(Q5_K | Q8_0 | Q4_0 | MXFP4) if rows == 1 => 32,
            _ => 8,
        }
    }

    /// Prefill matmul on tensor cores: x to f16 (bf16 for BF16 weights),
    /// then cuBLAS GemmEx with f32 accumulation, straight on F16/BF16
    /// weights, on W16_STAGING-sized chunks of dequantized rows otherwise.
    pub(super) fn gemm_prefill(&mut self, m: DevMatrix, x: u64, rows: usize, out: u64) {
        let (wr, wc) = (m.arg.rows as usize, m.arg.cols as usize);
        let bf16 = m.kind == kind_of_type(WeightType::BF16);
        let ty = if bf16 { blas::R_16BF } else { blas::R_16F };
        let holds = self.x_to_half(x, rows * wc, bf16);
        let gemm = |s: &mut Self, a: u64, m_rows: usize, c: u64| {
            // Column-major: out' (wr × rows, ldc wr) = W' (wc × m)ᵀ · x' (wc × rows).
            s.gemm(blas::Gemm {
                ops: (blas::OP_T, blas::OP_N),
                mnk: (m_rows, rows, wc),
                ab_type: ty,
                a,
                lda: wc,
                b: s.upload.x16,
                ldb: wc,
                c,
                ldc: wr,
            });
        };
        if bf16 || m.kind == kind_of_type(WeightType::F16) {
            gemm(self, m.arg.data, wr, out);
            self.x16_holds = holds;
            return;
        }
        let chunk =
            ((W16_STAGING as usize / (2 * wc)) / 64 * 64).clamp(64, wr.next_multiple_of(64));
        let f = self.k.dequant[m.kind];
        let mut r0 = 0;
        while r0 < wr {
            let nr = chunk.min(wr - r0);
            let (mut arg, mut row0, mut w16) = (m.arg, r0 as i32, self.upload.w16);
            self.launch(f, (nr as u32, 1, 1), 128, &mut args![arg, row0, w16]);
            gemm(self, self.upload.w16, nr, out + 4 * r0 as u64);
            r0 += nr;
        }
        // The dequant launches write only the weight staging.
        self.x16_holds = holds;
    }

    pub(super) fn matmul(&mut self, w: MatrixId, x: Buf, rows: usize, out: Buf) {
        let m = self.matrices[w.0 as usize];
        let (wr, wc) = (m.arg.rows as usize, m.arg.cols as usize);
        let mut xp = self.buf(x, rows * wc * 4);
        let mut op = self.buf(out, rows * wr * 4);
        if rows == 0 || !self.ready() {
            return;
        }
        if m.kind == kind_of_type(WeightType::F32) {
            // Row-major out (rows × wr) = x (rows × wc) · Wᵀ is, column-major,
            // out' (wr × rows) = W' (wc × wr)ᵀ · x' (wc × rows).
            self.gemm(blas::Gemm {
                ops: (blas::OP_T, blas::OP_N),
                mnk: (wr, rows, wc),
                ab_type: blas::R_32F,
                a: m.arg.data,
                lda: wc,
                b: xp,
                ldb: wc,
                c: op,
                ldc: wr,
            });
            return;
        }
        let mut arg = m.arg;
        if rows == 1 {
            self.matvec_one(&[(m, op)], xp);
        } else if let Some(f) = self.mma_few_kernel(&m, rows) {
            self.matmul_mma(f, m, xp, rows, op);
        } else if rows <= MV_MAX_TOKENS && !self.k.mv[m.kind].is_null() {
            let mut n = rows as i32;
            let f = self.k.mv[m.kind];
            let split = Self::matvec_split(wr, wc / Self::matvec_chunk(m.kind, rows));
            let mut sp = split as i32;
            let grid = wr.div_ceil(MV_WARPS / split) as u32;
            self.launch(
                f,
                (grid, 1, 1),
                32 * MV_WARPS as u32,
                &mut args![arg, xp, op, n, sp],
            );
        } else if self.tiled_prefill
            || wc > self.upload.x16_cols
            || rows > self.upload.tokens
            || 64 * 2 * wc > W16_STAGING as usize
        {
            let f = self.k.mm[m.kind];
            // The tiled kernel covers up to 65,535 × 64 tokens a launch.
            let mut done = 0;
            while done < rows {
                let n = (rows - done).min(65_535 * 64);
                let mut xn = xp + (done * wc * 4) as u64;
                let mut on = op + (done * wr * 4) as u64;
                let mut nn = n as i32;
                let grid = (wr.div_ceil(64) as u32, n.div_ceil(64) as u32, 1);
                self.launch(f, grid, 256, &mut args![arg, xn, on, nn]);
                done += n;
            }
        } else {
            self.gemm_prefill(m, xp, rows, op);
        }
    }

    /// One launch for one token through matrices of one type and width
    /// (q, k and v, as `matvec_one` takes them); otherwise one matmul each.
    pub(super) fn matmul_many(&mut self, ws: &[MatrixId], x: Buf, rows: usize, outs: &[Buf]) {
        let first = self.matrices[ws[0].0 as usize];
        let fused = rows == 1
            && ws.len() <= MV_SEGMENTS
            && first.kind != kind_of_type(WeightType::F32)
            && ws.iter().all(|w| {
                let m = self.matrices[w.0 as usize];
                m.kind == first.kind && m.arg.cols == first.arg.cols
            });
        if !fused {
            for (&w, &out) in ws.iter().zip(outs) {
                self.matmul(w, x, rows, out);
            }
            return;
        }
        let xp = self.buf(x, first.arg.cols as usize * 4);
        let mut parts = [(first, 0u64); MV_SEGMENTS];
        for (i, (&w, &out)) in ws.iter().zip(outs).enumerate() {
            let m = self.matrices[w.0 as usize];
            parts[i] = (m, self.buf(out, m.arg.rows as usize * 4));
        }
        if self.ready() {
            self.matvec_one(&parts[..ws.len()], xp);
        }
    }

    pub(super) fn matmul_glu(
        &mut self,
        [gate, up]: [MatrixId; 2],
        x: Buf,
        rows: usize,
        act: Glu,
        [out, up_out]: [Buf; 2],
        width: usize,
    ) {
        let (g, u) = (self.matrices[gate.0 as usize], self.matrices[up.0 as usize]);
        let fused = rows <= MV_MAX_TOKENS
            && if rows == 1 {
                // Every kind but MXFP4 (gate and up apart) has them.
                !self.k.mvglu1[g.kind].is_null()
            } else {
                self.mma_few_kernel(&g, rows).is_none() && !self.k.mvglu[g.kind].is_null()
            }
            && g.kind == u.kind
            && g.kind != kind_of_type(WeightType::F32)
            && (g.arg.rows, g.arg.cols) == (u.arg.rows, u.arg.cols)
            && g.arg.rows as usize == width;
        if !fused {
            // Prefill (cuBLAS), a few rows on the tensor-core kernels, F32
            // weights, or a mixed-type pair (Q4_K_M keeps some up
            // projections in another type than their gates).
            self.matmul(gate, x, rows, out);
            self.matmul(up, x, rows, up_out);
            self.glu(out, up_out, rows, width, act);
            return;
        }
        let (wr, wc) = (g.arg.rows as usize, g.arg.cols as usize);
        let mut xp = self.buf(x, rows * wc * 4);
        let mut op = self.buf(out, rows * wr * 4);
        if rows == 0 || !self.ready() {
            return;
        }
        let x = xp;
        let x8 = if rows == 1 {
            self.x8_input(g.kind, wc, xp)
        } else {
            None
        };
        let f = if let Some(x8p) = x8 {
            xp = x8p;
            self.k.mvglu1x8[g.kind]
        } else if rows == 1 {
            self.k.mvglu1[g.kind]
        } else {
            self.k.mvglu[g.kind]
        };
        let split = Self::matvec_split(wr, wc / Self::matvec_chunk(g.kind, rows));
        let (mut ga, mut ua, mut n, mut sp) = (g.arg, u.arg, rows as i32, split as i32);
        let mut a = act_id(act);
        let grid = wr.div_ceil(MV_WARPS / split) as u32;
        self.launch(
            f,
            (grid, 1, 1),
            32 * MV_WARPS as u32,
            &mut args![ga, ua, xp, op, n, sp, a],
        );
        if x8.is_some() && op != x {
            self.x8_holds = Some((x, wc));
        }
    }
}
