//! x86-64 SIMD kernels.
//!
//! Every function here is `unsafe` for two reasons its callers check: the
//! CPU must have the features the function's `target_feature` names (the
//! caller holds an [`Isa`](crate::isa::Isa) at that level, which only
//! detection creates), and raw pointers must cover the blocks the function
//! reads and writes, as each documents.
//!
//! Helpers are `#[inline(always)]` without features of their own so they
//! inherit the caller's: the same generic tile compiles once for AVX2 and
//! once for AVX-512 VNNI, picking its integer dot product through [`Dot`].

pub(crate) mod batch;
pub(crate) mod float;
pub(crate) mod kquant;
pub(crate) mod ops;
pub(crate) mod q32;

use crate::isa::Isa;
use crate::matmul::{drive, Job, KernelFn};
use crate::WeightType;
use std::arch::x86_64::*;
use std::ops::Range;

/// Defines kernel entry points: a generic kernel (`drive` over a tile
/// type with R x T tiles, or the decode-batch kernel over a block layout),
/// compiled for one feature set.
macro_rules! entries {
    ($features:literal: $($name:ident = $kernel:expr;)*) => {$(
        #[target_feature(enable = $features)]
        unsafe fn $name(job: &Job, rows: Range<usize>) {
            ($kernel)(job, rows)
        }
    )*};
}

// Tile shapes: with AVX-512's 32 vector registers a 4 x 4 tile's 16
// accumulators fit beside its operands; the k-quants also hold 4 x 2
// integer sums. AVX2 has 16 registers, so half the tokens. The 32-value
// block types take their 8-row `decode` kernel for single tokens (Q8_0 on
// AVX2 its 4 x 1 tile: a block ahead of its sign-moved pairs does not fit
// 16 registers): from two tokens on, their `batch` kernels are faster
// (`batch_kernel`).
entries! {"avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni":
    q4_0_vnni = q32::decode::<q32::Q4_0, Vnni>;
    q4_1_vnni = q32::decode::<q32::Q4_1, Vnni>;
    q5_0_vnni = q32::decode::<q32::Q5_0, Vnni>;
    q5_1_vnni = q32::decode::<q32::Q5_1, Vnni>;
    q8_0_vnni = q32::decode::<q32::Q8_0, Vnni>;
    mxfp4_vnni = q32::decode::<q32::Mxfp4, Vnni>;
    q4_k_vnni = drive::<kquant::K45<Vnni, false>, 4, 2>;
    q5_k_vnni = drive::<kquant::K45<Vnni, true>, 4, 2>;
    q2_k_vnni = drive::<kquant::K16<kquant::Q2K, Vnni>, 4, 2>;
    q3_k_vnni = drive::<kquant::K16<kquant::Q3K, Vnni>, 4, 2>;
    q6_k_vnni = drive::<kquant::K16<kquant::Q6K, Vnni>, 4, 2>;
    f32_vnni = drive::<float::Float<float::F32>, 4, 4>;
    f16_vnni = drive::<float::Float<float::F16>, 4, 4>;
    bf16_vnni = drive::<float::Float<float::BF16>, 4, 4>;
    q4_0_vnni_batch = q32::batch::<q32::Q4_0, Vnni>;
    q4_1_vnni_batch = q32::batch::<q32::Q4_1, Vnni>;
    q5_0_vnni_batch = q32::batch::<q32::Q5_0, Vnni>;
    q5_1_vnni_batch = q32::batch::<q32::Q5_1, Vnni>;
    q8_0_vnni_batch = q32::batch::<q32::Q8_0, Vnni>;
    mxfp4_vnni_batch = q32::batch::<q32::Mxfp4, Vnni>;
    q4_k_vnni_batch = batch::batch::<kquant::K45<Vnni, false>>;
    q5_k_vnni_batch = batch::batch::<kquant::K45<Vnni, true>>;
    q2_k_vnni_batch = batch::batch::<kquant::K16<kquant::Q2K, Vnni>>;
    q3_k_vnni_batch = batch::batch::<kquant::K16<kquant::Q3K, Vnni>>;
    q6_k_vnni_batch = batch::batch::<kquant::K16<kquant::Q6K, Vnni>>;
}

