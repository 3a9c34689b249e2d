use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use fathom_fixtures::*;
use serde_json::Value;

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!(
            "fathom-fixtures-{}-{tag}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The header JSON and where the data section starts.
fn read_safetensors_header(path: &Path) -> (Value, u64) {
    let bytes = fs::read(path).unwrap();
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let header = serde_json::from_slice(&bytes[8..8 + len as usize]).unwrap();
    (header, 8 + len)
}

/// Reads only the header bytes of a (possibly huge, sparse) file.
fn read_prefix(path: &Path, len: usize) -> Vec<u8> {
    use std::io::Read;
    let mut buf = Vec::new();
    fs::File::open(path)
        .unwrap()
        .take(len as u64)
        .read_to_end(&mut buf)
        .unwrap();
    buf
}

fn within(actual: u64, published: f64, tolerance: f64) -> bool {
    (actual as f64 - published).abs() <= published * tolerance
}

#[test]
fn parameter_counts_match_published() {
    for (model, published) in [
        (llama_3_1_8b(), 8.03e9),
        (qwen2_5_7b(), 7.62e9),
        (qwen3_30b_a3b(), 30.5e9),
        (gemma3_1b(), 1.0e9),
        (gemma3_4b_multimodal_text(), 4.3e9),
        (smollm2_135m(), 1.35e8),
    ] {
        let count = model.parameter_count();
        assert!(within(count, published, 0.01), "{}: {count}", model.name);
    }
}

#[test]
fn tensor_tables_have_the_real_names() {
    let all = [
        llama_3_1_8b(),
        qwen2_5_7b(),
        qwen3_30b_a3b(),
        gemma3_1b(),
        gemma3_4b_multimodal_text(),
        smollm2_135m(),
        tiny_llama(),
        tiny_qwen2(),
        tiny_qwen3_moe(),
        tiny_gemma3(),
    ];
    for model in &all {
        let names: HashSet<&str> = model.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names.len(),
            model.tensors.len(),
            "{} repeats a name",
            model.name
        );
    }
    let shape = |model: &ModelDef, name: &str| -> Vec<u64> {
        let tensor = model.tensors.iter().find(|t| t.name == name);
        tensor
            .unwrap_or_else(|| panic!("{}: no {name}", model.name))
            .shape
            .clone()
    };
    let has = |model: &ModelDef, name: &str| model.tensors.iter().any(|t| t.name == name);

    let llama = &all[0];
    assert_eq!(shape(llama, "lm_head.weight"), [128256, 4096]);
    assert_eq!(
        shape(llama, "model.layers.31.self_attn.k_proj.weight"),
        [1024, 4096]
    );
    assert_eq!(
        shape(llama, "model.layers.0.mlp.down_proj.weight"),
        [4096, 14336]
    );

    let qwen = &all[1];
    assert_eq!(shape(qwen, "model.layers.27.self_attn.v_proj.bias"), [512]);
    assert!(has(qwen, "lm_head.weight"));

    let moe = &all[2];
    assert_eq!(shape(moe, "model.layers.47.mlp.gate.weight"), [128, 2048]);
    assert_eq!(
        shape(moe, "model.layers.0.mlp.experts.127.down_proj.weight"),
        [2048, 768]
    );
    assert_eq!(
        shape(moe, "model.layers.0.self_attn.q_proj.weight"),
        [4096, 2048]
    );
    assert_eq!(shape(moe, "model.layers.0.self_attn.q_norm.weight"), [128]);
    assert!(within(moe.total_bytes(), 61.07e9, 0.01));

    let gemma = &all[3];
    assert!(!has(gemma, "lm_head.weight"));
    assert_eq!(shape(gemma, "model.embed_tokens.weight"), [262144, 1152]);
    assert_eq!(
        shape(gemma, "model.layers.25.post_feedforward_layernorm.weight"),
        [1152]
    );
    assert_eq!(
        shape(gemma, "model.layers.0.self_attn.k_norm.weight"),
        [256]
    );
    let types = gemma.config["layer_types"].as_array().unwrap();
    assert_eq!(types.len(), 26);
    assert_eq!(types[5], "full_attention");
    assert_eq!(types[6], "sliding_attention");

    let gemma4 = &all[4];
    assert_eq!(gemma4.text_config()["hidden_size"], 2560);
    assert_eq!(
        shape(gemma4, "language_model.model.embed_tokens.weight"),
        [262208, 2560]
    );
    assert_eq!(
        shape(
            gemma4,
            "language_model.model.layers.33.self_attn.q_proj.weight"
        ),
        [2048, 2560]
    );
    assert!(!has(gemma4, "language_model.lm_head.weight"));

    let smol = &all[5];
    assert!(!has(smol, "lm_head.weight"));
    assert_eq!(
        shape(smol, "model.layers.29.self_attn.k_proj.weight"),
        [192, 576]
    );
}

