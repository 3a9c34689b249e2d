//! qwen2, qwen3_moe, gemma3, gemma4, qwen35 and llama forward passes on synthetic GGUF
//! checkpoints (random F32 weights, the families' real tensor layouts and
//! real attention shapes — head counts, GQA ratios, head dims — with few
//! layers and a narrow FFN to stay small), checked against the
//! independent numpy forward pass.

mod common;

use common::families::{family, gemma4_shaped, qwen3_5_shaped, Family, Format};
use common::{compare, engine, inputs, numpy_logits, smollm2};
use fathom_checkpoint::Checkpoint;
use fathom_fixtures::{self as fx, GgufTensorType, ModelDef};
use fathom_plan::KvDtype;

/// F32 weights leave the engine's f32 math against numpy's: the differences
/// are summation order and the f16 KV cache, so logits agree far more
/// tightly than for the quantized model (measured: at most 2.2e-4 of the
/// largest logit); a wrong norm, rope layout, window or routing moves them
/// by whole percents.
const TOLERANCE: f32 = 1e-3;

/// `family` with its real model's attention shape, in F32.
fn check(family: &Family) {
    check_model(family.name, family.real, &family.real_shaped());
}

/// `model` against numpy: the last position's logits after 40 tokens.
fn check_model(name: &str, real: &str, model: &ModelDef) {
    let dir = std::env::temp_dir().join(format!("fathom-families-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.gguf"));
    Format::Gguf(GgufTensorType::F32).write(model, &path, 7);
    // The fixture's vocabulary has no merges; the ids are fed directly, so
    // any tokenizer serves to build the engine.
    let tokenizer = fathom_engine::load_tokenizer(&Checkpoint::open(&smollm2()).unwrap()).unwrap();
    let mut engine = engine(&path, inputs(64, KvDtype::F16), Some(tokenizer));
    // Longer than tiny-gemma3's window of 16, so local layers slide.
    let tokens: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 1000).collect();
    let ours = engine.logits(&tokens).unwrap().to_vec();
    let reference = numpy_logits(&path, &tokens, false);
    let a = compare(&ours, &reference);
    println!("{name} ({real} attention): {a:?}");
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

/// Qwen3.5: three gated-delta-rule layers (the causal convolution and the
/// recurrence carried across the 40 tokens) and one gated full attention
/// with a quarter-head rope, in Qwen3.5-4B's head shapes (16 heads over 4
/// KV heads of 256; 16 key and 32 value heads of 128 in the linear
/// layers) at hidden 512.
#[test]
fn qwen3_5_hybrid_linear_and_gated_attention() {
    check_model("qwen35", "Qwen3.5-4B", &qwen3_5_shaped());
}

/// Qwen3.5 MoE: the hybrid layers with routed experts (top-2 of 4,
/// renormalized) and the sigmoid-gated shared expert.
#[test]
fn qwen3_5_moe_with_shared_expert() {
    check_model("qwen35moe", "Qwen3.5-35B-A3B", &fx::tiny_qwen3_5_moe());
}

