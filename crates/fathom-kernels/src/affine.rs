//! MLX affine-quantized weights: `bits`-bit unsigned values packed
//! little-endian into u32 words (value k of a word in bits k·bits..), each
//! group of `group` values of a row with its own scale and bias, stored
//! f16 or bf16: w = scale · q + bias. Read in place like every other
//! weight type; the portable path dequantizes a group at a time on the fly.

use crate::ops;
use crate::Pool;

/// One affine-quantized matrix: `rows` rows of `cols` values.
#[derive(Clone, Copy)]
pub struct AffineWeights<'a> {
    pub bits: u32,
    pub group: usize,
    pub rows: usize,
    pub cols: usize,
    /// `rows × cols·bits/32` little-endian u32 words.
    pub packed: &'a [u8],
    /// `rows × cols/group` scales and biases, f16 (or bf16 when `bf16`).
    pub scales: &'a [u8],
    pub biases: &'a [u8],
    pub bf16: bool,
}

/// Bit widths whose values never straddle a word.
pub const AFFINE_BITS: [u32; 3] = [2, 4, 8];

impl AffineWeights<'_> {
    fn half(&self, bytes: &[u8], i: usize) -> f32 {
        let h = u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]);
        if self.bf16 {
            ops::bf16_to_f32(h)
        } else {
            ops::f16_to_f32(h)
        }
    }

    /// Row `row`'s group `g` dequantized into `dst` (`group` values).
    fn group_values(&self, row: usize, g: usize, dst: &mut [f32]) {
        let per_word = (32 / self.bits) as usize;
        let mask = (1u32 << self.bits) - 1;
        let groups = self.cols / self.group;
        let scale = self.half(self.scales, row * groups + g);
        let bias = self.half(self.biases, row * groups + g);
        let words_per_row = self.cols / per_word;
        let first_word = row * words_per_row + g * self.group / per_word;
        for (w, chunk) in dst.chunks_mut(per_word).enumerate() {
            let o = 4 * (first_word + w);
            let word = u32::from_le_bytes([
                self.packed[o],
                self.packed[o + 1],
                self.packed[o + 2],
                self.packed[o + 3],
            ]);
            for (k, d) in chunk.iter_mut().enumerate() {
                *d = scale * ((word >> (k as u32 * self.bits)) & mask) as f32 + bias;
            }
        }
    }

    fn check(&self) {
        assert!(
            AFFINE_BITS.contains(&self.bits),
            "affine weights of {} bits",
            self.bits
        );
        assert!(
            self.group > 0
                && self.cols.is_multiple_of(self.group)
                && self.group.is_multiple_of((32 / self.bits) as usize)
        );
        let words = self.rows * self.cols * self.bits as usize / 32;
        let halves = self.rows * (self.cols / self.group);
        assert!(
            self.packed.len() >= 4 * words
                && self.scales.len() >= 2 * halves
                && self.biases.len() >= 2 * halves
        );
    }
}

/// Row `row` of `w` as f32 (embedding lookup).
pub fn affine_dequantize_row(w: &AffineWeights, row: usize, dst: &mut [f32]) {
    w.check();
    for (g, chunk) in dst[..w.cols].chunks_mut(w.group).enumerate() {
        w.group_values(row, g, chunk);
    }
}

/// Largest group the on-stack dequantization buffer holds.
const MAX_GROUP: usize = 1024;

