//! Tiles for the 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)
//! against `Q8S` activations.
//!
//! A block's contribution is `d_w d_x I + c_w d_x S`, where `I` is the
//! integer dot of the weight quants (unsigned, except Q8_0's) with the
//! activation quants, `S` the activations' quant sum, and `c_w` the weight
//! offset as a float: -8 d (Q4_0), -16 d (Q5_0) or the min m (Q4_1, Q5_1).
//!
//! Rows go in pairs: one register holds the first 16 quants of a block of
//! two rows, another the last 16, each dotted with the matching activation
//! half repeated in both 128-bit lanes. The result's low four lanes belong
//! to the first row and the high four to the second, so one conversion and
//! one FMA per block serve two rows; the scale vector is built once per
//! block for all rows from one eight-wide f16 conversion.

// Tiles index several arrays by the same row, token or block index;
// iterator chains would hide that the indices line up.
#![allow(clippy::needless_range_loop)]

use super::{prefetch_distance, prefetch_l2, Dot};
use crate::matmul::Tile;
use crate::quant::Q8S_BYTES;
use std::arch::x86_64::*;
use std::marker::PhantomData;

/// How a block offsets its quants.
pub(crate) enum Offset {
    /// Q8_0: none; quants are signed.
    None,
    /// `c = k d` (Q4_0: -8, Q5_0: -16).
    Scaled(f32),
    /// `c = m`, the block's second f16 (Q4_1, Q5_1).
    Min,
}

/// A 32-value weight block layout.
pub(crate) trait Block32 {
    const BYTES: usize;
    const OFFSET: Offset;
    /// The four bytes at the start of the block: the f16 scale, then the
    /// f16 min (Q4_1, Q5_1) or bytes of no interest.
    #[inline(always)]
    unsafe fn scale_bits(p: *const u8) -> i32 {
        (p as *const i32).read_unaligned()
    }
    /// Quants 0..16 of the blocks at `p0` and `p1`, then quants 16..32, as
    /// `[p0 | p1]` registers.
    unsafe fn pair<D: Dot>(p0: *const u8, p1: *const u8) -> (__m256i, __m256i);
}

/// The 16 nibble bytes at `p0` and `p1` as low nibbles `[p0 | p1]` and
/// high nibbles `[p0 | p1]`.
#[inline(always)]
unsafe fn nibble_pair(p0: *const u8, p1: *const u8) -> (__m256i, __m256i) {
    let v = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(p0 as *const __m128i)),
        _mm_loadu_si128(p1 as *const __m128i),
        1,
    );
    let low4 = _mm256_set1_epi8(0x0f);
    (
        _mm256_and_si256(v, low4),
        _mm256_and_si256(_mm256_srli_epi16(v, 4), low4),
    )
}

/// Adds the fifth bits of two Q5 blocks, bit j of the u32 at `qh` going to
/// quant j, to a [`nibble_pair`].
#[inline(always)]
unsafe fn fifth_bit_pair<D: Dot>(
    q: (__m256i, __m256i),
    qh0: *const u8,
    qh1: *const u8,
) -> (__m256i, __m256i) {
    let h0 = (qh0 as *const u32).read_unaligned();
    let h1 = (qh1 as *const u32).read_unaligned();
    let first = (h0 & 0xffff) | (h1 << 16);
    let last = (h0 >> 16) | (h1 & 0xffff_0000);
    let bit = _mm256_set1_epi8(0x10);
    (
        _mm256_or_si256(q.0, _mm256_and_si256(D::bit_mask(first), bit)),
        _mm256_or_si256(q.1, _mm256_and_si256(D::bit_mask(last), bit)),
    )
}

pub(crate) struct Q4_0;
pub(crate) struct Q4_1;
pub(crate) struct Q5_0;
pub(crate) struct Q5_1;
pub(crate) struct Q8_0;

impl Block32 for Q4_0 {
    const BYTES: usize = 18;
    const OFFSET: Offset = Offset::Scaled(-8.0);
    #[inline(always)]
    unsafe fn pair<D: Dot>(p0: *const u8, p1: *const u8) -> (__m256i, __m256i) {
        nibble_pair(p0.add(2), p1.add(2))
    }
}

impl Block32 for Q4_1 {
    const BYTES: usize = 20;
    const OFFSET: Offset = Offset::Min;
    #[inline(always)]
    unsafe fn pair<D: Dot>(p0: *const u8, p1: *const u8) -> (__m256i, __m256i) {
        nibble_pair(p0.add(4), p1.add(4))
    }
}

impl Block32 for Q5_0 {
    const BYTES: usize = 22;
    const OFFSET: Offset = Offset::Scaled(-16.0);
    #[inline(always)]
    unsafe fn pair<D: Dot>(p0: *const u8, p1: *const u8) -> (__m256i, __m256i) {
        fifth_bit_pair::<D>(nibble_pair(p0.add(6), p1.add(6)), p0.add(2), p1.add(2))
    }
}

impl Block32 for Q5_1 {
    const BYTES: usize = 24;
    const OFFSET: Offset = Offset::Min;
    #[inline(always)]
    unsafe fn pair<D: Dot>(p0: *const u8, p1: *const u8) -> (__m256i, __m256i) {
        fifth_bit_pair::<D>(nibble_pair(p0.add(8), p1.add(8)), p0.add(4), p1.add(4))
    }
}

impl Block32 for Q8_0 {
    const BYTES: usize = 34;
    const OFFSET: Offset = Offset::None;
    #[inline(always)]
    unsafe fn pair<D: Dot>(p0: *const u8, p1: *const u8) -> (__m256i, __m256i) {
        let a = _mm256_loadu_si256(p0.add(2) as *const __m256i);
        let b = _mm256_loadu_si256(p1.add(2) as *const __m256i);
        (
            _mm256_permute2x128_si256(a, b, 0x20),
            _mm256_permute2x128_si256(a, b, 0x31),
        )
    }
}

