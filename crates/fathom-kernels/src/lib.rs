//! CPU kernels for fathom: quantized matrix-vector and matrix-matrix
//! products read in place from a GGUF mmap, the small element-wise ops of a
//! transformer forward pass, and the persistent worker pool they run on.
//!
//! Nothing here allocates on the hot path: callers pass every buffer, sized
//! by the memory plan (`activation_row_bytes` says what a matmul needs for
//! its quantized activations).
//!
//! Every kernel has a portable Rust path; on x86-64 an AVX2 (+FMA, F16C)
//! path and an AVX-512 VNNI path are chosen at run time, once, and on
//! aarch64 NEON matmul tiles for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K
//! and Q6_K (`FATHOM_ISA` forces one: [`selected_isa`]). The SIMD paths compute
//! the same integer dot products as the portable one and differ from it
//! only in the order of float additions, which the tests check.

#[cfg(target_arch = "aarch64")]
mod aarch64;
mod affine;
mod isa;
mod matmul;
pub mod ops;
mod pool;
mod quant;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use affine::{affine_dequantize_row, affine_matmul, AffineWeights, AFFINE_BITS};
pub use isa::{isa_name, selected_isa, IsaError, ENV_VARS, ISA_VAR};
pub use matmul::{activation_row_bytes, matmul, matmul_group, GroupedMatmul, MAX_GROUP};
pub use pool::Pool;
pub use quant::dequantize_row;

/// Weight storage types the kernels run; the layouts are `fathom-ggml`'s
/// table, re-exported so `fathom_kernels::WeightType` keeps working.
pub use fathom_ggml::WeightType;

/// A row-major weight matrix read in place from the mmap: `rows` rows of
/// `cols` values, each row stored as ggml blocks.
#[derive(Clone, Copy, Debug)]
pub struct Weights<'a> {
    pub ty: WeightType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}
