//! Tiles for the k-quants against `Q8_K` activations.
//!
//! Within a 256-value super-block every sub-block scale is a small integer,
//! so the whole super-block's dot is one exact integer sum: `vpmaddubsw`
//! multiplies unsigned weight quants by activation quants into i16 pairs,
//! and `vpmaddwd` (AVX2) or `vpdpwssds` (VNNI) weights those by the
//! sub-block scale into i32.
//! Floats enter once per super-block: `d d_x` times that sum, minus
//! `dmin d_x` times the mins dotted with the activations' 16-value sums
//! (or, for Q3_K and Q6_K, with their offsets folded into the integer
//! sum the same way).

// Tiles index several arrays by the same row, token or block index;
// iterator chains would hide that the indices line up.
#![allow(clippy::needless_range_loop)]

use super::batch::{
    dwords, f16_halves, group_rows, transpose8, AccumulatorStore, Accumulators, Pass, GROUP,
    PASS_GROUPS,
};
use super::{f16x2, prefetch_distance, prefetch_l2, Dot};
use crate::matmul::{Job, Tile, TOKEN_BLOCK};
use crate::quant::Q8K_BYTES;
use std::arch::x86_64::*;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ops::Range;

/// Q4_K and Q5_K (`FIVE`): the same scales, mins and nibble order, Q5_K
/// adding a fifth bit per value from `qh`.
pub(crate) struct K45<D, const FIVE: bool>(PhantomData<D>);

/// The 8 six-bit scales and 8 mins of a Q4_K/Q5_K block's 12 scale bytes,
/// one per byte, as in `quant::k4_scales`.
#[inline(always)]
unsafe fn k4_scales(s: *const u8) -> (u64, u64) {
    let w0 = (s as *const u32).read_unaligned() as u64;
    let w1 = (s.add(4) as *const u32).read_unaligned() as u64;
    let w2 = (s.add(8) as *const u32).read_unaligned() as u64;
    let sc = (w0 & 0x3f3f_3f3f) | (((w2 & 0x0f0f_0f0f) | ((w0 >> 2) & 0x3030_3030)) << 32);
    let m = (w1 & 0x3f3f_3f3f) | ((((w2 >> 4) & 0x0f0f_0f0f) | ((w1 >> 2) & 0x3030_3030)) << 32);
    (sc, m)
}

/// Activation scale and 16-value sums of `T` tokens' super-block `b`.
#[inline(always)]
unsafe fn act_header<const T: usize>(
    a: *const u8,
    a_stride: usize,
    b: usize,
) -> ([f32; T], [__m256i; T]) {
    let mut dx = [0.0f32; T];
    let mut bsums = [_mm256_setzero_si256(); T];
    for t in 0..T {
        let p = a.add(t * a_stride + b * Q8K_BYTES);
        dx[t] = (p as *const f32).read_unaligned();
        bsums[t] = _mm256_loadu_si256(p.add(260) as *const __m256i);
    }
    (dx, bsums)
}

/// Activation quants `at..at + 32` of `T` tokens' super-block `b`.
#[inline(always)]
unsafe fn act_quants<const T: usize>(
    a: *const u8,
    a_stride: usize,
    b: usize,
    at: usize,
) -> [__m256i; T] {
    let mut x = [_mm256_setzero_si256(); T];
    for (t, v) in x.iter_mut().enumerate() {
        *v = _mm256_loadu_si256(a.add(t * a_stride + b * Q8K_BYTES + 4 + at) as *const __m256i);
    }
    x
}

/// `vpshufb` masks; mask i copies i16 lane i of each 128-bit lane to all
/// of that lane's i16s.
///
/// Tiles take these through `black_box`: seeing constants, LLVM turns each
/// shuffle into `vpshufd` + `vpbroadcastw`, twice the work of one
/// `vpshufb` with its mask read from the stack.
#[inline(always)]
unsafe fn splat16_masks() -> [__m256i; 8] {
    let mut m = [_mm256_setzero_si256(); 8];
    for (i, v) in m.iter_mut().enumerate() {
        *v = _mm256_set1_epi16((2 * i as i16) | ((2 * i as i16 + 1) << 8));
    }
    std::hint::black_box(m)
}

