//! qwen2, qwen3_moe, gemma3 and llama forward passes on synthetic GGUF
//! checkpoints (random F32 weights, the families' real tensor layouts and
//! real attention shapes — head counts, GQA ratios, head dims — with few
//! layers and a narrow FFN to stay small), checked against the
//! independent numpy forward pass.

mod common;

use common::families::{family, Family, Format};
use common::{compare, engine, inputs, numpy_logits, smollm2};
use fathom_checkpoint::Checkpoint;
use fathom_fixtures::GgufTensorType;
use fathom_plan::KvDtype;

/// F32 weights leave the engine's f32 math against numpy's: the differences
/// are summation order and the f16 KV cache, so logits agree far more
/// tightly than for the quantized model (measured: at most 2.2e-4 of the
/// largest logit); a wrong norm, rope layout, window or routing moves them
/// by whole percents.
const TOLERANCE: f32 = 1e-3;

/// `family` with its real model's attention shape, in F32.
fn check(family: &Family) {
    let name = family.name;
    let dir = std::env::temp_dir().join(format!("fathom-families-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.gguf"));
    Format::Gguf(GgufTensorType::F32).write(&family.real_shaped(), &path, 7);
    // The fixture's vocabulary has no merges; the ids are fed directly, so
    // any tokenizer serves to build the engine.
    let tokenizer = fathom_engine::load_tokenizer(&Checkpoint::open(&smollm2()).unwrap()).unwrap();
    let mut engine = engine(&path, inputs(64, KvDtype::F16), Some(tokenizer));
    // Longer than tiny-gemma3's window of 16, so local layers slide.
    let tokens: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 1000).collect();
    let ours = engine.logits(&tokens).unwrap().to_vec();
    let reference = numpy_logits(&path, &tokens, false);
    let a = compare(&ours, &reference);
    println!("{name} ({} attention): {a:?}", family.real);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(a.max_rel < TOLERANCE && a.same_argmax, "{name}: {a:?}");
}

#[test]
fn llama_with_smollm2_attention() {
    check(family("llama"));
}

#[test]
fn qwen2_with_attention_biases() {
    check(family("qwen2"));
}

#[test]
fn qwen3_dense_with_qk_norm() {
    check(family("qwen3"));
}

#[test]
fn qwen3_moe_with_routed_experts_and_qk_norm() {
    check(family("qwen3_moe"));
}

#[test]
fn gemma3_with_sliding_window_layers() {
    check(family("gemma3"));
}