entries! {"avx2,fma,f16c":
    q4_0_avx2 = q32::decode::<q32::Q4_0, Avx2>;
    q4_1_avx2 = q32::decode::<q32::Q4_1, Avx2>;
    q5_0_avx2 = q32::decode::<q32::Q5_0, Avx2>;
    q5_1_avx2 = q32::decode::<q32::Q5_1, Avx2>;
    q8_0_avx2 = drive::<q32::Q32<q32::Q8_0, Avx2>, 4, 1>;
    mxfp4_avx2 = q32::decode::<q32::Mxfp4, Avx2>;
    q4_k_avx2 = drive::<kquant::K45<Avx2, false>, 2, 2>;
    q5_k_avx2 = drive::<kquant::K45<Avx2, true>, 2, 2>;
    q2_k_avx2 = drive::<kquant::K16<kquant::Q2K, Avx2>, 2, 2>;
    q3_k_avx2 = drive::<kquant::K16<kquant::Q3K, Avx2>, 2, 2>;
    q6_k_avx2 = drive::<kquant::K16<kquant::Q6K, Avx2>, 2, 2>;
    f32_avx2 = drive::<float::Float<float::F32>, 4, 2>;
    f16_avx2 = drive::<float::Float<float::F16>, 4, 2>;
    bf16_avx2 = drive::<float::Float<float::BF16>, 4, 2>;
    q4_0_avx2_batch = q32::batch::<q32::Q4_0, Avx2>;
    q4_1_avx2_batch = q32::batch::<q32::Q4_1, Avx2>;
    q5_0_avx2_batch = q32::batch::<q32::Q5_0, Avx2>;
    q5_1_avx2_batch = q32::batch::<q32::Q5_1, Avx2>;
    q8_0_avx2_batch = q32::batch::<q32::Q8_0, Avx2>;
    mxfp4_avx2_batch = q32::batch::<q32::Mxfp4, Avx2>;
    q4_k_avx2_batch = batch::batch::<kquant::K45<Avx2, false>>;
    q5_k_avx2_batch = batch::batch::<kquant::K45<Avx2, true>>;
    q2_k_avx2_batch = batch::batch::<kquant::K16<kquant::Q2K, Avx2>>;
    q3_k_avx2_batch = batch::batch::<kquant::K16<kquant::Q3K, Avx2>>;
    q6_k_avx2_batch = batch::batch::<kquant::K16<kquant::Q6K, Avx2>>;
}

/// The decode-batch kernel for `ty` at `isa` and `n_tokens`, where it
/// beats the tiles: the 32-value block types from two tokens, Q4_K and
/// Q5_K (whose scales cost more to unpack per group) from four, up to
/// prefill's 512 (matmul bench). One token streams the weights, which the
/// tiles prefetch for.
pub(crate) fn batch_kernel(isa: Isa, ty: WeightType, n_tokens: usize) -> Option<KernelFn> {
    use WeightType as W;
    let from = if ty.block_elems() == 256 { 4 } else { 2 };
    if n_tokens < from {
        return None;
    }
    let k: KernelFn = match (isa, ty) {
        (Isa::Avx512, W::Q4_0) => q4_0_vnni_batch,
        (Isa::Avx512, W::Q4_1) => q4_1_vnni_batch,
        (Isa::Avx512, W::Q5_0) => q5_0_vnni_batch,
        (Isa::Avx512, W::Q5_1) => q5_1_vnni_batch,
        (Isa::Avx512, W::Q8_0) => q8_0_vnni_batch,
        (Isa::Avx512, W::MXFP4) => mxfp4_vnni_batch,
        (Isa::Avx512, W::Q4_K) => q4_k_vnni_batch,
        (Isa::Avx512, W::Q5_K) => q5_k_vnni_batch,
        (Isa::Avx512, W::Q2_K) => q2_k_vnni_batch,
        (Isa::Avx512, W::Q3_K) => q3_k_vnni_batch,
        (Isa::Avx512, W::Q6_K) => q6_k_vnni_batch,
        (Isa::Avx2, W::Q4_0) => q4_0_avx2_batch,
        (Isa::Avx2, W::Q4_1) => q4_1_avx2_batch,
        (Isa::Avx2, W::Q5_0) => q5_0_avx2_batch,
        (Isa::Avx2, W::Q5_1) => q5_1_avx2_batch,
        (Isa::Avx2, W::Q8_0) => q8_0_avx2_batch,
        (Isa::Avx2, W::MXFP4) => mxfp4_avx2_batch,
        (Isa::Avx2, W::Q4_K) => q4_k_avx2_batch,
        (Isa::Avx2, W::Q5_K) => q5_k_avx2_batch,
        (Isa::Avx2, W::Q2_K) => q2_k_avx2_batch,
        (Isa::Avx2, W::Q3_K) => q3_k_avx2_batch,
        (Isa::Avx2, W::Q6_K) => q6_k_avx2_batch,
        _ => return None,
    };
    Some(k)
}

