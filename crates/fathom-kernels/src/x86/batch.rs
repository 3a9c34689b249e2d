//! The k-quants' decode-batch frame, and the register helpers the 32-value
//! types' `q32::batch` shares: rows in groups of eight, one 32-bit lane
//! each, passes of a few groups, tokens in blocks of [`TOKEN_BLOCK`]. A
//! weight type's [`Pass`] unpacks a block of a group
//! once, turned so register k holds quant dword k of all eight rows, and
//! applies it to every token with the token's dword broadcast: each
//! integer result is then one lane per row, so the float work per token
//! is a few ops for eight rows.

use crate::matmul::{Job, TOKEN_BLOCK};
use std::arch::x86_64::*;
use std::mem::MaybeUninit;
use std::ops::Range;

/// Rows unpacked together: one 32-bit lane each.
pub(crate) const GROUP: usize = 8;

/// Groups per pass: a pass walks the blocks once and, per block, reads the
/// tokens' activation headers once for all its groups.
pub(crate) const PASS_GROUPS: usize = 4;

/// One pass of a decode-batch kernel: `rows` (at most
/// `GROUP * PASS_GROUPS`) against `tokens` (at most `TOKEN_BLOCK`).
pub(crate) trait Pass {
    /// # Safety
    /// As [`KernelFn`](crate::matmul::KernelFn), for these rows and tokens.
    unsafe fn pass(job: &Job, rows: Range<usize>, tokens: Range<usize>);
}

/// A decode-batch kernel: `P`'s passes over `rows` and every token.
///
/// # Safety
/// As [`KernelFn`](crate::matmul::KernelFn).
#[inline(always)]
pub(crate) unsafe fn batch<P: Pass>(job: &Job, rows: Range<usize>) {
    let mut t0 = 0;
    while t0 < job.n_tokens {
        let t1 = (t0 + TOKEN_BLOCK).min(job.n_tokens);
        let mut r = rows.start;
        while r < rows.end {
            let end = (r + GROUP * PASS_GROUPS).min(rows.end);
            P::pass(job, r..end, t0..t1);
            r = end;
        }
        t0 = t1;
    }
}

/// Block `b` (`bytes` long) of group `g`'s rows of a pass over `rows`; a
/// short last group repeats its last row (its lanes are not stored).
#[inline(always)]
pub(crate) unsafe fn group_rows(
    job: &Job,
    rows: &Range<usize>,
    g: usize,
    b: usize,
    bytes: usize,
) -> [*const u8; GROUP] {
    let mut p = [job.w; GROUP];
    for (i, p) in p.iter_mut().enumerate() {
        let r = (rows.start + g * GROUP + i).min(rows.end - 1);
        *p = job.w.add(r * job.w_stride + b * bytes);
    }
    p
}

/// 4 x 4 transpose of dwords within each 128-bit half: dword k of half h
/// of `q[p]` goes to dword p of half h of result k.
#[inline(always)]
pub(crate) unsafe fn transpose4(q: [__m256i; 4]) -> [__m256i; 4] {
    let a = _mm256_unpacklo_epi32(q[0], q[1]);
    let b = _mm256_unpackhi_epi32(q[0], q[1]);
    let c = _mm256_unpacklo_epi32(q[2], q[3]);
    let d = _mm256_unpackhi_epi32(q[2], q[3]);
    [
        _mm256_unpacklo_epi64(a, c),
        _mm256_unpackhi_epi64(a, c),
        _mm256_unpacklo_epi64(b, d),
        _mm256_unpackhi_epi64(b, d),
    ]
}

/// 8 x 8 transpose of dwords: dword k of `q[i]` goes to dword i of
/// result k.
#[inline(always)]
pub(crate) unsafe fn transpose8(q: [__m256i; 8]) -> [__m256i; 8] {
    let lo = transpose4([q[0], q[1], q[2], q[3]]);
    let hi = transpose4([q[4], q[5], q[6], q[7]]);
    let mut t = [_mm256_setzero_si256(); 8];
    for k in 0..4 {
        t[k] = _mm256_permute2x128_si256(lo[k], hi[k], 0x20);
        t[k + 4] = _mm256_permute2x128_si256(lo[k], hi[k], 0x31);
    }
    t
}

