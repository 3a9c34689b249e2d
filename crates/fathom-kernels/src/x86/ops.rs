//! AVX2 forms of [`crate::ops`] and of the activation quantizers. Callers
//! check lengths; these trust them. Ragged tails run through a padded
//! stack copy, or through the portable code where that is bit-identical.

use super::{exp, hsum, hsum_i32};
use crate::ops::{f16_to_f32, f32_to_f16, Rows, GELU_COEF, SQRT_2_OVER_PI};
use crate::quant::{q8_scale, Q8K_BYTES, Q8S_BYTES, Q8_0_BYTES};
use std::arch::x86_64::*;

/// Replaces `x` by `f(x)` eight lanes at a time; a ragged tail goes
/// through a copy padded with `pad`, so it sees the same arithmetic.
#[inline(always)]
unsafe fn map8(x: &mut [f32], pad: f32, mut f: impl FnMut(__m256) -> __m256) {
    let n = x.len();
    let xp = x.as_mut_ptr();
    let mut i = 0;
    while i + 8 <= n {
        _mm256_storeu_ps(xp.add(i), f(_mm256_loadu_ps(xp.add(i))));
        i += 8;
    }
    if i < n {
        let mut a = [pad; 8];
        a[..n - i].copy_from_slice(&x[i..]);
        _mm256_storeu_ps(a.as_mut_ptr(), f(_mm256_loadu_ps(a.as_ptr())));
        x[i..].copy_from_slice(&a[..n - i]);
    }
}

