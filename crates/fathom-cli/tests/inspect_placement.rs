//! `fathom inspect --device cuda` placing a model larger than the device
//! between GPU and host, on header-only GGUF checkpoints of Llama-3.1-70B's
//! and Qwen3-30B-A3B's published shapes (Q4_K). The placement arithmetic is
//! derived by hand in crates/fathom-plan/tests/placement.rs; here the
//! command's text and JSON carry it, llama.cpp's flag spellings are read,
//! and misuse is refused with exit 1. No GPU is needed: `--memory` gives the
//! device's memory.

mod common;

use common::{fathom, inspect_json, stderr, stdout, u, TempDir};
use fathom_fixtures::{self as fx, Data, GgufTensorType};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn write(dir: &TempDir, model: &fx::ModelDef, name: &str) -> std::path::PathBuf {
    let path = dir.0.join(name);
    fx::write_gguf(model, &path, GgufTensorType::Q4_K, Data::Sparse).unwrap();
    path
}

#[test]
fn llama_70b_under_24g_is_placed_and_printed() {
    let dir = TempDir::new("place-llama70b");
    let gguf = write(&dir, &fx::llama_3_1_70b(), "llama-70b-q4_k.gguf");
    let cuda = [
        "--device", "cuda", "--memory", "24G", "-c", "8192", "-t", "2",
    ];
    let v = inspect_json(&gguf, &cuda, &[]);
    let p = &v["placement"];
    let n = u(p, "gpu_layers");
    assert_eq!(p["chosen_by"], "auto");
    assert_eq!(u(p, "n_layers"), 80);
    assert!(n > 0 && n < 80, "{n}");
    assert!(v["fits"].as_bool().unwrap());
    assert!(u(&v, "total_bytes") <= 24 * GIB);
    assert_eq!(p["embeddings"], "cpu");
    assert_eq!(p["output"], "cuda");
    // 32 MiB of f16 KV a layer at 8192 tokens (8 KV heads x 128 x 2 x 2 B).
    assert_eq!(u(&v, "kv_bytes"), n * 32 * MIB);
    let host_kv = v["host"]["terms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "host_kv")
        .expect("a host_kv term");
    assert_eq!(u(host_kv, "bytes"), (80 - n) * 32 * MIB);
    let layers = p["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 80);
    assert_eq!(layers[0]["place"], "cpu");
    assert_eq!(layers[79]["place"], "cuda");
    assert_eq!(
        u(p, "device_weights_bytes"),
        u(&v, "weights_bytes"),
        "the device's weights are the placed ones"
    );

    // The text says the same, runs of layers on a line.
    let mut all = vec!["inspect", gguf.to_str().unwrap()];
    all.extend_from_slice(&cuda);
    let out = fathom(&all, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "Placement (auto): {n} of 80 layers on the GPU, {} on the host; embeddings cpu, output head cuda",
            80 - n
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("layers   0-{:<3}  cpu (attention and KV)", 79 - n)),
        "{text}"
    );
    assert!(text.contains("Host layers' KV"), "{text}");

    // llama.cpp's -ngl, and `all`, which does not fit and says so.
    let v = inspect_json(&gguf, &[&cuda[..], &["-ngl", "10"]].concat(), &[]);
    assert_eq!(u(&v["placement"], "gpu_layers"), 10);
    assert_eq!(v["placement"]["chosen_by"], "--gpu-layers 10");
    let v = inspect_json(&gguf, &[&cuda[..], &["--gpu-layers", "all"]].concat(), &[]);
    assert_eq!(u(&v["placement"], "gpu_layers"), 80);
    assert!(!v["fits"].as_bool().unwrap());
}

#[test]
fn qwen3_moe_experts_go_to_the_host_by_flag_and_by_regex() {
    let dir = TempDir::new("place-qwen3moe");
    let gguf = write(&dir, &fx::qwen3_30b_a3b(), "qwen3-30b-a3b-q4_k.gguf");
    let cuda = ["--device", "cuda", "--memory", "80G", "-t", "2"];
    let by_flag = inspect_json(&gguf, &[&cuda[..], &["--cpu-moe"]].concat(), &[]);
    let by_regex = inspect_json(&gguf, &[&cuda[..], &["-ot", "exps=cpu"]].concat(), &[]);
    for v in [&by_flag, &by_regex] {
        assert_eq!(u(&v["placement"], "cpu_moe_layers"), 48);
        assert_eq!(u(&v["placement"], "gpu_layers"), 48);
    }
    assert_eq!(
        u(&by_flag["placement"], "host_weights_bytes"),
        u(&by_regex["placement"], "host_weights_bytes")
    );
    assert_eq!(by_regex["placement"]["overrides"][0][2], 144);
    // Under 12 GiB, auto moves experts and keeps every layer's attention.
    let v = inspect_json(
        &gguf,
        &["--device", "cuda", "--memory", "12G", "-t", "2"],
        &[],
    );
    let k = u(&v["placement"], "cpu_moe_layers");
    assert!(k > 0 && k < 48, "{k}");
    assert_eq!(u(&v["placement"], "gpu_layers"), 48);
}

#[test]
fn placement_flags_need_one_cuda_device_and_valid_values() {
    let dir = TempDir::new("place-errors");
    let gguf = write(&dir, &fx::qwen3_30b_a3b(), "qwen3-30b-a3b-q4_k.gguf");
    let model = gguf.to_str().unwrap();
    for (args, want) in [
        (
            vec!["--device", "cpu", "--gpu-layers", "10"],
            "need --device cuda",
        ),
        (
            vec![
                "--device",
                "cuda",
                "--memory",
                "80G",
                "--gpu-layers",
                "most",
            ],
            "expected auto, all, or a layer count",
        ),
        (
            vec!["--device", "cuda", "--memory", "80G", "-ot", "exps=tpu"],
            "\"tpu\" is not cpu or cuda",
        ),
    ] {
        let mut all = vec!["inspect", model];
        all.extend_from_slice(&args);
        let out = fathom(&all, &[]);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(want), "{args:?}: {}", stderr(&out));
    }
}