/// A Hugging Face Qwen3.5 directory runs as the GGUF llama.cpp's converter
/// makes of it (`fx::write_converted_gguf`: the same F32 weights with norms
/// stored as `1 + w`, `A_log` as −exp(A_log), the value heads moved from
/// grouped to tiled order): the same last logits after a 40-token prefill
/// in steps of 16, and the same 8 greedy tokens after it, so the engine
/// applies each of the converter's transforms itself. The 4B-shaped model has 2
/// value heads a key head (16 and 32), the MoE 2 (2 and 4), its experts
/// stacked (`gate_up_proj`, `down_proj`) and a shared expert with a `[1,
/// hidden]` gate, and both convolutions `[channels, 1, taps]`. Measured:
/// the two files' logits differ by summation order only (1.2e-5 and 2.9e-6
/// of the largest logit); with the grouped order left out, 150 %.
#[test]
fn qwen3_5_hf_directories_run_as_their_converted_gguf() {
    let dir = std::env::temp_dir().join(format!("fathom-families-q35-hf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tokens: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 1000).collect();
    for (name, model) in [
        ("qwen35", qwen3_5_shaped()),
        ("qwen35moe", fx::tiny_qwen3_5_moe()),
    ] {
        let hf = dir.join(format!("{name}-hf"));
        fx::write_hf_dir(&model, &hf, 1, fx::Data::Random { seed: 11 }).unwrap();
        let gguf = dir.join(format!("{name}.gguf"));
        fx::write_converted_gguf(&model, &gguf, 11).unwrap();
        let run = |path: &std::path::Path| {
            let tokenizer =
                fathom_engine::load_tokenizer(&Checkpoint::open(&smollm2()).unwrap()).unwrap();
            let mut plan = inputs(64, KvDtype::F16);
            plan.max_tokens_per_step = 16;
            let mut engine = engine(path, plan, Some(tokenizer));
            let logits = engine.logits(&tokens).unwrap().to_vec();
            (logits, common::generated(&mut engine, &tokens, 8))
        };
        let ((ours, our_tokens), (reference, their_tokens)) = (run(&hf), run(&gguf));
        let a = compare(&ours, &reference);
        println!("{name}: HF directory against its converted GGUF: {a:?}");
        assert!(a.max_rel < 1e-4 && a.same_argmax, "{name}: {a:?}");
        assert_eq!(our_tokens, their_tokens, "{name}: the same 8 greedy tokens");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// An MLX Qwen3.5 (mlx-lm's own layout, not the HF one the loader reads)
/// is refused by name rather than run wrong; `inspect` still plans it.
#[test]
fn qwen3_5_mlx_checkpoints_are_refused_by_name() {
    let dir = std::env::temp_dir().join(format!("fathom-families-q35-mlx-{}", std::process::id()));
    fx::write_hf_dir(
        &fx::mlx_quantize(&fx::tiny_qwen3_5(), 4, 64),
        &dir,
        1,
        fx::Data::Random { seed: 3 },
    )
    .unwrap();
    let checkpoint = Checkpoint::open(&dir).unwrap();
    let spec = fathom_spec::ModelSpec::from_checkpoint(&checkpoint).unwrap();
    let plan = fathom_plan::MemoryPlan::new(&spec, inputs(64, KvDtype::F16)).unwrap();
    let tokenizer = fathom_engine::load_tokenizer(&Checkpoint::open(&smollm2()).unwrap()).unwrap();
    let err = match fathom_engine::Engine::load(&checkpoint, spec, plan, tokenizer) {
        Ok(_) => panic!("an MLX Qwen3.5 loaded"),
        Err(e) => e.to_string(),
    };
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        err.contains("qwen35") && err.contains("MLX checkpoint"),
        "{err}"
    );
}

/// Each sequence keeps its recurrent state in its own slot, and the state
/// carries across prefill chunks: three prompts decoded together in steps
/// of 7 tokens (so prompts split and share steps) give, token for token,
/// what each gives alone, and the slots are reused by the next runs.
#[test]
fn qwen3_5_state_slots_hold_across_chunks_and_batches() {
    let dir =
        std::env::temp_dir().join(format!("fathom-families-q35-batch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("qwen35.gguf");
    Format::Gguf(GgufTensorType::F32).write(&fx::tiny_qwen3_5(), &path, 7);
    let tokenizer = fathom_engine::load_tokenizer(&Checkpoint::open(&smollm2()).unwrap()).unwrap();
    let mut plan = inputs(96, KvDtype::F16);
    plan.batch = 3;
    plan.max_tokens_per_step = 7;
    let mut engine = engine(&path, plan, Some(tokenizer));
    let prompts: Vec<Vec<u32>> = [5u32, 19, 33]
        .iter()
        .enumerate()
        .map(|(i, &seed)| {
            (0..12 + 9 * i as u32)
                .map(|j| (j * seed + 3) % 1000)
                .collect()
        })
        .collect();
    let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let mut samplers: Vec<_> = (0..3).map(|_| common::greedy_sampler()).collect();
    engine
        .generate_batch(&refs, 16, &mut samplers, &[], &mut |_, _| true)
        .unwrap();
    let batched: Vec<Vec<u32>> = (0..3).map(|i| engine.tokens_of(i).to_vec()).collect();
    for (i, prompt) in prompts.iter().enumerate() {
        let alone = common::generated(&mut engine, prompt, 16);
        assert_eq!(batched[i][prompt.len()..], alone[..], "prompt {i}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// gpt-oss on its real head shapes (64-value heads, 8 query heads to 2 KV
/// heads), 4 experts with biases (2 used): attention sinks, q/k/v/o
/// biases, a window of 8 on layers 0 and 2 (40 tokens slide it), YaRN
/// rope, the clamped SwiGLU and the softmax over the chosen experts'
/// biased logits. With F32 experts the logits are numpy's to the f16 KV
/// cache's rounding (measured: 2.5e-4 of the largest logit); with MXFP4
/// experts, as gpt-oss GGUFs store them, fathom's matmuls round the
/// experts' inputs to 8 bits as llama.cpp's do, and numpy emulating that
/// rounding is 8.9e-3 away (its own sums in another order), so that case
/// gets 1%.
#[test]
fn gpt_oss_sinks_yarn_biases_and_experts() {
    let dir = std::env::temp_dir().join(format!("fathom-families-gpt-oss-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tokens: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 512).collect();
    for (experts, emulate, tolerance) in [
        (GgufTensorType::F32, false, TOLERANCE),
        (GgufTensorType::MXFP4, true, 1e-2),
    ] {
        let path = dir.join(format!("gpt-oss-{}.gguf", experts.name()));
        let shape = fx::GptOssShape {
            experts_type: experts,
            ..fx::gpt_oss_tiny()
        };
        let data = fx::Data::Random { seed: 7 };
        fx::write_gpt_oss_gguf(&shape, GgufTensorType::F32, &path, data).unwrap();
        let tokenizer =
            fathom_engine::load_tokenizer(&Checkpoint::open(&smollm2()).unwrap()).unwrap();
        let mut engine = engine(&path, inputs(64, KvDtype::F16), Some(tokenizer));
        let ours = engine.logits(&tokens).unwrap().to_vec();
        let reference = numpy_logits(&path, &tokens, emulate);
        let a = compare(&ours, &reference);
        println!("gpt-oss ({} experts): {a:?}", experts.name());
        assert!(
            a.max_rel < tolerance && a.same_argmax,
            "gpt-oss {}: {a:?}",
            experts.name()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Gemma 4: sliding and global layers alternating, in gemma-4-31B's head
/// shapes (32 heads; sliding over 16 KV heads of 256 with a 16-token
/// window, global over 4 KV heads of 512 whose values are the keys'
/// projection) at hidden 512: unscaled scores, values normed without a
/// weight, rope factors on the global layers only, the layer output scale
/// and the logit softcap.
#[test]
fn gemma4_with_global_heads_of_their_own() {
    check_model("gemma4", "gemma-4-31B", &gemma4_shaped());
}

/// The Gemma 4 variants the forward pass does not run are refused by name
/// at load (their plans still stand): layers sharing KV (E2B/E4B),
/// per-layer token embeddings (E2B/E4B) and the mixture of experts
/// (26B-A4B).
#[test]
fn gemma4_variants_not_run_are_refused_by_name() {
    use fathom_fixtures::GgufValue;
    use fathom_plan::MemoryPlan;
    use fathom_spec::ModelSpec;
    let dir = std::env::temp_dir().join(format!("fathom-gemma4-variants-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tokenizer =
        || fathom_engine::load_tokenizer(&Checkpoint::open(&smollm2()).unwrap()).unwrap();
    let base = || fx::gguf_writer(&fx::tiny_gemma4(), GgufTensorType::F32).unwrap();
    let shared = "gemma4.attention.shared_kv_layers";
    let variants = [
        (
            base()
                .retain_kvs(|k| k != shared)
                .kv(shared, GgufValue::U32(1)),
            "KV shared across layers",
        ),
        (
            base().tensor("per_layer_token_embd.weight", &[64, 1024], 0, 64 * 1024 * 4),
            "per-layer token embeddings",
        ),
        (
            base()
                .kv("gemma4.expert_count", GgufValue::U32(4))
                .kv("gemma4.expert_used_count", GgufValue::U32(2)),
            "a mixture of experts",
        ),
    ];
    for (i, (writer, needle)) in variants.into_iter().enumerate() {
        let path = dir.join(format!("variant{i}.gguf"));
        writer.write(&path, fx::Data::Random { seed: 7 }).unwrap();
        let checkpoint = Checkpoint::open(&path).unwrap();
        let spec = ModelSpec::from_checkpoint(&checkpoint).unwrap();
        let plan = MemoryPlan::new(&spec, inputs(64, KvDtype::F16)).unwrap();
        let err = fathom_engine::Engine::load(&checkpoint, spec, plan, tokenizer())
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("gemma4") && err.contains(needle), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