/// Replaces `x` by `f(x, y)`, as [`map8`] with a second operand.
#[inline(always)]
unsafe fn zip8(x: &mut [f32], y: &[f32], f: impl Fn(__m256, __m256) -> __m256) {
    let n = x.len();
    let (xp, yp) = (x.as_mut_ptr(), y.as_ptr());
    let mut i = 0;
    while i + 8 <= n {
        let v = f(_mm256_loadu_ps(xp.add(i)), _mm256_loadu_ps(yp.add(i)));
        _mm256_storeu_ps(xp.add(i), v);
        i += 8;
    }
    if i < n {
        let mut a = [0.0f32; 8];
        let mut b = [0.0f32; 8];
        a[..n - i].copy_from_slice(&x[i..]);
        b[..n - i].copy_from_slice(&y[i..]);
        let v = f(_mm256_loadu_ps(a.as_ptr()), _mm256_loadu_ps(b.as_ptr()));
        _mm256_storeu_ps(a.as_mut_ptr(), v);
        x[i..].copy_from_slice(&a[..n - i]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = x.len();
    let xp = x.as_ptr();
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            let v = _mm256_loadu_ps(xp.add(i + 8 * k));
            *a = _mm256_fmadd_ps(v, v, *a);
        }
        i += 32;
    }
    while i + 8 <= n {
        let v = _mm256_loadu_ps(xp.add(i));
        acc[0] = _mm256_fmadd_ps(v, v, acc[0]);
        i += 8;
    }
    let mut ss = hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    for &v in &x[i..] {
        ss += v * v;
    }
    let vi = _mm256_set1_ps(1.0 / (ss / n as f32 + eps).sqrt());
    out.copy_from_slice(x);
    zip8(out, w, |v, w| _mm256_mul_ps(_mm256_mul_ps(v, vi), w));
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn softmax(x: &mut [f32]) {
    let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
    map8(x, f32::NEG_INFINITY, |v| {
        m = _mm256_max_ps(v, m);
        v
    });
    let mut lanes = [0.0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), m);
    let max = lanes.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let inv = _mm256_set1_ps(1.0 / exp_shifted_sum(x, max));
    map8(x, 0.0, |v| _mm256_mul_ps(v, inv));
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn exp_shifted_sum(x: &mut [f32], max: f32) -> f32 {
    let max = _mm256_set1_ps(max);
    // Padding of -inf adds exp(-inf) = 0 to the sum.
    let mut sum = _mm256_setzero_ps();
    map8(x, f32::NEG_INFINITY, |v| {
        let e = exp(_mm256_sub_ps(v, max));
        sum = _mm256_add_ps(sum, e);
        e
    });
    hsum(sum)
}

/// `x * sigmoid(k * x)`.
#[inline(always)]
unsafe fn x_sigmoid(x: __m256, k: __m256) -> __m256 {
    let e = exp(_mm256_mul_ps(_mm256_sub_ps(_mm256_setzero_ps(), k), x));
    _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn silu_mul(gate: &mut [f32], up: &[f32]) {
    let one = _mm256_set1_ps(1.0);
    zip8(gate, up, |g, u| _mm256_mul_ps(x_sigmoid(g, one), u));
}

/// Uses 0.5 g (1 + tanh(a)) = g * sigmoid(2a), which needs one exp and
/// stays accurate at both ends.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
    let c = _mm256_set1_ps(2.0 * SQRT_2_OVER_PI);
    let k = _mm256_set1_ps(GELU_COEF);
    let one = _mm256_set1_ps(1.0);
    zip8(gate, up, |g, u| {
        // 2a / g = 2 sqrt(2/pi) (1 + k g^2)
        let s = _mm256_mul_ps(c, _mm256_fmadd_ps(_mm256_mul_ps(k, g), g, one));
        _mm256_mul_ps(x_sigmoid(g, s), u)
    });
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn add(dst: &mut [f32], src: &[f32]) {
    zip8(dst, src, |a, b| _mm256_add_ps(a, b));
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn scale(x: &mut [f32], s: f32) {
    let s = _mm256_set1_ps(s);
    map8(x, 0.0, |v| _mm256_mul_ps(v, s));
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    let a = _mm256_set1_ps(a);
    zip8(y, x, |y, x| _mm256_fmadd_ps(a, x, y));
}

/// [`crate::ops::weighted_rows`]: two heads at a time, each head's 32
/// values held in registers across the keys, so each loaded piece of a
/// value row serves both; the tail as [`axpy`]'s padded vector. Every
/// value takes one fused multiply-add a key in key order, as `axpy` does.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn weighted_rows(y: &mut [f32], y_stride: usize, w: Rows, v: Rows, width: usize) {
    let mut h = 0;
    while h + 2 <= w.count {
        heads_rows::<2>(&mut y[h * y_stride..], y_stride, w.skip(h), v, width);
        h += 2;
    }
    if h < w.count {
        heads_rows::<1>(&mut y[h * y_stride..], y_stride, w.skip(h), v, width);
    }

    #[inline(always)]
    unsafe fn heads_rows<const H: usize>(
        y: &mut [f32],
        y_stride: usize,
        w: Rows,
        v: Rows,
        width: usize,
    ) {
        let (yp, wp, vp) = (y.as_mut_ptr(), w.data.as_ptr(), v.data.as_ptr());
        let mut j = 0;
        while j + 32 <= width {
            let mut acc: [[__m256; 4]; H] = std::array::from_fn(|h| {
                std::array::from_fn(|k| _mm256_loadu_ps(yp.add(h * y_stride + j + 8 * k)))
            });
            for i in 0..v.count {
                let x: [__m256; 4] =
                    std::array::from_fn(|k| _mm256_loadu_ps(vp.add(i * v.stride + j + 8 * k)));
                for (h, acc) in acc.iter_mut().enumerate() {
                    let a = _mm256_set1_ps(*wp.add(h * w.stride + i));
                    for (acc, x) in acc.iter_mut().zip(x) {
                        *acc = _mm256_fmadd_ps(a, x, *acc);
                    }
                }
            }
            for (h, acc) in acc.iter().enumerate() {
                for (k, acc) in acc.iter().enumerate() {
                    _mm256_storeu_ps(yp.add(h * y_stride + j + 8 * k), *acc);
                }
            }
            j += 32;
        }
        if j < width {
            for h in 0..H {
                for i in 0..v.count {
                    let row = &v.data[i * v.stride + j..i * v.stride + width];
                    axpy(
                        &mut y[h * y_stride + j..h * y_stride + width],
                        w.data[h * w.stride + i],
                        row,
                    );
                }
            }
        }
    }
}

/// [`crate::ops::scores_f32`]: blocks of up to four queries by two keys
/// (four keys for one or two queries), so that eight or so independent
/// chains hide the multiply-add's latency and each loaded piece of a key
/// serves every query of the block. Each score is one chain over the
/// 8-value pieces, then the lanes' sum, then the scalar tail: the same
/// sum in whichever block it falls.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn scores_f32(q: Rows, k: Rows, dim: usize, out: &mut [f32], out_stride: usize) {
    let (qp, kp, op) = (q.data.as_ptr(), k.data.as_ptr(), out.as_mut_ptr());
    let mut i = 0;
    while i + 4 <= q.count {
        let (qi, oi) = (qp.add(i * q.stride), op.add(i * out_stride));
        score_keys::<4, 2>(qi, q.stride, kp, k, dim, oi, out_stride);
        i += 4;
    }
    // Offsets taken only for rows that exist: past the last row the
    // pointer could leave the slice.
    let rest = q.count - i;
    if rest == 0 {
        return;
    }
    let (qp, op) = (qp.add(i * q.stride), op.add(i * out_stride));
    match rest {
        3 => score_keys::<3, 2>(qp, q.stride, kp, k, dim, op, out_stride),
        2 => score_keys::<2, 4>(qp, q.stride, kp, k, dim, op, out_stride),
        1 => score_keys::<1, 4>(qp, q.stride, kp, k, dim, op, out_stride),
        _ => {}
    }

    /// `R` queries at `qp` against every key, `C` keys at a time.
    #[inline(always)]
    unsafe fn score_keys<const R: usize, const C: usize>(
        qp: *const f32,
        q_stride: usize,
        kp: *const f32,
        k: Rows,
        dim: usize,
        op: *mut f32,
        out_stride: usize,
    ) {
        let mut j = 0;
        while j + C <= k.count {
            let (kj, oj) = (kp.add(j * k.stride), op.add(j));
            score_block::<R, C>(qp, q_stride, kj, k.stride, dim, oj, out_stride);
            j += C;
        }
        while j < k.count {
            let (kj, oj) = (kp.add(j * k.stride), op.add(j));
            score_block::<R, 1>(qp, q_stride, kj, k.stride, dim, oj, out_stride);
            j += 1;
        }
    }

    #[inline(always)]
    unsafe fn score_block<const R: usize, const C: usize>(
        qp: *const f32,
        q_stride: usize,
        kp: *const f32,
        k_stride: usize,
        dim: usize,
        op: *mut f32,
        out_stride: usize,
    ) {
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let mut d = 0;
        while d + 8 <= dim {
            let keys: [__m256; C] =
                std::array::from_fn(|c| _mm256_loadu_ps(kp.add(c * k_stride + d)));
            for (r, acc) in acc.iter_mut().enumerate() {
                let qv = _mm256_loadu_ps(qp.add(r * q_stride + d));
                for (a, key) in acc.iter_mut().zip(keys) {
                    *a = _mm256_fmadd_ps(qv, key, *a);
                }
            }
            d += 8;
        }
        for (r, acc) in acc.iter().enumerate() {
            for (c, a) in acc.iter().enumerate() {
                let mut s = hsum(*a);
                for e in d..dim {
                    s += *qp.add(r * q_stride + e) * *kp.add(c * k_stride + e);
                }
                *op.add(r * out_stride + c) = s;
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, s) in acc.iter_mut().enumerate() {
            let j = i + 8 * k;
            *s = _mm256_fmadd_ps(_mm256_loadu_ps(ap.add(j)), _mm256_loadu_ps(bp.add(j)), *s);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(
            _mm256_loadu_ps(ap.add(i)),
            _mm256_loadu_ps(bp.add(i)),
            acc[0],
        );
        i += 8;
    }
    let mut s = hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    for (x, y) in a[i..].iter().zip(&b[i..]) {
        s += x * y;
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn argmax(x: &[f32]) -> usize {
    let n = x.len();
    let xp = x.as_ptr();
    // `max_ps(v, m)` keeps `m` where `v` is NaN.
    let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut i = 0;
    while i + 8 <= n {
        m = _mm256_max_ps(_mm256_loadu_ps(xp.add(i)), m);
        i += 8;
    }
    let mut lanes = [0.0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), m);
    let max = lanes
        .iter()
        .chain(&x[i..])
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let vmax = _mm256_set1_ps(max);
    let mut i = 0;
    while i + 8 <= n {
        let eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(xp.add(i)), vmax, _CMP_EQ_OQ));
        if eq != 0 {
            return i + eq.trailing_zeros() as usize;
        }
        i += 8;
    }
    x[i..].iter().position(|&v| v == max).map_or(0, |p| i + p)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f32_to_f16_row(src: &[f32], dst: &mut [u16]) {
    let n = src.len();
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
        _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
        i += 8;
    }
    for (d, &s) in dst[i..].iter_mut().zip(&src[i..]) {
        *d = f32_to_f16(s);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f16_to_f32_row(src: &[u16], dst: &mut [f32]) {
    let n = src.len();
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
        _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        i += 8;
    }
    for (d, &s) in dst[i..].iter_mut().zip(&src[i..]) {
        *d = f16_to_f32(s);
    }
}

/// `dst.len() / width` rows of `width` f16 values, row r at `r × stride`
/// of `src`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f16_rows_to_f32(src: &[u16], stride: usize, width: usize, dst: &mut [f32]) {
    for (r, d) in dst.chunks_exact_mut(width).enumerate() {
        f16_to_f32_row(&src[r * stride..r * stride + width], d);
    }
}

/// Largest magnitude of the `n` (a multiple of 8) values at `x`.
#[inline(always)]
unsafe fn amax(x: *const f32, n: usize) -> f32 {
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_setzero_ps();
    for i in (0..n).step_by(8) {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x.add(i))));
    }
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
}

