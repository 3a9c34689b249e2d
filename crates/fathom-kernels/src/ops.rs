//! Element-wise and row ops of a transformer forward pass.
//!
//! Each public function picks the SIMD path detected at start-up; the
//! `*_with` twins take the path explicitly so tests can hold every SIMD
//! path against the portable one.

use crate::isa::Isa;
use crate::quant::Q8_0_BYTES;
#[cfg(target_arch = "x86_64")]
use crate::x86::ops as simd;
use fathom_ggml::blocks::QK;

/// Runs `$simd` when `$isa` is a SIMD level, `$portable` otherwise.
macro_rules! dispatch {
    ($isa:expr, $simd:expr, $portable:expr) => {{
        #[cfg(not(target_arch = "x86_64"))]
        let _ = $isa;
        #[cfg(target_arch = "x86_64")]
        if $isa != Isa::Portable {
            // SAFETY: an `Isa` above `Portable` exists only when
            // `Isa::detected` found AVX2, FMA and F16C on this CPU, which
            // is all the x86 ops need.
            #[allow(unused_unsafe)]
            return unsafe { $simd };
        }
        $portable
    }};
}

/// Root-mean-square normalization of one row, then an element-wise scale
/// by `weight` as stored (Gemma's `1 + w` is the caller's to apply).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    rms_norm_with(Isa::detected(), x, weight, eps, out)
}

pub(crate) fn rms_norm_with(isa: Isa, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    assert!(
        weight.len() == x.len() && out.len() == x.len(),
        "rms_norm: x, weight and out differ in length"
    );
    dispatch!(isa, simd::rms_norm(x, weight, eps, out), {
        let ss: f32 = x.iter().map(|v| v * v).sum();
        let inv = 1.0 / (ss / x.len() as f32 + eps).sqrt();
        for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
            *o = v * inv * w;
        }
    })
}

/// Rotary position embedding of `n_heads` heads of `head_dim` values at
/// position `pos`. `neox` rotates pairs (i, i + d/2) as GPT-NeoX does;
/// otherwise adjacent pairs (2i, 2i + 1) as the original LLaMA code.
/// `freq_factors` (llama3's `rope_freqs`) divides pair i's frequency.
///
/// The angles are computed in f64 once per call and shared by all heads:
/// at positions in the tens of thousands an f32 angle loses whole
/// hundredths of a radian, and sin/cos would otherwise dominate the op.
pub fn rope(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    pos: usize,
    theta: f32,
    neox: bool,
    freq_factors: Option<&[f32]>,
) {
    assert!(
        head_dim.is_multiple_of(2),
        "rope: head_dim {head_dim} is odd"
    );
    assert!(
        x.len() >= n_heads * head_dim,
        "rope: {} values hold fewer than {n_heads} heads of {head_dim}",
        x.len()
    );
    let half = head_dim / 2;
    if let Some(f) = freq_factors {
        assert!(
            f.len() >= half,
            "rope: {} frequency factors for {half} pairs",
            f.len()
        );
    }
    // theta^(-2i/d) by repeated multiplication: exact enough in f64 over a
    // head's few dozen pairs, and one powf per call instead of per pair.
    let step = (theta as f64).powf(-2.0 / head_dim as f64);
    let mut base = 1.0f64;
    for i in 0..half {
        let freq = match freq_factors {
            Some(f) => base / f[i] as f64,
            None => base,
        };
        base *= step;
        let (sin, cos) = (pos as f64 * freq).sin_cos();
        let (sin, cos) = (sin as f32, cos as f32);
        rotate_pair(
            &mut x[..n_heads * head_dim],
            head_dim,
            i,
            half,
            neox,
            sin,
            cos,
        );
    }
}

/// In-place softmax. An empty row is left alone.
pub fn softmax(x: &mut [f32]) {
    softmax_with(Isa::detected(), x)
}

pub(crate) fn softmax_with(isa: Isa, x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    dispatch!(isa, simd::softmax(x), {
        let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let inv = 1.0 / exp_shifted_sum_with(isa, x, max);
        for v in x.iter_mut() {
            *v *= inv;
        }
    })
}

/// `x[i] = exp(x[i] - max)`, returning their sum: softmax's middle step,
/// and attention's weights for a block of scores against the running
/// maximum.
pub fn exp_shifted_sum(x: &mut [f32], max: f32) -> f32 {
    exp_shifted_sum_with(Isa::detected(), x, max)
}

pub(crate) fn exp_shifted_sum_with(isa: Isa, x: &mut [f32], max: f32) -> f32 {
    dispatch!(isa, simd::exp_shifted_sum(x, max), {
        let mut sum = 0.0;
        for v in x.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        sum
    })
}

/// SwiGLU: `gate = silu(gate) * up`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    silu_mul_with(Isa::detected(), gate, up)
}

