//! Weights of every type with sane scales, and the kinds each op is tried on.

use super::*;

pub(crate) fn f16_bytes(x: f32) -> [u8; 2] {
    ops::f32_to_f16(x).to_le_bytes()
}

pub(crate) fn bf16_of(x: f32) -> u16 {
    let bits = x.to_bits();
    (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

pub(crate) fn random_blocks(rng: &mut Rng, ty: WeightType, rows: usize, cols: usize) -> Vec<u8> {
    let n = rows * cols;
    match ty {
        WeightType::F32 => return f32_bytes(&uniform(rng, n)),
        WeightType::F16 => return uniform(rng, n).iter().flat_map(|&x| f16_bytes(x)).collect(),
        WeightType::BF16 => {
            return uniform(rng, n)
                .iter()
                .flat_map(|&x| bf16_of(x).to_le_bytes())
                .collect()
        }
        _ => {}
    }
    let bytes = ty.row_bytes(cols) * rows;
    let mut data: Vec<u8> = (0..bytes).map(|_| rng.next_u64() as u8).collect();
    // (offset of d, offset of a min or dmin) within each block.
    let (d, m): (usize, Option<usize>) = match ty {
        WeightType::Q4_0 | WeightType::Q5_0 | WeightType::Q8_0 => (0, None),
        WeightType::Q4_1 | WeightType::Q5_1 | WeightType::Q4_K | WeightType::Q5_K => (0, Some(2)),
        WeightType::Q2_K => (80, Some(82)),
        WeightType::Q3_K => (108, None),
        WeightType::Q6_K => (208, None),
        WeightType::MXFP4 => {
            // An e8m0 scale byte of 2^-8 .. 2^-6 (values up to 0.19).
            for b in data.chunks_exact_mut(ty.block_bytes()) {
                b[0] = 120 + rng.below(3) as u8;
            }
            return data;
        }
        _ => unreachable!(),
    };
    for b in data.chunks_exact_mut(ty.block_bytes()) {
        let scale = 0.002 + 0.01 * (rng.f32_in(-1.0..1.0) + 1.0);
        b[d..d + 2].copy_from_slice(&f16_bytes(scale));
        if let Some(m) = m {
            b[m..m + 2].copy_from_slice(&f16_bytes(0.01 * rng.f32_in(-1.0..1.0)));
        }
    }
    data
}

/// A random matrix of `kind` (a ggml type, or MLX affine `bits` as
/// `Err(bits)`), with its f32 values for the reference.
pub(crate) fn random_matrix(
    rng: &mut Rng,
    kind: Result<WeightType, u32>,
    rows: usize,
    cols: usize,
) -> (HostMatrix, Vec<f32>) {
    match kind {
        Ok(ty) => {
            let data = random_blocks(rng, ty, rows, cols);
            let mut values = vec![0f32; rows * cols];
            let rb = ty.row_bytes(cols);
            for r in 0..rows {
                dequantize_row(
                    ty,
                    &data[r * rb..(r + 1) * rb],
                    &mut values[r * cols..(r + 1) * cols],
                );
            }
            let m = HostMatrix {
                data: host(data),
                storage: MatrixStorage::Blocks(ty),
                rows,
                cols,
            };
            (m, values)
        }
        Err(bits) => {
            let group = 64;
            let words = rows * cols * bits as usize / 32;
            let packed: Vec<u8> = (0..4 * words).map(|_| rng.next_u64() as u8).collect();
            let halves = rows * cols / group;
            let bf16 = bits == 8;
            let half = |x: f32| {
                if bf16 {
                    bf16_of(x).to_le_bytes()
                } else {
                    f16_bytes(x)
                }
            };
            let scales: Vec<u8> = (0..halves)
                .flat_map(|_| half(0.01 + 0.01 * rng.f32_in(-1.0..1.0)))
                .collect();
            let biases: Vec<u8> = (0..halves)
                .flat_map(|_| half(0.05 * rng.f32_in(-1.0..1.0)))
                .collect();
            let w = AffineWeights {
                bits,
                group,
                rows,
                cols,
                packed: &packed,
                scales: &scales,
                biases: &biases,
                bf16,
            };
            let mut values = vec![0f32; rows * cols];
            for r in 0..rows {
                affine_dequantize_row(&w, r, &mut values[r * cols..(r + 1) * cols]);
            }
            let m = HostMatrix {
                data: host(packed),
                storage: MatrixStorage::Affine {
                    bits,
                    group,
                    scales: host(scales),
                    biases: host(biases),
                    bf16,
                },
                rows,
                cols,
            };
            (m, values)
        }
    }
}

pub(crate) fn kind_name(kind: Result<WeightType, u32>) -> String {
    match kind {
        Ok(t) => t.name().to_string(),
        Err(b) => format!("MLX affine {b}-bit"),
    }
}

/// Every weight kind: the ggml types and MLX affine 2, 4 and 8 bits.
pub(crate) fn all_kinds() -> Vec<Result<WeightType, u32>> {
    let mut v: Vec<_> = WeightType::ALL.iter().map(|&t| Ok(t)).collect();
    v.extend([Err(2), Err(4), Err(8)]);
    v
}
