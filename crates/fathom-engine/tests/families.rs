//! qwen2, qwen3_moe, gemma3 and llama forward passes on synthetic GGUF
//! checkpoints (random F32 weights, the families' real tensor layouts and
//! real attention shapes — head counts, GQA ratios, head dims — with few
//! layers and a narrow FFN to stay small), checked against the
//! independent numpy forward pass.

mod common;

use common::{attention_shape as shape, compare, engine, inputs, numpy_logits, smollm2};
use fathom_checkpoint::Checkpoint;
use fathom_fixtures::{self as fx, Data, GgufTensorType, ModelDef};
use fathom_plan::KvDtype;

/// F32 weights leave the engine's f32 math against numpy's: the differences
/// are summation order and the f16 KV cache, so logits agree far more
/// tightly than for the quantized model (measured: at most 2.2e-4 of the
/// largest logit); a wrong norm, rope layout, window or routing moves them
/// by whole percents.
const TOLERANCE: f32 = 1e-3;

fn check(name: &str, model: ModelDef) {
    let dir = std::env::temp_dir().join(format!("fathom-families-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.gguf"));
    fx::write_gguf(&model, &path, GgufTensorType::F32, Data::Random { seed: 7 }).unwrap();
    // The fixture's vocabulary has no merges; the ids are fed directly, so
    // any tokenizer serves to build the engine.
    let tokenizer = fathom_engine::load_tokenizer(&Checkpoint::open(&smollm2()).unwrap()).unwrap();
    let mut engine = engine(&path, inputs(64, KvDtype::F16), Some(tokenizer));
    // Longer than tiny-gemma3's window of 16, so local layers slide.
    let tokens: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 1000).collect();
    let ours = engine.logits(&tokens).unwrap().to_vec();
    let reference = numpy_logits(&path, &tokens, false);
    let a = compare(&ours, &reference);
    println!("{name}: {a:?}");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(a.max_rel < TOLERANCE && a.same_argmax, "{name}: {a:?}");
}

#[test]
fn llama_with_smollm2_attention() {
    // SmolLM2-135M: 9 heads over 3 KV heads of 64.
    check(
        "llama",
        fx::reshaped(&fx::tiny_llama(), shape(576, 9, 3, 64)),
    );
}

#[test]
fn qwen2_with_attention_biases() {
    // Qwen2.5-0.5B: 14 heads over 2 KV heads of 64 (7:1).
    check(
        "qwen2",
        fx::reshaped(&fx::tiny_qwen2(), shape(896, 14, 2, 64)),
    );
}

#[test]
fn qwen3_dense_with_qk_norm() {
    // Qwen3-8B: 32 heads over 8 KV heads of 128 (4:1).
    check(
        "qwen3",
        fx::reshaped(&fx::tiny_qwen3(), shape(512, 32, 8, 128)),
    );
}

#[test]
fn qwen3_moe_with_routed_experts_and_qk_norm() {
    // Qwen3-30B-A3B: 32 heads over 4 KV heads of 128 (8:1), experts routed top-2 of 4.
    check(
        "qwen3moe",
        fx::reshaped(&fx::tiny_qwen3_moe(), shape(512, 32, 4, 128)),
    );
}

#[test]
fn gemma3_with_sliding_window_layers() {
    // Gemma-3-1B: 4 heads over 1 KV head of 256; tiny window of 16, global every 2nd layer.
    check(
        "gemma3",
        fx::reshaped(&fx::tiny_gemma3(), shape(1152, 4, 1, 256)),
    );
}
