//! `fathom inspect` on synthetic checkpoints with real architectures' tensor
//! tables, written as header-only sparse files: real sizes, no real disk.
//! Expected figures are computed here by hand from the published shapes.

mod common;

use common::{fathom, inspect_json, stderr, u, TempDir};
use fathom_fixtures::{self as fx, Data, GgufTensorType};

/// BF16: 2 bytes per parameter.
fn bf16(params: u64) -> u64 {
    2 * params
}

/// K + V bytes per token per layer in f16.
fn kv_f16(kv_heads: u64, head_dim: u64) -> u64 {
    2 * kv_heads * head_dim * 2
}

#[test]
fn llama_3_1_8b_sharded_safetensors() {
    let dir = TempDir::new("llama8b");
    fx::write_hf_dir(&fx::llama_3_1_8b(), &dir.0, 4, Data::Sparse).unwrap();
    let v = inspect_json(&dir.0, &["--memory", "64G", "-t", "2"], &[]);
    let (d, ffn, vocab, layers) = (4096u64, 14336u64, 128_256u64, 32u64);
    let per_layer = d * d * 2 + 1024 * d * 2 + 3 * ffn * d + 2 * d;
    let params = vocab * d * 2 + layers * per_layer + d;
    assert_eq!(
        params, 8_030_261_248,
        "Llama-3.1-8B's published parameter count"
    );
    assert_eq!(u(&v, "params"), params);
    assert_eq!(u(&v, "weights_bytes"), bf16(params));
    assert_eq!(v["format"], "safetensors");
    assert_eq!(v["family"], "llama");
    assert_eq!(u(&v, "context_length"), 131_072);
    assert_eq!(u(&v, "kv_bytes_per_token"), layers * kv_f16(8, 128));
    assert_eq!(
        u(&v, "kv_bytes"),
        layers * kv_f16(8, 128) * 8192,
        "1 GiB at 8192 tokens"
    );
    assert_eq!(u(&v, "kv_bytes"), 1 << 30);
}

#[test]
fn qwen2_5_7b_gguf_and_safetensors_agree_on_kv() {
    let dir = TempDir::new("qwen7b");
    let model = fx::qwen2_5_7b();
    fx::write_hf_dir(&model, &dir.0, 4, Data::Sparse).unwrap();
    let gguf = dir.0.join("qwen2.5-7b-q4_k.gguf");
    fx::write_gguf(&model, &gguf, GgufTensorType::Q4_K, Data::Sparse).unwrap();
    let (d, ffn, vocab, layers) = (3584u64, 18_944u64, 152_064u64, 28u64);
    let kv_dim = 4 * 128;
    let per_layer = d * d * 2 + kv_dim * d * 2 + (d + 2 * kv_dim) + 3 * ffn * d + 2 * d;
    let params = vocab * d * 2 + layers * per_layer + d;
    assert_eq!(
        params, 7_615_616_512,
        "Qwen2.5-7B's published parameter count"
    );

    let st = inspect_json(&dir.0, &["--memory", "64G", "-c", "32768"], &[]);
    assert_eq!(u(&st, "weights_bytes"), bf16(params));
    assert_eq!(st["family"], "qwen2");
    let gg = inspect_json(&gguf, &["--memory", "64G", "-c", "32768"], &[]);
    assert_eq!(gg["family"], "qwen2");
    assert_eq!(u(&gg, "params"), params);
    for v in [&st, &gg] {
        assert_eq!(u(v, "kv_bytes_per_token"), layers * kv_f16(4, 128));
        assert_eq!(u(v, "kv_bytes"), layers * kv_f16(4, 128) * 32_768);
    }
    // Q4_K rows (3584 and 18944 are whole 256-blocks) take 144 bytes per 256;
    // 1-D norms and biases stay F32.
    let matrices = params - layers * (2 * d + d + 2 * kv_dim) - d;
    let vectors = params - matrices;
    assert_eq!(u(&gg, "weights_bytes"), matrices / 256 * 144 + vectors * 4);
}