#[test]
fn safetensors_header_round_trips() {
    let dir = TempDir::new("st");
    let model = tiny_qwen2();
    for data in [Data::Sparse, Data::Random { seed: 1 }] {
        let path = dir.0.join("model.safetensors");
        let size = write_safetensors(&path, &model.tensors, &[("format", "pt")], data).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().len(), size);
        let (header, data_start) = read_safetensors_header(&path);
        assert_eq!(data_start % 8, 0);
        assert_eq!(header["__metadata__"]["format"], "pt");
        let mut offset = 0;
        for tensor in &model.tensors {
            let entry = &header[&tensor.name];
            assert_eq!(entry["dtype"], "F32");
            assert_eq!(entry["shape"], serde_json::json!(tensor.shape));
            assert_eq!(
                entry["data_offsets"],
                serde_json::json!([offset, offset + tensor.byte_len()])
            );
            offset += tensor.byte_len();
        }
        assert_eq!(header.as_object().unwrap().len(), model.tensors.len() + 1);
        assert_eq!(size, data_start + offset);
        if data != Data::Sparse {
            let bytes = fs::read(&path).unwrap();
            let floats = bytes[data_start as usize..]
                .chunks(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()));
            assert!(floats.clone().all(|x| (-0.1..0.1).contains(&x)));
            assert!(floats.filter(|&x| x == 0.0).count() < 10);
        }
    }
}

