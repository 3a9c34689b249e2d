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
//!
//! One token takes [`decode`] (all but Q8_0 on AVX2, which keeps the
//! 4 x 1 tile): eight rows a group, their dots reduced to one lane per row
//! as in [`batch`].
//!
//! Several tokens take [`batch`] (one weight stream): a block of eight
//! rows unpacked once and applied to every token; each integer result is
//! one lane per row, so the float work per token is one conversion and two
//! FMAs for eight rows rather than per row pair.

// Tiles index several arrays by the same row, token or block index;
// iterator chains would hide that the indices line up.
#![allow(clippy::needless_range_loop)]

use super::batch::{dwords, f16_halves, store_lanes, transpose4, GROUP};
use super::{prefetch_distance, prefetch_l2, Dot};
use crate::matmul::{Job, Tile, TOKEN_BLOCK};
use crate::quant::Q8S_BYTES;
use std::arch::x86_64::*;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ops::Range;

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
    /// The scale is an e8m0 byte at the block's start (MXFP4), not an f16.
    const E8M0: bool = false;
    /// The largest unsigned operand the batch pass multiplies: the quant
    /// itself, or for Q8_0 on AVX2 its magnitude (up to 128).
    const MAX_U: i32;
    /// Quants 0..16 of the blocks at `p0` and `p1`, then quants 16..32, as
    /// `[p0 | p1]` registers.
    unsafe fn pair<D: Dot>(p0: *const u8, p1: *const u8) -> (__m256i, __m256i);
    /// [`Block32::pair`] in two steps, the loads and then the unpacking,
    /// so a tile can load a block ahead in few registers.
    #[inline(always)]
    unsafe fn load_pair<D: Dot>(p0: *const u8, p1: *const u8) -> (__m256i, __m256i) {
        Self::pair::<D>(p0, p1)
    }
    #[inline(always)]
    unsafe fn unpack_pair(loaded: (__m256i, __m256i)) -> (__m256i, __m256i) {
        loaded
    }
}

/// The 16 nibble bytes at `p0` and `p1` as low nibbles `[p0 | p1]` and
/// high nibbles `[p0 | p1]`.
#[inline(always)]
unsafe fn nibble_pair(p0: *const u8, p1: *const u8) -> (__m256i, __m256i) {
    split_nibbles(load_nibbles(p0, p1))
}

/// The 16 bytes at `p0` and `p1` as `[p0 | p1]`.
#[inline(always)]
unsafe fn load_nibbles(p0: *const u8, p1: *const u8) -> __m256i {
    _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(p0 as *const __m128i)),
        _mm_loadu_si128(p1 as *const __m128i),
        1,
    )
}

