//! ModelSpec from real architectures' GGUF and safetensors headers: both
//! formats of the same model describe the same model.

use std::path::{Path, PathBuf};

use fathom_checkpoint::Checkpoint;
use fathom_fixtures::{self as fx, Data, GgufTensorType, GgufValue, GgufWriter, ModelDef};
use fathom_spec::{Attention, Family, ModelSpec, SpecError, VocabHeader};

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("fathom-spec-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn spec_of(path: &Path) -> Result<ModelSpec, SpecError> {
    ModelSpec::from_checkpoint(&Checkpoint::open(path).unwrap())
}

/// The spec from the HF directory and from the GGUF of the same model.
fn both_formats(model: &ModelDef, name: &str) -> (ModelSpec, ModelSpec) {
    let dir = TempDir::new(name);
    let hf = dir.0.join("hf");
    fx::write_hf_dir(model, &hf, 2, Data::Sparse).unwrap();
    let gguf = dir.0.join("model.gguf");
    fx::write_gguf(model, &gguf, GgufTensorType::Q8_0, Data::Sparse).unwrap();
    (spec_of(&hf).unwrap(), spec_of(&gguf).unwrap())
}

fn assert_same_model(a: &ModelSpec, b: &ModelSpec) {
    assert_eq!(a.family, b.family);
    assert_eq!(
        (
            a.n_layers,
            a.hidden,
            a.n_heads,
            a.n_kv_heads,
            a.head_dim,
            a.ffn,
            a.vocab
        ),
        (
            b.n_layers,
            b.hidden,
            b.n_heads,
            b.n_kv_heads,
            b.head_dim,
            b.ffn,
            b.vocab
        )
    );
    assert_eq!(
        (a.n_experts, a.n_experts_active, a.expert_ffn),
        (b.n_experts, b.n_experts_active, b.expert_ffn)
    );
    assert_eq!(a.context_length, b.context_length);
    assert_eq!(a.layers, b.layers);
    assert_eq!(a.tied_embeddings, b.tied_embeddings);
    // llama.cpp adds `rope_freqs.weight` (precomputed llama3 rope factors)
    // to the GGUF; every other parameter is in both.
    let model_params = |s: &ModelSpec| {
        s.params()
            - s.tensors
                .iter()
                .filter(|t| t.name == "rope_freqs.weight")
                .map(|t| t.params)
                .sum::<u64>()
    };
    assert_eq!(
        model_params(a),
        model_params(b),
        "parameters are the same in both formats"
    );
    let (ra, rb) = (a.rope.as_ref().unwrap(), b.rope.as_ref().unwrap());
    assert_eq!((ra.theta, ra.neox), (rb.theta, rb.neox));
}

#[test]
fn llama_3_1_8b() {
    let (hf, gguf) = both_formats(&fx::llama_3_1_8b(), "llama");
    assert_same_model(&hf, &gguf);
    assert_eq!(hf.family, Family::Llama);
    assert_eq!(
        (
            hf.n_layers,
            hf.hidden,
            hf.n_heads,
            hf.n_kv_heads,
            hf.head_dim
        ),
        (32, 4096, 32, 8, 128)
    );
    assert_eq!(
        (hf.ffn, hf.vocab, hf.context_length),
        (14_336, 128_256, 131_072)
    );
    assert!(hf.layers.iter().all(|l| l.attention == Attention::Full));
    assert!(!hf.tied_embeddings);
    let rope = hf.rope.as_ref().unwrap();
    assert_eq!(rope.theta, 500_000.0);
    assert!(!rope.neox);
    assert_eq!(rope.scaling.as_deref(), Some("llama3"));
    assert_eq!(rope.scaling_factor, Some(8.0));
    // The HF config's llama3 scaling, as llama.cpp's converter turns it into
    // rope_freqs: high frequencies kept, low ones divided by 8, and pair 30
    // (wavelength ~2946 tokens, between 8192/4 and 8192) blended: by hand,
    // smooth = (8192/2946 - 1)/3 = 0.594, divisor = 1/((1-0.594)/8 + 0.594) = 1.552.
    let factors = rope
        .llama3
        .as_ref()
        .expect("llama3 scaling")
        .freq_factors(rope.theta, 128);
    assert_eq!(factors.len(), 64);
    assert_eq!((factors[0], factors[63]), (1.0, 8.0));
    assert!((factors[30] - 1.552).abs() < 0.005, "{}", factors[30]);
    assert!(factors.windows(2).all(|w| w[0] <= w[1]));
    assert!(
        gguf.rope.as_ref().unwrap().llama3.is_none(),
        "GGUF carries rope_freqs instead"
    );
}