/// The SIMD kernel for `ty` at `isa`; none for the portable level.
pub(crate) fn kernel(isa: Isa, ty: WeightType) -> Option<KernelFn> {
    use WeightType as W;
    let k: KernelFn = match (isa, ty) {
        (Isa::Portable, _) => return None,
        (Isa::Avx512, W::Q4_0) => q4_0_vnni,
        (Isa::Avx512, W::Q4_1) => q4_1_vnni,
        (Isa::Avx512, W::Q5_0) => q5_0_vnni,
        (Isa::Avx512, W::Q5_1) => q5_1_vnni,
        (Isa::Avx512, W::Q8_0) => q8_0_vnni,
        (Isa::Avx512, W::MXFP4) => mxfp4_vnni,
        (Isa::Avx512, W::Q4_K) => q4_k_vnni,
        (Isa::Avx512, W::Q5_K) => q5_k_vnni,
        (Isa::Avx512, W::Q2_K) => q2_k_vnni,
        (Isa::Avx512, W::Q3_K) => q3_k_vnni,
        (Isa::Avx512, W::Q6_K) => q6_k_vnni,
        (Isa::Avx512, W::F32) => f32_vnni,
        (Isa::Avx512, W::F16) => f16_vnni,
        (Isa::Avx512, W::BF16) => bf16_vnni,
        (Isa::Avx2, W::Q4_0) => q4_0_avx2,
        (Isa::Avx2, W::Q4_1) => q4_1_avx2,
        (Isa::Avx2, W::Q5_0) => q5_0_avx2,
        (Isa::Avx2, W::Q5_1) => q5_1_avx2,
        (Isa::Avx2, W::Q8_0) => q8_0_avx2,
        (Isa::Avx2, W::MXFP4) => mxfp4_avx2,
        (Isa::Avx2, W::Q4_K) => q4_k_avx2,
        (Isa::Avx2, W::Q5_K) => q5_k_avx2,
        (Isa::Avx2, W::Q2_K) => q2_k_avx2,
        (Isa::Avx2, W::Q3_K) => q3_k_avx2,
        (Isa::Avx2, W::Q6_K) => q6_k_avx2,
        (Isa::Avx2, W::F32) => f32_avx2,
        (Isa::Avx2, W::F16) => f16_avx2,
        (Isa::Avx2, W::BF16) => bf16_avx2,
    };
    Some(k)
}

/// The integer multiply-accumulate the quantized tiles are built from.
pub(crate) trait Dot {
    /// Whether [`Dot::dot_u8i8`] takes unsigned bytes up to 255 times
    /// signed ones up to 127 without saturating.
    const WIDE_U8: bool;
    /// Per 32-bit lane, the sum of four products of unsigned bytes of `u`
    /// and signed bytes of `s`. The AVX2 form saturates pairs at i16, which
    /// callers avoid by keeping `u * s * 2 <= 32767`.
    unsafe fn dot_u8i8(u: __m256i, s: __m256i) -> __m256i;
    /// `acc` plus [`Dot::dot_u8i8`].
    unsafe fn dot_u8i8_acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
    /// Eight rows' dots from four row pairs: `u[2k]` and `u[2k + 1]` hold
    /// quants of rows 2k and 2k + 1 (`[2k | 2k + 1]`), unsigned and at
    /// most `max_u`, against `s[2k]` and `s[2k + 1]`. Lane j of the result
    /// is row `[0, 2, 4, 6, 1, 3, 5, 7][j]`'s sum, as the batch pass's.
    unsafe fn dots8(u: &[__m256i; 8], s: &[__m256i; 8], max_u: i32) -> __m256i;
    /// Per 32-bit lane, the sum of [`Dot::dot_u8i8`] over eight pairs,
    /// whose unsigned bytes are at most `max_u`.
    unsafe fn dot_u8i8_8(u: &[__m256i; 8], s: &[__m256i; 8], max_u: i32) -> __m256i;
    /// `acc` plus, per 32-bit lane, the sum of two i16 products.
    unsafe fn madd_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
    /// Byte i of the result is 0xff where bit i of `bits` is set.
    unsafe fn bit_mask(bits: u32) -> __m256i;
}