/// Low and high nibbles of `v`.
#[inline(always)]
unsafe fn split_nibbles(v: __m256i) -> (__m256i, __m256i) {
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
pub(crate) struct Mxfp4;
pub(crate) struct Q4_1;
pub(crate) struct Q5_0;
pub(crate) struct Q5_1;
pub(crate) struct Q8_0;

impl Block32 for Q4_0 {
    const BYTES: usize = 18;
    const OFFSET: Offset = Offset::Scaled(-8.0);
    const MAX_U: i32 = 15;
    #[inline(always)]
    unsafe fn pair<D: Dot>(p0: *const u8, p1: *const u8) -> (__m256i, __m256i) {
        nibble_pair(p0.add(2), p1.add(2))
    }
    #[inline(always)]
    unsafe fn load_pair<D: Dot>(p0: *const u8, p1: *const u8) -> (__m256i, __m256i) {
        (load_nibbles(p0.add(2), p1.add(2)), _mm256_setzero_si256())
    }
    #[inline(always)]
    unsafe fn unpack_pair(loaded: (__m256i, __m256i)) -> (__m256i, __m256i) {
        split_nibbles(loaded.0)
    }
}

/// The 16 signed values of MXFP4's nibbles in both lanes, for
/// `vpshufb`.
#[inline(always)]
unsafe fn mxfp4_table() -> __m256i {
    let v = fathom_ggml::blocks::MXFP4_VALUES;
    _mm256_broadcastsi128_si256(_mm_loadu_si128(v.as_ptr() as *const __m128i))
}

/// MXFP4 is Q4_0's nibble layout after a one-byte scale, each nibble
/// looked up as a signed value (|q| <= 12), so it meets the activations
/// as Q8_0's signed quants do.
impl Block32 for Mxfp4 {
    const BYTES: usize = 17;
    const OFFSET: Offset = Offset::None;
    const E8M0: bool = true;
    const MAX_U: i32 = 12;
    #[inline(always)]
    unsafe fn pair<D: Dot>(p0: *const u8, p1: *const u8) -> (__m256i, __m256i) {
        Self::unpack_pair(Self::load_pair::<D>(p0, p1))
    }
    #[inline(always)]
    unsafe fn load_pair<D: Dot>(p0: *const u8, p1: *const u8) -> (__m256i, __m256i) {
        (load_nibbles(p0.add(1), p1.add(1)), _mm256_setzero_si256())
    }
    #[inline(always)]
    unsafe fn unpack_pair(loaded: (__m256i, __m256i)) -> (__m256i, __m256i) {
        let (lo, hi) = split_nibbles(loaded.0);
        let t = mxfp4_table();
        (_mm256_shuffle_epi8(t, lo), _mm256_shuffle_epi8(t, hi))
    }
}

impl Block32 for Q4_1 {
    const BYTES: usize = 20;
    const OFFSET: Offset = Offset::Min;
    const MAX_U: i32 = 15;
    #[inline(always)]
    unsafe fn pair<D: Dot>(p0: *const u8, p1: *const u8) -> (__m256i, __m256i) {
        nibble_pair(p0.add(4), p1.add(4))
    }
    #[inline(always)]
    unsafe fn load_pair<D: Dot>(p0: *const u8, p1: *const u8) -> (__m256i, __m256i) {
        (load_nibbles(p0.add(4), p1.add(4)), _mm256_setzero_si256())
    }
    #[inline(always)]
    unsafe fn unpack_pair(loaded: (__m256i, __m256i)) -> (__m256i, __m256i) {
        split_nibbles(loaded.0)
    }
}

impl Block32 for Q5_0 {
    const BYTES: usize = 22;
    const OFFSET: Offset = Offset::Scaled(-16.0);
    const MAX_U: i32 = 31;
    #[inline(always)]
    unsafe fn pair<D: Dot>(p0: *const u8, p1: *const u8) -> (__m256i, __m256i) {
        fifth_bit_pair::<D>(nibble_pair(p0.add(6), p1.add(6)), p0.add(2), p1.add(2))
    }
}

impl Block32 for Q5_1 {
    const BYTES: usize = 24;
    const OFFSET: Offset = Offset::Min;
    const MAX_U: i32 = 31;
    #[inline(always)]
    unsafe fn pair<D: Dot>(p0: *const u8, p1: *const u8) -> (__m256i, __m256i) {
        fifth_bit_pair::<D>(nibble_pair(p0.add(8), p1.add(8)), p0.add(4), p1.add(4))
    }
}

impl Block32 for Q8_0 {
    const BYTES: usize = 34;
    const OFFSET: Offset = Offset::None;
    const MAX_U: i32 = 128;
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

/// The tile for block layout `B` with integer dot `D`.
pub(crate) struct Q32<B, D>(PhantomData<(B, D)>);

/// How `B`'s quants meet the activations under `D`: Q8_0's signed quants
/// go to VNNI offset by 128 as unsigned bytes (an offset of -128 d, like
/// Q4_0's -8 d); AVX2's `vpmaddubsw` would saturate on those, so there the
/// signs move to the activations and there is no offset term.
#[derive(Clone, Copy)]
struct Signs {
    biased: bool,
    moved: bool,
}

impl Signs {
    #[inline(always)]
    fn of<B: Block32, D: Dot>() -> Signs {
        let signed = matches!(B::OFFSET, Offset::None);
        Signs {
            biased: signed && D::WIDE_U8,
            moved: signed && !D::WIDE_U8,
        }
    }

    /// The unsigned operand for quants `w`.
    #[inline(always)]
    unsafe fn unsigned(self, w: __m256i) -> __m256i {
        if self.biased {
            _mm256_xor_si256(w, _mm256_set1_epi8(-128))
        } else if self.moved {
            _mm256_sign_epi8(w, w)
        } else {
            w
        }
    }

    /// The signed operand for activations `x` against quants `w`.
    #[inline(always)]
    unsafe fn signed(self, x: __m256i, w: __m256i) -> __m256i {
        if self.moved {
            _mm256_sign_epi8(x, w)
        } else {
            x
        }
    }
}

/// The scales `d` and offsets `c` (see [`Offset`]) of the blocks whose
/// first bytes are at `p`, lane i from `p[i]`.
#[inline(always)]
unsafe fn scales<B: Block32>(p: &[*const u8; GROUP]) -> (__m256, __m256) {
    scales_of::<B>(dwords(p, 0))
}

/// [`scales`] from the blocks' first dwords.
#[inline(always)]
unsafe fn scales_of<B: Block32>(bits: __m256i) -> (__m256, __m256) {
    let (d, m) = if B::E8M0 {
        (e8m0_half(bits), _mm256_setzero_ps())
    } else {
        f16_halves(bits)
    };
    let c = match B::OFFSET {
        Offset::None => _mm256_mul_ps(d, _mm256_set1_ps(-128.0)),
        Offset::Scaled(k) => _mm256_mul_ps(d, _mm256_set1_ps(k)),
        Offset::Min => m,
    };
    (d, c)
}

/// 2^(e - 128) of the low byte e of each lane, as
/// [`fathom_ggml::blocks::e8m0_half`]: the exponent field e - 1, or for e
/// below 2 the subnormals 2^-128 and 2^-127.
#[inline(always)]
unsafe fn e8m0_half(bits: __m256i) -> __m256 {
    let e = _mm256_and_si256(bits, _mm256_set1_epi32(0xff));
    let normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    let tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
    let is_tiny = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    _mm256_castsi256_ps(_mm256_blendv_epi8(normal, tiny, is_tiny))
}

/// One block's term added to the row accumulators `acc`, the same float
/// operations in the same order in the tile and in the batch pass, so a
/// row's output does not depend on how many tokens share the matmul.
#[inline(always)]
unsafe fn add_block(
    acc: __m256,
    i: __m256i,
    d: __m256,
    c: __m256,
    dx: f32,
    sx: f32,
    offset: bool,
) -> __m256 {
    let v = _mm256_fmadd_ps(
        _mm256_cvtepi32_ps(i),
        _mm256_mul_ps(d, _mm256_set1_ps(dx)),
        acc,
    );
    if offset {
        _mm256_fmadd_ps(c, _mm256_set1_ps(sx), v)
    } else {
        v
    }
}

/// The activation scale d_x of the block at `p` and d_x times its sum.
#[inline(always)]
unsafe fn act_scales(p: *const u8) -> (f32, f32) {
    let h = (p as *const i32).read_unaligned();
    let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
    (d, d * (h >> 16) as f32)
}

impl<B: Block32, D: Dot> Tile for Q32<B, D> {
    /// Rows pair up (an odd last row pairs with itself and keeps only its
    /// half); `R <= 4`. A pair's integer dot leaves four partial sums per
    /// row, which two horizontal adds turn into one lane per row before
    /// the floats: `[r0, r2, r0, r2 | r1, r3, r1, r3]`.
    #[inline(always)]
    unsafe fn tile<const R: usize, const T: usize>(
        w: *const u8,
        w_stride: usize,
        a: *const u8,
        a_stride: usize,
        cols: usize,
    ) -> [[f32; R]; T] {
        debug_assert!(R <= 4);
        let signs = Signs::of::<B, D>();
        let mut acc = [_mm256_setzero_ps(); T];
        let ahead = prefetch_distance(R, w_stride);
        for b in 0..cols / 32 {
            let row = |r: usize| w.add(r.min(R - 1) * w_stride + b * B::BYTES);
            if T == 1 {
                for r in 0..R {
                    prefetch_l2(row(r).wrapping_add(ahead));
                }
            }
            let (d, c) = scales::<B>(&LANE_ROWS.map(|r| row(r % 4)));
            let mut q = [(_mm256_setzero_si256(), _mm256_setzero_si256()); 2];
            for k in 0..2 {
                q[k] = B::pair::<D>(row(2 * k), row(2 * k + 1));
            }
            for t in 0..T {
                let p = a.add(t * a_stride + b * Q8S_BYTES);
                let xlo = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(4) as *const __m128i));
                let xhi = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(20) as *const __m128i));
                let mut i = [_mm256_setzero_si256(); 2];
                for k in 0..2 {
                    let (lo, hi) = q[k];
                    i[k] = D::dot_u8i8_acc(
                        D::dot_u8i8(signs.unsigned(lo), signs.signed(xlo, lo)),
                        signs.unsigned(hi),
                        signs.signed(xhi, hi),
                    );
                }
                let h = _mm256_hadd_epi32(i[0], i[1]);
                let (dx, sx) = act_scales(p);
                acc[t] = add_block(acc[t], _mm256_hadd_epi32(h, h), d, c, dx, sx, !signs.moved);
            }
        }
        let mut out = [[0.0f32; R]; T];
        for t in 0..T {
            let mut lanes = [0.0f32; GROUP];
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc[t]);
            for r in 0..R {
                out[t][r] = lanes[[0, 4, 1, 5][r]];
            }
        }
        out
    }
}

