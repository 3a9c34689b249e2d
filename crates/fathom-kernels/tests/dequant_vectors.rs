//! `dequantize_row` against values recorded from the `gguf` Python
//! package's own dequantizer (`tests/data/gen_dequant_vectors.py`), an
//! implementation that shares no code with ours.

use fathom_kernels::{dequantize_row, WeightType};

const DATA: &[u8] = include_bytes!("data/dequant_vectors.bin");

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

#[test]
fn every_type_matches_gguf_py_bit_for_bit() {
    assert_eq!(&DATA[..4], b"FKDQ");
    assert_eq!(u32_at(DATA, 4), 1, "file version");
    let entries = u32_at(DATA, 8) as usize;
    let mut at = 12;
    let mut seen = Vec::new();
    for _ in 0..entries {
        let (id, n, len) = (
            u32_at(DATA, at),
            u32_at(DATA, at + 4) as usize,
            u32_at(DATA, at + 8) as usize,
        );
        at += 12;
        let ty = WeightType::from_ggml_id(id).unwrap_or_else(|| panic!("unknown ggml type {id}"));
        let raw = &DATA[at..at + len];
        at += len;
        let want: Vec<f32> = DATA[at..at + 4 * n]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        at += 4 * n;
        assert_eq!(ty.row_bytes(n), len, "{}", ty.name());
        let mut got = vec![0.0f32; n];
        dequantize_row(ty, raw, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // Both evaluate (d * scale) * q - (dmin * min) in f32, so the
            // results agree exactly.
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{} value {i}: {g} vs {w}",
                ty.name()
            );
        }
        seen.push(ty);
    }
    assert_eq!(at, DATA.len());
    assert_eq!(seen, WeightType::ALL);
}
