//! The one table of ggml block layouts fathom uses.
//!
//! Everything that reads or writes ggml blocks asks this crate: the
//! checkpoint reader (ids, names, row bytes of all 34 types GGUF files
//! carry), the memory plan (KV rows, quantized activation rows, quant
//! advice), the CPU kernels (the 14 types they run, the activation format
//! each pairs with, block sizes) and the fixtures (which bytes of a block
//! are f16 scales). It depends on nothing.
//!
//! - [`GgmlType`]: every ggml type as numbered in GGUF, with its block
//!   elements and block bytes.
//! - [`WeightType`]: the types fathom's kernels run, with the activation
//!   format ([`ActFormat`]) a matmul against each quantizes its input into,
//!   and where its f16 scales sit.
//! - [`blocks`]: `#[repr(C)]` structs of the blocks the kernels read, each
//!   size checked at compile time against `ggml-common.h` and the table.
//! - [`f16_to_f32`], [`f32_to_f16`], [`bf16_to_f32`], [`f32_to_bf16`]: the
//!   half-float conversions.

pub mod blocks;
mod ggml_type;
mod half;
mod weight_type;

pub use ggml_type::GgmlType;
pub use half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
pub use weight_type::{ActFormat, WeightType};