#[test]
fn qwen2_5_7b() {
    let (hf, gguf) = both_formats(&fx::qwen2_5_7b(), "qwen2");
    assert_same_model(&hf, &gguf);
    assert_eq!(hf.family, Family::Qwen2);
    assert_eq!(
        (hf.n_layers, hf.n_heads, hf.n_kv_heads, hf.ffn),
        (28, 28, 4, 18_944)
    );
    // Its config carries a window, but `use_sliding_window` is false.
    assert!(hf.layers.iter().all(|l| l.attention == Attention::Full));
    assert!(hf.rope.as_ref().unwrap().neox);
    assert!(hf.tensors.iter().any(|t| t.name.ends_with("q_proj.bias")));
}

#[test]
fn qwen3_30b_a3b() {
    let (hf, gguf) = both_formats(&fx::qwen3_30b_a3b(), "qwen3moe");
    assert_same_model(&hf, &gguf);
    assert_eq!(hf.family, Family::Qwen3Moe);
    assert_eq!(
        (hf.n_experts, hf.n_experts_active, hf.expert_ffn),
        (128, 8, 768)
    );
    assert_eq!(
        (hf.n_layers, hf.hidden, hf.head_dim, hf.context_length),
        (48, 2048, 128, 40_960)
    );
    // GGUF merges the experts into 3-D tensors; the parameters still agree.
    assert!(gguf
        .tensors
        .iter()
        .any(|t| t.name == "blk.0.ffn_gate_exps.weight" && t.shape.len() == 3));
}

#[test]
fn gemma3_1b() {
    let (hf, gguf) = both_formats(&fx::gemma3_1b(), "gemma3");
    assert_same_model(&hf, &gguf);
    assert_eq!(hf.family, Family::Gemma3);
    assert!(hf.tied_embeddings);
    let global: Vec<usize> = hf
        .layers
        .iter()
        .enumerate()
        .filter(|(_, l)| l.attention == Attention::Full)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(global, [5, 11, 17, 23]);
    assert!(hf.layers.iter().all(
        |l| l.attention == Attention::Full || l.attention == Attention::Sliding { window: 512 }
    ));
    let rope = hf.rope.as_ref().unwrap();
    assert_eq!(
        (rope.theta, rope.local_theta),
        (1_000_000.0, Some(10_000.0))
    );
    assert_eq!(gguf.rope.as_ref().unwrap().local_theta, Some(10_000.0));
}

/// A Hugging Face directory's `tokenizer.json` is counted for the runtime
/// term as the tokenizer holds it: the texts of the vocabulary and added
/// tokens, a placeholder for each unused id, the merges' parts in both
/// forms, the file's size; entries the tokenizer would refuse count nothing.
#[test]
fn an_hf_tokenizer_json_is_counted_for_the_runtime_term() {
    let dir = TempDir::new("hf-tokenizer-json");
    fx::write_hf_dir(&fx::tiny_llama(), &dir.0, 1, Data::Sparse).unwrap();
    let spec = spec_of(&dir.0).unwrap();
    assert_eq!(
        spec.vocab_header,
        VocabHeader::default(),
        "no tokenizer.json"
    );
    let tokenizer = r#"{"added_tokens": [{"id": 5, "content": "<|end|>"}],
        "model": {"vocab": {"a": 0, "b": 1, "ab": 2, "a\"b": 3, "bad": -1},
                  "merges": ["a b", ["a\"", "b"], 7]}}"#;
    std::fs::write(dir.0.join("tokenizer.json"), tokenizer).unwrap();
    let spec = spec_of(&dir.0).unwrap();
    assert_eq!(
        spec.vocab_header,
        VocabHeader {
            // Ids 0 to 5, 4 unused: "[PAD5]" stands for it.
            tokens: 6,
            token_bytes: 1 + 1 + 2 + 3 + 7 + 6,
            token_arrays: 0,
            merges: 2,
            merge_bytes: 3 + 4,
            scores_kept: false,
            token_chunks: 6 * 32,
            merge_chunks: 0,
            merge_part_chunks: 4 * 32,
            tokenizer_json_bytes: tokenizer.len() as u64,
        }
    );
    assert_eq!(spec.tokenizer_merges, 0, "the allowance stays as it was");

    std::fs::write(dir.0.join("tokenizer.json"), "{not json").unwrap();
    let spec = spec_of(&dir.0).unwrap();
    assert_eq!(spec.vocab_header, VocabHeader::default());
    assert!(
        spec.notes
            .iter()
            .any(|n| n.contains("tokenizer.json: not valid JSON") && n.contains("allowance")),
        "{:?}",
        spec.notes
    );
}

#[test]
fn gemma3_pattern_without_layer_types() {
    let mut model = fx::gemma3_1b();
    model.config.as_object_mut().unwrap().remove("layer_types");
    model.config["sliding_window_pattern"] = 3.into();
    let dir = TempDir::new("gemma3-pattern");
    fx::write_hf_dir(&model, &dir.0, 1, Data::Sparse).unwrap();
    let spec = spec_of(&dir.0).unwrap();
    let global = spec
        .layers
        .iter()
        .filter(|l| l.attention == Attention::Full)
        .count();
    assert_eq!(global, 26 / 3);
    assert_eq!(spec.layers[2].attention, Attention::Full);
    assert_eq!(spec.layers[0].attention, Attention::Sliding { window: 512 });
}