/// The one-token kernel: rows in groups of eight, one lane each in
/// [`LANE_ROWS`] order as in [`batch`], so the float work per block (one
/// conversion, a product and two FMAs) serves eight rows rather than
/// four; each row pair's integer dot leaves four partial sums per row,
/// which [`Dot::dots8`] turns into one lane per row. The activation
/// scales are worked out once per run of blocks rather than per group,
/// and each block's weights are loaded one block ahead, so the dots do
/// not wait on them (from memory that was most of the time).
///
/// # Safety
/// As [`KernelFn`](crate::matmul::KernelFn).
#[inline(always)]
pub(crate) unsafe fn decode<B: Block32, D: Dot>(job: &Job, rows: Range<usize>) {
    let ahead = prefetch_distance(GROUP, job.w_stride);
    runs(job, rows, 1, |r0, n, tokens, blocks, act| {
        let t = tokens.start;
        if n == GROUP {
            decode_group::<B, D, true>(job, r0, n, t, blocks, act, ahead)
        } else {
            decode_group::<B, D, false>(job, r0, n, t, blocks, act, ahead)
        }
    });
}

/// [`decode`]'s rows `r0..r0 + n` against token `t` over `blocks`, whose
/// scales are at `act`; `FULL` as in [`row_offset`].
#[inline(always)]
unsafe fn decode_group<B: Block32, D: Dot, const FULL: bool>(
    job: &Job,
    r0: usize,
    n: usize,
    t: usize,
    blocks: &Range<usize>,
    act: *const [f32; 2],
    ahead: usize,
) {
    let signs = Signs::of::<B, D>();
    let w = job.w.add(r0 * job.w_stride);
    let off = |i: usize| row_offset::<FULL>(i, n, job.w_stride);
    let out = job.out.add(t * job.out_stride + r0);
    let mut acc = partial_sums(out, n, blocks.start);
    let a = job.a.add(t * job.a_stride);
    // Scales converted as their block is loaded, a block ahead.
    let load = |b: usize| {
        let (q, bits) = load_group::<B, D>(w, off, b);
        (q, scales_of::<B>(bits))
    };
    let mut next = load(blocks.start);
    for b in blocks.clone() {
        // One token's run is the whole row up to 131,072 values; past
        // that the sweep covers other parts of the rows ahead than their
        // runs read, which costs bandwidth, not results (testing for it
        // each block cost 2%).
        sweep::<B>(w.wrapping_add(ahead), true, b);
        let (q, (d, c)) = next;
        next = load((b + 1).min(blocks.end - 1));
        let [dx, sx] = *act.add(b - blocks.start);
        let x = a.add(b * Q8S_BYTES);
        let xlo = _mm256_broadcastsi128_si256(_mm_loadu_si128(x.add(4) as *const __m128i));
        let xhi = _mm256_broadcastsi128_si256(_mm_loadu_si128(x.add(20) as *const __m128i));
        let mut u = [_mm256_setzero_si256(); 8];
        let mut s = [_mm256_setzero_si256(); 8];
        for k in 0..4 {
            let (lo, hi) = B::unpack_pair(q[k]);
            (u[2 * k], s[2 * k]) = (signs.unsigned(lo), signs.signed(xlo, lo));
            (u[2 * k + 1], s[2 * k + 1]) = (signs.unsigned(hi), signs.signed(xhi, hi));
        }
        let i = D::dots8(&u, &s, B::MAX_U);
        acc = add_block(acc, i, d, c, dx, sx, !signs.moved);
    }
    store_rows(out, n, acc);
}

