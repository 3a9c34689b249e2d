//! CPU kernels for fathom: quantized matrix-vector and matrix-matrix
//! products read in place from a GGUF mmap, the small element-wise ops of a
//! transformer forward pass, and the persistent worker pool they run on.
//!
//! Nothing here allocates on the hot path: callers pass every buffer, sized
//! by the memory plan (`activation_row_bytes` says what a matmul needs for
//! its quantized activations).
//!
//! Every kernel has a portable Rust path; on x86-64 an AVX2 (+FMA, F16C)
//! path and an AVX-512 VNNI path are chosen at run time, once. The SIMD
//! paths compute the same integer dot products as the portable one and
//! differ from it only in the order of float additions, which the tests
//! check.

mod affine;
mod isa;
mod matmul;
pub mod ops;
mod pool;
mod quant;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use affine::{affine_dequantize_row, affine_matmul, AffineWeights, AFFINE_BITS};
pub use isa::isa_name;
pub use matmul::{activation_row_bytes, matmul};
pub use pool::Pool;
pub use quant::dequantize_row;

/// Weight storage types (ggml's, as GGUF names them by id).
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
}

impl WeightType {
    pub const ALL: [WeightType; 13] = [
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
    ];

    /// ggml's type id, elements per block and bytes per block, from
    /// `ggml-common.h`.
    const fn layout(self) -> (u32, usize, usize) {
        match self {
            WeightType::F32 => (0, 1, 4),
            WeightType::F16 => (1, 1, 2),
            WeightType::BF16 => (30, 1, 2),
            WeightType::Q4_0 => (2, 32, 18),
            WeightType::Q4_1 => (3, 32, 20),
            WeightType::Q5_0 => (6, 32, 22),
            WeightType::Q5_1 => (7, 32, 24),
            WeightType::Q8_0 => (8, 32, 34),
            WeightType::Q2_K => (10, 256, 84),
            WeightType::Q3_K => (11, 256, 110),
            WeightType::Q4_K => (12, 256, 144),
            WeightType::Q5_K => (13, 256, 176),
            WeightType::Q6_K => (14, 256, 210),
        }
    }

    pub fn from_ggml_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.ggml_id() == id)
    }

    pub fn ggml_id(self) -> u32 {
        self.layout().0
    }

    pub fn block_elems(self) -> usize {
        self.layout().1
    }

    pub fn block_bytes(self) -> usize {
        self.layout().2
    }

    /// Bytes of a row of `cols` values; `cols` must be a whole number of
    /// blocks, which GGUF guarantees for every stored tensor.
    pub fn row_bytes(self, cols: usize) -> usize {
        cols / self.block_elems() * self.block_bytes()
    }

    pub fn name(self) -> &'static str {
        match self {
            WeightType::F32 => "F32",
            WeightType::F16 => "F16",
            WeightType::BF16 => "BF16",
            WeightType::Q4_0 => "Q4_0",
            WeightType::Q4_1 => "Q4_1",
            WeightType::Q5_0 => "Q5_0",
            WeightType::Q5_1 => "Q5_1",
            WeightType::Q8_0 => "Q8_0",
            WeightType::Q2_K => "Q2_K",
            WeightType::Q3_K => "Q3_K",
            WeightType::Q4_K => "Q4_K",
            WeightType::Q5_K => "Q5_K",
            WeightType::Q6_K => "Q6_K",
        }
    }
}

/// A row-major weight matrix read in place from the mmap: `rows` rows of
/// `cols` values, each row stored as ggml blocks.
#[derive(Clone, Copy, Debug)]
pub struct Weights<'a> {
    pub ty: WeightType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}