impl<D: Dot, const FIVE: bool> Tile for K45<D, FIVE> {
    #[inline(always)]
    unsafe fn tile<const R: usize, const T: usize>(
        w: *const u8,
        w_stride: usize,
        a: *const u8,
        a_stride: usize,
        cols: usize,
    ) -> [[f32; R]; T] {
        let bytes = if FIVE { 176 } else { 144 };
        let qs_at = if FIVE { 48 } else { 16 };
        let low4 = _mm256_set1_epi8(0x0f);
        debug_assert!(R <= 4);
        // Rows in lanes 0..R, as the batch pass keeps them.
        let mut acc = [_mm_setzero_ps(); T];
        let ahead = prefetch_distance(R, w_stride);
        let splat = splat16_masks();
        for b in 0..cols / 256 {
            let (dx, bsums) = act_header::<T>(a, a_stride, b);
            let mut scales = [_mm256_setzero_si256(); R];
            let mut d = [0.0f32; 4];
            let mut dmins = [0.0f32; 4];
            let mut imin = [[_mm256_setzero_si256(); R]; T];
            let mut isum = [[_mm256_setzero_si256(); T]; R];
            for r in 0..R {
                let p = w.add(r * w_stride + b * bytes);
                if T == 1 {
                    for line in (0..bytes).step_by(64) {
                        prefetch_l2(p.wrapping_add(ahead + line));
                    }
                }
                let (sc, m) = k4_scales(p.add(4));
                // The eight scales as i16, in both 128-bit lanes.
                scales[r] =
                    _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
                // Mins weight the sums of their sub-block's two 16-value
                // groups: [m0, m0, m1, m1, ...] as i16 against the sums.
                let m8 = _mm_cvtsi64_si128(m as i64);
                let mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
                (d[r], dmins[r]) = f16x2(p);
                for t in 0..T {
                    imin[t][r] = _mm256_madd_epi16(bsums[t], mins);
                }
            }
            for c in 0..4 {
                let xlo = act_quants::<T>(a, a_stride, b, 64 * c);
                let xhi = act_quants::<T>(a, a_stride, b, 64 * c + 32);
                for r in 0..R {
                    let p = w.add(r * w_stride + b * bytes);
                    let q = _mm256_loadu_si256(p.add(qs_at + 32 * c) as *const __m256i);
                    let mut lo = _mm256_and_si256(q, low4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
                    if FIVE {
                        let qh = _mm256_loadu_si256(p.add(16) as *const __m256i);
                        let one = _mm256_set1_epi8(1);
                        let hb_lo = _mm256_and_si256(
                            _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32)),
                            one,
                        );
                        let hb_hi = _mm256_and_si256(
                            _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32 + 1)),
                            one,
                        );
                        lo = _mm256_or_si256(lo, _mm256_slli_epi16(hb_lo, 4));
                        hi = _mm256_or_si256(hi, _mm256_slli_epi16(hb_hi, 4));
                    }
                    let s_lo = _mm256_shuffle_epi8(scales[r], splat[2 * c]);
                    let s_hi = _mm256_shuffle_epi8(scales[r], splat[2 * c + 1]);
                    for t in 0..T {
                        isum[r][t] =
                            D::madd_acc(isum[r][t], _mm256_maddubs_epi16(lo, xlo[t]), s_lo);
                        isum[r][t] =
                            D::madd_acc(isum[r][t], _mm256_maddubs_epi16(hi, xhi[t]), s_hi);
                    }
                }
            }
            // The batch pass's float operations in its order, so a row's
            // output does not depend on how many tokens share the matmul.
            let (d, dmins) = (_mm_loadu_ps(d.as_ptr()), _mm_loadu_ps(dmins.as_ptr()));
            for t in 0..T {
                let mut rows = [_mm256_setzero_si256(); R];
                for r in 0..R {
                    rows[r] = isum[r][t];
                }
                let mins = Some(row_sums(&imin[t]));
                let dxt = _mm_set1_ps(dx[t]);
                acc[t] = block_terms4(acc[t], row_sums(&rows), mins, d, dmins, dxt);
            }
        }
        tile_out(&acc)
    }
}