/// out[t · rows + r] = dot(row r of w, x[t · cols ..]) for t in 0..n_tokens,
/// rows split across the pool.
pub fn affine_matmul(pool: &Pool, w: &AffineWeights, x: &[f32], n_tokens: usize, out: &mut [f32]) {
    w.check();
    assert!(w.group <= MAX_GROUP && x.len() >= n_tokens * w.cols && out.len() >= n_tokens * w.rows);
    struct Out(*mut f32);
    // SAFETY: each worker writes only the rows it owns (r ≡ worker mod n).
    unsafe impl Sync for Out {}
    impl Out {
        fn ptr(&self) -> *mut f32 {
            self.0
        }
    }
    let shared = Out(out.as_mut_ptr());
    let (rows, cols) = (w.rows, w.cols);
    pool.run(&|worker, workers| {
        let mut values = [0f32; MAX_GROUP];
        for r in (worker..rows).step_by(workers) {
            let mut acc = [0f32; 64];
            for t0 in (0..n_tokens).step_by(acc.len()) {
                let tn = (n_tokens - t0).min(acc.len());
                acc[..tn].fill(0.0);
                for g in 0..cols / w.group {
                    let v = &mut values[..w.group];
                    w.group_values(r, g, v);
                    for (t, a) in acc[..tn].iter_mut().enumerate() {
                        let xs = &x[(t0 + t) * cols + g * w.group..][..w.group];
                        *a += ops::dot_f32(v, xs);
                    }
                }
                for (t, a) in acc[..tn].iter().enumerate() {
                    // SAFETY: row r belongs to this worker alone, and
                    // (t0 + t) · rows + r < n_tokens · rows ≤ out.len().
                    unsafe { *shared.ptr().add((t0 + t) * rows + r) = *a };
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn halves(xs: &[f32]) -> Vec<u8> {
        xs.iter()
            .flat_map(|&x| ops::f32_to_f16(x).to_le_bytes())
            .collect()
    }

    #[test]
    fn unpacks_little_endian_values_and_applies_scale_and_bias() {
        // One row of 8 four-bit values 0..7 in one word, group 8, scale 0.5, bias -1.
        let word: u32 = (0..8).map(|k| (k as u32) << (4 * k)).sum();
        let (scales, biases) = (halves(&[0.5]), halves(&[-1.0]));
        let w = AffineWeights {
            bits: 4,
            group: 8,
            rows: 1,
            cols: 8,
            packed: &word.to_le_bytes(),
            scales: &scales,
            biases: &biases,
            bf16: false,
        };
        let mut row = [0f32; 8];
        affine_dequantize_row(&w, 0, &mut row);
        assert_eq!(row, [-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5]);
        let pool = Pool::new(2);
        let x = [1.0f32; 16];
        let mut out = [0f32; 2];
        affine_matmul(&pool, &w, &x, 2, &mut out);
        assert_eq!(out, [6.0, 6.0]);
    }

    #[test]
    fn matmul_equals_dequantized_dot_for_8_and_2_bits() {
        let pool = Pool::new(3);
        for bits in [8u32, 2] {
            let (rows, cols, group) = (5usize, 128usize, 32usize);
            let words: Vec<u8> = (0..rows * cols * bits as usize / 32)
                .flat_map(|i| ((i as u32).wrapping_mul(2_654_435_761)).to_le_bytes())
                .collect();
            let groups = rows * cols / group;
            let scales = halves(
                &(0..groups)
                    .map(|i| 0.01 + i as f32 * 0.001)
                    .collect::<Vec<_>>(),
            );
            let biases = halves(
                &(0..groups)
                    .map(|i| -0.1 + i as f32 * 0.003)
                    .collect::<Vec<_>>(),
            );
            let w = AffineWeights {
                bits,
                group,
                rows,
                cols,
                packed: &words,
                scales: &scales,
                biases: &biases,
                bf16: false,
            };
            let x: Vec<f32> = (0..3 * cols)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) / 6.0)
                .collect();
            let mut out = vec![0f32; 3 * rows];
            affine_matmul(&pool, &w, &x, 3, &mut out);
            for r in 0..rows {
                let mut row = vec![0f32; cols];
                affine_dequantize_row(&w, r, &mut row);
                for t in 0..3 {
                    let want: f32 = row.iter().zip(&x[t * cols..]).map(|(a, b)| a * b).sum();
                    assert!(
                        (out[t * rows + r] - want).abs() < 1e-4 * (1.0 + want.abs()),
                        "{bits} bits"
                    );
                }
            }
        }
    }
}