#[test]
fn qwen3_dense_and_sliding_window_variants() {
    // A dense Qwen3 config: the MoE fields removed.
    let mut model = fx::tiny_qwen2();
    model.config["model_type"] = "qwen3".into();
    model.config["use_sliding_window"] = true.into();
    model.config["sliding_window"] = 64.into();
    model.config["max_window_layers"] = 1.into();
    let dir = TempDir::new("qwen3");
    fx::write_hf_dir(&model, &dir.0, 1, Data::Sparse).unwrap();
    let spec = spec_of(&dir.0).unwrap();
    assert_eq!(spec.family, Family::Qwen3);
    assert_eq!(spec.layers[0].attention, Attention::Full);
    assert_eq!(spec.layers[1].attention, Attention::Sliding { window: 64 });

    // Mistral v0.1 slides in every layer.
    let mut mistral = fx::tiny_llama();
    mistral.config["model_type"] = "mistral".into();
    mistral.config["sliding_window"] = 4096.into();
    let dir = TempDir::new("mistral");
    fx::write_hf_dir(&mistral, &dir.0, 1, Data::Sparse).unwrap();
    let spec = spec_of(&dir.0).unwrap();
    assert_eq!(spec.family, Family::Llama);
    assert!(spec
        .layers
        .iter()
        .all(|l| l.attention == Attention::Sliding { window: 4096 }));
    // ... and Mistral v0.2 has `sliding_window: null`.
    mistral.config["sliding_window"] = serde_json::Value::Null;
    fx::write_hf_dir(&mistral, &dir.0, 1, Data::Sparse).unwrap();
    assert!(spec_of(&dir.0)
        .unwrap()
        .layers
        .iter()
        .all(|l| l.attention == Attention::Full));
}

#[test]
fn bad_config_fields_are_named() {
    let dir = TempDir::new("bad-config");
    let cases: Vec<(&str, serde_json::Value, &str)> = vec![
        (
            "num_hidden_layers",
            serde_json::json!(1_000_000),
            "num_hidden_layers",
        ),
        (
            "num_hidden_layers",
            serde_json::json!("two"),
            "num_hidden_layers",
        ),
        ("hidden_size", serde_json::json!(-5), "hidden_size"),
        (
            "layer_types",
            serde_json::json!(["full_attention"]),
            "layer_types",
        ),
        ("rope_theta", serde_json::json!("fast"), "rope_theta"),
    ];
    for (field, value, needle) in cases {
        let mut model = fx::tiny_llama();
        model.config[field] = value.clone();
        fx::write_hf_dir(&model, &dir.0, 1, Data::Sparse).unwrap();
        let err = spec_of(&dir.0).unwrap_err().to_string();
        assert!(
            err.contains(needle) && err.contains("config.json"),
            "{field}={value}: {err}"
        );
    }
    let mut model = fx::tiny_llama();
    model.config.as_object_mut().unwrap().remove("hidden_size");
    fx::write_hf_dir(&model, &dir.0, 1, Data::Sparse).unwrap();
    let err = spec_of(&dir.0).unwrap_err();
    assert!(
        matches!(&err, SpecError::MissingField { field, .. } if field == "hidden_size"),
        "{err}"
    );
}

/// A GGUF holding only metadata.
fn gguf_with(dir: &TempDir, kvs: Vec<(&str, GgufValue)>) -> PathBuf {
    let mut writer = GgufWriter::new();
    for (k, v) in kvs {
        writer = writer.kv(k, v);
    }
    let path = dir.0.join("meta.gguf");
    writer.write(&path, Data::Sparse).unwrap();
    path
}

#[test]
fn hostile_gguf_hyperparameters_are_errors_not_allocations() {
    let dir = TempDir::new("bad-gguf");
    let arch = || ("general.architecture", GgufValue::string("llama"));
    let base = |layers: GgufValue, kv: GgufValue| {
        vec![
            arch(),
            ("llama.block_count", layers),
            ("llama.embedding_length", GgufValue::U32(64)),
            ("llama.attention.head_count", GgufValue::U32(4)),
            ("llama.attention.head_count_kv", kv),
        ]
    };
    let cases = [
        (
            base(GgufValue::U64(u64::MAX), GgufValue::U32(4)),
            "llama.block_count",
        ),
        (
            base(GgufValue::I32(-3), GgufValue::U32(4)),
            "llama.block_count",
        ),
        (
            base(
                GgufValue::U32(2),
                GgufValue::Array(4, vec![GgufValue::U32(1)]),
            ),
            "llama.attention.head_count_kv",
        ),
        (
            base(GgufValue::U32(2), GgufValue::U64(1 << 40)),
            "llama.attention.head_count_kv",
        ),
        (
            base(GgufValue::U32(2), GgufValue::string("four")),
            "llama.attention.head_count_kv",
        ),
        (
            vec![arch(), ("llama.embedding_length", GgufValue::U32(64))],
            "llama.block_count",
        ),
        (
            vec![("general.name", GgufValue::string("x"))],
            "general.architecture",
        ),
    ];
    for (kvs, needle) in cases {
        let path = gguf_with(&dir, kvs);
        let err = spec_of(&path).unwrap_err().to_string();
        assert!(
            err.contains(needle) && err.contains("meta.gguf"),
            "{needle}: {err}"
        );
    }
    // Per-layer KV heads as an array are read per layer.
    let path = gguf_with(
        &dir,
        base(
            GgufValue::U32(2),
            GgufValue::Array(4, vec![GgufValue::U32(1), GgufValue::U32(2)]),
        ),
    );
    let spec = spec_of(&path).unwrap();
    assert_eq!(
        spec.layers.iter().map(|l| l.n_kv_heads).collect::<Vec<_>>(),
        [1, 2]
    );
    assert_eq!(spec.n_kv_heads, 2);
}