/// The sums of the eight i32 lanes of each of `v` (at most four), in
/// lanes 0..R.
#[inline(always)]
unsafe fn row_sums<const R: usize>(v: &[__m256i; R]) -> __m128i {
    let mut x = [_mm256_setzero_si256(); 4];
    x[..R].copy_from_slice(v);
    let h = _mm256_hadd_epi32(_mm256_hadd_epi32(x[0], x[1]), _mm256_hadd_epi32(x[2], x[3]));
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1))
}

/// A super-block's float terms for the rows of a tile (lanes 0..4), in the
/// order [`block_terms8`] does them for a decode-batch group, so a row's
/// output does not depend on how many tokens share the matmul: `acc + I d
/// dx`, less `M dmin dx` where the layout has mins (`I`, `M` the rows'
/// exact integer sums of quants times scales and of mins times activation
/// sums).
#[inline(always)]
unsafe fn block_terms4(
    acc: __m128,
    i: __m128i,
    mins: Option<__m128i>,
    d: __m128,
    dmin: __m128,
    dx: __m128,
) -> __m128 {
    let v = _mm_fmadd_ps(_mm_cvtepi32_ps(i), _mm_mul_ps(d, dx), acc);
    match mins {
        Some(m) => _mm_fnmadd_ps(_mm_cvtepi32_ps(m), _mm_mul_ps(dmin, dx), v),
        None => v,
    }
}

/// [`block_terms4`] for the eight rows of a decode-batch group.
#[inline(always)]
unsafe fn block_terms8(
    acc: __m256,
    i: __m256i,
    mins: Option<__m256i>,
    d: __m256,
    dmin: __m256,
    dx: __m256,
) -> __m256 {
    let v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(d, dx), acc);
    match mins {
        Some(m) => _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(dmin, dx), v),
        None => v,
    }
}

/// A tile's outputs `out[t][r]` from its accumulators (rows in lanes).
#[inline(always)]
unsafe fn tile_out<const R: usize, const T: usize>(acc: &[__m128; T]) -> [[f32; R]; T] {
    let mut out = [[0.0f32; R]; T];
    for t in 0..T {
        let mut lanes = [0.0f32; 4];
        _mm_storeu_ps(lanes.as_mut_ptr(), acc[t]);
        out[t].copy_from_slice(&lanes[..R]);
    }
    out
}

/// `(v >> shift) & mask` per 32-bit lane.
#[inline(always)]
unsafe fn bits(v: __m256i, shift: usize, mask: i32) -> __m256i {
    _mm256_and_si256(
        _mm256_srl_epi32(v, _mm_cvtsi32_si128(shift as i32)),
        _mm256_set1_epi32(mask),
    )
}

