//! The ggml types fathom's CPU kernels run, and the activation format a
//! matmul against each quantizes its input into.

use std::mem::size_of;

use crate::blocks::{self, BlockQ8S, BlockQ8_K, QK, QK_K};
use crate::GgmlType;

/// Weight storage types the CPU kernels run (and the fixtures write): a
/// subset of [`GgmlType`], whose table row gives each one's layout.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    /// OCP microscaling FP4 (gpt-oss's experts): 32 e2m1 values and one
    /// shared e8m0 scale, no f16 field.
    MXFP4,
}

/// How a matmul against a weight type wants its activations.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ActFormat {
    /// fathom's `Q8S` ([`BlockQ8S`], 36 bytes per 32 values), for the
    /// 32-value block types.
    Q8S,
    /// ggml's `Q8_K` ([`BlockQ8_K`], 292 bytes per 256 values), for the
    /// k-quants.
    Q8K,
    /// The caller's f32 rows as they are: float weights gain nothing from
    /// quantized activations, and f16 copies would not fit the plan's
    /// `q8_rows` reservation.
    F32,
}

impl WeightType {
    pub const ALL: [WeightType; 14] = [
        WeightType::F32,
        WeightType::F16,
        WeightType::BF16,
        WeightType::Q4_0,
        WeightType::Q4_1,
        WeightType::Q5_0,
        WeightType::Q5_1,
        WeightType::Q8_0,
        WeightType::Q2_K,
        WeightType::Q3_K,
        WeightType::Q4_K,
        WeightType::Q5_K,
        WeightType::Q6_K,
        WeightType::MXFP4,
    ];

    /// This type's row of the ggml table, the activation format its matmul
    /// pairs with, and the byte offsets of its blocks' f16 scales.
    const fn row(self) -> (GgmlType, ActFormat, &'static [usize]) {
        use ActFormat::{Q8K, Q8S};
        match self {
            WeightType::F32 => (GgmlType::F32, ActFormat::F32, &[]),
            WeightType::F16 => (GgmlType::F16, ActFormat::F32, &[]),
            WeightType::BF16 => (GgmlType::BF16, ActFormat::F32, &[]),
            WeightType::Q4_0 => (GgmlType::Q4_0, Q8S, blocks::Q4_0_SCALES),
            WeightType::Q4_1 => (GgmlType::Q4_1, Q8S, blocks::Q4_1_SCALES),
            WeightType::Q5_0 => (GgmlType::Q5_0, Q8S, blocks::Q5_0_SCALES),
            WeightType::Q5_1 => (GgmlType::Q5_1, Q8S, blocks::Q5_1_SCALES),
            WeightType::Q8_0 => (GgmlType::Q8_0, Q8S, blocks::Q8_0_SCALES),
            WeightType::Q2_K => (GgmlType::Q2_K, Q8K, blocks::Q2_K_SCALES),
            WeightType::Q3_K => (GgmlType::Q3_K, Q8K, blocks::Q3_K_SCALES),
            WeightType::Q4_K => (GgmlType::Q4_K, Q8K, blocks::Q4_K_SCALES),
            WeightType::Q5_K => (GgmlType::Q5_K, Q8K, blocks::Q5_K_SCALES),
            WeightType::Q6_K => (GgmlType::Q6_K, Q8K, blocks::Q6_K_SCALES),
            // Its scale is one e8m0 byte ([`blocks::BlockMxfp4`]).
            WeightType::MXFP4 => (GgmlType::MXFP4, Q8S, &[]),
        }
    }

    /// The ggml type this is.
    #[inline]
    pub const fn ggml(self) -> GgmlType {
        self.row().0
    }