#[test]
fn random_data_does_not_depend_on_sharding() {
    let dir = TempDir::new("seed");
    let model = tiny_llama();
    let data = Data::Random { seed: 42 };
    write_hf_dir(&model, &dir.0.join("one"), 1, data).unwrap();
    write_hf_dir(&model, &dir.0.join("three"), 3, data).unwrap();
    let index: Value = serde_json::from_slice(
        &fs::read(dir.0.join("three/model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    let bytes_of = |file: &Path, name: &str| {
        let (header, start) = read_safetensors_header(file);
        let offsets = &header[name]["data_offsets"];
        let (a, b) = (offsets[0].as_u64().unwrap(), offsets[1].as_u64().unwrap());
        fs::read(file).unwrap()[(start + a) as usize..(start + b) as usize].to_vec()
    };
    let name = "lm_head.weight";
    let shard = index["weight_map"][name].as_str().unwrap();
    let whole = bytes_of(&dir.0.join("one/model.safetensors"), name);
    assert_eq!(whole, bytes_of(&dir.0.join("three").join(shard), name));
    write_hf_dir(&model, &dir.0.join("other"), 1, Data::Random { seed: 43 }).unwrap();
    assert_ne!(
        whole,
        bytes_of(&dir.0.join("other/model.safetensors"), name)
    );
}

#[test]
fn shard_index_lists_every_tensor_once() {
    let dir = TempDir::new("shards");
    let model = tiny_qwen3_moe();
    write_hf_dir(&model, &dir.0, 5, Data::Sparse).unwrap();
    let config: Value =
        serde_json::from_slice(&fs::read(dir.0.join("config.json")).unwrap()).unwrap();
    assert_eq!(config, model.config);
    let index: Value =
        serde_json::from_slice(&fs::read(dir.0.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    assert_eq!(index["metadata"]["total_size"], model.total_bytes());
    let map = index["weight_map"].as_object().unwrap();
    assert_eq!(map.len(), model.tensors.len());
    let mut per_file: HashMap<&str, usize> = HashMap::new();
    for tensor in &model.tensors {
        *per_file
            .entry(map[&tensor.name].as_str().unwrap())
            .or_default() += 1;
    }
    assert_eq!(per_file.len(), 5);
    for (file, count) in per_file {
        assert!(file.ends_with("-of-00005.safetensors"), "{file}");
        let (header, _) = read_safetensors_header(&dir.0.join(file));
        let names = header
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| *k != "__metadata__");
        assert_eq!(names.clone().count(), count);
        assert!(names.into_iter().all(|n| map[n] == file));
    }
    let err = write_hf_dir(&tiny_llama(), &dir.0.join("x"), 10_000, Data::Sparse).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}

#[test]
fn qwen3_30b_a3b_sparse_dir_is_fast_and_costs_no_disk() {
    let dir = TempDir::new("qwen3");
    let model = qwen3_30b_a3b();
    let start = Instant::now();
    write_hf_dir(&model, &dir.0, 13, Data::Sparse).unwrap();
    let elapsed = start.elapsed();
    assert!(elapsed.as_secs_f64() < 5.0, "took {elapsed:?}");
    let (mut length, mut on_disk) = (0u64, 0u64);
    for entry in fs::read_dir(&dir.0).unwrap() {
        let meta = entry.unwrap().metadata().unwrap();
        length += meta.len();
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            on_disk += meta.blocks() * 512;
        }
    }
    assert!(within(length, 61.07e9, 0.01), "{length}");
    assert!(on_disk < 64 << 20, "{on_disk} bytes on disk");
}

#[test]
fn mlx_quantize_packs_linears_and_stacks_experts() {
    let smol = mlx_quantize(&smollm2_135m(), 4, 64);
    let find = |model: &ModelDef, name: &str| {
        model
            .tensors
            .iter()
            .find(|t| t.name == name)
            .cloned()
            .unwrap()
    };
    let embed = find(&smol, "model.embed_tokens.weight");
    assert_eq!(
        (embed.shape.clone(), embed.dtype),
        (vec![49152, 72], DType::U32)
    );
    let scales = find(&smol, "model.embed_tokens.scales");
    assert_eq!(
        (scales.shape.clone(), scales.dtype),
        (vec![49152, 9], DType::F16)
    );
    assert_eq!(
        find(&smol, "model.layers.0.mlp.down_proj.biases").shape,
        [576, 24]
    );
    assert_eq!(find(&smol, "model.norm.weight").dtype, DType::BF16);
    assert_eq!(
        smol.config["quantization"],
        serde_json::json!({"group_size": 64, "bits": 4})
    );
    assert_eq!(
        smol.config["quantization_config"],
        smol.config["quantization"]
    );

    let moe = mlx_quantize(&qwen3_30b_a3b(), 4, 64);
    assert!(moe.tensors.iter().all(|t| !t.name.contains(".experts.")));
    let up = find(&moe, "model.layers.47.mlp.switch_mlp.up_proj.weight");
    assert_eq!(
        (up.shape.clone(), up.dtype),
        (vec![128, 768, 256], DType::U32)
    );
    assert_eq!(
        find(&moe, "model.layers.47.mlp.switch_mlp.down_proj.scales").shape,
        [128, 2048, 12]
    );
    assert_eq!(
        find(&moe, "model.layers.0.mlp.gate.weight").shape,
        [128, 256]
    );
    // 4.5 bits per weight, give or take the unquantized norms.
    assert!(
        within(moe.total_bytes(), 30.5e9 * 4.5 / 8.0, 0.02),
        "{}",
        moe.total_bytes()
    );

    let dir = TempDir::new("mlx");
    write_hf_dir(
        &mlx_quantize(&tiny_qwen3_moe(), 8, 32),
        &dir.0,
        1,
        Data::Random { seed: 3 },
    )
    .unwrap();
    let (header, _) = read_safetensors_header(&dir.0.join("model.safetensors"));
    assert_eq!(
        header["model.layers.1.mlp.switch_mlp.gate_proj.weight"]["dtype"],
        "U32"
    );
    assert_eq!(
        header["model.layers.1.mlp.switch_mlp.gate_proj.weight"]["shape"],
        serde_json::json!([4, 256, 64])
    );
}

/// A GGUF file read back by a parser written for this test.
struct Gguf {
    version: u32,
    kvs: HashMap<String, Value>,
    tensors: Vec<(String, Vec<u64>, u32, u64)>,
    data_start: u64,
}

fn parse_gguf(bytes: &[u8]) -> Gguf {
    struct Cursor<'a>(&'a [u8], usize);
    impl Cursor<'_> {
        fn take(&mut self, n: usize) -> &[u8] {
            self.1 += n;
            &self.0[self.1 - n..self.1]
        }
        fn u32(&mut self) -> u32 {
            u32::from_le_bytes(self.take(4).try_into().unwrap())
        }
        fn u64(&mut self) -> u64 {
            u64::from_le_bytes(self.take(8).try_into().unwrap())
        }
        fn string(&mut self) -> String {
            let len = self.u64() as usize;
            String::from_utf8(self.take(len).to_vec()).unwrap()
        }
        fn value(&mut self, ty: u32) -> Value {
            match ty {
                0 | 1 => self.take(1)[0].into(),
                2 | 3 => u16::from_le_bytes(self.take(2).try_into().unwrap()).into(),
                4 | 5 => self.u32().into(),
                6 => f32::from_le_bytes(self.take(4).try_into().unwrap()).into(),
                7 => (self.take(1)[0] != 0).into(),
                8 => self.string().into(),
                9 => {
                    let elem = self.u32();
                    let n = self.u64();
                    (0..n).map(|_| self.value(elem)).collect()
                }
                10 | 11 => self.u64().into(),
                12 => f64::from_le_bytes(self.take(8).try_into().unwrap()).into(),
                _ => panic!("value type {ty}"),
            }
        }
    }
    let mut c = Cursor(bytes, 0);
    assert_eq!(c.take(4), b"GGUF");
    let version = c.u32();
    let (n_tensors, n_kvs) = (c.u64(), c.u64());
    let mut kvs = HashMap::new();
    for _ in 0..n_kvs {
        let key = c.string();
        let ty = c.u32();
        kvs.insert(key, c.value(ty));
    }
    let mut tensors = Vec::new();
    for _ in 0..n_tensors {
        let name = c.string();
        let n_dims = c.u32();
        let dims = (0..n_dims).map(|_| c.u64()).collect();
        tensors.push((name, dims, c.u32(), c.u64()));
    }
    let align = kvs
        .get("general.alignment")
        .and_then(Value::as_u64)
        .unwrap_or(32) as usize;
    let data_start = c.1.next_multiple_of(align) as u64;
    Gguf {
        version,
        kvs,
        tensors,
        data_start,
    }
}