/// The decode-batch pass of Q4_K and Q5_K: per group and super-block the
/// eight rows' scales and mins as i32 lanes, unpacked from their 12 bytes
/// in every lane at once; per 64-value chunk the rows' 32 quant bytes
/// transposed (8 x 8 dwords) and split into the two sub-blocks' nibbles.
/// Each token's sub-block dots times their scales sum exactly as integers,
/// and the mins meet the token's 16-value sums through `madd`; floats
/// enter once per super-block, as in the tiles.
impl<D: Dot, const FIVE: bool> Pass for K45<D, FIVE> {
    #[inline(always)]
    unsafe fn pass(job: &Job, rows: Range<usize>, tokens: Range<usize>) {
        let bytes = if FIVE { 176 } else { 144 };
        let qs_at = if FIVE { 48 } else { 16 };
        let max_u = if FIVE { 31 } else { 15 };
        let nt = tokens.len();
        let groups = rows.len().div_ceil(GROUP);
        let a = job.a.add(tokens.start * job.a_stride);
        let low4 = _mm256_set1_epi8(0x0f);
        let next_pass = GROUP * PASS_GROUPS * job.w_stride;
        let mut store: AccumulatorStore = [[MaybeUninit::uninit(); TOKEN_BLOCK]; PASS_GROUPS];
        let mut acc = Accumulators::new(&mut store, groups, nt);
        let mut isum = [_mm256_setzero_si256(); TOKEN_BLOCK];
        for b in 0..job.cols / 256 {
            for g in 0..groups {
                let p = group_rows(job, &rows, g, b, bytes);
                for row in p {
                    for line in (0..bytes).step_by(64) {
                        prefetch_l2(row.wrapping_add(bytes + line));
                        if b == 0 {
                            prefetch_l2(row.wrapping_add(next_pass + line));
                        }
                    }
                }
                let (dw, dmin) = f16_halves(dwords(&p, 0));
                let (s0, s1, s2) = (dwords(&p, 4), dwords(&p, 8), dwords(&p, 12));
                // As `quant::k4_scales`, from byte j of each lane's words.
                let mut sc = [_mm256_setzero_si256(); 8];
                // Each min twice per lane, as i16, against a pair of sums.
                let mut mins = [_mm256_setzero_si256(); 8];
                for j in 0..4 {
                    let top = 8 * j + 6;
                    sc[j] = bits(s0, 8 * j, 63);
                    sc[j + 4] = _mm256_or_si256(
                        bits(s2, 8 * j, 15),
                        _mm256_slli_epi32(bits(s0, top, 3), 4),
                    );
                    let m = [
                        bits(s1, 8 * j, 63),
                        _mm256_or_si256(
                            bits(s2, 8 * j + 4, 15),
                            _mm256_slli_epi32(bits(s1, top, 3), 4),
                        ),
                    ];
                    for (h, m) in m.into_iter().enumerate() {
                        mins[j + 4 * h] = _mm256_or_si256(m, _mm256_slli_epi32(m, 16));
                    }
                }
                let qh = if FIVE {
                    let mut h = [_mm256_setzero_si256(); 8];
                    for i in 0..GROUP {
                        h[i] = _mm256_loadu_si256(p[i].add(16) as *const __m256i);
                    }
                    transpose8(h)
                } else {
                    [_mm256_setzero_si256(); 8]
                };
                for c in 0..4 {
                    let mut q = [_mm256_setzero_si256(); 8];
                    for i in 0..GROUP {
                        q[i] = _mm256_loadu_si256(p[i].add(qs_at + 32 * c) as *const __m256i);
                    }
                    // Register k: quant bytes 4k..4k+4 of row i in lane i;
                    // low nibbles sub-block 2c, high ones 2c + 1.
                    let q = transpose8(q);
                    for half in 0..2 {
                        let s = 2 * c + half;
                        let mut w = [_mm256_setzero_si256(); 8];
                        for k in 0..8 {
                            w[k] = if half == 0 {
                                _mm256_and_si256(q[k], low4)
                            } else {
                                _mm256_and_si256(_mm256_srli_epi16(q[k], 4), low4)
                            };
                            if FIVE {
                                let bit = _mm256_and_si256(
                                    _mm256_srl_epi16(qh[k], _mm_cvtsi32_si128(s as i32)),
                                    _mm256_set1_epi8(1),
                                );
                                w[k] = _mm256_or_si256(w[k], _mm256_slli_epi16(bit, 4));
                            }
                        }
                        for t in 0..nt {
                            let x =
                                a.add(t * job.a_stride + b * Q8K_BYTES + 4 + 32 * s) as *const i32;
                            let mut xs = [_mm256_setzero_si256(); 8];
                            for k in 0..8 {
                                xs[k] = _mm256_set1_epi32(x.add(k).read_unaligned());
                            }
                            let i = _mm256_mullo_epi32(D::dot_u8i8_8(&w, &xs, max_u), sc[s]);
                            isum[t] = if s == 0 {
                                i
                            } else {
                                _mm256_add_epi32(isum[t], i)
                            };
                        }
                    }
                }
                for t in 0..nt {
                    let x = a.add(t * job.a_stride + b * Q8K_BYTES);
                    let dx = _mm256_set1_ps((x as *const f32).read_unaligned());
                    let sums = x.add(260) as *const i32;
                    let mut imin = _mm256_setzero_si256();
                    for j in 0..8 {
                        let pair = _mm256_set1_epi32(sums.add(j).read_unaligned());
                        imin = D::madd_acc(imin, mins[j], pair);
                    }
                    let v = block_terms8(acc.get(g, t), isum[t], Some(imin), dw, dmin, dx);
                    acc.set(g, t, v);
                }
            }
        }
        acc.store(
            job,
            &rows,
            &tokens,
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        );
    }
}

