//! The same SmolLM2 weights as a Hugging Face safetensors checkpoint
//! (converted from the GGUF by scripts/reference/gguf_to_safetensors.py,
//! undoing llama.cpp's q/k row permutation) run through the HF path:
//! HF tensor names, NeoX rope, F16 weights read in place.

mod common;

use std::process::Command;

use common::{compare, engine, inputs, numpy_logits, root, smollm2};
use fathom_checkpoint::Checkpoint;
use fathom_plan::KvDtype;

#[test]
fn safetensors_copy_agrees_with_numpy_on_the_gguf() {
    let dir = std::env::temp_dir().join(format!("fathom-smollm2-hf-{}", std::process::id()));
    let status = Command::new("python3")
        .arg(root().join("scripts/reference/gguf_to_safetensors.py"))
        .arg(smollm2())
        .arg(&dir)
        .args(["--dtype", "f16", "--no-tokenizer"])
        .status()
        .expect("run python3 (scripts/test.sh installs numpy and gguf)");
    assert!(status.success());
    let tokenizer = fathom_engine::load_tokenizer(&Checkpoint::open(&smollm2()).unwrap()).unwrap();
    let tokens = tokenizer.encode("The quick brown fox jumps over the lazy dog", true, true);
    let mut engine = engine(&dir, inputs(64, KvDtype::F16), Some(tokenizer));
    let ours = engine.logits(&tokens).unwrap().to_vec();
    let _ = std::fs::remove_dir_all(&dir);
    let a = compare(&ours, &numpy_logits(&smollm2(), &tokens, false));
    println!("safetensors copy vs numpy on the GGUF: {a:?}");
    // F16 copies of the dequantized weights against f32 activations: only
    // the f16 rounding of weights and of the KV cache remains (measured
    // 7.6e-4 of the largest logit).
    assert!(a.same_argmax && a.max_rel < 0.005, "{a:?}");
}