#[test]
fn unknown_gguf_architecture_still_lists_weights() {
    let dir = TempDir::new("unknown-gguf");
    let path = dir.0.join("rwkv.gguf");
    GgufWriter::new()
        .kv("general.architecture", GgufValue::string("rwkv7"))
        .tensor("token_embd.weight", &[64, 100], 0, 64 * 100 * 4)
        .write(&path, Data::Sparse)
        .unwrap();
    let spec = spec_of(&path).unwrap();
    assert_eq!(spec.family, Family::Unknown("rwkv7".into()));
    assert_eq!(spec.weights_bytes(), 64 * 100 * 4);
    assert!(spec.layers.is_empty());
    assert!(
        spec.notes.iter().any(|n| n.contains("rwkv7")),
        "{:?}",
        spec.notes
    );
}

#[test]
fn degenerate_rope_base_and_norm_epsilon_are_refused_with_key_and_value() {
    let dir = TempDir::new("degenerate-gguf");
    let with = |key: &'static str, value: f32| {
        vec![
            ("general.architecture", GgufValue::string("llama")),
            ("llama.block_count", GgufValue::U32(2)),
            ("llama.embedding_length", GgufValue::U32(64)),
            ("llama.attention.head_count", GgufValue::U32(4)),
            ("llama.attention.head_count_kv", GgufValue::U32(4)),
            (key, GgufValue::F32(value)),
        ]
    };
    for (key, value, shown) in [
        ("llama.rope.freq_base", 0.0, "0"),
        ("llama.rope.freq_base", -10000.0, "-10000"),
        ("llama.rope.freq_base", f32::INFINITY, "inf"),
        ("llama.rope.scaling.factor", 0.0, "0"),
        ("llama.attention.layer_norm_rms_epsilon", -1e-5, "-1e-5"),
        ("llama.attention.layer_norm_rms_epsilon", 0.0, "0"),
        ("llama.attention.layer_norm_rms_epsilon", 2.0, "2"),
        ("llama.attention.layer_norm_rms_epsilon", f32::NAN, "NaN"),
    ] {
        let path = gguf_with(&dir, with(key, value));
        let err = spec_of(&path).unwrap_err().to_string();
        assert!(
            err.contains(key) && err.to_lowercase().contains(&shown.to_lowercase()),
            "{key}={value}: {err}"
        );
    }
    // In range, they load.
    for (key, value) in [
        ("llama.rope.freq_base", 500_000.0),
        ("llama.attention.layer_norm_rms_epsilon", 1e-6),
    ] {
        spec_of(&gguf_with(&dir, with(key, value))).unwrap();
    }

    let dir = TempDir::new("degenerate-config");
    for (field, value) in [
        ("rope_theta", serde_json::json!(0.0)),
        ("rope_theta", serde_json::json!(-1)),
        ("rms_norm_eps", serde_json::json!(-1e-6)),
        ("rms_norm_eps", serde_json::json!(0)),
    ] {
        let mut model = fx::tiny_llama();
        model.config[field] = value.clone();
        fx::write_hf_dir(&model, &dir.0, 1, Data::Sparse).unwrap();
        let err = spec_of(&dir.0).unwrap_err().to_string();
        assert!(
            err.contains(field) && err.contains(&value.to_string()),
            "{field}={value}: {err}"
        );
    }
}