fn read_gguf(path: &Path) -> Gguf {
    // Headers of the largest fixtures (262k-token vocabularies) stay under 8 MiB.
    parse_gguf(&read_prefix(path, 8 << 20))
}

#[test]
fn gguf_round_trips_for_every_family_and_type() {
    let dir = TempDir::new("gguf");
    for model in [tiny_llama(), tiny_qwen2(), tiny_qwen3_moe(), tiny_gemma3()] {
        for ty in GgufTensorType::ALL {
            let path = dir.0.join(format!("{}-{ty:?}.gguf", model.name));
            let size = write_gguf(&model, &path, ty, Data::Random { seed: 9 }).unwrap();
            let bytes = fs::read(&path).unwrap();
            assert_eq!(bytes.len() as u64, size);
            let g = parse_gguf(&bytes);
            let arch = model.gguf_arch;
            assert_eq!(g.version, 3);
            assert_eq!(g.kvs["general.architecture"], arch);
            assert_eq!(g.kvs[&format!("{arch}.embedding_length")], 256);
            assert_eq!(g.kvs[&format!("{arch}.block_count")], 2);
            assert_eq!(g.kvs[&format!("{arch}.attention.key_length")], 64);
            assert_eq!(
                g.kvs["tokenizer.ggml.tokens"].as_array().unwrap().len(),
                1024
            );
            assert_eq!(g.kvs["tokenizer.ggml.tokens"][7], "t7");

            let mut end = 0;
            for (name, dims, type_id, offset) in &g.tensors {
                assert_eq!(offset % 32, 0, "{name}");
                assert!(*offset >= end, "{name} overlaps");
                let stored = GgufTensorType::from_ggml_id(*type_id).unwrap();
                if dims.len() == 1 || name.contains("ffn_gate_inp") {
                    assert_eq!(stored, GgufTensorType::F32, "{name}");
                } else {
                    assert_eq!(stored, ty, "{name}");
                }
                let len = stored.ggml().padded_row_bytes(dims.iter().product());
                end = offset + len;
                if stored == GgufTensorType::MXFP4 {
                    // The first block's e8m0 scale is 2^-8 or 2^-7.
                    let e = bytes[(g.data_start + offset) as usize];
                    assert!(e == 120 || e == 121, "{name}: scale {e}");
                } else if stored.block_elems() > 1 {
                    // The first block's f16 scale is a small finite number.
                    let at = (g.data_start + offset) as usize;
                    let scale_at = match stored {
                        GgufTensorType::Q2_K => 80,
                        GgufTensorType::Q3_K => 108,
                        GgufTensorType::Q6_K => 208,
                        _ => 0,
                    };
                    let half = u16::from_le_bytes([bytes[at + scale_at], bytes[at + scale_at + 1]]);
                    assert!(half > 0 && half < 0x2c00, "{name}: scale {half:#x}");
                }
            }
            assert_eq!(size, g.data_start + end.next_multiple_of(32));
        }
    }
}