/// `vpshufb` masks; mask j copies i16 lane 2j of the low 128-bit lane,
/// and lane 2j + 1 of the high one, to all i16s of their lane. Through
/// `black_box` as [`splat16_masks`].
#[inline(always)]
unsafe fn q6_split_masks() -> [__m256i; 4] {
    let lane = |k: usize| (2 * k as i16) | ((2 * k as i16 + 1) << 8);
    let mut m = [_mm256_setzero_si256(); 4];
    for (j, v) in m.iter_mut().enumerate() {
        *v = _mm256_setr_m128i(_mm_set1_epi16(lane(2 * j)), _mm_set1_epi16(lane(2 * j + 1)));
    }
    std::hint::black_box(m)
}

/// What a [`K16`] tile needs of a block whose scales cover 16 values
/// (Q2_K, Q3_K, Q6_K). Quants are unsigned; an offset or min brings them
/// back to the stored values.
pub(crate) trait Group16 {
    const BYTES: usize;
    /// Quants are stored plus this (Q3_K 4, Q6_K 32, Q2_K 0), as a shift.
    const OFFSET_SHIFT: Option<i32>;
    /// d, dmin (Q2_K only), the 16 scales and the 16 mins (Q2_K only) as
    /// i16.
    unsafe fn header(p: *const u8) -> (f32, f32, __m256i, __m256i);
    /// The 32 unsigned quants of values `128n + 32j..+32`.
    unsafe fn quants(p: *const u8, n: usize, j: usize) -> __m256i;
}

pub(crate) struct Q2K;
pub(crate) struct Q3K;
pub(crate) struct Q6K;

/// `v >> count` per 16-bit lane; `count` is a constant once tiles unroll.
#[inline(always)]
unsafe fn srl16(v: __m256i, count: usize) -> __m256i {
    _mm256_srl_epi16(v, _mm_cvtsi32_si128(count as i32))
}

impl Group16 for Q2K {
    const BYTES: usize = 84;
    const OFFSET_SHIFT: Option<i32> = None;
    #[inline(always)]
    unsafe fn header(p: *const u8) -> (f32, f32, __m256i, __m256i) {
        let (d, dmin) = f16x2(p.add(80));
        let v = _mm_loadu_si128(p as *const __m128i);
        let low4 = _mm_set1_epi8(0x0f);
        let sc = _mm256_cvtepu8_epi16(_mm_and_si128(v, low4));
        let m = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), low4));
        (d, dmin, sc, m)
    }
    #[inline(always)]
    unsafe fn quants(p: *const u8, n: usize, j: usize) -> __m256i {
        let q = _mm256_loadu_si256(p.add(16 + 32 * n) as *const __m256i);
        _mm256_and_si256(srl16(q, 2 * j), _mm256_set1_epi8(3))
    }
}

