//! ggml block layouts (`ggml-common.h`), their dequantization, and the
//! activation formats a matmul quantizes its input into.
//!
//! Activation formats are fathom's own, chosen so every weight type's dot
//! product is an exact integer sum per block:
//!
//! - `Q8S` (36 bytes per 32 values): f16 scale `d`, i16 sum of the quants,
//!   32 i8 quants. The sum turns a weight offset (Q4_0's -8, Q5_0's -16)
//!   or minimum (Q4_1, Q5_1) into one product per block, so the SIMD paths
//!   can multiply unsigned weight quants by signed activations directly.
//! - `Q8K` (292 bytes per 256 values, ggml's `block_q8_K`): f32 scale, 256
//!   i8 quants, 16 i16 sums of 16 quants each, for the k-quants' mins and
//!   offsets.

use crate::ops::f16_to_f32;
use crate::WeightType;
use fathom_ggml::blocks::{e8m0_half, BlockQ8S, BlockQ8_0, BlockQ8_K, MXFP4_VALUES};
use std::mem::size_of;

pub(crate) const Q8S_BYTES: usize = size_of::<BlockQ8S>();
pub(crate) const Q8K_BYTES: usize = size_of::<BlockQ8_K>();
/// ggml's `block_q8_0`, the q8_0 KV cache's row format.
pub(crate) const Q8_0_BYTES: usize = size_of::<BlockQ8_0>();

/// The f16 at `b[at..at + 2]`.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// The six-bit scales and mins of a Q4_K/Q5_K block, as ggml's
/// `get_scale_min_k4` unpacks its 12 bytes.
#[inline(always)]
pub(crate) fn k4_scales(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..4 {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 6) << 4);
        m[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
    (sc, m)
}

/// The 16 signed six-bit scales of a Q3_K block.
#[inline(always)]
pub(crate) fn q3k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let low = (s[i % 8] >> (4 * (i / 8))) & 0x0f;
        let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        *o = ((low | (high << 4)) as i8) - 32;
    }
    out
}

/// The integer quant of element `i` (0..256) of a k-quant block, and for
/// Q2_K/Q4_K/Q5_K the unsigned value before its min is subtracted.
#[inline(always)]
pub(crate) fn q2k_quant(b: &[u8], i: usize) -> u8 {
    let (n, j, l) = (i / 128, (i % 128) / 32, i % 32);
    (b[16 + 32 * n + l] >> (2 * j)) & 3
}

#[inline(always)]
pub(crate) fn q3k_quant(b: &[u8], i: usize) -> i8 {
    let (n, j, l) = (i / 128, (i % 128) / 32, i % 32);
    let low = ((b[32 + 32 * n + l] >> (2 * j)) & 3) as i8;
    let high_set = (b[l] >> (i / 32)) & 1 == 1;
    if high_set {
        low
    } else {
        low - 4
    }
}

#[inline(always)]
pub(crate) fn q4k_quant(b: &[u8], i: usize) -> u8 {
    let (c, h, l) = (i / 64, (i % 64) / 32, i % 32);
    (b[16 + 32 * c + l] >> (4 * h)) & 0x0f
}

#[inline(always)]
pub(crate) fn q5k_quant(b: &[u8], i: usize) -> u8 {
    let (c, h, l) = (i / 64, (i % 64) / 32, i % 32);
    let low = (b[48 + 32 * c + l] >> (4 * h)) & 0x0f;
    let high = (b[16 + l] >> (i / 32)) & 1;
    low | (high << 4)
}

#[inline(always)]
pub(crate) fn q6k_quant(b: &[u8], i: usize) -> i8 {
    let (n, j, l) = (i / 128, (i % 128) / 32, i % 32);
    let low = (b[64 * n + 32 * (j % 2) + l] >> (4 * (j / 2))) & 0x0f;
    let high = (b[128 + 32 * n + l] >> (2 * j)) & 3;
    (low | (high << 4)) as i8 - 32
}

/// The unsigned 4- or 5-bit quant of element `j` (0..32) of a Q4/Q5 block
/// whose nibbles start at `qs` and (for Q5) whose high bits are `qh`.
#[inline(always)]
pub(crate) fn q4_quant(b: &[u8], qs: usize, j: usize) -> u8 {
    (b[qs + j % 16] >> (4 * (j / 16))) & 0x0f
}