#[test]
fn qwen3_30b_a3b_sixty_gigabytes_of_experts() {
    let dir = TempDir::new("qwen3moe");
    fx::write_hf_dir(&fx::qwen3_30b_a3b(), &dir.0, 13, Data::Sparse).unwrap();
    let v = inspect_json(&dir.0, &["--memory", "128G", "-t", "2"], &[]);
    let (d, layers, experts, expert_ffn, vocab) = (2048u64, 48u64, 128u64, 768u64, 151_936u64);
    let attn = d * 4096 + 2 * 512 * d + 4096 * d + 2 * 128;
    let moe = experts * 3 * expert_ffn * d + experts * d;
    let params = vocab * d * 2 + layers * (attn + moe + 2 * d) + d;
    assert_eq!(u(&v, "params"), params);
    assert!(
        (30_400_000_000..30_600_000_000).contains(&params),
        "published: 30.5 B"
    );
    assert_eq!(u(&v, "weights_bytes"), bf16(params));
    assert_eq!(v["family"], "qwen3_moe");
    assert_eq!(u(&v, "kv_bytes_per_token"), layers * kv_f16(4, 128));
    assert_eq!(u(&v, "kv_bytes"), layers * kv_f16(4, 128) * 8192);
    let router = v["activation_detail"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "router_logits")
        .expect("MoE models plan router logits");
    assert_eq!((u(router, "rows"), u(router, "width")), (512, experts));
}

#[test]
fn gemma3_1b_sliding_layers_hold_only_their_window() {
    let dir = TempDir::new("gemma3");
    let model = fx::gemma3_1b();
    fx::write_hf_dir(&model, &dir.0, 1, Data::Sparse).unwrap();
    let gguf = dir.0.join("gemma3-1b-f16.gguf");
    fx::write_gguf(&model, &gguf, GgufTensorType::F16, Data::Sparse).unwrap();
    // 26 layers, every 6th global: layers 5, 11, 17, 23. One KV head of 256.
    let per_layer_token = kv_f16(1, 256);
    for path in [&dir.0, &gguf] {
        let v = inspect_json(path, &["--memory", "16G", "-c", "8192"], &[]);
        assert_eq!(v["family"], "gemma3");
        assert_eq!(
            u(&v, "kv_bytes"),
            4 * per_layer_token * 8192 + 22 * per_layer_token * 512
        );
        let groups = v["kv_detail"].as_array().unwrap();
        assert_eq!(groups.len(), 2);
        let sliding = groups.iter().find(|g| g["attention"] == "sliding").unwrap();
        assert_eq!(
            (
                u(sliding, "layers"),
                u(sliding, "window"),
                u(sliding, "tokens")
            ),
            (22, 512, 512)
        );
        // Below the window every layer holds the whole context.
        let v = inspect_json(path, &["--memory", "16G", "-c", "300"], &[]);
        assert_eq!(u(&v, "kv_bytes"), 26 * per_layer_token * 304);
    }
}

#[test]
fn gemma3_multimodal_reads_the_nested_text_config() {
    let dir = TempDir::new("gemma3-4b");
    fx::write_hf_dir(&fx::gemma3_4b_multimodal_text(), &dir.0, 2, Data::Sparse).unwrap();
    let v = inspect_json(&dir.0, &["--memory", "16G", "-c", "4096"], &[]);
    assert_eq!(v["family"], "gemma3");
    // 34 layers, global every 6th (5, 11, 17, 23, 29), 4 KV heads of 256, window 1024.
    let t = kv_f16(4, 256);
    assert_eq!(u(&v, "kv_bytes"), 5 * t * 4096 + 29 * t * 1024);
    // The vision tower is never read by a text runtime: not in the weights.
    let model = fx::gemma3_4b_multimodal_text();
    let text_bytes: u64 = model
        .tensors
        .iter()
        .filter(|t| t.name.starts_with("language_model."))
        .map(|t| t.byte_len())
        .sum();
    assert!(text_bytes < model.total_bytes());
    assert_eq!(u(&v, "weights_bytes"), text_bytes);
    let notes = v["notes"].as_array().unwrap();
    assert!(
        notes
            .iter()
            .any(|n| n.as_str().unwrap().contains("vision tensors")),
        "{notes:?}"
    );
}

#[test]
fn mlx_quantized_counts_packed_parameters() {
    let dir = TempDir::new("mlx");
    let model = fx::smollm2_135m();
    let q = fx::mlx_quantize(&model, 4, 64);
    fx::write_hf_dir(&q, &dir.0, 1, Data::Sparse).unwrap();
    let v = inspect_json(&dir.0, &["--memory", "8G"], &[]);
    assert_eq!(v["format"], "mlx");
    assert_eq!(u(&v, "params"), model.parameter_count());
    let stored: u64 = q.tensors.iter().map(|t| t.byte_len()).sum();
    assert_eq!(u(&v, "weights_bytes"), stored);
    assert!(
        stored < model.total_bytes() / 3,
        "4-bit packing shrinks the BF16 weights"
    );
}