/// AVX2: `vpmaddubsw` + `vpmaddwd`.
pub(crate) struct Avx2;

/// AVX-512 VNNI on 256-bit registers: `vpdpbusd`, `vpdpwssd`.
pub(crate) struct Vnni;

impl Dot for Avx2 {
    const WIDE_U8: bool = false;

    #[inline(always)]
    unsafe fn dot_u8i8(u: __m256i, s: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }

    #[inline(always)]
    unsafe fn dot_u8i8_acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_add_epi32(acc, Self::dot_u8i8(u, s))
    }

    /// Where 16 products cannot pass i16 (quants up to 15), a pair's two
    /// `vpmaddubsw` results add as i16 and two of the three horizontal
    /// adds run on i16 too, leaving one `vpmaddwd` for all eight rows;
    /// otherwise each pair widens to i32 first.
    #[inline(always)]
    unsafe fn dots8(u: &[__m256i; 8], s: &[__m256i; 8], max_u: i32) -> __m256i {
        let ones = _mm256_set1_epi16(1);
        let mut m = [_mm256_setzero_si256(); 4];
        if 16 * 128 * max_u <= 32767 {
            // Each i16 lane sums 4, then 8, then 16 products.
            for k in 0..4 {
                m[k] = _mm256_add_epi16(
                    _mm256_maddubs_epi16(u[2 * k], s[2 * k]),
                    _mm256_maddubs_epi16(u[2 * k + 1], s[2 * k + 1]),
                );
            }
            let h = _mm256_hadd_epi16(_mm256_hadd_epi16(m[0], m[1]), _mm256_hadd_epi16(m[2], m[3]));
            return _mm256_madd_epi16(h, ones);
        }
        for k in 0..4 {
            m[k] = if 4 * 128 * max_u <= 32767 {
                _mm256_madd_epi16(
                    _mm256_add_epi16(
                        _mm256_maddubs_epi16(u[2 * k], s[2 * k]),
                        _mm256_maddubs_epi16(u[2 * k + 1], s[2 * k + 1]),
                    ),
                    ones,
                )
            } else {
                Self::dot_u8i8_acc(
                    Self::dot_u8i8(u[2 * k], s[2 * k]),
                    u[2 * k + 1],
                    s[2 * k + 1],
                )
            };
        }
        _mm256_hadd_epi32(_mm256_hadd_epi32(m[0], m[1]), _mm256_hadd_epi32(m[2], m[3]))
    }

    /// Adds `vpmaddubsw` results as i16 while they cannot saturate
    /// (each is at most 2 * 127 * `max_u`), widening once per run.
    #[inline(always)]
    unsafe fn dot_u8i8_8(u: &[__m256i; 8], s: &[__m256i; 8], max_u: i32) -> __m256i {
        let run = (32767 / (2 * 127 * max_u)).max(1) as usize;
        let mut acc = _mm256_setzero_si256();
        let mut k = 0;
        while k < 8 {
            let mut sum = _mm256_maddubs_epi16(u[k], s[k]);
            for j in k + 1..(k + run).min(8) {
                sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(u[j], s[j]));
            }
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(sum, _mm256_set1_epi16(1)));
            k += run;
        }
        acc
    }

    #[inline(always)]
    unsafe fn madd_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
    }

    #[inline(always)]
    unsafe fn bit_mask(bits: u32) -> __m256i {
        // Spread byte k of `bits` over bytes 8k..8k+8, then test one bit
        // per byte.
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(bits as i32),
            _mm256_setr_epi64x(
                0,
                0x0101_0101_0101_0101,
                0x0202_0202_0202_0202,
                0x0303_0303_0303_0303,
            ),
        );
        let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select)
    }
}

impl Dot for Vnni {
    const WIDE_U8: bool = true;