#[inline(always)]
pub(crate) fn q5_quant(b: &[u8], qs: usize, j: usize) -> u8 {
    let qh = u32::from_le_bytes([b[qs - 4], b[qs - 3], b[qs - 2], b[qs - 1]]);
    q4_quant(b, qs, j) | ((((qh >> j) & 1) as u8) << 4)
}

/// Converts a row of `dst.len()` values stored as `ty` to f32; `dst.len()`
/// must be a whole number of blocks and `src` must hold them.
pub fn dequantize_row(ty: WeightType, src: &[u8], dst: &mut [f32]) {
    let be = ty.block_elems();
    assert!(
        dst.len().is_multiple_of(be),
        "{} rows hold whole blocks of {be} values, not {}",
        ty.name(),
        dst.len()
    );
    let need = ty.row_bytes(dst.len());
    assert!(
        src.len() >= need,
        "{} values of {} need {need} bytes, got {}",
        dst.len(),
        ty.name(),
        src.len()
    );
    let blocks = src[..need].chunks_exact(ty.block_bytes());
    for (b, out) in blocks.zip(dst.chunks_exact_mut(be)) {
        dequantize_block(ty, b, out);
    }
}

fn dequantize_block(ty: WeightType, b: &[u8], out: &mut [f32]) {
    match ty {
        WeightType::F32 => out[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        WeightType::F16 => out[0] = f16_at(b, 0),
        WeightType::BF16 => out[0] = crate::ops::bf16_to_f32(u16::from_le_bytes([b[0], b[1]])),
        WeightType::Q4_0 => {
            let d = f16_at(b, 0);
            for (j, o) in out.iter_mut().enumerate() {
                *o = d * (q4_quant(b, 2, j) as i32 - 8) as f32;
            }
        }
        WeightType::Q4_1 => {
            let (d, m) = (f16_at(b, 0), f16_at(b, 2));
            for (j, o) in out.iter_mut().enumerate() {
                *o = d * q4_quant(b, 4, j) as f32 + m;
            }
        }
        WeightType::Q5_0 => {
            let d = f16_at(b, 0);
            for (j, o) in out.iter_mut().enumerate() {
                *o = d * (q5_quant(b, 6, j) as i32 - 16) as f32;
            }
        }
        WeightType::Q5_1 => {
            let (d, m) = (f16_at(b, 0), f16_at(b, 2));
            for (j, o) in out.iter_mut().enumerate() {
                *o = d * q5_quant(b, 8, j) as f32 + m;
            }
        }
        WeightType::Q8_0 => {
            let d = f16_at(b, 0);
            for (o, &q) in out.iter_mut().zip(&b[2..34]) {
                *o = d * q as i8 as f32;
            }
        }
        WeightType::Q2_K => {
            let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
            for (i, o) in out.iter_mut().enumerate() {
                let s = b[i / 16];
                let q = q2k_quant(b, i);
                *o = d * (s & 0x0f) as f32 * q as f32 - dmin * (s >> 4) as f32;
            }
        }
        WeightType::Q3_K => {
            let d = f16_at(b, 108);
            let sc = q3k_scales(&b[96..108]);
            for (i, o) in out.iter_mut().enumerate() {
                *o = d * sc[i / 16] as f32 * q3k_quant(b, i) as f32;
            }
        }
        WeightType::Q4_K => {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let (sc, m) = k4_scales(&b[4..16]);
            for (i, o) in out.iter_mut().enumerate() {
                let s = i / 32;
                *o = d * sc[s] as f32 * q4k_quant(b, i) as f32 - dmin * m[s] as f32;
            }
        }
        WeightType::Q5_K => {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let (sc, m) = k4_scales(&b[4..16]);
            for (i, o) in out.iter_mut().enumerate() {
                let s = i / 32;
                *o = d * sc[s] as f32 * q5k_quant(b, i) as f32 - dmin * m[s] as f32;
            }
        }
        WeightType::Q6_K => {
            let d = f16_at(b, 208);
            for (i, o) in out.iter_mut().enumerate() {
                let sc = b[192 + i / 16] as i8;
                *o = d * sc as f32 * q6k_quant(b, i) as f32;
            }
        }
        WeightType::MXFP4 => {
            let d = e8m0_half(b[0]);
            for (j, o) in out.iter_mut().enumerate() {
                *o = d * mxfp4_quant(b, j) as f32;
            }
        }
    }
}

/// Element `j` (0..32) of an MXFP4 block as the integer of
/// [`MXFP4_VALUES`] (twice its e2m1 value).
#[inline(always)]
pub(crate) fn mxfp4_quant(b: &[u8], j: usize) -> i8 {
    MXFP4_VALUES[q4_quant(b, 1, j) as usize]
}

/// The scale and reciprocal for quantizing values of largest magnitude
/// `amax` to [-127, 127]; the SIMD quantizers use the same two numbers so
/// their quants match these bit for bit.
#[inline(always)]
pub(crate) fn q8_scale(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    (d, id)
}

/// Quantizes whole 32-value blocks to `Q8S`.
pub(crate) fn quantize_q8s(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.chunks_exact(32).zip(dst.chunks_exact_mut(Q8S_BYTES)) {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let (d, id) = q8_scale(amax);
        let mut sum = 0i32;
        for (o, &v) in out[4..].iter_mut().zip(x) {
            let q = (v * id).round_ties_even() as i8;
            sum += q as i32;
            *o = q as u8;
        }
        out[0..2].copy_from_slice(&crate::ops::f32_to_f16(d).to_le_bytes());
        out[2..4].copy_from_slice(&(sum as i16).to_le_bytes());
    }
}

/// Quantizes whole 256-value blocks to `Q8K`.
pub(crate) fn quantize_q8k(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.chunks_exact(256).zip(dst.chunks_exact_mut(Q8K_BYTES)) {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let (d, id) = q8_scale(amax);
        out[0..4].copy_from_slice(&d.to_le_bytes());
        for (g, xs) in x.chunks_exact(16).enumerate() {
            let mut sum = 0i32;
            for (i, &v) in xs.iter().enumerate() {
                let q = (v * id).round_ties_even() as i8;
                sum += q as i32;
                out[4 + 16 * g + i] = q as u8;
            }
            out[260 + 2 * g..262 + 2 * g].copy_from_slice(&(sum as i16).to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::f32_to_f16;

    fn h(x: f32) -> [u8; 2] {
        f32_to_f16(x).to_le_bytes()
    }

    fn deq(ty: WeightType, block: &[u8]) -> Vec<f32> {
        let mut out = vec![0.0; ty.block_elems()];
        dequantize_row(ty, block, &mut out);
        out
    }

    #[test]
    fn type_table_matches_ggml() {
        for ty in WeightType::ALL {
            assert_eq!(WeightType::from_ggml_id(ty.ggml_id()), Some(ty));
        }
        assert_eq!(WeightType::from_ggml_id(3), Some(WeightType::Q4_1));
        assert_eq!(WeightType::from_ggml_id(4), None);
        assert_eq!(WeightType::Q4_K.row_bytes(512), 288);
        assert_eq!(WeightType::Q8_0.row_bytes(576), 612);
        assert_eq!(WeightType::BF16.name(), "BF16");
    }

    #[test]
    fn floats() {
        assert_eq!(deq(WeightType::F32, &1.5f32.to_le_bytes()), [1.5]);
        assert_eq!(deq(WeightType::F16, &h(-0.25)), [-0.25]);
        assert_eq!(deq(WeightType::BF16, &[0xc0, 0x3f]), [1.5]);
    }

    #[test]
    fn q4_0_and_q4_1() {
        // Byte j holds element j (low nibble) and element j + 16 (high).
        let mut b = h(0.5).to_vec();
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let want: Vec<f32> = (0..32)
            .map(|i| if i < 16 { i as f32 - 8.0 } else { 31.0 - i as f32 - 8.0 } * 0.5)
            .collect();
        assert_eq!(deq(WeightType::Q4_0, &b), want);

        let mut b = h(2.0).to_vec();
        b.extend(h(-1.0));
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let want: Vec<f32> = (0..32)
            .map(|i| if i < 16 { i as f32 } else { 31.0 - i as f32 } * 2.0 - 1.0)
            .collect();
        assert_eq!(deq(WeightType::Q4_1, &b), want);
    }

    #[test]
    fn q5_0_and_q5_1() {
        // High bit j of qh belongs to element j; set it for odd elements.
        let qh = 0xaaaa_aaaau32.to_le_bytes();
        let nib = |i: usize| if i < 16 { i } else { 31 - i } as f32;
        let hi = |i: usize| if i % 2 == 1 { 16.0 } else { 0.0 };
        let mut b = h(0.25).to_vec();
        b.extend(qh);
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let want: Vec<f32> = (0..32).map(|i| (nib(i) + hi(i) - 16.0) * 0.25).collect();
        assert_eq!(deq(WeightType::Q5_0, &b), want);

        let mut b = h(0.5).to_vec();
        b.extend(h(3.0));
        b.extend(qh);
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let want: Vec<f32> = (0..32).map(|i| (nib(i) + hi(i)) * 0.5 + 3.0).collect();
        assert_eq!(deq(WeightType::Q5_1, &b), want);
    }

    #[test]
    fn q8_0() {
        let mut b = h(0.125).to_vec();
        b.extend((0..32).map(|i| (i as i8 * 4 - 64) as u8));
        let want: Vec<f32> = (0..32).map(|i| (i as f32 * 4.0 - 64.0) * 0.125).collect();
        assert_eq!(deq(WeightType::Q8_0, &b), want);
    }

    #[test]
    fn q2_k() {
        // Group g (16 values) has scale g % 16 and min 1; quant bits for
        // element n*128 + j*32 + l sit at bits 2j of qs[32n + l].
        let mut b: Vec<u8> = (0..16u8).map(|g| g | (1 << 4)).collect();
        b.extend((0..64).map(|i| {
            if i < 32 {
                0b11_10_01_00u8
            } else {
                0b00_01_10_11
            }
        }));
        b.extend(h(0.5));
        b.extend(h(0.25));
        let want: Vec<f32> = (0..256)
            .map(|i| {
                let j = (i % 128) / 32;
                let q = if i < 128 { j } else { 3 - j } as f32;
                0.5 * (i / 16) as f32 * q - 0.25
            })
            .collect();
        assert_eq!(deq(WeightType::Q2_K, &b), want);
    }

    #[test]
    fn q3_k() {
        // hmask bit (i / 32) of byte (i % 32) set for the first 128 values:
        // those keep their 2-bit quant, the rest have 4 subtracted.
        let mut b = vec![0x0fu8; 32];
        b.extend((0..64).map(|i| {
            if i < 32 {
                0b11_10_01_00u8
            } else {
                0b00_01_10_11
            }
        }));
        // Scales: byte i holds the low nibbles of groups i (1) and i + 8
        // (2); the high-bit bytes give every group 2 << 4, which the -32
        // offset cancels.
        b.extend([0x21u8; 8]);
        b.extend([0xaau8; 4]);
        b.extend(h(0.5));
        let want: Vec<f32> = (0..256)
            .map(|i| {
                let j = (i % 128) / 32;
                let q = if i < 128 {
                    j as f32
                } else {
                    (3 - j) as f32 - 4.0
                };
                let sc = if i / 16 < 8 { 1.0 } else { 2.0 };
                0.5 * sc * q
            })
            .collect();
        assert_eq!(deq(WeightType::Q3_K, &b), want);
    }

    /// 12 scale bytes packing sc = [1..=8] (j = 4..8 use the 2 high bits)
    /// and mins = [60, 2, 3, 4, 5, 6, 7, 63].
    fn k4_scale_bytes() -> ([u8; 12], [u8; 8], [u8; 8]) {
        let sc = [1u8, 2, 3, 4, 37, 38, 39, 40];
        let m = [60u8, 2, 3, 4, 5, 6, 7, 63];
        let mut s = [0u8; 12];
        for j in 0..4 {
            s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
            s[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
            s[j + 8] = (sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4);
        }
        (s, sc, m)
    }

    #[test]
    fn k4_scale_unpacking() {
        let (s, sc, m) = k4_scale_bytes();
        assert_eq!(k4_scales(&s), (sc, m));
    }

    #[test]
    fn q4_k_and_q5_k() {
        let (s, sc, m) = k4_scale_bytes();
        // qs[32c + l]: element 64c + l low nibble, 64c + 32 + l high nibble.
        let qs: Vec<u8> = (0..128)
            .map(|i| (i % 16) as u8 | (((i / 8) % 16) << 4) as u8)
            .collect();
        let q4 = |i: usize| {
            let (c, hh, l) = (i / 64, (i % 64) / 32, i % 32);
            let byte = 32 * c + l;
            if hh == 0 {
                byte % 16
            } else {
                (byte / 8) % 16
            }
        };
        let mut b = h(0.5).to_vec();
        b.extend(h(0.25));
        b.extend(s);
        b.extend(&qs);
        let want: Vec<f32> = (0..256)
            .map(|i| 0.5 * sc[i / 32] as f32 * q4(i) as f32 - 0.25 * m[i / 32] as f32)
            .collect();
        assert_eq!(deq(WeightType::Q4_K, &b), want);

        // qh bit (i / 32) of byte (i % 32): set for elements whose byte
        // index l is even and whose bit index is odd.
        let qh: Vec<u8> = (0..32).map(|l| if l % 2 == 0 { 0xaa } else { 0 }).collect();
        let mut b = h(0.5).to_vec();
        b.extend(h(0.25));
        b.extend(s);
        b.extend(&qh);
        b.extend(&qs);
        let want: Vec<f32> = (0..256)
            .map(|i| {
                let high = if (i % 32) % 2 == 0 && (i / 32) % 2 == 1 {
                    16
                } else {
                    0
                };
                0.5 * sc[i / 32] as f32 * (q4(i) + high) as f32 - 0.25 * m[i / 32] as f32
            })
            .collect();
        assert_eq!(deq(WeightType::Q5_K, &b), want);
    }

    #[test]
    fn q6_k() {
        // ql[64n + 32(j%2) + l] nibble (j/2); qh[32n + l] bits 2j.
        let ql: Vec<u8> = (0..128)
            .map(|i| (i % 16) as u8 | ((15 - i % 16) << 4) as u8)
            .collect();
        let qh: Vec<u8> = (0..64)
            .map(|i| if i < 32 { 0b11_10_01_00 } else { 0b01_01_01_01 })
            .collect();
        let scales: Vec<u8> = (0..16).map(|g| (g as i8 - 8) as u8).collect();
        let mut b = ql.clone();
        b.extend(&qh);
        b.extend(&scales);
        b.extend(h(0.5));
        let want: Vec<f32> = (0..256)
            .map(|i| {
                let (n, j, l) = (i / 128, (i % 128) / 32, i % 32);
                let byte = ql[64 * n + 32 * (j % 2) + l];
                let low = if j < 2 { byte & 15 } else { byte >> 4 };
                let high = (qh[32 * n + l] >> (2 * j)) & 3;
                let q = (low | (high << 4)) as f32 - 32.0;
                0.5 * ((i / 16) as f32 - 8.0) * q
            })
            .collect();
        assert_eq!(deq(WeightType::Q6_K, &b), want);
    }

    #[test]
    fn q8s_and_q8k_quantize_round_trip() {
        let x: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let mut q = vec![0u8; 16 * Q8S_BYTES];
        quantize_q8s(&x, &mut q);
        for (xs, b) in x.chunks(32).zip(q.chunks(Q8S_BYTES)) {
            let d = f16_at(b, 0);
            let sum = i16::from_le_bytes([b[2], b[3]]) as i32;
            let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert_eq!(sum, b[4..].iter().map(|&v| v as i8 as i32).sum::<i32>());
            for (&v, &qv) in xs.iter().zip(&b[4..]) {
                assert!((v - d * qv as i8 as f32).abs() <= amax / 254.0 + v.abs() / 2048.0);
            }
        }
        let mut q = vec![0u8; 2 * Q8K_BYTES];
        quantize_q8k(&x, &mut q);
        for (xs, b) in x.chunks(256).zip(q.chunks(Q8K_BYTES)) {
            let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for g in 0..16 {
                let sum: i32 = b[4 + 16 * g..20 + 16 * g]
                    .iter()
                    .map(|&v| v as i8 as i32)
                    .sum();
                assert_eq!(
                    sum,
                    i16::from_le_bytes([b[260 + 2 * g], b[261 + 2 * g]]) as i32
                );
            }
            for (&v, &qv) in xs.iter().zip(&b[4..260]) {
                assert!((v - d * qv as i8 as f32).abs() <= amax / 254.0 * 1.0001);
            }
        }
    }
}