/// Qwen3.5-4B: KV for its 8 full-attention layers only, and per sequence
/// the 24 linear-attention layers' state: (3 taps x 8192 channels +
/// 32 heads x 128 x 128) f32.
#[test]
fn qwen3_5_4b_plans_a_recurrent_state_per_sequence() {
    let dir = TempDir::new("qwen35");
    let gguf = dir.0.join("qwen3.5-4b-q4_k.gguf");
    fx::write_gguf(&fx::qwen3_5_4b(), &gguf, GgufTensorType::Q4_K, Data::Sparse).unwrap();
    let args = ["--memory", "64G", "-c", "8192", "--batch", "2", "-t", "2"];
    let v = inspect_json(&gguf, &args, &[]);
    assert_eq!(v["family"], "qwen35");
    let per_sequence = 24 * (3 * 8192 + 32 * 128 * 128) * 4;
    assert_eq!(u(&v, "recurrent_bytes"), 2 * per_sequence);
    assert_eq!(
        u(&v["recurrent_detail"], "bytes_per_sequence"),
        per_sequence
    );
    assert_eq!(u(&v, "kv_bytes_per_token"), 8 * kv_f16(4, 256));
    assert_eq!(u(&v, "kv_bytes"), 8 * kv_f16(4, 256) * 8192 * 2);
    // The state's term follows the KV's.
    assert_eq!(v["terms"][2]["name"], "kv");
    assert_eq!(v["terms"][3]["name"], "recurrent_state");
    let mut text_args = vec!["inspect", gguf.to_str().unwrap()];
    text_args.extend(args);
    let out = fathom(&text_args, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Recurrent state") && text.contains("24 linear-attention layers"),
        "{text}"
    );
}

#[test]
fn unknown_family_gets_weights_and_a_note() {
    let dir = TempDir::new("unknown");
    let mut model = fx::tiny_llama();
    model.config["model_type"] = "mamba_like".into();
    model.config["architectures"] = serde_json::json!(["MambaLikeForCausalLM"]);
    fx::write_hf_dir(&model, &dir.0, 1, Data::Sparse).unwrap();
    let v = inspect_json(&dir.0, &["--memory", "8G"], &[]);
    assert_eq!(v["family"], "mamba_like");
    assert_eq!(u(&v, "weights_bytes"), model.total_bytes());
    let notes = v["notes"].as_array().unwrap();
    assert!(
        notes
            .iter()
            .any(|n| n.as_str().unwrap().contains("not a family fathom runs")),
        "{notes:?}"
    );
    let out = fathom(&["inspect", dir.0.to_str().unwrap(), "--memory", "8G"], &[]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("note: "),
        "{}",
        stderr(&out)
    );
}

#[test]
fn unreadable_input_names_the_file() {
    let dir = TempDir::new("bad");
    let truncated = dir.0.join("truncated.gguf");
    let full = std::fs::read(common::smollm2()).unwrap();
    std::fs::write(&truncated, &full[..4096]).unwrap();
    let missing_shard = dir.0.join("sharded");
    fx::write_hf_dir(&fx::tiny_llama(), &missing_shard, 2, Data::Sparse).unwrap();
    std::fs::remove_file(missing_shard.join("model-00002-of-00002.safetensors")).unwrap();
    let not_gguf = dir.0.join("notes.gguf");
    std::fs::write(&not_gguf, b"this is not a model").unwrap();
    for (path, needle) in [
        (truncated.clone(), "truncated"),
        (missing_shard, "model-00002-of-00002.safetensors"),
        (not_gguf.clone(), "GGUF"),
        (dir.0.join("absent.gguf"), "absent.gguf"),
    ] {
        let out = fathom(&["inspect", path.to_str().unwrap()], &[]);
        assert_eq!(out.status.code(), Some(1), "{}", path.display());
        let err = stderr(&out);
        assert!(err.contains(needle), "{}: {err}", path.display());
        assert!(!err.contains("panicked"), "{err}");
        assert!(out.stdout.is_empty());
    }
}