/// The row of each lane of [`batch`]'s registers: the 4 x 4 dword
/// transpose of row pairs leaves the pairs' first rows in the low half.
const LANE_ROWS: [usize; GROUP] = [0, 2, 4, 6, 1, 3, 5, 7];

/// Tokens a [`batch`] pass takes when a step has more than [`TOKEN_BLOCK`]
/// (prefill): each weight block is unpacked twice as often as with 64, but
/// the passes over long rows ran a third faster. Measured (fathom-kernels'
/// matmul bench with Llama 8B's shapes added, AMD EPYC Zen 4, AVX-512 VNNI,
/// Q4_0 at 512 tokens, one thread, old and new alternately): 14336x4096
/// 184-197 -> 243-275 GFLOP/s, 4096x14336 189-205 -> 268; 24 and 16 tokens
/// no better; SmolLM2's 1536x576 178-189 -> 198-203.
const PREFILL_TOKEN_BLOCK: usize = 32;

/// Activation scales [`runs`] keeps on the stack: `[d_x, d_x S]` for
/// each block of a run of blocks and each token of a token block (32 KiB:
/// 64 blocks, 2,048 values, at 64 tokens; 4,096 blocks for one token).
const RUN_SCALES: usize = 4096;

/// The frame of [`decode`] and [`batch`]: tokens in blocks of
/// `token_block`, each row walked a run of blocks at a time (the tokens'
/// activation scales for the run worked out once, block-major), rows in
/// groups of eight; `group(r0, n, tokens, blocks, act)` adds the run's
/// terms to rows `r0..r0 + n` (`n <= GROUP`).
///
/// A group's sums are parked in `out` between runs ([`partial_sums`],
/// [`store_rows`]): f32 stores and loads are exact, so a row's sum is the
/// same float operations in the same order as in one walk.
#[inline(always)]
unsafe fn runs(
    job: &Job,
    rows: Range<usize>,
    token_block: usize,
    mut group: impl FnMut(usize, usize, &Range<usize>, &Range<usize>, *const [f32; 2]),
) {
    let nb = job.cols / 32;
    let mut act = [MaybeUninit::<[f32; 2]>::uninit(); RUN_SCALES];
    let mut t0 = 0;
    while t0 < job.n_tokens {
        let tokens = t0..(t0 + token_block).min(job.n_tokens);
        let nt = tokens.len();
        let mut b0 = 0;
        while b0 < nb {
            let blocks = b0..(b0 + RUN_SCALES / nt).min(nb);
            for b in blocks.clone() {
                for t in 0..nt {
                    let p = job.a.add((t0 + t) * job.a_stride + b * Q8S_BYTES);
                    let (dx, sx) = act_scales(p);
                    act[(b - b0) * nt + t].write([dx, sx]);
                }
            }
            let mut r = rows.start;
            while r < rows.end {
                let n = (rows.end - r).min(GROUP);
                group(r, n, &tokens, &blocks, act.as_ptr() as *const [f32; 2]);
                r += GROUP;
            }
            b0 = blocks.end;
        }
        t0 = tokens.end;
    }
}

