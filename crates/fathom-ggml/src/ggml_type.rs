//! ggml tensor types and their block layouts.
//!
//! The ids, block sizes and block bytes follow ggml's `type_traits` table
//! (`ggml.c`) and the block structs of `ggml-common.h` (NVFP4 = 40 and
//! Q1_0 = 41 are the newest, as numbered by gguf-py 0.19); the unit test below
//! re-derives every block size from those structs' fields so a typo in the
//! table cannot pass silently. Ids 4, 5 and 31–33, 36–38 were retired by
//! ggml and never appear in GGUF files, so they are rejected like any other
//! unknown id.

use std::fmt;

/// A ggml tensor type as numbered in the GGUF format.
///
/// Variant names are spelled as llama.cpp prints them (`Q4_K`, `IQ2_XXS`),
/// so they can be matched by eye against its logs and `gguf-py`.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
}

/// The traits of one type, kept in a single row so id, name and layout
/// cannot drift apart.
struct Traits {
    id: u32,
    name: &'static str,
    block_elems: u64,
    block_bytes: u64,
}

const fn t(id: u32, name: &'static str, block_elems: u64, block_bytes: u64) -> Traits {
    Traits {
        id,
        name,
        block_elems,
        block_bytes,
    }
}

impl GgmlType {
    /// Every type fathom knows, in id order; used to parse ids and to list
    /// the valid ids in error messages.
    pub const ALL: [GgmlType; 34] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ1_S,
        GgmlType::IQ4_NL,
        GgmlType::IQ3_S,
        GgmlType::IQ2_S,
        GgmlType::IQ4_XS,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
        GgmlType::I64,
        GgmlType::F64,
        GgmlType::IQ1_M,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
        GgmlType::NVFP4,
        GgmlType::Q1_0,
    ];

    const fn traits(self) -> Traits {
        use GgmlType::*;
        match self {
            F32 => t(0, "F32", 1, 4),
            F16 => t(1, "F16", 1, 2),
            Q4_0 => t(2, "Q4_0", 32, 18),
            Q4_1 => t(3, "Q4_1", 32, 20),
            Q5_0 => t(6, "Q5_0", 32, 22),
            Q5_1 => t(7, "Q5_1", 32, 24),
            Q8_0 => t(8, "Q8_0", 32, 34),
            // ggml's block_q8_1 holds two f16 (d, s): 36 bytes. gguf-py's
            // table says 40 (two f32), which ggml never wrote.
            Q8_1 => t(9, "Q8_1", 32, 36),
            Q2_K => t(10, "Q2_K", 256, 84),
            Q3_K => t(11, "Q3_K", 256, 110),
            Q4_K => t(12, "Q4_K", 256, 144),
            Q5_K => t(13, "Q5_K", 256, 176),
            Q6_K => t(14, "Q6_K", 256, 210),
            Q8_K => t(15, "Q8_K", 256, 292),
            IQ2_XXS => t(16, "IQ2_XXS", 256, 66),
            IQ2_XS => t(17, "IQ2_XS", 256, 74),
            IQ3_XXS => t(18, "IQ3_XXS", 256, 98),
            IQ1_S => t(19, "IQ1_S", 256, 50),
            IQ4_NL => t(20, "IQ4_NL", 32, 18),
            IQ3_S => t(21, "IQ3_S", 256, 110),
            IQ2_S => t(22, "IQ2_S", 256, 82),
            IQ4_XS => t(23, "IQ4_XS", 256, 136),
            I8 => t(24, "I8", 1, 1),
            I16 => t(25, "I16", 1, 2),
            I32 => t(26, "I32", 1, 4),
            I64 => t(27, "I64", 1, 8),
            F64 => t(28, "F64", 1, 8),
            IQ1_M => t(29, "IQ1_M", 256, 56),
            BF16 => t(30, "BF16", 1, 2),
            TQ1_0 => t(34, "TQ1_0", 256, 54),
            TQ2_0 => t(35, "TQ2_0", 256, 66),
            MXFP4 => t(39, "MXFP4", 32, 17),
            NVFP4 => t(40, "NVFP4", 64, 36),
            Q1_0 => t(41, "Q1_0", 128, 18),
        }
    }

    /// Parses the on-disk type id; `None` for ids fathom does not know.
    pub fn from_id(id: u32) -> Option<Self> {
        GgmlType::ALL.into_iter().find(|ty| ty.id() == id)
    }
    /// The on-disk id.
    #[inline]
    pub const fn id(self) -> u32 {
        self.traits().id
    }
    /// Canonical name as llama.cpp prints it, e.g. "Q4_K", "F16", "IQ2_XXS".
    #[inline]
    pub const fn name(self) -> &'static str {
        self.traits().name
    }
    /// Elements per block (1 for plain types, 32 or 256 for quantized ones).
    #[inline]
    pub const fn block_elems(self) -> u64 {
        self.traits().block_elems
    }
    /// Bytes per block.
    #[inline]
    pub const fn block_bytes(self) -> u64 {
        self.traits().block_bytes
    }
    /// Bytes of a row of `n` elements; `None` if `n` is not a whole number
    /// of blocks or the product overflows.
    // `u64::is_multiple_of` needs Rust 1.87; the workspace targets 1.80.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let Traits {
            block_elems,
            block_bytes,
            ..
        } = self.traits();
        if !n.is_multiple_of(block_elems) {
            return None;
        }
        (n / block_elems).checked_mul(block_bytes)
    }
    /// Bytes of `n` elements rounded up to whole blocks (a partial block
    /// costs a whole one), saturating at `u64::MAX`.
    pub const fn padded_row_bytes(self, n: u64) -> u64 {
        n.div_ceil(self.block_elems())
            .saturating_mul(self.block_bytes())
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::GgmlType::{self, *};

    /// Block bytes re-derived from the fields of ggml's block structs
    /// (`ggml-common.h`), written the way the structs' `static_assert`s are.
    fn struct_layout_bytes(ty: GgmlType) -> u64 {
        const QK_K: u64 = 256;
        const HALF: u64 = 2; // ggml_half
        const K_SCALE_SIZE: u64 = 12;
        match ty {
            F32 | I32 => 4,
            F16 | BF16 | I16 => HALF,
            I8 => 1,
            F64 | I64 => 8,
            Q4_0 => HALF + 32 / 2,                                  // d, qs
            Q4_1 => 2 * HALF + 32 / 2,                              // d, m, qs
            Q5_0 => HALF + 4 + 32 / 2,                              // d, qh, qs
            Q5_1 => 2 * HALF + 4 + 32 / 2,                          // d, m, qh, qs
            Q8_0 => HALF + 32,                                      // d, qs
            Q8_1 => 2 * HALF + 32,                                  // d, s, qs
            Q2_K => 2 * HALF + QK_K / 16 + QK_K / 4,                // d, dmin, scales, qs
            Q3_K => HALF + QK_K / 4 + QK_K / 8 + 12,                // d, qs, hmask, scales
            Q4_K => 2 * HALF + K_SCALE_SIZE + QK_K / 2,             // d, dmin, scales, qs
            Q5_K => 2 * HALF + K_SCALE_SIZE + QK_K / 2 + QK_K / 8,  // + qh
            Q6_K => HALF + QK_K / 16 + 3 * QK_K / 4,                // d, scales, ql + qh
            Q8_K => 4 + QK_K + QK_K / 16 * 2,                       // f32 d, qs, i16 bsums
            IQ2_XXS => HALF + QK_K / 8 * 2,                         // d, u16 qs
            IQ2_XS => HALF + QK_K / 8 * 2 + QK_K / 32,              // d, u16 qs, scales
            IQ3_XXS => HALF + 3 * (QK_K / 8),                       // d, qs
            IQ1_S => HALF + QK_K / 8 + QK_K / 16,                   // d, qs, u16 qh
            IQ4_NL => HALF + 32 / 2,                                // d, qs
            IQ3_S => HALF + 13 * (QK_K / 32) + QK_K / 64,           // d, qs+qh+signs, scales
            IQ2_S => HALF + QK_K / 4 + QK_K / 16,                   // d, qs, qh + scales
            IQ4_XS => HALF + 2 + QK_K / 64 + QK_K / 2,              // d, scales_h, scales_l, qs
            IQ1_M => QK_K / 8 + QK_K / 16 + QK_K / 32,              // qs, qh, scales
            TQ1_0 => HALF + QK_K / 64 + (QK_K - 4 * QK_K / 64) / 5, // d, qh, qs
            TQ2_0 => HALF + QK_K / 4,                               // d, qs
            MXFP4 => 1 + 32 / 2,                                    // e8m0 e, qs
            NVFP4 => 64 / 16 + 64 / 2,                              // ue4m3 d[4], qs
            Q1_0 => HALF + 128 / 8,                                 // d, qs
        }
    }

    #[test]
    fn block_bytes_match_struct_layouts() {
        for ty in GgmlType::ALL {
            assert_eq!(ty.block_bytes(), struct_layout_bytes(ty), "{ty}");
        }
    }

    #[test]
    fn ids_round_trip_and_are_unique() {
        for ty in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(ty.id()), Some(ty), "{ty}");
            assert_eq!(format!("{ty:?}"), ty.name());
        }
        let mut ids: Vec<u32> = GgmlType::ALL.iter().map(|ty| ty.id()).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), GgmlType::ALL.len());
    }

    #[test]
    fn retired_and_unknown_ids_are_rejected() {
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 42, 1000, u32::MAX] {
            assert_eq!(GgmlType::from_id(id), None, "{id}");
        }
    }

    #[test]
    fn block_elems_follow_the_block_structs() {
        for ty in GgmlType::ALL {
            let expected = match ty {
                F32 | F16 | BF16 | F64 | I8 | I16 | I32 | I64 => 1,
                Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4_NL | MXFP4 => 32,
                NVFP4 => 64,
                Q1_0 => 128,
                _ => 256,
            };
            assert_eq!(ty.block_elems(), expected, "{ty}");
        }
    }

    #[test]
    fn padded_rows_round_up_and_saturate() {
        assert_eq!(Q8_0.padded_row_bytes(64), 68);
        assert_eq!(Q8_0.padded_row_bytes(33), 68);
        assert_eq!(F16.padded_row_bytes(7), 14);
        assert_eq!(F32.padded_row_bytes(u64::MAX), u64::MAX);
    }

    #[test]
    fn row_bytes_needs_whole_blocks_and_does_not_overflow() {
        assert_eq!(Q4_K.row_bytes(512), Some(288));
        assert_eq!(Q4_1.row_bytes(576), Some(18 * 20));
        assert_eq!(F32.row_bytes(0), Some(0));
        assert_eq!(Q4_K.row_bytes(255), None);
        assert_eq!(Q8_0.row_bytes(33), None);
        assert_eq!(F32.row_bytes(u64::MAX), None);
        assert_eq!(I8.row_bytes(u64::MAX), Some(u64::MAX));
        assert_eq!(Q8_0.row_bytes(u64::MAX / 32 * 32), None);
    }
}