pub(crate) fn silu_mul_with(isa: Isa, gate: &mut [f32], up: &[f32]) {
    assert_eq!(
        gate.len(),
        up.len(),
        "silu_mul: gate and up differ in length"
    );
    dispatch!(isa, simd::silu_mul(gate, up), {
        for (g, &u) in gate.iter_mut().zip(up) {
            *g = *g / (1.0 + (-*g).exp()) * u;
        }
    })
}

/// gpt-oss's clamped SwiGLU, as llama.cpp's `swiglu_oai` (alpha 1.702,
/// limit 7): with g = min(gate, 7) and u = clamp(up, -7, 7),
/// `gate = g / (1 + e^(-1.702 g)) * (u + 1)`. Scalar: a sliver of a MoE
/// layer's time beside its matmuls.
pub fn swiglu_oai_mul(gate: &mut [f32], up: &[f32]) {
    const ALPHA: f32 = 1.702;
    const LIMIT: f32 = 7.0;
    assert_eq!(
        gate.len(),
        up.len(),
        "swiglu_oai_mul: gate and up differ in length"
    );
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = g.min(LIMIT);
        let y = u.clamp(-LIMIT, LIMIT);
        *g = x / (1.0 + (-ALPHA * x).exp()) * (y + 1.0);
    }
}

/// YaRN rope scaling for [`rope_yarn`], as llama.cpp's `rope_yarn` with
/// `ext_factor` 1: the rotary pairs below `corr[0]` keep their frequency,
/// those past `corr[1]` are divided by the factor (`freq_scale` = 1 /
/// factor), the ones between blended linearly; cos and sin are scaled by
/// `mscale` (attn_factor × (1 + 0.1 ln factor)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    pub freq_scale: f32,
    pub corr: [f32; 2],
    pub mscale: f32,
}

/// [`rope`] (every pair of each head, NeoX or interleaved) with YaRN's
/// frequencies and magnitude.
pub fn rope_yarn(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    pos: usize,
    theta: f32,
    neox: bool,
    yarn: &Yarn,
) {
    assert!(
        head_dim.is_multiple_of(2) && x.len() >= n_heads * head_dim,
        "rope_yarn: {} values for {n_heads} heads of {head_dim}",
        x.len()
    );
    let half = head_dim / 2;
    let step = (theta as f64).powf(-2.0 / head_dim as f64);
    let (low, high) = (yarn.corr[0] as f64, yarn.corr[1] as f64);
    let mut base = 1.0f64;
    for i in 0..half {
        let extrap = pos as f64 * base;
        base *= step;
        let interp = yarn.freq_scale as f64 * extrap;
        let y = (i as f64 - low) / (high - low).max(0.001);
        let mix = 1.0 - y.clamp(0.0, 1.0);
        let angle = interp * (1.0 - mix) + extrap * mix;
        let (sin, cos) = angle.sin_cos();
        let m = yarn.mscale as f64;
        let (sin, cos) = ((sin * m) as f32, (cos * m) as f32);
        rotate_pair(
            &mut x[..n_heads * head_dim],
            head_dim,
            i,
            half,
            neox,
            sin,
            cos,
        );
    }
}

/// Rotates pair `i` of every head of `x` (`head_dim` values a head) by
/// the angle whose sine and cosine are given: the pair is `(i, i + half)`
/// in NeoX layout, `(2i, 2i + 1)` otherwise.
fn rotate_pair(
    x: &mut [f32],
    head_dim: usize,
    i: usize,
    half: usize,
    neox: bool,
    sin: f32,
    cos: f32,
) {
    let (a, b) = if neox {
        (i, i + half)
    } else {
        (2 * i, 2 * i + 1)
    };
    for head in x.chunks_exact_mut(head_dim) {
        let (x0, x1) = (head[a], head[b]);
        head[a] = x0 * cos - x1 * sin;
        head[b] = x0 * sin + x1 * cos;
    }
}

/// GeGLU with the tanh approximation of GELU, as Gemma uses:
/// `gate = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * up`.
pub fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
    gelu_tanh_mul_with(Isa::detected(), gate, up)
}

pub(crate) const SQRT_2_OVER_PI: f32 = 0.797_884_6;
pub(crate) const GELU_COEF: f32 = 0.044_715;

pub(crate) fn gelu_tanh_mul_with(isa: Isa, gate: &mut [f32], up: &[f32]) {
    assert_eq!(
        gate.len(),
        up.len(),
        "gelu_tanh_mul: gate and up differ in length"
    );
    dispatch!(isa, simd::gelu_tanh_mul(gate, up), {
        // 0.5 g (1 + tanh(a)) = g / (1 + e^(-2a)), which does not cancel
        // to nothing for negative g.
        for (g, &u) in gate.iter_mut().zip(up) {
            let v = *g;
            let a = SQRT_2_OVER_PI * v * (1.0 + GELU_COEF * v * v);
            *g = v / (1.0 + (-2.0 * a).exp()) * u;
        }
    })
}

/// `dst += src`.
pub fn add(dst: &mut [f32], src: &[f32]) {
    add_with(Isa::detected(), dst, src)
}

