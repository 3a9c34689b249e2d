//! The blocks the CPU kernels read and write, as `ggml-common.h` declares
//! them (f16 fields are raw `u16` bits, little-endian on disk).
//!
//! The kernels address blocks by byte offset rather than through these
//! structs; the structs pin those offsets and sizes down. Every size is
//! checked at compile time twice: against the number `ggml-common.h`'s own
//! `static_assert` gives, and against the [`GgmlType`] table row (or the
//! [`ActFormat`] it belongs to).

use std::mem::{offset_of, size_of};

use crate::{ActFormat, GgmlType};

/// Elements per block of the 32-value types.
pub const QK: usize = 32;
/// Elements per block of the k-quants ("super-blocks").
pub const QK_K: usize = 256;

/// `block_q4_0`: x = d * (q - 8), q in 0..16.
#[repr(C)]
pub struct BlockQ4_0 {
    pub d: u16,
    /// Element j in the low nibble of byte j, element j + 16 in its high one.
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_0>() == 18);

/// `block_q4_1`: x = d * q + m.
#[repr(C)]
pub struct BlockQ4_1 {
    pub d: u16,
    pub m: u16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_1>() == 20);

/// `block_q5_0`: x = d * (q - 16), the fifth bit of element j at bit j of `qh`.
#[repr(C)]
pub struct BlockQ5_0 {
    pub d: u16,
    /// A little-endian u32 (bytes, so the block stays 2-aligned).
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ5_0>() == 22);

/// `block_q5_1`: x = d * q + m.
#[repr(C)]
pub struct BlockQ5_1 {
    pub d: u16,
    pub m: u16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ5_1>() == 24);

/// `block_q8_0`: x = d * q; also the q8_0 KV cache's row format.
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: u16,
    pub qs: [i8; QK],
}
const _: () = assert!(size_of::<BlockQ8_0>() == 34);

/// `block_mxfp4`: x = kvalues_mxfp4[q] * 2^(e - 128), where the table
/// holds twice the e2m1 values ([`MXFP4_VALUES`]) and so the scale is half
/// of e8m0's 2^(e - 127) ([`e8m0_half`]). The nibbles are laid out as
/// Q4_0's: element j in the low nibble of byte j, j + 16 in its high one.
#[repr(C)]
pub struct BlockMxfp4 {
    pub e: u8,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockMxfp4>() == 17);

/// ggml's `kvalues_mxfp4`: the e2m1 values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and
/// their negatives, doubled to integers.
pub const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// An MXFP4 block's scale for [`MXFP4_VALUES`]: 2^(e - 128), exactly as
/// ggml's `GGML_E8M0_TO_FP32_HALF` (subnormal for e < 2).
#[inline]
pub const fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// `block_q2_K`: 16 groups of 16, each with a 4-bit scale and min.
#[repr(C)]
pub struct BlockQ2_K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: u16,
    pub dmin: u16,
}
const _: () = assert!(size_of::<BlockQ2_K>() == 84);

/// `block_q3_K`: 16 groups of 16 with signed 6-bit scales.
#[repr(C)]
pub struct BlockQ3_K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: u16,
}
const _: () = assert!(size_of::<BlockQ3_K>() == 110);

/// `block_q4_K`: 8 groups of 32 with 6-bit scales and mins.
#[repr(C)]
pub struct BlockQ4_K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ4_K>() == 144);

/// `block_q5_K`: Q4_K plus a fifth bit per element.
#[repr(C)]
pub struct BlockQ5_K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ5_K>() == 176);

/// `block_q6_K`: 16 groups of 16 with signed 8-bit scales.
#[repr(C)]
pub struct BlockQ6_K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: u16,
}
const _: () = assert!(size_of::<BlockQ6_K>() == 210);

/// `block_q8_K`: the k-quants' activation format ([`ActFormat::Q8K`]): an
/// f32 scale, 256 quants and the sums of each 16 of them.
#[repr(C)]
pub struct BlockQ8_K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}
const _: () = assert!(size_of::<BlockQ8_K>() == 292);

/// fathom's `Q8S`, the 32-value types' activation format
/// ([`ActFormat::Q8S`]): an f16 scale, the i16 sum of the quants (which
/// turns a weight offset or minimum into one product per block) and 32
/// quants. ggml's `block_q8_1` has the same size but stores d * sum as f16.
#[repr(C)]
pub struct BlockQ8S {
    pub d: u16,
    pub sum: i16,
    pub qs: [i8; QK],
}
const _: () = assert!(size_of::<BlockQ8S>() == 36);