/// The u32 at byte `at` of each of the eight blocks, lane i from `p[i]`.
#[inline(always)]
pub(crate) unsafe fn dwords(p: &[*const u8; GROUP], at: usize) -> __m256i {
    let d = |i: usize| (p[i].add(at) as *const i32).read_unaligned();
    _mm256_setr_epi32(d(0), d(1), d(2), d(3), d(4), d(5), d(6), d(7))
}

/// The low and the high f16 of each u32 lane of `bits`, as f32 in the
/// same lane order.
#[inline(always)]
pub(crate) unsafe fn f16_halves(bits: __m256i) -> (__m256, __m256) {
    // Low halves to the low 128 bits, high ones to the high 128 bits.
    let h = _mm256_permute4x64_epi64(
        _mm256_shuffle_epi8(
            bits,
            _mm256_broadcastsi128_si256(_mm_setr_epi8(
                0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
            )),
        ),
        0b11_01_10_00,
    );
    (
        _mm256_cvtph_ps(_mm256_castsi256_si128(h)),
        _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)),
    )
}

/// Room for a pass's accumulators, declared by the pass (uninitialized,
/// so free) and lent to [`Accumulators`]: returning the 8 KiB by value
/// would copy them every pass.
pub(crate) type AccumulatorStore = [[MaybeUninit<__m256>; TOKEN_BLOCK]; PASS_GROUPS];

/// A pass's float accumulators, one eight-row vector per group and token.
pub(crate) struct Accumulators<'a> {
    /// Only the used ones are set: zeroing all 8 KiB cost a few per cent
    /// of a decode step.
    acc: &'a mut AccumulatorStore,
    groups: usize,
    nt: usize,
}

impl<'a> Accumulators<'a> {
    #[inline(always)]
    pub(crate) unsafe fn new(
        acc: &'a mut AccumulatorStore,
        groups: usize,
        nt: usize,
    ) -> Accumulators<'a> {
        for a in &mut acc[..groups] {
            for v in &mut a[..nt] {
                v.write(_mm256_setzero_ps());
            }
        }
        Accumulators { acc, groups, nt }
    }

    #[inline(always)]
    pub(crate) unsafe fn get(&self, g: usize, t: usize) -> __m256 {
        debug_assert!(g < self.groups && t < self.nt);
        self.acc[g][t].assume_init()
    }

    #[inline(always)]
    pub(crate) fn set(&mut self, g: usize, t: usize, v: __m256) {
        self.acc[g][t].write(v);
    }

    /// Writes the pass's outputs: lane `order[r]` of a group's vector is
    /// its row r.
    #[inline(always)]
    pub(crate) unsafe fn store(
        &self,
        job: &Job,
        rows: &Range<usize>,
        tokens: &Range<usize>,
        order: __m256i,
    ) {
        for g in 0..self.groups {
            let r0 = rows.start + g * GROUP;
            let n = (rows.end - r0).min(GROUP);
            for t in 0..self.nt {
                let v = _mm256_permutevar8x32_ps(self.get(g, t), order);
                store_lanes(job.out.add((tokens.start + t) * job.out_stride + r0), n, v);
            }
        }
    }
}

/// Stores the first `n` lanes of `v` at `out` (a group's rows; a short
/// group's other lanes are not its rows).
#[inline(always)]
pub(crate) unsafe fn store_lanes(out: *mut f32, n: usize, v: __m256) {
    if n == GROUP {
        _mm256_storeu_ps(out, v);
    } else {
        let mut lanes = [0.0f32; GROUP];
        _mm256_storeu_ps(lanes.as_mut_ptr(), v);
        std::ptr::copy_nonoverlapping(lanes.as_ptr(), out, n);
    }
}
