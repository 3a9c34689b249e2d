//! Hugging Face / MLX checkpoint directories written to temporary
//! directories: single files, sharded indexes (good and hostile), nested
//! configs, MLX quantization, and a sparse multi-GiB shard that must open
//! from its header alone.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fathom_checkpoint::{Checkpoint, ErrorKind, HfCheckpoint, MlxQuantization, StDtype};
use serde_json::json;

/// A temporary directory removed on drop, unique per test and process.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "fathom-hf-{name}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The header of a safetensors file holding `tensors` back to back, and
/// the size of its data section.
fn header(tensors: &[(&str, StDtype, &[u64])]) -> (String, u64) {
    let mut entries = vec!["\"__metadata__\":{\"format\":\"pt\"}".to_owned()];
    let mut offset = 0u64;
    for (name, dtype, shape) in tensors {
        let n_bytes = shape.iter().product::<u64>() * dtype.size_bytes();
        entries.push(format!(
            "{name:?}:{{\"dtype\":\"{}\",\"shape\":{shape:?},\"data_offsets\":[{offset},{}]}}",
            dtype.name(),
            offset + n_bytes
        ));
        offset += n_bytes;
    }
    (format!("{{{}}}", entries.join(",")), offset)
}

/// Writes a safetensors file whose data section is sparse (zeros that cost
/// no disk), so the same helper serves tiny and multi-GiB files.
fn write_st(path: &Path, tensors: &[(&str, StDtype, &[u64])]) {
    let (header, data_len) = header(tensors);
    let mut file = File::create(path).unwrap();
    file.write_all(&(header.len() as u64).to_le_bytes())
        .unwrap();
    file.write_all(header.as_bytes()).unwrap();
    file.set_len(8 + header.len() as u64 + data_len).unwrap();
}

fn write_json(path: &Path, value: &serde_json::Value) {
    fs::write(path, serde_json::to_vec_pretty(value).unwrap()).unwrap();
}