pub(crate) fn add_with(isa: Isa, dst: &mut [f32], src: &[f32]) {
    assert_eq!(dst.len(), src.len(), "add: dst and src differ in length");
    dispatch!(isa, simd::add(dst, src), {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d += s;
        }
    })
}

/// `x *= s`.
pub fn scale(x: &mut [f32], s: f32) {
    scale_with(Isa::detected(), x, s)
}

pub(crate) fn scale_with(isa: Isa, x: &mut [f32], s: f32) {
    dispatch!(isa, simd::scale(x, s), {
        for v in x.iter_mut() {
            *v *= s;
        }
    })
}

/// Inner product, for attention scores.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    dot_f32_with(Isa::detected(), a, b)
}

pub(crate) fn dot_f32_with(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f32: a and b differ in length");
    dispatch!(
        isa,
        simd::dot_f32(a, b),
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    )
}

/// `count` rows of a matrix, row `i` at `data[i * stride..]`.
#[derive(Clone, Copy, Debug)]
pub struct Rows<'a> {
    pub data: &'a [f32],
    pub stride: usize,
    pub count: usize,
}

impl<'a> Rows<'a> {
    /// The rows from row `i` on.
    pub fn skip(self, i: usize) -> Rows<'a> {
        Rows {
            data: &self.data[(i * self.stride).min(self.data.len())..],
            stride: self.stride,
            count: self.count - i,
        }
    }

    /// Panics unless the rows hold `width` values each, naming the op:
    /// the SIMD paths read them through raw pointers.
    fn check(&self, what: &str, width: usize) {
        assert_rows(what, self.data, self.count, width, self.stride);
    }
}

/// `out[i * out_stride + j] = q_i · k_j` over the first `dim` values of
/// each row: attention's scores of a few query heads against a run of
/// keys in one call. Each score is the same sum whichever call, block or
/// count of rows it comes from (so attention's output does not depend
/// on how a sequence was cut into steps), though not [`dot_f32`]'s.
pub fn scores_f32(q: Rows, k: Rows, dim: usize, out: &mut [f32], out_stride: usize) {
    scores_f32_with(Isa::detected(), q, k, dim, out, out_stride)
}

pub(crate) fn scores_f32_with(
    isa: Isa,
    q: Rows,
    k: Rows,
    dim: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    q.check("scores_f32's queries", dim);
    k.check("scores_f32's keys", dim);
    if q.count == 0 || k.count == 0 {
        return;
    }
    assert!(
        k.count <= out_stride && out.len() >= (q.count - 1) * out_stride + k.count,
        "scores_f32: {} × {} scores, {out_stride} apart, into {} values",
        q.count,
        k.count,
        out.len()
    );
    dispatch!(isa, simd::scores_f32(q, k, dim, out, out_stride), {
        for i in 0..q.count {
            let qi = &q.data[i * q.stride..i * q.stride + dim];
            for j in 0..k.count {
                let kj = &k.data[j * k.stride..j * k.stride + dim];
                out[i * out_stride + j] = qi.iter().zip(kj).map(|(a, b)| a * b).sum();
            }
        }
    })
}

/// `y_h += Σ_i w_h[i] · v_i` over the first `width` values, for each of
/// `w.count` heads (`y_h` at `y[h * y_stride..]`, head h's weights the
/// row `w_h`, one a value row of `v`): attention's weighted values of a
/// few query heads over a run of keys in one call. Each value takes one
/// multiply-add a key, in key order, the same as [`axpy`]'s, whichever
/// call or head it comes with.
pub fn weighted_rows(y: &mut [f32], y_stride: usize, w: Rows, v: Rows, width: usize) {
    weighted_rows_with(Isa::detected(), y, y_stride, w, v, width)
}

pub(crate) fn weighted_rows_with(
    isa: Isa,
    y: &mut [f32],
    y_stride: usize,
    w: Rows,
    v: Rows,
    width: usize,
) {
    w.check("weighted_rows' weights", v.count);
    v.check("weighted_rows' values", width);
    if w.count == 0 {
        return;
    }
    assert!(
        width <= y_stride && y.len() >= (w.count - 1) * y_stride + width,
        "weighted_rows: {} heads of {width} values, {y_stride} apart, into {} values",
        w.count,
        y.len()
    );
    dispatch!(isa, simd::weighted_rows(y, y_stride, w, v, width), {
        for h in 0..w.count {
            let yh = &mut y[h * y_stride..h * y_stride + width];
            for i in 0..v.count {
                let a = w.data[h * w.stride + i];
                axpy_with(isa, yh, a, &v.data[i * v.stride..i * v.stride + width]);
            }
        }
    })
}