/// Byte offset of row `i` of a group of `n` rows from its first: a short
/// group (`n < GROUP`) repeats its last row, whose extra lanes are not
/// stored. `FULL` (`n == GROUP`) leaves the plain multiples of the stride,
/// which the one-token loop addresses with fewer registers.
#[inline(always)]
fn row_offset<const FULL: bool>(i: usize, n: usize, w_stride: usize) -> usize {
    if FULL {
        i * w_stride
    } else {
        i.min(n - 1) * w_stride
    }
}

/// A group's sums before block `first` of its rows, in [`LANE_ROWS`]
/// order: zero at the first block, else what [`store_rows`] left at `out`.
#[inline(always)]
unsafe fn partial_sums(out: *const f32, n: usize, first: usize) -> __m256 {
    if first == 0 {
        return _mm256_setzero_ps();
    }
    let mut lanes = [0.0f32; GROUP];
    std::ptr::copy_nonoverlapping(out, lanes.as_mut_ptr(), n);
    _mm256_permutevar8x32_ps(
        _mm256_loadu_ps(lanes.as_ptr()),
        _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7),
    )
}

/// Stores the first `n` rows of sums `acc` (in [`LANE_ROWS`] order) to
/// `out` in row order.
#[inline(always)]
unsafe fn store_rows(out: *mut f32, n: usize, acc: __m256) {
    let v = _mm256_permutevar8x32_ps(acc, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    store_lanes(out, n, v);
}

/// Prefetches into L2 the rows at `at`, a group's worth a few lines per
/// block `b`: enough to cover them by the group's last block. Only when
/// the run is the whole row (`whole`): the rows ahead are then one
/// contiguous span. Rows walked in several runs (over 2,048 values at 64
/// tokens) are compute-bound, and a run's part of eight rows is not one
/// span: a cursor over it cost decode a fifth of its speed.
#[inline(always)]
unsafe fn sweep<B: Block32>(at: *const u8, whole: bool, b: usize) {
    if whole {
        let lines = (GROUP * B::BYTES).div_ceil(64);
        for j in 0..lines {
            prefetch_l2(at.wrapping_add((b * lines + j) * 64));
        }
    }
}

/// The decode-batch kernel (several tokens, one weight stream): each
/// group of eight rows walks a run of blocks once per token block, each
/// block unpacked once, turned so register k holds quant dword k of the
/// eight rows, and applied to every token with the token's dword
/// broadcast, so the float work per token is one conversion and two FMAs
/// for eight rows. The next block's weights are loaded while a block's
/// tokens run, and the next group's rows are prefetched.
///
/// # Safety
/// As [`KernelFn`](crate::matmul::KernelFn).
#[inline(always)]
pub(crate) unsafe fn batch<B: Block32, D: Dot>(job: &Job, rows: Range<usize>) {
    if job.n_tokens > TOKEN_BLOCK {
        batch_of::<B, D, PREFILL_TOKEN_BLOCK>(job, rows)
    } else {
        batch_of::<B, D, TOKEN_BLOCK>(job, rows)
    }
}

/// [`batch`] in passes of `TB` tokens.
#[inline(always)]
unsafe fn batch_of<B: Block32, D: Dot, const TB: usize>(job: &Job, rows: Range<usize>) {
    runs(job, rows, TB, |r0, n, tokens, blocks, act| {
        let nt = tokens.len();
        let signs = Signs::of::<B, D>();
        let w = job.w.add(r0 * job.w_stride);
        let off = |i: usize| row_offset::<false>(i, n, job.w_stride);
        let out = |t: usize| job.out.add((tokens.start + t) * job.out_stride + r0);
        let mut store = [MaybeUninit::<__m256>::uninit(); TOKEN_BLOCK];
        for t in 0..nt {
            store[t].write(partial_sums(out(t), n, blocks.start));
        }
        let acc = store.as_mut_ptr() as *mut __m256;
        let whole = blocks.len() == job.cols / 32;
        let mut next = load_group::<B, D>(w, off, blocks.start);
        for b in blocks.clone() {
            sweep::<B>(w.wrapping_add(GROUP * job.w_stride), whole, b);
            let (q, bits) = next;
            next = load_group::<B, D>(w, off, (b + 1).min(blocks.end - 1));
            let mut lo = [_mm256_setzero_si256(); 4];
            let mut hi = [_mm256_setzero_si256(); 4];
            for p in 0..4 {
                (lo[p], hi[p]) = B::unpack_pair(q[p]);
            }
            // Register k: quants 4k..4k+4 of the rows in `LANE_ROWS` order.
            let (w03, w47) = (transpose4(lo), transpose4(hi));
            let wq = [
                w03[0], w03[1], w03[2], w03[3], w47[0], w47[1], w47[2], w47[3],
            ];
            let (d, c) = scales_of::<B>(bits);
            let mut u = wq;
            for k in 0..8 {
                u[k] = signs.unsigned(wq[k]);
            }
            let act = act.add((b - blocks.start) * nt);
            let a = job.a.add(tokens.start * job.a_stride + b * Q8S_BYTES + 4);
            for t in 0..nt {
                let x = a.add(t * job.a_stride) as *const i32;
                let mut s = [_mm256_setzero_si256(); 8];
                for k in 0..8 {
                    s[k] = signs.signed(_mm256_set1_epi32(x.add(k).read_unaligned()), wq[k]);
                }
                let i = D::dot_u8i8_8(&u, &s, B::MAX_U);
                let [dx, sx] = *act.add(t);
                *acc.add(t) = add_block(*acc.add(t), i, d, c, dx, sx, !signs.moved);
            }
        }
        for t in 0..nt {
            store_rows(out(t), n, *acc.add(t));
        }
    });
}

/// Block `b` of the rows at `w` plus `off(i)` (row i of the group): the row pairs' quants as
/// [`Block32::load_pair`] leaves them, and the blocks' first dwords (their
/// scales) in [`LANE_ROWS`] order.
#[inline(always)]
unsafe fn load_group<B: Block32, D: Dot>(
    w: *const u8,
    off: impl Fn(usize) -> usize,
    b: usize,
) -> ([(__m256i, __m256i); 4], __m256i) {
    let ptrs: [*const u8; GROUP] = std::array::from_fn(|i| w.add(off(i) + b * B::BYTES));
    let mut q = [(_mm256_setzero_si256(), _mm256_setzero_si256()); 4];
    for p in 0..4 {
        q[p] = B::load_pair::<D>(ptrs[2 * p], ptrs[2 * p + 1]);
    }
    (q, dwords(&LANE_ROWS.map(|r| ptrs[r]), 0))
}