/// Quantizes 32 values at `x` by `id` into 32 i8 at `dst`, returning the
/// i32 quants as four vectors of eight for the callers' sums. Rounds to
/// nearest even, as the portable quantizers do.
#[inline(always)]
unsafe fn quantize32(x: *const f32, id: __m256, dst: *mut u8) -> [__m256i; 4] {
    let mut q = [_mm256_setzero_si256(); 4];
    for (k, v) in q.iter_mut().enumerate() {
        *v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x.add(8 * k)), id));
    }
    let packed = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    // The packs interleave 128-bit lanes; put the 4-byte groups in order.
    let ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(dst as *mut __m256i, ordered);
    q
}

/// ggml `block_q8_0` rows; `dst` holds `src.len() / 32 * 34` bytes.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_q8_0_row(src: &[f32], dst: &mut [u8]) {
    for (b, x) in src.chunks_exact(32).enumerate() {
        let (d, id) = q8_scale(amax(x.as_ptr(), 32));
        let out = dst.as_mut_ptr().add(Q8_0_BYTES * b);
        (out as *mut u16).write_unaligned(f32_to_f16(d));
        quantize32(x.as_ptr(), _mm256_set1_ps(id), out.add(2));
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dequantize_q8_0_row(src: &[u8], dst: &mut [f32]) {
    for (b, out) in dst.chunks_exact_mut(32).enumerate() {
        let p = src.as_ptr().add(Q8_0_BYTES * b);
        let d = _mm256_set1_ps(f16_to_f32((p as *const u16).read_unaligned()));
        for k in 0..4 {
            let q = _mm_loadl_epi64(p.add(2 + 8 * k) as *const __m128i);
            let v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
            _mm256_storeu_ps(out.as_mut_ptr().add(8 * k), _mm256_mul_ps(d, v));
        }
    }
}

/// [`crate::quant::quantize_q8s`], bit for bit.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_q8s(src: &[f32], dst: &mut [u8]) {
    for (b, x) in src.chunks_exact(32).enumerate() {
        let (d, id) = q8_scale(amax(x.as_ptr(), 32));
        let out = dst.as_mut_ptr().add(Q8S_BYTES * b);
        let q = quantize32(x.as_ptr(), _mm256_set1_ps(id), out.add(4));
        let sum = hsum_i32(_mm256_add_epi32(
            _mm256_add_epi32(q[0], q[1]),
            _mm256_add_epi32(q[2], q[3]),
        ));
        (out as *mut u16).write_unaligned(f32_to_f16(d));
        (out.add(2) as *mut i16).write_unaligned(sum as i16);
    }
}

/// [`crate::quant::quantize_q8k`], bit for bit.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_q8k(src: &[f32], dst: &mut [u8]) {
    for (b, x) in src.chunks_exact(256).enumerate() {
        let (d, id) = q8_scale(amax(x.as_ptr(), 256));
        let out = dst.as_mut_ptr().add(Q8K_BYTES * b);
        (out as *mut f32).write_unaligned(d);
        let id = _mm256_set1_ps(id);
        for c in 0..8 {
            let q = quantize32(x.as_ptr().add(32 * c), id, out.add(4 + 32 * c));
            for g in 0..2 {
                let sum = hsum_i32(_mm256_add_epi32(q[2 * g], q[2 * g + 1]));
                (out.add(260 + 4 * c + 2 * g) as *mut i16).write_unaligned(sum as i16);
            }
        }
    }
}