    #[inline(always)]
    unsafe fn dot_u8i8(u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
    }

    #[inline(always)]
    unsafe fn dot_u8i8_acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, s)
    }

    /// A pair's two halves accumulate in one `vpdpbusd` chain; three
    /// horizontal adds leave one lane per row.
    #[inline(always)]
    unsafe fn dots8(u: &[__m256i; 8], s: &[__m256i; 8], _max_u: i32) -> __m256i {
        let mut m = [_mm256_setzero_si256(); 4];
        for k in 0..4 {
            m[k] = _mm256_dpbusd_epi32(
                Self::dot_u8i8(u[2 * k], s[2 * k]),
                u[2 * k + 1],
                s[2 * k + 1],
            );
        }
        _mm256_hadd_epi32(_mm256_hadd_epi32(m[0], m[1]), _mm256_hadd_epi32(m[2], m[3]))
    }

    /// Two chains of four, so a token's sum waits on four `vpdpbusd`
    /// latencies rather than eight.
    #[inline(always)]
    unsafe fn dot_u8i8_8(u: &[__m256i; 8], s: &[__m256i; 8], _max_u: i32) -> __m256i {
        let mut acc = [_mm256_setzero_si256(); 2];
        for k in 0..8 {
            acc[k % 2] = _mm256_dpbusd_epi32(acc[k % 2], u[k], s[k]);
        }
        _mm256_add_epi32(acc[0], acc[1])
    }

    /// The saturating form: LLVM splits `vpdpwssd` back into `vpmaddwd` +
    /// `vpaddd` unless tuning for a CPU it knows has a fast one, and the
    /// sums here stay far from saturation.
    #[inline(always)]
    unsafe fn madd_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpwssds_epi32(acc, a, b)
    }

    #[inline(always)]
    unsafe fn bit_mask(bits: u32) -> __m256i {
        _mm256_movm_epi8(bits)
    }
}

/// How far ahead decode prefetches weights: the same block of the row so
/// many tiles on, about 16 KiB ahead (at least one tile, at most four).
///
/// Decode streams each matrix once. The hardware prefetcher follows a
/// tile's interleaved rows poorly; prefetching into L2 (not L1, whose
/// miss buffers it would tie up) about doubles what one core draws from
/// memory here.
#[inline(always)]
pub(crate) fn prefetch_distance(rows: usize, w_stride: usize) -> usize {
    (16384 / (rows * w_stride).max(1)).clamp(1, 4) * rows * w_stride
}

/// Prefetches the line at `p` into L2; `p` may be past the end of the
/// weights, which a prefetch tolerates.
#[inline(always)]
pub(crate) unsafe fn prefetch_l2(p: *const u8) {
    _mm_prefetch::<_MM_HINT_T1>(p as *const i8);
}

/// Sum of the eight lanes.
#[inline(always)]
pub(crate) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Sum of the eight i32 lanes.
#[inline(always)]
pub(crate) unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01)))
}

/// The two f16s in the four bytes at `p`, as f32.
///
/// Reading four bytes even where one f16 is wanted keeps LLVM from
/// loading a lone u16 with `vpinsrw` into a live register, a false
/// dependency that chained every block of a tile to the one before.
#[inline(always)]
pub(crate) unsafe fn f16x2(p: *const u8) -> (f32, f32) {
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128((p as *const i32).read_unaligned()));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// `e^x` per lane, relative error below 2e-7 over the range where the
/// result is a normal f32; 0 below it (so masked scores of -inf vanish),
/// `e^88` above it, NaN kept.
#[inline(always)]
pub(crate) unsafe fn exp(x: __m256) -> __m256 {
    let lo = _mm256_set1_ps(-87.336_55);
    // `max_ps`/`min_ps` return their second operand when either is NaN.
    let xc = _mm256_min_ps(_mm256_set1_ps(88.0), _mm256_max_ps(lo, x));
    let n = _mm256_round_ps(
        _mm256_mul_ps(xc, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
    );
    // Cody-Waite: ln 2 split so n * LN2_HI is exact.
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), xc);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    // Taylor to r^6 on |r| <= ln2 / 2: truncation below 1.2e-7.
    let mut p = _mm256_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let scale = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
        23,
    );
    let y = _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
    _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), y)
}