impl Group16 for Q3K {
    const BYTES: usize = 110;
    const OFFSET_SHIFT: Option<i32> = Some(2);
    #[inline(always)]
    unsafe fn header(p: *const u8) -> (f32, f32, __m256i, __m256i) {
        // Six-bit scales: low nibbles in bytes 0..8 (groups i and i + 8),
        // high pairs in bytes 8..12 (group i at bits 2(i / 4) of byte
        // 8 + i % 4), as `quant::q3k_scales`.
        let s = p.add(96);
        let a0 = (s as *const u32).read_unaligned();
        let a1 = (s.add(4) as *const u32).read_unaligned();
        let h = (s.add(8) as *const u32).read_unaligned();
        let (nib, two) = (0x0f0f_0f0fu32, 0x0303_0303u32);
        let g = |low: u32, shift: u32| low | (((h >> shift) & two) << 4);
        let lo = (g(a0 & nib, 0) as u64) | ((g(a1 & nib, 2) as u64) << 32);
        let hi = (g((a0 >> 4) & nib, 4) as u64) | ((g((a1 >> 4) & nib, 6) as u64) << 32);
        let sc = _mm256_cvtepu8_epi16(_mm_set_epi64x(hi as i64, lo as i64));
        let sc = _mm256_sub_epi16(sc, _mm256_set1_epi16(32));
        (f16x2(p.add(106)).1, 0.0, sc, _mm256_setzero_si256())
    }
    #[inline(always)]
    unsafe fn quants(p: *const u8, n: usize, j: usize) -> __m256i {
        // Two low bits, plus 4 where the hmask bit is set: the stored
        // value plus 4.
        let q = _mm256_loadu_si256(p.add(32 + 32 * n) as *const __m256i);
        let low = _mm256_and_si256(srl16(q, 2 * j), _mm256_set1_epi8(3));
        let hm = _mm256_loadu_si256(p as *const __m256i);
        let high = _mm256_and_si256(srl16(hm, 4 * n + j), _mm256_set1_epi8(1));
        _mm256_or_si256(low, _mm256_slli_epi16(high, 2))
    }
}

impl Group16 for Q6K {
    const BYTES: usize = 210;
    const OFFSET_SHIFT: Option<i32> = Some(5);
    #[inline(always)]
    unsafe fn header(p: *const u8) -> (f32, f32, __m256i, __m256i) {
        // d is the block's last two bytes.
        let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(192) as *const __m128i));
        (f16x2(p.add(206)).1, 0.0, sc, _mm256_setzero_si256())
    }
    #[inline(always)]
    unsafe fn quants(p: *const u8, n: usize, j: usize) -> __m256i {
        let ql = _mm256_loadu_si256(p.add(64 * n + 32 * (j % 2)) as *const __m256i);
        let qh = _mm256_loadu_si256(p.add(128 + 32 * n) as *const __m256i);
        let low = if j < 2 { ql } else { _mm256_srli_epi16(ql, 4) };
        let high = match j {
            0 => _mm256_slli_epi16(qh, 4),
            1 => _mm256_slli_epi16(qh, 2),
            2 => qh,
            _ => _mm256_srli_epi16(qh, 2),
        };
        _mm256_or_si256(
            _mm256_and_si256(low, _mm256_set1_epi8(0x0f)),
            _mm256_and_si256(high, _mm256_set1_epi8(0x30)),
        )
    }
}

/// The tile for a [`Group16`] layout: 32 values share two scales, so each
/// `vpmaddubsw` result is weighted by a vector holding one scale in its
/// low eight i16 lanes and the next in its high eight.
pub(crate) struct K16<G, D>(PhantomData<(G, D)>);