#[test]
fn gguf_names_and_dims_follow_llama_cpp() {
    let dir = TempDir::new("gguf-names");
    let dims_of = |g: &Gguf, name: &str| -> (Vec<u64>, u32) {
        let t = g.tensors.iter().find(|t| t.0 == name);
        let t = t.unwrap_or_else(|| panic!("no {name}"));
        (t.1.clone(), t.2)
    };

    let path = dir.0.join("llama.gguf");
    write_gguf(&llama_3_1_8b(), &path, GgufTensorType::Q4_K, Data::Sparse).unwrap();
    let g = read_gguf(&path);
    assert_eq!(g.tensors.len(), 32 * 9 + 4);
    assert_eq!(dims_of(&g, "rope_freqs.weight"), (vec![64], 0));
    assert_eq!(dims_of(&g, "blk.0.attn_k.weight"), (vec![4096, 1024], 12));
    assert_eq!(
        dims_of(&g, "blk.31.ffn_down.weight"),
        (vec![14336, 4096], 12)
    );
    assert_eq!(dims_of(&g, "output.weight"), (vec![4096, 128256], 12));
    assert_eq!(g.kvs["llama.rope.freq_base"], 500000.0);
    assert_eq!(g.kvs["llama.context_length"], 131072);
    assert_eq!(g.kvs["llama.attention.head_count_kv"], 8);

    let path = dir.0.join("qwen2.gguf");
    write_gguf(&qwen2_5_7b(), &path, GgufTensorType::Q8_0, Data::Sparse).unwrap();
    let g = read_gguf(&path);
    assert_eq!(dims_of(&g, "blk.3.attn_q.bias"), (vec![3584], 0));
    // 18944 is a whole number of Q8_0 blocks but not of K-quant blocks.
    assert_eq!(dims_of(&g, "blk.3.ffn_down.weight"), (vec![18944, 3584], 8));

    let path = dir.0.join("qwen3moe.gguf");
    let start = Instant::now();
    let size = write_gguf(&qwen3_30b_a3b(), &path, GgufTensorType::Q4_K, Data::Sparse).unwrap();
    assert!(start.elapsed().as_secs_f64() < 5.0);
    assert!(within(size, 30.5e9 * 4.5 / 8.0, 0.02), "{size}");
    let g = read_gguf(&path);
    assert_eq!(g.tensors.len(), 48 * 12 + 3);
    assert_eq!(
        dims_of(&g, "blk.0.ffn_gate_inp.weight"),
        (vec![2048, 128], 0)
    );
    assert_eq!(
        dims_of(&g, "blk.0.ffn_gate_exps.weight"),
        (vec![2048, 768, 128], 12)
    );
    assert_eq!(
        dims_of(&g, "blk.47.ffn_down_exps.weight"),
        (vec![768, 2048, 128], 14 - 2)
    );
    assert_eq!(dims_of(&g, "blk.47.attn_k_norm.weight"), (vec![128], 0));
    assert_eq!(g.kvs["qwen3moe.expert_count"], 128);
    assert_eq!(g.kvs["qwen3moe.expert_used_count"], 8);
    assert_eq!(g.kvs["qwen3moe.expert_feed_forward_length"], 768);
    assert_eq!(g.kvs["qwen3moe.feed_forward_length"], 6144);

    let path = dir.0.join("gemma3.gguf");
    write_gguf(
        &gemma3_4b_multimodal_text(),
        &path,
        GgufTensorType::Q8_0,
        Data::Sparse,
    )
    .unwrap();
    let g = read_gguf(&path);
    assert_eq!(g.tensors.len(), 34 * 13 + 2);
    assert!(g
        .tensors
        .iter()
        .all(|t| !t.0.contains("vision") && !t.0.starts_with("mm")));
    assert_eq!(dims_of(&g, "token_embd.weight"), (vec![2560, 262208], 8));
    for norm in [
        "attn_norm",
        "post_attention_norm",
        "ffn_norm",
        "post_ffw_norm",
        "attn_q_norm",
    ] {
        assert_eq!(dims_of(&g, &format!("blk.33.{norm}.weight")).1, 0);
    }
    assert_eq!(g.kvs["gemma3.attention.sliding_window"], 1024);
    assert_eq!(g.kvs["gemma3.rope.scaling.type"], "linear");
    assert_eq!(g.kvs["gemma3.context_length"], 131072);

    let err = write_gguf(
        &mlx_quantize(&tiny_llama(), 4, 64),
        &path,
        GgufTensorType::F16,
        Data::Sparse,
    );
    assert_eq!(err.unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
}

#[test]
fn gguf_writer_writes_what_it_is_told() {
    let writer = GgufWriter::new()
        .version(2)
        .kv("general.alignment", GgufValue::U32(64))
        .kv(
            "bad.array",
            GgufValue::Array(4, vec![GgufValue::string("x")]),
        )
        .tensor("a", &[3], 0, 12)
        .tensor_at("b", &[u64::MAX, 2], 999, 5, 1 << 40)
        .tensor("c", &[8], 1, 16);
    let tensors = writer.tensors();
    assert_eq!(tensors[0].offset, 0);
    assert_eq!(tensors[1].offset, 5);
    assert_eq!(tensors[2].offset, ((1u64 << 40) + 5).next_multiple_of(64));
    let header = writer.header();
    assert_eq!(header.len() % 64, 0);
    assert_eq!(&header[..4], b"GGUF");
    assert_eq!(u32::from_le_bytes(header[4..8].try_into().unwrap()), 2);
    assert_eq!(u64::from_le_bytes(header[8..16].try_into().unwrap()), 3);
    assert_eq!(u64::from_le_bytes(header[16..24].try_into().unwrap()), 2);
    // The mislabelled array is written as given: type 9, elements of type 4,
    // one element, then a string's bytes.
    let key = b"bad.array";
    let at = header.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    assert_eq!(header[at..at + 4], 9u32.to_le_bytes());
    assert_eq!(header[at + 4..at + 8], 4u32.to_le_bytes());
    assert_eq!(header[at + 8..at + 16], 1u64.to_le_bytes());
    assert_eq!(header[at + 16..at + 24], 1u64.to_le_bytes());
    assert_eq!(header[at + 24], b'x');
}

/// `scaled` draws the same random tensor at `factor` times its magnitude:
/// a float tensor's values, a quantized block's f16 scale (its quants
/// unchanged); MXFP4's power-of-two scales refuse a factor.
#[test]
fn gguf_writer_scales_a_tensor() {
    let dir = TempDir::new("scaled");
    let q8_0 = GgufTensorType::Q8_0;
    let write = |factor: Option<f32>, file: &str| {
        let mut w =
            GgufWriter::new()
                .tensor("f", &[64], 0, 256)
                .tensor("q", &[64], q8_0.ggml_id(), 68);
        if let Some(f) = factor {
            w = w.scaled("f", f).scaled("q", f);
        }
        let path = dir.0.join(file);
        w.write(&path, Data::Random { seed: 3 }).unwrap();
        let bytes = fs::read(&path).unwrap();
        let start = parse_gguf(&bytes).data_start as usize;
        bytes[start..].to_vec()
    };
    let (plain, big) = (write(None, "plain.gguf"), write(Some(150.0), "big.gguf"));
    let f32s = |b: &[u8]| -> Vec<f32> {
        b[..256]
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let (a, b) = (f32s(&plain), f32s(&big));
    assert!(a.iter().all(|v| v.abs() <= 0.1));
    assert!(b.iter().any(|v| v.abs() > 1.0));
    for (x, y) in a.iter().zip(&b) {
        assert!(
            (x * 150.0 - y).abs() <= 1e-5 * y.abs().max(1.0),
            "{x} × 150 vs {y}"
        );
    }
    // Q8_0 at offset 256 (aligned): two blocks of an f16 scale and 32 quants.
    let f16 = |b: &[u8]| fathom_ggml::f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    for at in [256, 256 + 34] {
        let (s, t) = (f16(&plain[at..]), f16(&big[at..]));
        assert!(
            s > 0.0 && (s * 150.0 - t).abs() <= 1e-3 * t,
            "{s} × 150 vs {t}"
        );
        assert_eq!(plain[at + 2..at + 34], big[at + 2..at + 34]);
    }
    let mxfp4 = GgufTensorType::MXFP4;
    let err = GgufWriter::new()
        .tensor("m", &[32], mxfp4.ggml_id(), 17)
        .scaled("m", 2.0)
        .write(&dir.0.join("m.gguf"), Data::Random { seed: 3 });
    assert_eq!(err.unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
}

/// The real gpt-oss shapes are `conditioned`: embeddings 225 and the
/// attention output 3 times the other matrices' magnitude, router biases
/// from -6 to 6; the tiny test model keeps plain random weights.
#[test]
fn gpt_oss_real_shapes_are_conditioned_and_the_tiny_one_is_not() {
    assert!(gpt_oss_20b().conditioned && gpt_oss_120b().conditioned);
    assert!(!gpt_oss_tiny().conditioned);
    let dir = TempDir::new("gpt-oss");
    // The largest |value| of each F32 tensor, by name.
    let largest = |conditioned: bool| -> HashMap<String, f32> {
        let shape = GptOssShape {
            conditioned,
            layers: 1,
            ..gpt_oss_tiny()
        };
        let path = dir.0.join(format!("{conditioned}.gguf"));
        let ty = GgufTensorType::F32;
        write_gpt_oss_gguf(&shape, ty, &path, Data::Random { seed: 5 }).unwrap();
        let bytes = fs::read(&path).unwrap();
        let g = parse_gguf(&bytes);
        let mut out = HashMap::new();
        for (name, dims, type_id, offset) in &g.tensors {
            if *type_id != ty.ggml_id() {
                continue;
            }
            let at = (g.data_start + offset) as usize;
            let n = dims.iter().product::<u64>() as usize;
            let max = bytes[at..at + 4 * n]
                .chunks(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()).abs())
                .fold(0.0, f32::max);
            out.insert(name.clone(), max);
        }
        out
    };
    let (plain, cond) = (largest(false), largest(true));
    for (name, bound) in [
        ("token_embd.weight", 22.5),
        ("blk.0.attn_output.weight", 0.3),
        ("blk.0.ffn_gate_inp.bias", 6.0),
    ] {
        assert!(plain[name] <= 0.1, "{name}: {}", plain[name]);
        assert!(
            cond[name] <= bound && cond[name] > bound / 2.0,
            "{name}: {} against {bound}",
            cond[name]
        );
    }
    for name in ["output.weight", "blk.0.attn_q.weight", "output_norm.weight"] {
        assert_eq!(plain[name], cond[name], "{name}");
    }
}