fn llama_config() -> serde_json::Value {
    json!({"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1})
}

fn names(hf: &HfCheckpoint) -> Vec<(&str, usize)> {
    hf.tensors
        .iter()
        .map(|t| (t.name.as_str(), t.file))
        .collect()
}

#[test]
fn single_model_safetensors() {
    let dir = TempDir::new("single");
    write_json(&dir.path().join("config.json"), &llama_config());
    write_st(
        &dir.path().join("model.safetensors"),
        &[
            ("model.embed_tokens.weight", StDtype::BF16, &[32, 8]),
            ("model.norm.weight", StDtype::F32, &[8]),
        ],
    );
    // Without an index, model.safetensors wins over other files.
    write_st(
        &dir.path().join("other.safetensors"),
        &[("x", StDtype::F16, &[1])],
    );

    let hf = HfCheckpoint::open(dir.path()).unwrap();
    assert_eq!(hf.dir, dir.path());
    assert_eq!(hf.files.len(), 1);
    assert_eq!(hf.quantization, None);
    assert_eq!(hf.config["model_type"], "llama");
    assert_eq!(hf.text_config(), &hf.config);
    assert_eq!(
        names(&hf),
        [("model.embed_tokens.weight", 0), ("model.norm.weight", 0)]
    );
    assert_eq!(hf.tensors[0].n_bytes(), 32 * 8 * 2);
    assert_eq!(hf.files[0].metadata["format"], "pt");

    let checkpoint = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(checkpoint.format_name(), "safetensors");
}

/// Three shards, the weight map listing them out of order, plus a stray
/// `*.safetensors` the index does not name.
fn sharded_dir(name: &str) -> TempDir {
    let dir = TempDir::new(name);
    write_json(&dir.path().join("config.json"), &llama_config());
    let shard = |i: usize| format!("model-0000{i}-of-00003.safetensors");
    write_st(
        &dir.path().join(shard(1)),
        &[("a", StDtype::F16, &[4, 8]), ("c", StDtype::F16, &[8])],
    );
    write_st(&dir.path().join(shard(2)), &[("b", StDtype::BF16, &[16])]);
    write_st(&dir.path().join(shard(3)), &[("d", StDtype::F32, &[2, 2])]);
    write_st(
        &dir.path().join("stray.safetensors"),
        &[("zz", StDtype::U8, &[1])],
    );
    write_json(
        &dir.path().join("model.safetensors.index.json"),
        &json!({
            "metadata": {"total_size": 64 + 16 + 32 + 16},
            "weight_map": {"b": shard(2), "a": shard(1), "d": shard(3), "c": shard(1)},
        }),
    );
    dir
}

#[test]
fn three_shard_index() {
    let dir = sharded_dir("sharded");
    let hf = HfCheckpoint::open(dir.path()).unwrap();
    let files: Vec<String> = hf
        .files
        .iter()
        .map(|f| f.path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    // Each shard once, in order of first appearance in the weight map.
    assert_eq!(
        files,
        [
            "model-00002-of-00003.safetensors",
            "model-00001-of-00003.safetensors",
            "model-00003-of-00003.safetensors"
        ]
    );
    assert_eq!(names(&hf), [("b", 0), ("a", 1), ("c", 1), ("d", 2)]);
    for (i, file) in hf.files.iter().enumerate() {
        assert!(file.tensors.iter().all(|t| t.file == i));
    }
    let total: u64 = hf.tensors.iter().map(|t| t.n_bytes()).sum();
    assert_eq!(total, 64 + 32 + 16 + 16);
}

#[test]
fn index_naming_a_missing_shard() {
    let dir = sharded_dir("missing");
    fs::remove_file(dir.path().join("model-00003-of-00003.safetensors")).unwrap();
    let err = HfCheckpoint::open(dir.path()).unwrap_err();
    assert!(
        matches!(&err.kind, ErrorKind::MissingShard { shard } if shard == "model-00003-of-00003.safetensors"),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("model-00003-of-00003.safetensors"), "{text}");
    assert!(text.contains("model.safetensors.index.json"), "{text}");
}

#[test]
fn index_with_shard_names_outside_the_directory() {
    let root = TempDir::new("escape");
    let dir = root.path().join("model");
    fs::create_dir(&dir).unwrap();
    write_json(&dir.join("config.json"), &llama_config());
    // The target exists, so only the name check can stop it.
    write_st(
        &root.path().join("evil.safetensors"),
        &[("w", StDtype::F16, &[1])],
    );
    let absolute = root.path().join("evil.safetensors");
    for shard in [
        "../evil.safetensors",
        "..",
        ".",
        "",
        "sub/evil.safetensors",
        "sub\\evil.safetensors",
        absolute.to_str().unwrap(),
    ] {
        write_json(
            &dir.join("model.safetensors.index.json"),
            &json!({"weight_map": {"w": shard}}),
        );
        let err = HfCheckpoint::open(&dir).unwrap_err();
        assert!(
            matches!(err.kind, ErrorKind::InvalidValue { .. }),
            "{shard}: {err:?}"
        );
        let text = err.to_string();
        assert!(text.contains("weight_map[w]"), "{text}");
        assert!(text.contains("plain file name"), "{text}");
    }
}

type KindCheck = fn(&ErrorKind) -> bool;

#[test]
fn index_errors_name_the_index_and_field() {
    let dir = sharded_dir("index-errors");
    let index = dir.path().join("model.safetensors.index.json");
    let shard1 = "model-00001-of-00003.safetensors";
    let cases: [(&str, KindCheck, &str); 7] = [
        // The tensor exists, but in another shard.
        (
            r#"{"weight_map": {"a": "model-00002-of-00003.safetensors"}}"#,
            |k| matches!(k, ErrorKind::InvalidValue { .. }),
            "weight_map[a]",
        ),
        (
            r#"{"metadata": {}}"#,
            |k| matches!(k, ErrorKind::InvalidValue { .. }),
            "weight_map",
        ),
        (
            r#"{"weight_map": {}}"#,
            |k| matches!(k, ErrorKind::InvalidValue { .. }),
            "weight_map has invalid value {}",
        ),
        (
            r#"{"weight_map": []}"#,
            |k| matches!(k, ErrorKind::InvalidValue { .. }),
            "weight_map",
        ),
        (
            r#"{"weight_map": {"a": 1}}"#,
            |k| matches!(k, ErrorKind::InvalidValue { .. }),
            "weight_map[a]",
        ),
        (
            r#"{"weight_map": {"a": "x", "a": "y"}}"#,
            |k| matches!(k, ErrorKind::DuplicateTensor { .. }),
            "\"a\"",
        ),
        (
            r#"{"weight_map": {"#,
            |k| matches!(k, ErrorKind::Json { .. }),
            "line 1",
        ),
    ];
    for (text, kind, field) in cases {
        fs::write(&index, text).unwrap();
        let err = HfCheckpoint::open(dir.path()).unwrap_err();
        assert!(kind(&err.kind), "{text}: {err:?}");
        let message = err.to_string();
        assert!(
            message.contains("model.safetensors.index.json"),
            "{message}"
        );
        assert!(message.contains(field), "{message} lacks {field}");
    }

    // A tensor in two shards, even if the map names only one of them.
    write_st(
        &dir.path().join(shard1),
        &[
            ("a", StDtype::F16, &[4, 8]),
            ("c", StDtype::F16, &[8]),
            ("b", StDtype::F16, &[1]),
        ],
    );
    write_json(
        &index,
        &json!({"weight_map": {"a": shard1, "b": "model-00002-of-00003.safetensors"}}),
    );
    let err = HfCheckpoint::open(dir.path()).unwrap_err();
    assert!(
        matches!(&err.kind, ErrorKind::DuplicateTensor { name } if name == "b"),
        "{err:?}"
    );
}

#[test]
fn directory_of_loose_safetensors_files() {
    let dir = TempDir::new("glob");
    write_json(&dir.path().join("config.json"), &llama_config());
    write_st(
        &dir.path().join("weights-b.safetensors"),
        &[("b", StDtype::F16, &[2])],
    );
    write_st(
        &dir.path().join("weights-a.safetensors"),
        &[("a", StDtype::F16, &[2])],
    );
    fs::write(dir.path().join("tokenizer.json"), "{}").unwrap();
    fs::create_dir(dir.path().join("dir.safetensors")).unwrap();
    let hf = HfCheckpoint::open(dir.path()).unwrap();
    assert_eq!(names(&hf), [("a", 0), ("b", 1)]);

    write_st(
        &dir.path().join("weights-c.safetensors"),
        &[("a", StDtype::F16, &[2])],
    );
    let err = HfCheckpoint::open(dir.path()).unwrap_err();
    assert!(
        matches!(&err.kind, ErrorKind::DuplicateTensor { name } if name == "a"),
        "{err:?}"
    );
    assert!(err.to_string().contains("weights-c.safetensors"), "{err}");
}

#[test]
fn directory_without_weights_or_config() {
    let dir = TempDir::new("empty");
    let err = HfCheckpoint::open(dir.path()).unwrap_err();
    assert!(matches!(err.kind, ErrorKind::Io(_)), "{err:?}");
    assert!(err.to_string().contains("config.json"), "{err}");

    fs::write(dir.path().join("config.json"), "{\"a\": }").unwrap();
    let err = HfCheckpoint::open(dir.path()).unwrap_err();
    assert!(matches!(err.kind, ErrorKind::Json { .. }), "{err:?}");
    assert!(err.to_string().contains("line 1 column 7"), "{err}");

    fs::write(dir.path().join("config.json"), "[]").unwrap();
    let err = HfCheckpoint::open(dir.path()).unwrap_err();
    assert!(
        matches!(err.kind, ErrorKind::InvalidValue { .. }),
        "{err:?}"
    );

    write_json(&dir.path().join("config.json"), &llama_config());
    let err = HfCheckpoint::open(dir.path()).unwrap_err();
    let text = err.to_string();
    assert!(text.contains(&dir.path().display().to_string()), "{text}");
    assert!(text.contains("model.safetensors"), "{text}");
}

#[test]
fn nested_text_config() {
    let dir = TempDir::new("nested");
    write_json(
        &dir.path().join("config.json"),
        &json!({
            "model_type": "llava",
            "vision_config": {"hidden_size": 1024},
            "text_config": {"model_type": "llama", "hidden_size": 4096},
        }),
    );
    write_st(
        &dir.path().join("model.safetensors"),
        &[("w", StDtype::F16, &[2])],
    );
    let hf = HfCheckpoint::open(dir.path()).unwrap();
    assert_eq!(hf.text_config()["hidden_size"], 4096);
    assert_eq!(hf.config["model_type"], "llava");
}

/// An MLX 4-bit layer: U32-packed weights with F16 scales and biases.
fn write_mlx_dir(dir: &Path, config: serde_json::Value) {
    write_json(&dir.join("config.json"), &config);
    write_st(
        &dir.join("model.safetensors"),
        &[
            (
                "model.layers.0.mlp.down_proj.weight",
                StDtype::U32,
                &[64, 8],
            ),
            (
                "model.layers.0.mlp.down_proj.scales",
                StDtype::F16,
                &[64, 1],
            ),
            (
                "model.layers.0.mlp.down_proj.biases",
                StDtype::F16,
                &[64, 1],
            ),
        ],
    );
}

#[test]
fn mlx_quantized_checkpoint() {
    let dir = TempDir::new("mlx");
    let quantization = json!({
        "group_size": 64,
        "bits": 4,
        "model.layers.0.mlp.gate": {"group_size": 64, "bits": 8},
    });
    write_mlx_dir(
        dir.path(),
        json!({"model_type": "qwen2", "quantization": quantization, "quantization_config": quantization}),
    );
    let hf = HfCheckpoint::open(dir.path()).unwrap();
    assert_eq!(
        hf.quantization,
        Some(MlxQuantization {
            group_size: 64,
            bits: 4
        })
    );
    assert_eq!(hf.tensors[0].dtype, StDtype::U32);
    assert_eq!(hf.tensors[0].n_bytes(), 64 * 64 * 4 / 8);
    assert_eq!(Checkpoint::open(dir.path()).unwrap().format_name(), "mlx");

    // quantization_config alone, as some converters write it.
    write_mlx_dir(
        dir.path(),
        json!({"quantization_config": {"group_size": 32, "bits": 8}}),
    );
    let hf = HfCheckpoint::open(dir.path()).unwrap();
    assert_eq!(
        hf.quantization,
        Some(MlxQuantization {
            group_size: 32,
            bits: 8
        })
    );
}

#[test]
fn non_mlx_quantization_configs_are_not_mlx() {
    let dir = TempDir::new("gptq");
    for config in [
        json!({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": -1}}),
        json!({"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}),
        json!({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}),
        json!({"quantization_config": {"load_in_4bit": true}}),
        json!({"quantization": null}),
    ] {
        write_mlx_dir(dir.path(), config.clone());
        let hf = HfCheckpoint::open(dir.path()).unwrap();
        assert_eq!(hf.quantization, None, "{config}");
    }
}

#[test]
fn invalid_mlx_quantization() {
    let dir = TempDir::new("mlx-bad");
    for (quantization, field, value) in [
        (
            json!({"group_size": 64, "bits": 7}),
            "quantization.bits",
            "7",
        ),
        (
            json!({"group_size": 64, "bits": 1}),
            "quantization.bits",
            "1",
        ),
        (
            json!({"group_size": 64, "bits": "4"}),
            "quantization.bits",
            "\"4\"",
        ),
        (
            json!({"group_size": 64, "bits": 4.0}),
            "quantization.bits",
            "4.0",
        ),
        (json!({"group_size": 64}), "quantization.bits", "missing"),
        (
            json!({"group_size": 48, "bits": 4}),
            "quantization.group_size",
            "48",
        ),
        (
            json!({"group_size": -64, "bits": 4}),
            "quantization.group_size",
            "-64",
        ),
        (json!({"bits": 4}), "quantization.group_size", "missing"),
        (json!("4bit"), "quantization", "\"4bit\""),
    ] {
        write_mlx_dir(dir.path(), json!({"quantization": quantization}));
        let err = HfCheckpoint::open(dir.path()).unwrap_err();
        assert!(
            matches!(err.kind, ErrorKind::InvalidValue { .. }),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(text.contains("config.json"), "{text}");
        assert!(
            text.contains(&format!("{field} has invalid value {value}")),
            "{text}"
        );
    }
}

#[test]
fn sparse_8_gib_shard_opens_from_its_header() {
    let dir = TempDir::new("sparse");
    write_json(&dir.path().join("config.json"), &llama_config());
    // 65536 × 65536 × 2 bytes = 8 GiB of data that is never written.
    let shape: &[u64] = &[65536, 65536];
    write_st(
        &dir.path().join("model.safetensors"),
        &[
            ("model.embed_tokens.weight", StDtype::F16, shape),
            ("lm_head.weight", StDtype::F16, &[16]),
        ],
    );
    let start = Instant::now();
    let hf = HfCheckpoint::open(dir.path()).unwrap();
    let elapsed = start.elapsed();
    assert!(elapsed < Duration::from_secs(2), "opening took {elapsed:?}");
    let gib8 = 8u64 << 30;
    assert_eq!(hf.tensors[0].n_bytes(), gib8);
    assert_eq!(hf.tensors[1].end, hf.files[0].file_size);
    assert!(hf.files[0].file_size > gib8);
}
