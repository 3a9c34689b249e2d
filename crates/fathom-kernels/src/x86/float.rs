//! Tiles for float weights (F32, F16, BF16) against the caller's f32
//! activations: eight weights converted to f32 per load, one FMA per row
//! and token.

use super::{hsum, prefetch_distance, prefetch_l2};
use crate::matmul::Tile;
use crate::ops::{bf16_to_f32, f16_to_f32};
use std::arch::x86_64::*;
use std::marker::PhantomData;

/// A float storage type.
pub(crate) trait FloatLoad {
    const BYTES: usize;
    /// Eight values at `p` as f32.
    unsafe fn load8(p: *const u8) -> __m256;
    /// One value at `p`, for ragged tails.
    unsafe fn load1(p: *const u8) -> f32;
}

pub(crate) struct F32;
pub(crate) struct F16;
pub(crate) struct BF16;

impl FloatLoad for F32 {
    const BYTES: usize = 4;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_loadu_ps(p as *const f32)
    }
    #[inline(always)]
    unsafe fn load1(p: *const u8) -> f32 {
        (p as *const f32).read_unaligned()
    }
}

impl FloatLoad for F16 {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn load1(p: *const u8) -> f32 {
        f16_to_f32((p as *const u16).read_unaligned())
    }
}

impl FloatLoad for BF16 {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
        _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16))
    }
    #[inline(always)]
    unsafe fn load1(p: *const u8) -> f32 {
        bf16_to_f32((p as *const u16).read_unaligned())
    }
}

pub(crate) struct Float<L>(PhantomData<L>);

impl<L: FloatLoad> Tile for Float<L> {
    #[inline(always)]
    unsafe fn tile<const R: usize, const T: usize>(
        w: *const u8,
        w_stride: usize,
        a: *const u8,
        a_stride: usize,
        cols: usize,
    ) -> [[f32; R]; T] {
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        let x = |t: usize, k: usize| (a.add(t * a_stride) as *const f32).add(k);
        let ahead = prefetch_distance(R, w_stride);
        let mut k = 0;
        while k + 8 <= cols {
            if T == 1 && (k * L::BYTES) % 64 < 8 * L::BYTES {
                for r in 0..R {
                    prefetch_l2(w.wrapping_add(r * w_stride + k * L::BYTES + ahead));
                }
            }
            let mut xv = [_mm256_setzero_ps(); T];
            for (t, v) in xv.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(x(t, k));
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let wv = L::load8(w.add(r * w_stride + k * L::BYTES));
                for t in 0..T {
                    row[t] = _mm256_fmadd_ps(wv, xv[t], row[t]);
                }
            }
            k += 8;
        }
        let mut out = [[0.0f32; R]; T];
        for (r, row) in acc.iter().enumerate() {
            for (t, v) in row.iter().enumerate() {
                let mut s = hsum(*v);
                for j in k..cols {
                    s += L::load1(w.add(r * w_stride + j * L::BYTES)) * *x(t, j);
                }
                out[t][r] = s;
            }
        }
        out
    }
}