impl<G: Group16, D: Dot> Tile for K16<G, D> {
    #[inline(always)]
    unsafe fn tile<const R: usize, const T: usize>(
        w: *const u8,
        w_stride: usize,
        a: *const u8,
        a_stride: usize,
        cols: usize,
    ) -> [[f32; R]; T] {
        debug_assert!(R <= 4);
        // Rows in lanes 0..R, as the batch pass keeps them.
        let mut acc = [_mm_setzero_ps(); T];
        let ahead = prefetch_distance(R, w_stride);
        let split = q6_split_masks();
        for b in 0..cols / 256 {
            let (dx, bsums) = act_header::<T>(a, a_stride, b);
            let mut isum = [[_mm256_setzero_si256(); T]; R];
            let mut imin = [[_mm256_setzero_si256(); R]; T];
            let mut d = [0.0f32; 4];
            let mut dmins = [0.0f32; 4];
            // Per row, the 16 scales as i16: groups 0..8 in both 128-bit
            // lanes, then groups 8..16 in both.
            let mut halves = [[_mm256_setzero_si256(); 2]; R];
            for r in 0..R {
                let p = w.add(r * w_stride + b * G::BYTES);
                if T == 1 {
                    for line in (0..G::BYTES).step_by(64) {
                        prefetch_l2(p.wrapping_add(ahead + line));
                    }
                }
                let (dr, dmin, sc, mins) = G::header(p);
                (d[r], dmins[r]) = (dr, dmin);
                halves[r] = [
                    _mm256_permute2x128_si256(sc, sc, 0x00),
                    _mm256_permute2x128_si256(sc, sc, 0x11),
                ];
                for t in 0..T {
                    if let Some(shift) = G::OFFSET_SHIFT {
                        // The offset: sum over groups of scale x offset x
                        // (sum of the group's activation quants).
                        let off = _mm256_sll_epi32(
                            _mm256_madd_epi16(sc, bsums[t]),
                            _mm_cvtsi32_si128(shift),
                        );
                        isum[r][t] = _mm256_sub_epi32(isum[r][t], off);
                    } else {
                        imin[t][r] = _mm256_madd_epi16(bsums[t], mins);
                    }
                }
            }
            for n in 0..2 {
                for j in 0..4 {
                    let x = act_quants::<T>(a, a_stride, b, 128 * n + 32 * j);
                    for r in 0..R {
                        let q = G::quants(w.add(r * w_stride + b * G::BYTES), n, j);
                        // Groups 2j and 2j + 1 of half n over the low and
                        // high eight i16 lanes.
                        let s = _mm256_shuffle_epi8(halves[r][n], split[j]);
                        for t in 0..T {
                            isum[r][t] = D::madd_acc(isum[r][t], _mm256_maddubs_epi16(q, x[t]), s);
                        }
                    }
                }
            }
            // The batch pass's float operations in its order, so a row's
            // output does not depend on how many tokens share the matmul.
            let (d, dmins) = (_mm_loadu_ps(d.as_ptr()), _mm_loadu_ps(dmins.as_ptr()));
            for t in 0..T {
                let mut rows = [_mm256_setzero_si256(); R];
                for r in 0..R {
                    rows[r] = isum[r][t];
                }
                let mins = G::OFFSET_SHIFT.is_none().then(|| row_sums(&imin[t]));
                let dxt = _mm_set1_ps(dx[t]);
                acc[t] = block_terms4(acc[t], row_sums(&rows), mins, d, dmins, dxt);
            }
        }
        tile_out(&acc)
    }
}

