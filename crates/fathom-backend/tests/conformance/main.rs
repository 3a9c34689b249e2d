//! Backend conformance, in the manner of llama.cpp's test-backend-ops:
//! every op of the [`Backend`] trait, on every backend present, against an
//! independent scalar reference written here (f64 accumulation; weights
//! through `fathom_kernels::dequantize_row`, the bit-exact gguf-py port),
//! on random inputs of real models' shapes (SmolLM2-135M, Llama-3.1-8B,
//! Qwen3-30B-A3B experts).
//!
//! Only the trait is used: inputs go in through `embed` of an F32 table
//! (an exact copy), outputs come back through `matmul` by an 8×8 identity
//! into the logits buffer and `logits()` (exact too: one product by 1.0 and
//! seven by 0.0 a value).
//!
//! A backend whose device is absent is skipped with a message naming why;
//! `FATHOM_REQUIRE_GPU=1` turns a skipped GPU into a failure.
//!
//! Tolerances, as normalized mean squared error `Σ(got−ref)² / Σref²`:
//! - matmul 5e-4: a backend may quantize activations to 8 bits (the CPU's
//!   Q8_0 / Q8_K); that alone gives about (amax/127)²/12 relative variance,
//!   ~2e-5 for Gaussian rows, while a wrong block decode or index is ≥1e-2.
//!   Exact-f32 kernels land near 1e-13.
//! - embed, rms/head norm, add, bias, zero, gather, glu, MoE scatter: 1e-10
//!   (f32 arithmetic on exact inputs: ~1e-14).
//! - rope 1e-9: angles in f64 then an f32 sine (~1e-6 absolute each).
//! - attention 1e-8: K/V rounded to the cache dtype on both sides (the
//!   reference rounds the same way), then f32 online softmax against f64.
//! - gated delta rule 1e-8: f32 convolution, norms and state against f64,
//!   the state carried over a few steps (a wrong tap, head or slot is
//!   ≥1e-2).

use std::sync::Arc;

use fathom_backend::cuda::{self, CudaBackend};
use fathom_backend::{
    AttentionIo, AttentionShape, Backend, Buf, Glu, HostBytes, HostMatrix, KvLayout, MatrixId,
    MatrixStorage, RopeParams, RoutedFfn, Step, StepSeq, VectorId, WeightType, Yarn,
};
use fathom_fixtures::Rng;
use fathom_kernels::{affine_dequantize_row, dequantize_row, ops, AffineWeights};
use fathom_plan::activations::ArenaBuffer;
use fathom_plan::cuda::{
    DeviceLayout, MoeGrouping, ALLOCATION_GRANULE, BLAS_HANDLE_BYTES, CONTEXT_BYTES, GRAPH_BYTES,
    GRAPH_MAX_NODES, MODULE_BYTES,
};
use fathom_plan::kv::{KvGroup, KV_BLOCK_TOKENS};
use fathom_plan::KvDtype;

/// Every test buffer holds this many rows of this many f32.
const ROWS: u64 = 256;
const WIDTH: u64 = 14336;
const WEIGHTS: u64 = 1 << 30;
/// Read-back chunk: every tested width is a multiple of 8.
const EYE: usize = 8;

/// The attention op's buffers, as the forward pass passes them.
const IO: AttentionIo = AttentionIo {
    q: Buf::Q,
    k: Buf::K,
    v: Buf::V,
    out: Buf::AttnOut,
};

const TOL_MATMUL: f64 = 5e-4;
const TOL_EXACT: f64 = 1e-10;
const TOL_ROPE: f64 = 1e-9;
const TOL_ATTN: f64 = 1e-8;
/// `attend` against a q8_0 cache: roped keys near an int8 rounding boundary
/// (see `test_attention`).
const TOL_ATTN_Q8_ROPE: f64 = 2e-7;
const TOL_LINEAR: f64 = 1e-8;

mod attention;
mod cuda_only;
mod elementwise;
mod gpt_oss;
mod greedy;
mod harness;
mod linear;
mod matmul;
mod moe;
mod weights;

use attention::*;
use elementwise::*;
use gpt_oss::*;
use greedy::*;
use harness::*;
use linear::*;
use matmul::*;
use moe::*;
use weights::*;

#[test]
fn conformance() {
    let mut failures = Vec::new();
    let mut rng = Rng::xorshift64_star(0x5eed_1234_abcd_0001);
    let mut ran = 0;
    for b in backends(&small_kv()) {
        let mut h = Harness::new(b);
        test_embed(&mut h, &mut rng);
        test_matmul(&mut h, &mut rng, false);
        test_elementwise(&mut h, &mut rng);
        test_scaled_rows(&mut h, &mut rng);
        test_matmul_glu(&mut h, &mut rng);
        test_matmul_many(&mut h, &mut rng);
        test_norm_then_matmul(&mut h, &mut rng);
        test_shards(&mut h, &mut rng);
        test_rope(&mut h, &mut rng);
        test_moe(&mut h, &mut rng);
        test_routed_experts(&mut h, &mut rng);
        test_grouped_experts_match_the_gather_path(&mut h, &mut rng);
        test_greedy(&mut h, &mut rng);
        test_gates(&mut h, &mut rng);
        failures.extend(h.finish());
        ran += 1;
    }
    for (label, shape) in linear_cases() {
        for b in backends(&linear_kv(&shape)) {
            let mut h = Harness::new(b);
            test_gated_delta_rule(&mut h, &mut rng, label, shape);
            failures.extend(h.finish());
        }
    }
    failures.extend(attention_on_every_backend(attention_cases(), &mut rng));
    // gpt-oss's ops and attention cases, on their own random stream.
    let mut rng = Rng::xorshift64_star(0x6b70_7403_55ee_d001);
    for b in backends(&small_kv()) {
        let mut h = Harness::new(b);
        test_gpt_oss_matmul(&mut h, &mut rng);
        test_gpt_oss_glu(&mut h, &mut rng);
        test_gpt_oss_rope(&mut h, &mut rng);
        test_gpt_oss_experts(&mut h, &mut rng);
        failures.extend(h.finish());
    }
    failures.extend(attention_on_every_backend(
        gpt_oss_attention_cases(),
        &mut rng,
    ));
    if ran == 0 {
        println!("conformance: no backend present; nothing compared");
    }
    assert!(
        failures.is_empty(),
        "{} checks failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// [`test_attention`] of each case, without and with rope, on every
/// backend present; the failures.
fn attention_on_every_backend(
    cases: Vec<(String, AttentionShape, KvLayout, [usize; 2])>,
    rng: &mut Rng,
) -> Vec<String> {
    let mut failures = Vec::new();
    for (label, shape, kv, layers) in cases {
        let sliding = shape.window.is_some();
        for rope in [None, Some(attention_rope(&label))] {
            for b in backends(&kv) {
                let mut h = Harness::new(b);
                let (tables, steps) = attention_schedule(sliding);
                test_attention(
                    &mut h,
                    rng,
                    &label,
                    shape,
                    kv.dtype,
                    layers,
                    tables,
                    steps,
                    rope.as_ref(),
                );
                failures.extend(h.finish());
            }
        }
    }
    failures
}