/// Panics unless `rows` holds `count` rows of `n` values `stride` apart,
/// naming the op: `axpys`' SIMD path reads them through raw pointers.
fn assert_rows(what: &str, rows: &[f32], count: usize, n: usize, stride: usize) {
    if let Some(last) = count.checked_sub(1) {
        assert!(
            rows.len() >= last * stride + n,
            "{what}: {count} rows of {n} values {stride} apart need {} values, got {}",
            last * stride + n,
            rows.len()
        );
    }
}

/// `y += a * x`, for attention's weighted sum of values.
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    axpy_with(Isa::detected(), y, a, x)
}

pub(crate) fn axpy_with(isa: Isa, y: &mut [f32], a: f32, x: &[f32]) {
    assert_eq!(y.len(), x.len(), "axpy: y and x differ in length");
    dispatch!(isa, simd::axpy(y, a, x), {
        for (d, &s) in y.iter_mut().zip(x) {
            *d += a * s;
        }
    })
}

/// Index of the first largest value, NaNs ignored; 0 for an empty or
/// all-NaN row.
pub fn argmax(x: &[f32]) -> usize {
    argmax_with(Isa::detected(), x)
}

pub(crate) fn argmax_with(isa: Isa, x: &[f32]) -> usize {
    dispatch!(isa, simd::argmax(x), {
        let mut best: Option<(usize, f32)> = None;
        for (i, &v) in x.iter().enumerate() {
            if !v.is_nan() && best.is_none_or(|(_, b)| v > b) {
                best = Some((i, v));
            }
        }
        best.map_or(0, |(i, _)| i)
    })
}

pub use fathom_ggml::{bf16_to_f32, f16_to_f32, f32_to_f16};

/// Stores a row as f16, for the KV cache.
pub fn f32_to_f16_row(src: &[f32], dst: &mut [u16]) {
    f32_to_f16_row_with(Isa::detected(), src, dst)
}

pub(crate) fn f32_to_f16_row_with(isa: Isa, src: &[f32], dst: &mut [u16]) {
    assert_eq!(
        src.len(),
        dst.len(),
        "f32_to_f16_row: src and dst differ in length"
    );
    dispatch!(isa, simd::f32_to_f16_row(src, dst), {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = f32_to_f16(s);
        }
    })
}

/// Stores a row as f16 in little-endian bytes (the KV cache's layout),
/// without a staging copy when the bytes are 2-aligned, as the cache's
/// rows are.
pub fn f32_to_f16_bytes_row(src: &[f32], dst: &mut [u8]) {
    assert_eq!(
        src.len() * 2,
        dst.len(),
        "f32_to_f16_bytes_row: {} values for {} bytes",
        src.len(),
        dst.len()
    );
    if cfg!(target_endian = "little") {
        // SAFETY: every bit pattern is a valid u16, and `align_to_mut`
        // hands back only the correctly aligned middle part.
        let (head, halves, tail) = unsafe { dst.align_to_mut::<u16>() };
        if head.is_empty() && tail.is_empty() {
            return f32_to_f16_row(src, halves);
        }
    }
    for (d, &s) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&f32_to_f16(s).to_le_bytes());
    }
}

/// Loads an f16 row, for the KV cache.
pub fn f16_to_f32_row(src: &[u16], dst: &mut [f32]) {
    f16_to_f32_row_with(Isa::detected(), src, dst)
}

/// Loads an f16 row stored as little-endian bytes (the KV cache's
/// layout) without a staging copy when the bytes are 2-aligned, as the
/// cache's rows are.
pub fn f16_bytes_to_f32_row(src: &[u8], dst: &mut [f32]) {
    assert_eq!(
        src.len(),
        dst.len() * 2,
        "f16_bytes_to_f32_row: {} bytes for {} values",
        src.len(),
        dst.len()
    );
    if cfg!(target_endian = "little") {
        // SAFETY: every bit pattern is a valid u16, and `align_to` hands
        // back only the correctly aligned middle part.
        let (head, halves, tail) = unsafe { src.align_to::<u16>() };
        if head.is_empty() && tail.is_empty() {
            return f16_to_f32_row(halves, dst);
        }
    }
    const CHUNK: usize = 256;
    let mut halves = [0u16; CHUNK];
    for (d, s) in dst.chunks_mut(CHUNK).zip(src.chunks(CHUNK * 2)) {
        for (h, b) in halves.iter_mut().zip(s.chunks_exact(2)) {
            *h = u16::from_le_bytes([b[0], b[1]]);
        }
        f16_to_f32_row(&halves[..d.len()], d);
    }
}