/// Every family `fathom bench fixture --like` makes, header-only at its
/// real shape (Q8_0; gpt-oss's experts MXFP4), on a 3 GiB device at 4,096
/// tokens: `inspect --device cuda` prints a placement the engine accepts —
/// the engine's own load-time rule (`fathom_engine::check_runs`, with the
/// CUDA backend's features) takes the same placement, which puts no group
/// apart, and a model larger than the device is split with the host
/// layers' KV and (Qwen3.5) recurrent state counted on the host.
#[test]
fn every_fixture_family_is_placed_as_the_engine_runs_it() {
    use fathom_backend::Features;
    use fathom_checkpoint::Checkpoint;
    use fathom_plan::placement::{Place, PlacementRequest};
    use fathom_plan::{Available, Device, KvDtype, MemoryPlan, PlanInputs};
    use fathom_spec::ModelSpec;

    let dir = TempDir::new("place-families");
    let cuda = [
        "--device", "cuda", "--memory", "3G", "-c", "4096", "-t", "2",
    ];
    let mut files: Vec<(&str, std::path::PathBuf)> = Vec::new();
    for (name, shape) in fx::LIKE {
        let path = dir.0.join(format!("{name}.gguf"));
        fx::write_gguf(&shape(), &path, GgufTensorType::Q8_0, Data::Sparse).unwrap();
        files.push((name, path));
    }
    for (name, shape) in fx::GPT_OSS_LIKE {
        let path = dir.0.join(format!("{name}.gguf"));
        fx::write_gpt_oss_gguf(&shape(), GgufTensorType::Q8_0, &path, Data::Sparse).unwrap();
        files.push((name, path));
    }
    let mut split = Vec::new();
    for (name, path) in &files {
        let spec = ModelSpec::from_checkpoint(&Checkpoint::open(path).unwrap()).unwrap();
        let model = path.to_str().unwrap();
        let v = inspect_json(path, &cuda, &[]);
        let p = &v["placement"];
        assert!(p["apart"].is_null(), "{name}: {p}");
        let inputs = PlanInputs {
            context: 4096,
            batch: 1,
            device: Device::Cuda,
            kv_dtype: KvDtype::F16,
            max_tokens_per_step: 512,
            threads: 2,
            headroom_factor: 1.0,
            rocm_inflight_raw: None,
            host_available: None,
            available: Available {
                bytes: 3 * GIB,
                source: "--memory".into(),
            },
        };
        let plan = MemoryPlan::with_placement(&spec, inputs, &PlacementRequest::default()).unwrap();
        let placed = plan.placement.as_ref().unwrap();
        assert_eq!(placed.gpu_layers, u(p, "gpu_layers"), "{name}");
        assert_eq!(placed.cpu_moe_layers, u(p, "cpu_moe_layers"), "{name}");
        fathom_engine::check_runs(
            &spec,
            Features::of(Device::Cuda, 1),
            ("cuda", 1),
            Some(placed),
        )
        .unwrap_or_else(|e| panic!("{name}: the engine refuses inspect's placement: {e}"));
        let host_terms: Vec<&str> = v["host"]["terms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        let host_layers = placed.layers.iter().filter(|l| l.place == Place::Cpu);
        let host_linear = host_layers
            .filter(|l| spec.layers[l.layer as usize].attention == fathom_spec::Attention::Linear)
            .count();
        assert_eq!(
            host_terms.contains(&"host_recurrent_state"),
            host_linear > 0,
            "{name}: {host_terms:?}"
        );
        if host_linear > 0 {
            let out = fathom(&[&["inspect", model][..], &cuda].concat(), &[]);
            let text = stdout(&out);
            assert!(
                text.contains("Host layers' state")
                    && text.contains("cpu (attention, KV and recurrent state)"),
                "{name}: {text}"
            );
        }
        println!(
            "{name}: {} of {} layers on the GPU, experts of {} on the host; host terms {host_terms:?}",
            placed.gpu_layers, placed.n_layers, placed.cpu_moe_layers
        );
        if placed.is_split() {
            split.push(*name);
        }
    }
    // The shapes larger than 3 GiB at Q8_0 are the ones split.
    assert_eq!(
        split,
        [
            "llama-3.1-8b",
            "llama-3.1-70b",
            "qwen3-32b",
            "qwen3-30b-a3b",
            "gemma-4-31b",
            "qwen3.5-4b",
            "qwen3.5-35b-a3b",
            "gpt-oss-20b",
            "gpt-oss-120b"
        ],
        "split placements"
    );
}