/// The decode-batch pass of the [`Group16`] layouts (Q2_K, Q3_K, Q6_K):
/// per group and super-block the eight rows' 16 scales (and Q2_K's mins)
/// turned so register j holds the pair for values `32j..32j + 32` of every
/// row, then per 32-value run the rows' quants transposed (8 x 8 dwords)
/// once for all tokens. A token's run is two 16-value integer dots, each
/// times its scale; the offset (or the mins) meets the token's 16-value
/// sums through `madd`; floats enter once per super-block, as in the tile.
impl<G: Group16, D: Dot> Pass for K16<G, D> {
    #[inline(always)]
    unsafe fn pass(job: &Job, rows: Range<usize>, tokens: Range<usize>) {
        let nt = tokens.len();
        let groups = rows.len().div_ceil(GROUP);
        let a = job.a.add(tokens.start * job.a_stride);
        let next_pass = GROUP * PASS_GROUPS * job.w_stride;
        let mut store: AccumulatorStore = [[MaybeUninit::uninit(); TOKEN_BLOCK]; PASS_GROUPS];
        let mut acc = Accumulators::new(&mut store, groups, nt);
        let mut isum = [_mm256_setzero_si256(); TOKEN_BLOCK];
        // The low and the high i16 of each lane, sign-extended.
        let low16 = |v: __m256i| _mm256_srai_epi32(_mm256_slli_epi32(v, 16), 16);
        let high16 = |v: __m256i| _mm256_srai_epi32(v, 16);
        for b in 0..job.cols / 256 {
            for g in 0..groups {
                let p = group_rows(job, &rows, g, b, G::BYTES);
                let mut d = [0.0f32; GROUP];
                let mut dmin = [0.0f32; GROUP];
                let mut sc = [_mm256_setzero_si256(); GROUP];
                let mut mins = [_mm256_setzero_si256(); GROUP];
                for (i, row) in p.iter().enumerate() {
                    for line in (0..G::BYTES).step_by(64) {
                        prefetch_l2(row.wrapping_add(G::BYTES + line));
                        if b == 0 {
                            prefetch_l2(row.wrapping_add(next_pass + line));
                        }
                    }
                    (d[i], dmin[i], sc[i], mins[i]) = G::header(*row);
                }
                // Register j: scales (or mins) 2j and 2j + 1 of row i in
                // lane i, as two i16.
                let sc = transpose8(sc);
                let mins = if G::OFFSET_SHIFT.is_none() {
                    transpose8(mins)
                } else {
                    mins
                };
                for n in 0..2 {
                    for j in 0..4 {
                        let mut q = [_mm256_setzero_si256(); GROUP];
                        for i in 0..GROUP {
                            q[i] = G::quants(p[i], n, j);
                        }
                        // Register k: quants 4k..4k + 4 of the run, row i
                        // in lane i.
                        let q = transpose8(q);
                        let pair = sc[4 * n + j];
                        let (s_lo, s_hi) = (low16(pair), high16(pair));
                        for t in 0..nt {
                            let x = a.add(t * job.a_stride + b * Q8K_BYTES + 4 + 128 * n + 32 * j)
                                as *const i32;
                            let xs = |k: usize| _mm256_set1_epi32(x.add(k).read_unaligned());
                            let mut lo = D::dot_u8i8(q[0], xs(0));
                            let mut hi = D::dot_u8i8(q[4], xs(4));
                            for k in 1..4 {
                                lo = D::dot_u8i8_acc(lo, q[k], xs(k));
                                hi = D::dot_u8i8_acc(hi, q[k + 4], xs(k + 4));
                            }
                            let v = _mm256_add_epi32(
                                _mm256_mullo_epi32(lo, s_lo),
                                _mm256_mullo_epi32(hi, s_hi),
                            );
                            isum[t] = if n == 0 && j == 0 {
                                v
                            } else {
                                _mm256_add_epi32(isum[t], v)
                            };
                        }
                    }
                }
                let d = _mm256_loadu_ps(d.as_ptr());
                let dmin = _mm256_loadu_ps(dmin.as_ptr());
                for t in 0..nt {
                    let x = a.add(t * job.a_stride + b * Q8K_BYTES);
                    let dx = _mm256_set1_ps((x as *const f32).read_unaligned());
                    // The scales (or mins) against the token's 16-value
                    // sums, a pair of groups per register.
                    let sums = x.add(260) as *const i32;
                    let by = if G::OFFSET_SHIFT.is_some() {
                        &sc
                    } else {
                        &mins
                    };
                    let mut side = _mm256_setzero_si256();
                    for j in 0..8 {
                        let pair = _mm256_set1_epi32(sums.add(j).read_unaligned());
                        side = D::madd_acc(side, by[j], pair);
                    }
                    let (i, mins) = match G::OFFSET_SHIFT {
                        Some(shift) => (
                            _mm256_sub_epi32(
                                isum[t],
                                _mm256_sll_epi32(side, _mm_cvtsi32_si128(shift)),
                            ),
                            None,
                        ),
                        None => (isum[t], Some(side)),
                    };
                    let v = block_terms8(acc.get(g, t), i, mins, d, dmin, dx);
                    acc.set(g, t, v);
                }
            }
        }
        acc.store(
            job,
            &rows,
            &tokens,
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        );
    }
}