/// `dst.len() / width` rows of `width` f16 values stored as little-endian
/// bytes, row r at byte `r × stride` of `src` (one KV head's rows in a
/// cache block), loaded in one call: a block of keys costs one dispatch,
/// not one a position.
pub fn f16_bytes_to_f32_rows(src: &[u8], stride: usize, width: usize, dst: &mut [f32]) {
    let rows = dst.len() / width.max(1);
    assert!(
        rows * width == dst.len() && (rows == 0 || (rows - 1) * stride + 2 * width <= src.len()),
        "f16_bytes_to_f32_rows: {rows} rows of {width} at stride {stride} in {} bytes",
        src.len()
    );
    if cfg!(target_endian = "little") && stride.is_multiple_of(2) {
        // SAFETY: every bit pattern is a valid u16, and `align_to` hands
        // back only the correctly aligned middle part.
        let (head, halves, _) = unsafe { src.align_to::<u16>() };
        if head.is_empty() && (rows == 0 || (rows - 1) * stride / 2 + width <= halves.len()) {
            let isa = Isa::detected();
            dispatch!(
                isa,
                simd::f16_rows_to_f32(halves, stride / 2, width, dst),
                {
                    for (r, d) in dst.chunks_exact_mut(width).enumerate() {
                        let row = &halves[r * stride / 2..r * stride / 2 + width];
                        d.iter_mut().zip(row).for_each(|(d, &h)| *d = f16_to_f32(h));
                    }
                    return;
                }
            )
        }
    }
    for (r, d) in dst.chunks_exact_mut(width).enumerate() {
        f16_bytes_to_f32_row(&src[r * stride..r * stride + 2 * width], d);
    }
}

pub(crate) fn f16_to_f32_row_with(isa: Isa, src: &[u16], dst: &mut [f32]) {
    assert_eq!(
        src.len(),
        dst.len(),
        "f16_to_f32_row: src and dst differ in length"
    );
    dispatch!(isa, simd::f16_to_f32_row(src, dst), {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = f16_to_f32(s);
        }
    })
}

/// Quantizes a row to ggml's `block_q8_0` (f16 scale and 32 i8 per block),
/// for a q8_0 KV cache. `src.len()` must be a multiple of 32 and `dst` must
/// hold `src.len() / 32 * 34` bytes.
pub fn quantize_q8_0_row(src: &[f32], dst: &mut [u8]) {
    quantize_q8_0_row_with(Isa::detected(), src, dst)
}

fn check_q8_0(values: usize, bytes: usize) {
    let q8_0 = crate::WeightType::Q8_0;
    assert!(
        values.is_multiple_of(q8_0.block_elems()),
        "q8_0 rows hold whole blocks of 32 values, not {values}"
    );
    let need = q8_0.row_bytes(values);
    assert!(
        bytes >= need,
        "{values} q8_0 values need {need} bytes, got {bytes}"
    );
}

pub(crate) fn quantize_q8_0_row_with(isa: Isa, src: &[f32], dst: &mut [u8]) {
    check_q8_0(src.len(), dst.len());
    dispatch!(isa, simd::quantize_q8_0_row(src, dst), {
        for (x, out) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q8_0_BYTES)) {
            let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let (d, id) = crate::quant::q8_scale(amax);
            out[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
            for (o, &v) in out[2..].iter_mut().zip(x) {
                *o = (v * id).round_ties_even() as i8 as u8;
            }
        }
    })
}

/// Inverse of [`quantize_q8_0_row`].
pub fn dequantize_q8_0_row(src: &[u8], dst: &mut [f32]) {
    dequantize_q8_0_row_with(Isa::detected(), src, dst)
}