/// Qwen3.5's GGUF: the layer pattern from `full_attention_interval`, the
/// gated delta rule's dimensions from `ssm.*`, the quarter-head rope.
#[test]
fn qwen3_5_hybrid_layers_from_gguf() {
    let dir = TempDir::new("qwen35");
    let path = dir.0.join("model.gguf");
    fx::write_gguf(&fx::qwen3_5_4b(), &path, GgufTensorType::Q8_0, Data::Sparse).unwrap();
    let spec = spec_of(&path).unwrap();
    assert_eq!(spec.family, Family::Qwen35);
    assert!(spec.block.gated_attention);
    assert_eq!((spec.n_layers, spec.hidden, spec.n_heads), (32, 2560, 16));
    let full: Vec<usize> = (0..32)
        .filter(|&i| spec.layers[i].attention == Attention::Full)
        .collect();
    assert_eq!(full, [3, 7, 11, 15, 19, 23, 27, 31]);
    assert!(spec
        .layers
        .iter()
        .all(|l| (l.attention == Attention::Linear) == (l.n_kv_heads == 0)));
    let linear = spec.linear.unwrap();
    assert_eq!(
        (
            linear.conv_kernel,
            linear.key_heads,
            linear.value_heads,
            linear.head_dim
        ),
        (4, 16, 32, 128)
    );
    // q, k and v side by side: 2 × 16 × 128 + 32 × 128.
    assert_eq!(linear.conv_channels(), 8192);
    assert_eq!(spec.rope.as_ref().unwrap().dims, Some(64));
    assert!(spec.tied_embeddings);

    let moe = dir.0.join("moe.gguf");
    fx::write_gguf(
        &fx::qwen3_5_35b_a3b(),
        &moe,
        GgufTensorType::Q8_0,
        Data::Sparse,
    )
    .unwrap();
    let spec = spec_of(&moe).unwrap();
    assert_eq!(spec.family, Family::Qwen35Moe);
    assert_eq!(
        (spec.n_experts, spec.n_experts_active, spec.expert_ffn),
        (256, 8, 512)
    );
    assert_eq!(spec.shared_expert_ffn, 512);
    assert!(spec.norm_topk_prob);
    assert_eq!(
        spec.layers
            .iter()
            .filter(|l| l.attention == Attention::Full)
            .count(),
        10
    );
}

/// Qwen3.5's HF config (`qwen3_5_text`, `qwen3_5_moe_text`): the same
/// model as its GGUF — layer pattern, the gated delta rule's dimensions,
/// the quarter-head rope, the shared expert — with norms stored as `w` of
/// `1 + w`.
#[test]
fn qwen3_5_from_hf_config_matches_its_gguf() {
    for (model, family) in [
        (fx::qwen3_5_4b(), Family::Qwen35),
        (fx::qwen3_5_35b_a3b(), Family::Qwen35Moe),
    ] {
        let (hf, gguf) = both_formats(&model, "qwen35-hf");
        assert_same_model(&hf, &gguf);
        assert_eq!(hf.family, family);
        assert_eq!(hf.linear, gguf.linear);
        assert_eq!(hf.linear.unwrap().conv_channels(), 8192);
        assert_eq!(hf.rope.as_ref().unwrap().dims, Some(64));
        assert_eq!(
            hf.rope.as_ref().unwrap().dims,
            gguf.rope.as_ref().unwrap().dims
        );
        assert_eq!(
            (hf.shared_expert_ffn, hf.norm_topk_prob),
            (gguf.shared_expert_ffn, gguf.norm_topk_prob)
        );
        assert!(hf.block.gated_attention && hf.block.norm_adds_one);
        assert!(!gguf.block.norm_adds_one);
        assert_eq!(hf.rms_norm_eps, 1e-6);
    }
}