    /// The kernels' type for a ggml type; `None` for types they do not run.
    pub fn from_ggml(ty: GgmlType) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.ggml() == ty)
    }

    pub fn from_ggml_id(id: u32) -> Option<Self> {
        GgmlType::from_id(id).and_then(Self::from_ggml)
    }

    #[inline]
    pub const fn ggml_id(self) -> u32 {
        self.ggml().id()
    }

    #[inline]
    pub const fn name(self) -> &'static str {
        self.ggml().name()
    }

    #[inline]
    pub const fn block_elems(self) -> usize {
        self.ggml().block_elems() as usize
    }

    #[inline]
    pub const fn block_bytes(self) -> usize {
        self.ggml().block_bytes() as usize
    }

    /// Bytes of a row of `cols` values; `cols` must be a whole number of
    /// blocks, which GGUF guarantees for every stored tensor.
    #[inline]
    pub const fn row_bytes(self, cols: usize) -> usize {
        cols / self.block_elems() * self.block_bytes()
    }

    /// The activation format a matmul against this type quantizes into.
    #[inline]
    pub const fn activation(self) -> ActFormat {
        self.row().1
    }

    /// Byte offsets in a block of its f16 scale fields (`d`, then `m` or
    /// `dmin` where the type has one); empty for the float types and for
    /// MXFP4, whose scale is an e8m0 byte.
    #[inline]
    pub const fn f16_scales(self) -> &'static [usize] {
        self.row().2
    }
}

impl ActFormat {
    /// Values per block (1 for [`ActFormat::F32`]).
    #[inline]
    pub const fn block_elems(self) -> usize {
        match self {
            ActFormat::Q8S => QK,
            ActFormat::Q8K => QK_K,
            ActFormat::F32 => 1,
        }
    }

    /// Bytes per block (none for [`ActFormat::F32`]: the matmul reads the
    /// caller's rows directly).
    #[inline]
    pub const fn block_bytes(self) -> usize {
        match self {
            ActFormat::Q8S => size_of::<BlockQ8S>(),
            ActFormat::Q8K => size_of::<BlockQ8_K>(),
            ActFormat::F32 => 0,
        }
    }

    /// Bytes of one activation row of `cols` values in this format; a
    /// partial block costs a whole one. Saturates rather than overflowing.
    #[inline]
    pub const fn row_bytes(self, cols: u64) -> u64 {
        cols.div_ceil(self.block_elems() as u64)
            .saturating_mul(self.block_bytes() as u64)
    }

    /// The most any weight type's matmul needs for one activation row of
    /// `cols` values: the memory plan's `q8_rows` reservation.
    pub const fn max_row_bytes(cols: u64) -> u64 {
        let q8s = ActFormat::Q8S.row_bytes(cols);
        let q8k = ActFormat::Q8K.row_bytes(cols);
        if q8s > q8k {
            q8s
        } else {
            q8k
        }
    }
}

impl GgmlType {
    /// The activation format a CPU matmul against this type pairs with;
    /// `None` for types the kernels do not run.
    pub fn activation(self) -> Option<ActFormat> {
        WeightType::from_ggml(self).map(WeightType::activation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subset_of_the_ggml_table() {
        for ty in WeightType::ALL {
            assert_eq!(WeightType::from_ggml(ty.ggml()), Some(ty));
            assert_eq!(format!("{ty:?}"), ty.name());
        }
        assert_eq!(WeightType::from_ggml(GgmlType::Q8_K), None);
    }

    #[test]
    fn activation_formats_pair_by_block_size() {
        for ty in WeightType::ALL {
            let want = match ty.block_elems() {
                1 => ActFormat::F32,
                32 => ActFormat::Q8S,
                _ => ActFormat::Q8K,
            };
            assert_eq!(ty.activation(), want, "{ty:?}");
            assert_eq!(ty.ggml().activation(), Some(want));
            // Every scale field lies inside the block.
            for &at in ty.f16_scales() {
                assert!(at + 2 <= ty.block_bytes(), "{ty:?}");
            }
        }
        assert_eq!(GgmlType::IQ2_XXS.activation(), None);
    }

    #[test]
    fn activation_rows_round_up_to_whole_blocks() {
        assert_eq!(ActFormat::Q8S.row_bytes(576), 18 * 36);
        assert_eq!(ActFormat::Q8S.row_bytes(33), 2 * 36);
        assert_eq!(ActFormat::Q8K.row_bytes(576), 3 * 292);
        assert_eq!(ActFormat::F32.row_bytes(576), 0);
        assert_eq!(ActFormat::max_row_bytes(576), 3 * 292);
        assert_eq!(ActFormat::max_row_bytes(256), 292);
        assert_eq!(ActFormat::max_row_bytes(u64::MAX), u64::MAX);
    }
}