pub(crate) fn dequantize_q8_0_row_with(isa: Isa, src: &[u8], dst: &mut [f32]) {
    check_q8_0(dst.len(), src.len());
    dispatch!(
        isa,
        simd::dequantize_q8_0_row(src, dst),
        crate::quant::dequantize_row(crate::WeightType::Q8_0, src, dst)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_bytes_load_the_same_aligned_or_not() {
        let values = data(300, 7);
        let expected: Vec<f32> = values.iter().map(|&v| f16_to_f32(f32_to_f16(v))).collect();
        // One spare byte in front, so both alignments can be sliced.
        let mut bytes = vec![0u8; 1 + values.len() * 2];
        for offset in [0, 1] {
            for (d, &v) in bytes[offset..].chunks_exact_mut(2).zip(&values) {
                d.copy_from_slice(&f32_to_f16(v).to_le_bytes());
            }
            let mut out = vec![0f32; values.len()];
            f16_bytes_to_f32_row(&bytes[offset..offset + values.len() * 2], &mut out);
            assert_eq!(out, expected, "byte offset {offset}");
        }
    }

    /// `n` values uniform in [-4, 4).
    fn data(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = fathom_fixtures::Rng::new(seed);
        (0..n).map(|_| rng.f32_in(-4.0..4.0)).collect()
    }

    /// Equal within `rel` of `scale[i]` (the size of the op's inputs, so
    /// a result that cancels to near zero is not held to a relative bound
    /// its inputs could not meet).
    fn close(what: &str, a: &[f32], b: &[f32], scale: &[f32], rel: f32) {
        assert_eq!(a.len(), b.len());
        for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
            let s = scale[i].abs().max(x.abs()).max(1e-3);
            assert!((x - y).abs() <= rel * s, "{what} at {i}: {x} vs {y}");
        }
    }

    /// Odd lengths exercise every SIMD loop's tail.
    const LENS: [usize; 6] = [0, 1, 7, 33, 64, 1000];

    fn rows(data: &[f32], stride: usize, count: usize) -> Rows<'_> {
        Rows {
            data,
            stride,
            count,
        }
    }

    /// Every score of a call is the bits of the same score computed alone
    /// (so a query's attention does not depend on which heads and keys
    /// share its call), and within rounding of the f64 dot product; for
    /// every block shape and tail of the SIMD path.
    #[test]
    fn scores_are_the_same_sums_in_any_call() {
        for isa in Isa::available() {
            for dim in [0, 1, 7, 8, 33, 64, 128] {
                for (nq, nk) in [
                    (1, 1),
                    (1, 5),
                    (2, 7),
                    (3, 3),
                    (4, 2),
                    (5, 9),
                    (9, 16),
                    (8, 1),
                ] {
                    let (qs, ks) = (dim + 3, 2 * dim + 1);
                    let q = data(nq * qs + dim, 11);
                    let k = data(nk * ks + dim, 12);
                    let out_stride = nk + 2;
                    let mut all = vec![f32::NAN; nq * out_stride];
                    scores_f32_with(
                        isa,
                        rows(&q, qs, nq),
                        rows(&k, ks, nk),
                        dim,
                        &mut all,
                        out_stride,
                    );
                    for i in 0..nq {
                        for j in 0..nk {
                            let mut one = [0.0f32];
                            let (qi, kj) = (&q[i * qs..], &k[j * ks..]);
                            scores_f32_with(
                                isa,
                                rows(qi, qs, 1),
                                rows(kj, ks, 1),
                                dim,
                                &mut one,
                                1,
                            );
                            let got = all[i * out_stride + j];
                            assert_eq!(
                                got.to_bits(),
                                one[0].to_bits(),
                                "{isa:?} dim {dim}, {nq}×{nk}: ({i}, {j})"
                            );
                            let exact: f64 = (0..dim).map(|d| qi[d] as f64 * kj[d] as f64).sum();
                            let size: f64 =
                                (0..dim).map(|d| (qi[d] as f64 * kj[d] as f64).abs()).sum();
                            assert!(
                                (got as f64 - exact).abs() <= 1e-6 * size.max(1.0),
                                "{got} vs {exact}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn simd_matches_portable() {
        for isa in Isa::available() {
            for n in LENS {
                let x = data(n, 1);
                let y = data(n, 2);
                let w = data(n, 3);

                let mut a = vec![0.0; n];
                let mut b = vec![0.0; n];
                rms_norm_with(Isa::Portable, &x, &w, 1e-5, &mut a);
                rms_norm_with(isa, &x, &w, 1e-5, &mut b);
                close("rms_norm", &a, &b, &a, 1e-5);

                let (mut a, mut b) = (x.clone(), x.clone());
                softmax_with(Isa::Portable, &mut a);
                softmax_with(isa, &mut b);
                close("softmax", &a, &b, &a, 1e-5);

                // Three rows of n values, 2n + 5 apart.
                let stride = 2 * n + 5;
                let rows_data = data(2 * stride + n, 4);
                let row = |i: usize| &rows_data[i * stride..i * stride + n];
                // Three heads of n values 2n + 5 apart, their weights for the
                // three rows 4 apart: each value as `axpy` gives it.
                let w = [
                    0.5, -1.25, 2.0, 9.0, 0.25, 1.5, -3.0, 9.0, -0.75, 4.0, 0.125,
                ];
                let (mut a, mut b) = (data(2 * stride + n, 5), Vec::new());
                b.clone_from(&a);
                let (weights, values) = (rows(&w, 4, 3), rows(&rows_data, stride, 3));
                weighted_rows_with(isa, &mut a, stride, weights, values, n);
                for h in 0..3 {
                    for i in 0..3 {
                        axpy_with(
                            isa,
                            &mut b[h * stride..h * stride + n],
                            w[h * 4 + i],
                            row(i),
                        );
                    }
                }
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "weighted_rows against axpy, n = {n}");

                let (mut a, mut b) = (x.clone(), x.clone());
                let max = 0.5;
                let sa = exp_shifted_sum_with(Isa::Portable, &mut a, max);
                let sb = exp_shifted_sum_with(isa, &mut b, max);
                close("exp_shifted_sum", &a, &b, &a, 1e-5);
                close("exp_shifted_sum's sum", &[sa], &[sb], &[sa], 1e-5);

                let (mut a, mut b) = (x.clone(), x.clone());
                silu_mul_with(Isa::Portable, &mut a, &y);
                silu_mul_with(isa, &mut b, &y);
                close("silu_mul", &a, &b, &a, 1e-5);

                let (mut a, mut b) = (x.clone(), x.clone());
                gelu_tanh_mul_with(Isa::Portable, &mut a, &y);
                gelu_tanh_mul_with(isa, &mut b, &y);
                close("gelu_tanh_mul", &a, &b, &a, 1e-5);

                let (mut a, mut b) = (x.clone(), x.clone());
                add_with(Isa::Portable, &mut a, &y);
                add_with(isa, &mut b, &y);
                assert_eq!(a, b);

                let (mut a, mut b) = (x.clone(), x.clone());
                scale_with(Isa::Portable, &mut a, 0.3);
                scale_with(isa, &mut b, 0.3);
                assert_eq!(a, b);

                let (mut a, mut b) = (x.clone(), x.clone());
                axpy_with(Isa::Portable, &mut a, -0.7, &y);
                axpy_with(isa, &mut b, -0.7, &y);
                let mag: Vec<f32> = x
                    .iter()
                    .zip(&y)
                    .map(|(u, v)| u.abs() + 0.7 * v.abs())
                    .collect();
                close("axpy", &a, &b, &mag, 1e-6);

                let p = dot_f32_with(Isa::Portable, &x, &y);
                let s = dot_f32_with(isa, &x, &y);
                let mag: f32 = x.iter().zip(&y).map(|(a, b)| (a * b).abs()).sum();
                assert!((p - s).abs() <= 1e-5 * mag, "dot {p} vs {s}");

                assert_eq!(argmax_with(Isa::Portable, &x), argmax_with(isa, &x));
            }
        }
    }

    #[test]
    fn activations_at_extremes() {
        let x = [-1e4f32, -100.0, -87.5, -20.0, 0.0, 20.0, 87.0, 100.0, 1e4];
        for isa in Isa::available() {
            let mut g = x.to_vec();
            silu_mul_with(isa, &mut g, &[1.0; 9]);
            for (&v, &s) in x.iter().zip(&g) {
                let want = if v < -50.0 {
                    0.0
                } else {
                    v / (1.0 + (-v).exp())
                };
                assert!(
                    (s - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "{isa:?} silu({v}) = {s}"
                );
            }
            let mut g = x.to_vec();
            gelu_tanh_mul_with(isa, &mut g, &[1.0; 9]);
            for (&v, &s) in x.iter().zip(&g).filter(|(v, _)| v.abs() > 10.0) {
                let want = v.max(0.0);
                assert!(
                    (s - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "{isa:?} gelu({v}) = {s}"
                );
            }
            let y = [0.5f32, -0.5, 3.0, -3.0];
            let mut g = y.to_vec();
            gelu_tanh_mul_with(isa, &mut g, &[1.0; 4]);
            for (&v, &s) in y.iter().zip(&g) {
                let want = 0.5 * v * (1.0 + (SQRT_2_OVER_PI * (v + GELU_COEF * v * v * v)).tanh());
                assert!(
                    (s - want).abs() <= 1e-6,
                    "{isa:?} gelu({v}) = {s}, want {want}"
                );
            }
            let mut p = [f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY, 0.0];
            softmax_with(isa, &mut p);
            assert_eq!(p, [0.0, 0.5, 0.0, 0.5], "{isa:?}");
        }
    }

    #[test]
    fn argmax_ties_nan_and_empty() {
        for isa in Isa::available() {
            assert_eq!(argmax_with(isa, &[]), 0);
            assert_eq!(argmax_with(isa, &[f32::NAN; 20]), 0);
            let mut x = vec![1.0f32; 100];
            x[37] = 5.0;
            x[90] = 5.0;
            x[3] = f32::NAN;
            assert_eq!(argmax_with(isa, &x), 37, "{isa:?}");
            x[99] = f32::INFINITY;
            assert_eq!(argmax_with(isa, &x), 99, "{isa:?}");
        }
    }

    #[test]
    fn f16_known_values() {
        let cases: [(f32, u16); 9] = [
            (1.0, 0x3c00),
            (-2.0, 0xc000),
            (0.1, 0x2e66),
            (65504.0, 0x7bff),
            (1e6, 0x7c00),
            (6.103_515_6e-5, 0x0400),
            (1e-7, 0x0002),
            (1e-9, 0x0000),
            (f32::NEG_INFINITY, 0xfc00),
        ];
        for (x, h) in cases {
            assert_eq!(f32_to_f16(x), h, "{x}");
        }
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0x0001), 5.960_464_5e-8);
        assert_eq!(f16_to_f32(0x8400), -6.103_515_6e-5);
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(bf16_to_f32(0x3fc0), 1.5);
        // Every finite f16 survives a round trip.
        for h in 0..=u16::MAX {
            if h & 0x7c00 != 0x7c00 {
                assert_eq!(f32_to_f16(f16_to_f32(h)), h);
            }
        }
    }

    #[test]
    fn f16_rows_match_portable() {
        let mut x = data(1003, 9);
        x[5] = 1e-6;
        x[6] = 70000.0;
        x[7] = -3e-8;
        x[8] = 0.0009765625 * 1.5;
        let halves: Vec<u16> = (0..=u16::MAX).filter(|h| h & 0x7c00 != 0x7c00).collect();
        for isa in Isa::available() {
            let mut a = vec![0u16; x.len()];
            let mut b = vec![0u16; x.len()];
            f32_to_f16_row_with(Isa::Portable, &x, &mut a);
            f32_to_f16_row_with(isa, &x, &mut b);
            assert_eq!(a, b, "{isa:?}");
            let mut a = vec![0.0; halves.len()];
            let mut b = vec![0.0; halves.len()];
            f16_to_f32_row_with(Isa::Portable, &halves, &mut a);
            f16_to_f32_row_with(isa, &halves, &mut b);
            assert_eq!(a, b, "{isa:?}");
        }
    }

    #[test]
    fn f16_byte_rows_equal_each_value_stored_alone() {
        let x = data(131, 3);
        let want: Vec<u8> = x
            .iter()
            .flat_map(|&v| f32_to_f16(v).to_le_bytes())
            .collect();
        // A 2-aligned row (the cache's) and one at an odd address.
        let mut bytes = vec![0u8; want.len() + 2];
        for at in [0, 1] {
            f32_to_f16_bytes_row(&x, &mut bytes[at..at + want.len()]);
            assert_eq!(&bytes[at..at + want.len()], &want[..], "offset {at}");
        }
    }

    #[test]
    fn f16_strided_rows_load_as_each_row_alone() {
        // 5 rows of 64 values, 384 bytes apart (one head of a 3-head KV
        // row), at an aligned and at an odd start.
        let halves: Vec<u16> = (0..1000u16).map(|i| i.wrapping_mul(37) & 0x7bff).collect();
        let bytes: Vec<u8> = halves.iter().flat_map(|h| h.to_le_bytes()).collect();
        for at in [0, 1] {
            let src = &bytes[at..];
            let mut want = vec![0.0; 5 * 64];
            for (r, d) in want.chunks_exact_mut(64).enumerate() {
                f16_bytes_to_f32_row(&src[r * 384..r * 384 + 128], d);
            }
            let mut got = vec![0.0; 5 * 64];
            f16_bytes_to_f32_rows(src, 384, 64, &mut got);
            // Bits: an odd start reads NaN patterns too.
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "start {at}");
        }
    }

    #[test]
    fn q8_0_rows() {
        let mut x = data(32 * 9, 4);
        x[32..64].fill(0.0);
        for isa in Isa::available() {
            let mut a = vec![0u8; 9 * 34];
            let mut b = vec![0u8; 9 * 34];
            quantize_q8_0_row_with(Isa::Portable, &x, &mut a);
            quantize_q8_0_row_with(isa, &x, &mut b);
            assert_eq!(a, b, "{isa:?}");
            let mut y = vec![0.0; x.len()];
            let mut z = vec![0.0; x.len()];
            dequantize_q8_0_row_with(Isa::Portable, &a, &mut y);
            dequantize_q8_0_row_with(isa, &a, &mut z);
            assert_eq!(y, z, "{isa:?}");
            for (xs, ys) in x.chunks(32).zip(y.chunks(32)) {
                let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                for (&u, &v) in xs.iter().zip(ys) {
                    // Half a quant step, plus the f16 rounding of the scale.
                    assert!((u - v).abs() <= amax / 254.0 + u.abs() / 2048.0);
                }
            }
        }
    }

    #[test]
    fn rope_rotates_pairs() {
        // Position 0 is the identity; norms of each rotated pair survive.
        let x = data(2 * 8, 5);
        for neox in [false, true] {
            let mut y = x.clone();
            rope(&mut y, 2, 8, 0, 10000.0, neox, None);
            assert_eq!(x, y);
            rope(&mut y, 2, 8, 7, 10000.0, neox, Some(&[1.0, 2.0, 4.0, 8.0]));
            for h in 0..2 {
                for i in 0..4 {
                    let (a, b) = if neox { (i, i + 4) } else { (2 * i, 2 * i + 1) };
                    let n0 = x[8 * h + a].hypot(x[8 * h + b]);
                    let n1 = y[8 * h + a].hypot(y[8 * h + b]);
                    assert!((n0 - n1).abs() < 1e-5);
                }
            }
            // Pair 0 turns by exactly pos radians.
            let (a, b) = if neox { (0, 4) } else { (0, 1) };
            let want = (x[b].atan2(x[a]) + 7.0).sin_cos();
            let n = x[a].hypot(x[b]);
            assert!((y[a] - n * want.1).abs() < 1e-5 && (y[b] - n * want.0).abs() < 1e-5);
            // Pair 1's frequency 10000^(-2/8) is halved by its factor.
            let (a, b) = if neox { (1, 5) } else { (2, 3) };
            let ang = 7.0 * 10000f32.powf(-0.25) / 2.0;
            let want = (x[b].atan2(x[a]) + ang).sin_cos();
            let n = x[a].hypot(x[b]);
            assert!((y[a] - n * want.1).abs() < 1e-5 && (y[b] - n * want.0).abs() < 1e-5);
        }
    }
}