/// The multimodal layout of a published Qwen3.5 checkpoint: the language
/// model's fields under `text_config` with `layer_types` and the rope in
/// `rope_parameters`, its tensors under `model.language_model.`, the
/// vision tower under `model.visual.` (not planned) and a
/// multi-token-prediction layer under `mtp.` (counted, not run).
#[test]
fn qwen3_5_multimodal_layout_nests_the_text_model() {
    let text = fx::tiny_qwen3_5();
    let mut config = text.config.clone();
    let c = config.as_object_mut().unwrap();
    for key in [
        "architectures",
        "full_attention_interval",
        "rope_theta",
        "partial_rotary_factor",
        "mrope_section",
    ] {
        c.remove(key);
    }
    c.insert("model_type".into(), "qwen3_5_text".into());
    c.insert("mtp_num_hidden_layers".into(), 1.into());
    c.insert(
        "layer_types".into(),
        serde_json::json!([
            "linear_attention",
            "linear_attention",
            "linear_attention",
            "full_attention"
        ]),
    );
    c.insert(
        "rope_parameters".into(),
        serde_json::json!({
            "rope_type": "default",
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [3, 3, 2],
            "mrope_interleaved": true
        }),
    );
    let mut tensors: Vec<fx::TensorDef> = text
        .tensors
        .iter()
        .map(|t| {
            let name = t.name.replacen("model.", "model.language_model.", 1);
            fx::TensorDef::new(name, &t.shape, t.dtype)
        })
        .collect();
    tensors.push(fx::TensorDef::new(
        "model.visual.blocks.0.attn.qkv.weight",
        &[48, 16],
        fx::DType::BF16,
    ));
    tensors.push(fx::TensorDef::new(
        "mtp.fc.weight",
        &[64, 128],
        fx::DType::BF16,
    ));
    let model = ModelDef {
        name: "tiny-qwen3.5-multimodal",
        config: serde_json::json!({
            "architectures": ["Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5",
            "text_config": config,
            "vision_config": {"model_type": "qwen3_5_vision"},
        }),
        tensors,
        gguf_arch: "qwen35",
    };
    let dir = TempDir::new("qwen35-mm");
    fx::write_hf_dir(&model, &dir.0, 1, Data::Sparse).unwrap();
    let nested = spec_of(&dir.0).unwrap();
    fx::write_hf_dir(&text, &dir.0.join("text"), 1, Data::Sparse).unwrap();
    let flat = spec_of(&dir.0.join("text")).unwrap();
    assert_eq!(nested.family, Family::Qwen35);
    assert_eq!(nested.architecture, "Qwen3_5ForConditionalGeneration");
    assert_eq!(nested.layers, flat.layers);
    assert_eq!(nested.linear, flat.linear);
    let (a, b) = (nested.rope.clone().unwrap(), flat.rope.clone().unwrap());
    assert_eq!((a.theta, a.dims, a.scaling), (b.theta, b.dims, b.scaling));
    assert_eq!(a.dims, Some(16));
    assert_eq!(nested.mtp_layers, 1);
    assert!(nested
        .notes
        .iter()
        .any(|n| n.contains("multi-token-prediction")));
    assert!(nested.notes.iter().any(|n| n.contains("1 vision tensors")));
    assert!(!nested
        .tensors
        .iter()
        .any(|t| t.name.starts_with("model.visual.")));
    assert_eq!(nested.params(), flat.params() + 64 * 128, "mtp counted");
}

/// Qwen3.5 config fields fathom cannot run, or that disagree, are named.
#[test]
fn qwen3_5_hf_config_fields_are_checked() {
    let dir = TempDir::new("qwen35-hf-bad");
    for (overrides, needle) in [
        (
            serde_json::json!({"linear_conv_kernel_dim": null}),
            "linear_conv_kernel_dim",
        ),
        (
            serde_json::json!({"linear_value_head_dim": 64}),
            "linear_value_head_dim",
        ),
        (
            serde_json::json!({"linear_num_value_heads": 3}),
            "linear_num_value_heads",
        ),
        (
            serde_json::json!({"attn_output_gate": false}),
            "attn_output_gate",
        ),
        (
            serde_json::json!({"full_attention_interval": 0}),
            "full_attention_interval",
        ),
        (
            serde_json::json!({"full_attention_interval": null}),
            "full_attention_interval",
        ),
        (
            serde_json::json!({"layer_types": ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]}),
            "layer_types",
        ),
        (
            serde_json::json!({"partial_rotary_factor": 1.5}),
            "partial_rotary_factor",
        ),
        (
            serde_json::json!({"mrope_section": [2, 2, 2, 2]}),
            "mrope_section",
        ),
    ] {
        let mut model = fx::tiny_qwen3_5();
        for (k, v) in overrides.as_object().unwrap() {
            let c = model.config.as_object_mut().unwrap();
            if v.is_null() {
                c.remove(k);
            } else {
                c.insert(k.clone(), v.clone());
            }
        }
        let _ = std::fs::remove_dir_all(&dir.0);
        fx::write_hf_dir(&model, &dir.0, 1, Data::Sparse).unwrap();
        let err = spec_of(&dir.0).unwrap_err().to_string();
        assert!(err.contains(needle), "{overrides}: {err}");
    }
}