// The structs and the tables agree.
const fn table_is(ty: GgmlType, elems: usize, bytes: usize) -> bool {
    ty.block_elems() == elems as u64 && ty.block_bytes() == bytes as u64
}
const _: () = {
    assert!(table_is(GgmlType::Q4_0, QK, size_of::<BlockQ4_0>()));
    assert!(table_is(GgmlType::Q4_1, QK, size_of::<BlockQ4_1>()));
    assert!(table_is(GgmlType::Q5_0, QK, size_of::<BlockQ5_0>()));
    assert!(table_is(GgmlType::Q5_1, QK, size_of::<BlockQ5_1>()));
    assert!(table_is(GgmlType::Q8_0, QK, size_of::<BlockQ8_0>()));
    assert!(table_is(GgmlType::Q2_K, QK_K, size_of::<BlockQ2_K>()));
    assert!(table_is(GgmlType::Q3_K, QK_K, size_of::<BlockQ3_K>()));
    assert!(table_is(GgmlType::Q4_K, QK_K, size_of::<BlockQ4_K>()));
    assert!(table_is(GgmlType::Q5_K, QK_K, size_of::<BlockQ5_K>()));
    assert!(table_is(GgmlType::Q6_K, QK_K, size_of::<BlockQ6_K>()));
    assert!(table_is(GgmlType::Q8_K, QK_K, size_of::<BlockQ8_K>()));
    assert!(table_is(GgmlType::MXFP4, QK, size_of::<BlockMxfp4>()));
    assert!(ActFormat::Q8S.block_elems() == QK);
    assert!(ActFormat::Q8S.block_bytes() == size_of::<BlockQ8S>());
    assert!(ActFormat::Q8K.block_elems() == QK_K);
    assert!(ActFormat::Q8K.block_bytes() == size_of::<BlockQ8_K>());
};

/// Byte offsets of the f16 scale fields (`d`, and `m` or `dmin`) of each
/// block above, for [`crate::WeightType::f16_scales`].
pub(crate) const Q4_0_SCALES: &[usize] = &[offset_of!(BlockQ4_0, d)];
pub(crate) const Q4_1_SCALES: &[usize] = &[offset_of!(BlockQ4_1, d), offset_of!(BlockQ4_1, m)];
pub(crate) const Q5_0_SCALES: &[usize] = &[offset_of!(BlockQ5_0, d)];
pub(crate) const Q5_1_SCALES: &[usize] = &[offset_of!(BlockQ5_1, d), offset_of!(BlockQ5_1, m)];
pub(crate) const Q8_0_SCALES: &[usize] = &[offset_of!(BlockQ8_0, d)];
pub(crate) const Q2_K_SCALES: &[usize] = &[offset_of!(BlockQ2_K, d), offset_of!(BlockQ2_K, dmin)];
pub(crate) const Q3_K_SCALES: &[usize] = &[offset_of!(BlockQ3_K, d)];
pub(crate) const Q4_K_SCALES: &[usize] = &[offset_of!(BlockQ4_K, d), offset_of!(BlockQ4_K, dmin)];
pub(crate) const Q5_K_SCALES: &[usize] = &[offset_of!(BlockQ5_K, d), offset_of!(BlockQ5_K, dmin)];
pub(crate) const Q6_K_SCALES: &[usize] = &[offset_of!(BlockQ6_K, d)];

#[cfg(test)]
mod tests {
    use super::*;

    /// The offsets the kernels index blocks by.
    #[test]
    fn field_offsets_match_the_kernels() {
        assert_eq!(offset_of!(BlockQ5_0, qs), 6);
        assert_eq!(offset_of!(BlockQ5_1, qs), 8);
        assert_eq!(offset_of!(BlockQ2_K, qs), 16);
        assert_eq!(offset_of!(BlockQ3_K, qs), 32);
        assert_eq!(offset_of!(BlockQ3_K, scales), 96);
        assert_eq!(offset_of!(BlockQ4_K, scales), 4);
        assert_eq!(offset_of!(BlockQ4_K, qs), 16);
        assert_eq!(offset_of!(BlockQ5_K, qh), 16);
        assert_eq!(offset_of!(BlockQ5_K, qs), 48);
        assert_eq!(offset_of!(BlockQ6_K, qh), 128);
        assert_eq!(offset_of!(BlockQ6_K, scales), 192);
        assert_eq!(offset_of!(BlockQ8_K, qs), 4);
        assert_eq!(offset_of!(BlockQ8_K, bsums), 260);
        assert_eq!(offset_of!(BlockQ8S, qs), 4);
        assert_eq!(Q2_K_SCALES, [80, 82]);
        assert_eq!(Q3_K_SCALES, [108]);
        assert_eq!(Q6_K_SCALES, [208]);
        assert_eq!(offset_of!(BlockMxfp4, qs), 1);
    }

    #[test]
    fn e8m0_half_is_two_to_the_e_minus_128() {
        assert_eq!(e8m0_half(128), 1.0);
        assert_eq!(e8m0_half(127), 0.5);
        assert_eq!(e8m0_half(121), 1.0 / 128.0);
        assert_eq!(e8m0_half(255), 2f32.powi(127));
        assert_eq!(e8m0_half(2), 2f32.powi(-126));
        assert_eq!(e8m0_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_half(0), 2f32.powi(-128));
    }
}