/// `v` with its 32-bit lane `i` (0..4) set to `x`.
#[inline(always)]
unsafe fn insert_u32(v: __m128i, x: i32, i: usize) -> __m128i {
    match i {
        0 => _mm_insert_epi32(v, x, 0),
        1 => _mm_insert_epi32(v, x, 1),
        2 => _mm_insert_epi32(v, x, 2),
        _ => _mm_insert_epi32(v, x, 3),
    }
}

/// The tile for block layout `B` with integer dot `D`.
pub(crate) struct Q32<B, D>(PhantomData<(B, D)>);

impl<B: Block32, D: Dot> Tile for Q32<B, D> {
    /// Rows pair up (an odd last row pairs with itself and keeps only its
    /// half); `R <= 4`.
    #[inline(always)]
    unsafe fn tile<const R: usize, const T: usize>(
        w: *const u8,
        w_stride: usize,
        a: *const u8,
        a_stride: usize,
        cols: usize,
    ) -> [[f32; R]; T] {
        debug_assert!(R <= 4);
        let pairs = R.div_ceil(2);
        let signed = matches!(B::OFFSET, Offset::None);
        let mut acc = [[_mm256_setzero_ps(); T]; 2];
        // Offset terms, lane r for row r.
        let mut bias = [_mm_setzero_ps(); T];
        let ahead = prefetch_distance(R, w_stride);
        for b in 0..cols / 32 {
            let mut xlo = [_mm256_setzero_si256(); T];
            let mut xhi = [_mm256_setzero_si256(); T];
            let mut headers = _mm_setzero_si128();
            for t in 0..T {
                let p = a.add(t * a_stride + b * Q8S_BYTES);
                headers = insert_u32(headers, (p as *const i32).read_unaligned(), t);
                xlo[t] = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(4) as *const __m128i));
                xhi[t] = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(20) as *const __m128i));
            }
            // All tokens' scales and sums at once: d_x from the low f16 of
            // each header, s_x = d_x * (the high i16).
            let dx = _mm_cvtph_ps(_mm_shuffle_epi8(
                headers,
                _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1),
            ));
            let sx = _mm_mul_ps(dx, _mm_cvtepi32_ps(_mm_srai_epi32(headers, 16)));
            let dx = _mm256_castps128_ps256(dx);
            let row = |r: usize| w.add(r.min(R - 1) * w_stride + b * B::BYTES);
            if T == 1 {
                for r in 0..R {
                    prefetch_l2(row(r).wrapping_add(ahead));
                }
            }
            // [d0, m0, d1, m1, d2, m2, d3, m3] (m meaningful for Offset::Min).
            let mut bits = _mm_setzero_si128();
            for r in 0..R {
                bits = insert_u32(bits, B::scale_bits(row(r)), r);
            }
            let scales = _mm256_cvtph_ps(bits);
            for k in 0..pairs {
                let (lo, hi) = B::pair::<D>(row(2 * k), row(2 * k + 1));
                let (e, f) = (4 * k as i32, 4 * k as i32 + 2);
                let d = _mm256_permutevar8x32_ps(scales, _mm256_setr_epi32(e, e, e, e, f, f, f, f));
                let (ulo, uhi) = if signed {
                    (_mm256_sign_epi8(lo, lo), _mm256_sign_epi8(hi, hi))
                } else {
                    (lo, hi)
                };
                for t in 0..T {
                    let (slo, shi) = if signed {
                        (_mm256_sign_epi8(xlo[t], lo), _mm256_sign_epi8(xhi[t], hi))
                    } else {
                        (xlo[t], xhi[t])
                    };
                    let i = D::dot_u8i8_acc(D::dot_u8i8(ulo, slo), uhi, shi);
                    let s =
                        _mm256_mul_ps(d, _mm256_permutevar8x32_ps(dx, _mm256_set1_epi32(t as i32)));
                    acc[k][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), s, acc[k][t]);
                }
            }
            let c = match B::OFFSET {
                Offset::None => None,
                Offset::Scaled(k) => Some(_mm_mul_ps(
                    _mm256_castps256_ps128(_mm256_permutevar8x32_ps(
                        scales,
                        _mm256_setr_epi32(0, 2, 4, 6, 0, 0, 0, 0),
                    )),
                    _mm_set1_ps(k),
                )),
                Offset::Min => Some(_mm256_castps256_ps128(_mm256_permutevar8x32_ps(
                    scales,
                    _mm256_setr_epi32(1, 3, 5, 7, 0, 0, 0, 0),
                ))),
            };
            if let Some(c) = c {
                for t in 0..T {
                    bias[t] =
                        _mm_fmadd_ps(c, _mm_permutevar_ps(sx, _mm_set1_epi32(t as i32)), bias[t]);
                }
            }
        }
        let mut out = [[0.0f32; R]; T];
        for t in 0..T {
            // Lanes 0..4 of pair k sum to row 2k, lanes 4..8 to row 2k + 1.
            let h = _mm256_hadd_ps(acc[0][t], acc[1][t]);
            let h = _mm256_hadd_ps(h, h);
            let rows = _mm_unpacklo_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
            let mut lanes = [0.0f32; 4];
            _mm_storeu_ps(lanes.as_mut_ptr(), _mm_add_ps(rows, bias[t]));
            out[t].copy_from_slice(&lanes[..R]);
        }
        out
    }
}