/// Without a layer pattern, with `ssm.*` that disagree, with MTP layers
/// counted: named errors, or the decoder's layers only.
#[test]
fn qwen3_5_metadata_is_checked() {
    let dir = TempDir::new("qwen35-bad");
    let base = || {
        let mut kvs = vec![
            ("general.architecture", GgufValue::string("qwen35")),
            ("qwen35.block_count", GgufValue::U32(5)),
            ("qwen35.embedding_length", GgufValue::U32(64)),
            ("qwen35.attention.head_count", GgufValue::U32(2)),
            ("qwen35.attention.head_count_kv", GgufValue::U32(1)),
            ("qwen35.attention.key_length", GgufValue::U32(32)),
            ("qwen35.ssm.conv_kernel", GgufValue::U32(4)),
            ("qwen35.ssm.state_size", GgufValue::U32(16)),
            ("qwen35.ssm.group_count", GgufValue::U32(2)),
            ("qwen35.ssm.time_step_rank", GgufValue::U32(4)),
            ("qwen35.ssm.inner_size", GgufValue::U32(64)),
        ];
        kvs.push(("qwen35.nextn_predict_layers", GgufValue::U32(1)));
        kvs
    };
    let err = spec_of(&gguf_with(&dir, base())).unwrap_err().to_string();
    assert!(err.contains("qwen35.full_attention_interval"), "{err}");

    let mut kvs = base();
    kvs.push(("qwen35.full_attention_interval", GgufValue::U32(2)));
    let spec = spec_of(&gguf_with(&dir, kvs.clone())).unwrap();
    assert_eq!(spec.n_layers, 4, "the MTP layer is not a decoder layer");
    assert_eq!(spec.mtp_layers, 1);
    let kinds: Vec<Attention> = spec.layers.iter().map(|l| l.attention).collect();
    assert_eq!(
        kinds,
        [
            Attention::Linear,
            Attention::Full,
            Attention::Linear,
            Attention::Full
        ]
    );

    // An explicit flag per layer wins over the interval.
    let mut flags = kvs.clone();
    flags.push((
        "qwen35.attention.recurrent_layers",
        GgufValue::Array(
            7,
            [true, true, true, false, false]
                .map(GgufValue::Bool)
                .to_vec(),
        ),
    ));
    let spec = spec_of(&gguf_with(&dir, flags)).unwrap();
    assert_eq!(spec.layers[2].attention, Attention::Linear);
    assert_eq!(spec.layers[1].attention, Attention::Linear);

    for (key, value, needle) in [
        (
            "qwen35.ssm.inner_size",
            GgufValue::U32(60),
            "qwen35.ssm.inner_size",
        ),
        ("qwen35.ssm.time_step_rank", GgufValue::U32(3), "qwen35.ssm"),
        (
            "qwen35.full_attention_interval",
            GgufValue::U32(0),
            "qwen35.full_attention_interval",
        ),
        (
            "qwen35.nextn_predict_layers",
            GgufValue::U32(5),
            "qwen35.nextn_predict_layers",
        ),
        (
            "qwen35.rope.dimension_count",
            GgufValue::U32(7),
            "qwen35.rope.dimension_count",
        ),
        (
            "qwen35.rope.dimension_sections",
            GgufValue::Array(5, [2, 2, 2, 2].map(GgufValue::I32).to_vec()),
            "qwen35.rope.dimension_sections",
        ),
    ] {
        let mut bad: Vec<(&str, GgufValue)> =
            kvs.iter().filter(|(k, _)| *k != key).cloned().collect();
        bad.push((key, value));
        if key == "qwen35.rope.dimension_sections" {
            bad.push(("qwen35.rope.dimension_count", GgufValue::U32(16)));
        }
        let err = spec_of(&gguf_with(&dir, bad)).unwrap_err().to_string();
        assert!(err.contains(needle), "{key}: {err}");
    }
}

/// Gemma 4 31B's GGUF: the layer pattern from
/// `attention.sliding_window_pattern`, each kind's heads (16 of 256 in the
/// sliding layers, 4 of 512 in the global ones), the sliding layers' rope
/// base, unscaled scores and the logit softcap.
#[test]
fn gemma4_31b_layers_from_gguf() {
    let dir = TempDir::new("gemma4");
    let path = dir.0.join("model.gguf");
    fx::write_gguf(
        &fx::gemma_4_31b(),
        &path,
        GgufTensorType::Q8_0,
        Data::Sparse,
    )
    .unwrap();
    let spec = spec_of(&path).unwrap();
    assert_eq!(spec.family, Family::Gemma4);
    assert!(spec.block.value_norm && spec.block.post_norms && spec.block.embed_scaled);
    assert!(
        !spec.block.norm_adds_one,
        "llama.cpp stores Gemma 4's norms as they multiply"
    );
    assert_eq!((spec.n_layers, spec.hidden, spec.n_heads), (60, 5376, 32));
    assert_eq!((spec.head_dim, spec.n_kv_heads), (512, 16));
    for (i, l) in spec.layers.iter().enumerate() {
        let shape = (l.attention, l.n_kv_heads, l.key_dim, l.value_dim);
        if (i + 1) % 6 == 0 {
            assert_eq!(shape, (Attention::Full, 4, 512, 512), "layer {i}");
        } else {
            let sliding = Attention::Sliding { window: 1024 };
            assert_eq!(shape, (sliding, 16, 256, 256), "layer {i}");
        }
    }
    let rope = spec.rope.as_ref().unwrap();
    assert_eq!((rope.theta, rope.local_theta), (1e6, Some(1e4)));
    assert!(rope.factors_global_only && rope.neox && rope.dims.is_none());
    assert_eq!(spec.attn_scale, Some(1.0));
    assert_eq!(spec.final_logit_softcap, Some(30.0));
    assert!(spec.tied_embeddings);
    // The global layers take their values from the k projection.
    assert!(spec.tensors.iter().any(|t| t.name == "blk.0.attn_v.weight"));
    assert!(!spec.tensors.iter().any(|t| t.name == "blk.5.attn_v.weight"));
    assert!(spec.notes.is_empty(), "{:?}", spec.notes);
}

/// A minimal gemma4 header: 4 layers (sliding, global, sliding, global),
/// with the rope factors' tensor when `factors`.
fn gemma4_gguf(dir: &TempDir, kvs: &[(&str, GgufValue)], factors: bool) -> PathBuf {
    let mut writer = GgufWriter::new();
    let replaced = |key: &str| kvs.iter().any(|(k, _)| *k == key);
    let pattern = GgufValue::Array(7, [true, false, true, false].map(GgufValue::Bool).to_vec());
    let heads = GgufValue::Array(4, [2, 1, 2, 1].map(GgufValue::U32).to_vec());
    for (k, v) in [
        ("general.architecture", GgufValue::string("gemma4")),
        ("gemma4.block_count", GgufValue::U32(4)),
        ("gemma4.embedding_length", GgufValue::U32(64)),
        ("gemma4.attention.head_count", GgufValue::U32(2)),
        ("gemma4.attention.head_count_kv", heads),
        ("gemma4.attention.key_length", GgufValue::U32(32)),
        ("gemma4.attention.value_length", GgufValue::U32(32)),
        ("gemma4.attention.key_length_swa", GgufValue::U32(16)),
        ("gemma4.attention.value_length_swa", GgufValue::U32(16)),
        ("gemma4.attention.sliding_window", GgufValue::U32(8)),
        ("gemma4.attention.sliding_window_pattern", pattern),
        ("gemma4.embedding_length_per_layer_input", GgufValue::U32(0)),
        ("gemma4.rope.dimension_count", GgufValue::U32(32)),
        ("gemma4.rope.dimension_count_swa", GgufValue::U32(16)),
    ] {
        if !replaced(k) {
            writer = writer.kv(k, v);
        }
    }
    for (k, v) in kvs {
        if !matches!(v, GgufValue::Array(_, items) if items.is_empty()) {
            writer = writer.kv(*k, v.clone());
        }
    }
    if factors {
        writer = writer.tensor("rope_freqs.weight", &[16], 0, 64);
    }
    let path = dir.0.join("gemma4.gguf");
    writer.write(&path, Data::Sparse).unwrap();
    path
}

/// Keys Gemma 4 needs are named when missing or wrong; the E2B/E4B
/// variants are planned (shared-KV layers without KV of their own) with
/// notes saying fathom does not run them.
#[test]
fn gemma4_metadata_is_checked() {
    let dir = TempDir::new("gemma4-bad");
    let merges = GgufValue::strings(["a b", "ab c", "d e"]);
    let spec = spec_of(&gemma4_gguf(
        &dir,
        &[("tokenizer.ggml.merges", merges)],
        true,
    ))
    .unwrap();
    assert_eq!(spec.tokenizer_merges, 3, "the runtime term counts them");
    let header = spec.vocab_header;
    assert_eq!(
        (header.merges, header.merge_bytes),
        (3, 3 + 4 + 3),
        "merges and their strings' bytes"
    );
    assert_eq!(
        (header.merge_chunks, header.merge_part_chunks),
        (3 * 32, 6 * 32),
        "each line and each part a 32-byte malloc chunk"
    );
    let dims: Vec<(u64, u64)> = spec
        .layers
        .iter()
        .map(|l| (l.n_kv_heads, l.key_dim))
        .collect();
    assert_eq!(dims, [(2, 16), (1, 32), (2, 16), (1, 32)]);
    assert_eq!(spec.rope.as_ref().unwrap().local_theta, Some(10_000.0));

    let err = spec_of(&gemma4_gguf(&dir, &[], false))
        .unwrap_err()
        .to_string();
    assert!(err.contains("rope_freqs.weight"), "{err}");

    // Leaving a required key out (an empty array drops it).
    let none = || GgufValue::Array(4, Vec::new());
    for (key, value, needle) in [
        (
            "gemma4.attention.sliding_window_pattern",
            none(),
            "gemma4.attention.sliding_window_pattern",
        ),
        (
            "gemma4.attention.sliding_window_pattern",
            GgufValue::Array(7, [true, false].map(GgufValue::Bool).to_vec()),
            "at least 4 booleans",
        ),
        (
            "gemma4.attention.key_length_swa",
            none(),
            "gemma4.attention.key_length_swa",
        ),
        (
            "gemma4.rope.dimension_count",
            GgufValue::U32(8),
            "gemma4.rope.dimension_count",
        ),
        (
            "gemma4.attention.shared_kv_layers",
            GgufValue::U32(4),
            "gemma4.attention.shared_kv_layers",
        ),
    ] {
        let err = spec_of(&gemma4_gguf(&dir, &[(key, value)], true))
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{key}: {err}");
    }

    let kvs = [
        ("gemma4.attention.shared_kv_layers", GgufValue::U32(2)),
        ("gemma4.embedding_length_per_layer_input", GgufValue::U32(8)),
    ];
    let spec = spec_of(&gemma4_gguf(&dir, &kvs, true)).unwrap();
    let kinds: Vec<Attention> = spec.layers.iter().map(|l| l.attention).collect();
    assert_eq!(
        kinds,
        [
            Attention::Sliding { window: 8 },
            Attention::Full,
            Attention::None,
            Attention::None
        ]
    );
    assert_eq!(spec.notes.len(), 2, "{:?}", spec.notes);
    assert!(
        spec.notes[0].contains("shared_kv_layers"),
        "{:?}",
        spec.notes
    );
}
