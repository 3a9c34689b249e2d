//! `fathom inspect --device cuda --tensor-parallel N` on header-only
//! checkpoints with Llama-3.1-70B's and Qwen3-30B-A3B's published shapes.
//! The per-device figures are derived by hand in
//! crates/fathom-plan/tests/tensor_parallel.rs; here the command's text and
//! JSON carry them, and bad sizes are refused with exit 1 and a clear
//! message. No GPU is needed: `--memory` gives the device's memory.

mod common;

use common::{fathom, inspect_json, stderr, stdout, u, TempDir};
use fathom_fixtures::{self as fx, Data, GgufTensorType};

const CUDA_40G: [&str; 6] = ["--device", "cuda", "--memory", "40G", "-t", "2"];

fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut all = CUDA_40G.to_vec();
    all.extend_from_slice(extra);
    all
}

#[test]
fn llama_70b_json_per_device_and_the_table() {
    let dir = TempDir::new("tp-llama70b");
    let gguf = dir.0.join("llama-70b-q4_k.gguf");
    fx::write_gguf(
        &fx::llama_3_1_70b(),
        &gguf,
        GgufTensorType::Q4_K,
        Data::Sparse,
    )
    .unwrap();
    fx::write_hf_dir(&fx::llama_3_1_70b(), &dir.0, 8, Data::Sparse).unwrap();

    // BF16 safetensors: 72,656,371,712 weight bytes per device at N = 2,
    // 21,318,090,752 at N = 8 (hand-derived in the plan's tests).
    for (n, weights, kv) in [
        ("2", 72_656_371_712u64, 1_342_177_280u64),
        ("8", 21_318_090_752, 335_544_320),
    ] {
        let v = inspect_json(&dir.0, &args(&["--tensor-parallel", n]), &[]);
        assert_eq!((u(&v, "weights_bytes"), u(&v, "kv_bytes")), (weights, kv));
        assert_eq!(u(&v, "params"), 70_553_706_496, "params stay the model's");
        let tp = &v["tensor_parallel"];
        assert_eq!(u(tp, "size"), n.parse::<u64>().unwrap());
        let names: Vec<&str> = v["terms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"nccl"), "{names:?}");
        let sizes = tp["sizes"].as_array().unwrap();
        let fits: Vec<bool> = sizes.iter().map(|s| s["fits"].as_bool().unwrap()).collect();
        assert_eq!(
            fits,
            [false, false, true, true],
            "40 GiB per device: 4 or 8"
        );
        let whole = tp["weights"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| w["split"] == "replicated")
            .map(|w| w["name"].as_str().unwrap())
            .collect::<Vec<_>>();
        assert_eq!(whole, ["embeddings", "output head", "norms and biases"]);
    }

    // `-tp` as vLLM spells it, on the Q4_K file: rows split on whole
    // 256-value blocks at N = 8.
    let v = inspect_json(&gguf, &args(&["-tp", "8"]), &[]);
    assert_eq!(u(&v["tensor_parallel"], "size"), 8);

    // N = 1 is exactly the plan without the flag (but the host's free
    // memory, read anew by each run).
    let host_free = |mut v: serde_json::Value| {
        for key in ["available_bytes", "fits"] {
            v["host"].as_object_mut().map(|h| h.remove(key));
        }
        v
    };
    let plain = host_free(inspect_json(&dir.0, &args(&[]), &[]));
    let one = host_free(inspect_json(
        &dir.0,
        &args(&["--tensor-parallel-size", "1"]),
        &[],
    ));
    assert_eq!(plain, one);
    assert!(plain.get("tensor_parallel").is_none());
}

#[test]
fn qwen3_moe_text_names_the_split_and_the_replicated_kv_heads() {
    let dir = TempDir::new("tp-qwen3moe");
    fx::write_hf_dir(&fx::qwen3_30b_a3b(), &dir.0, 13, Data::Sparse).unwrap();
    let out = fathom(
        &[
            &["inspect", dir.0.to_str().unwrap()][..],
            &args(&["--tensor-parallel", "8"]),
        ]
        .concat(),
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for expected in [
        "each of 8 devices holds the same share; --memory is per device",
        // 8,769,662,976 bytes per device (hand-derived in the plan's tests).
        "(8769662976 bytes)",
        "NCCL buffers",
        "Tensor parallel over 8 devices: 4 heads, 1 KV head per device, each held by 2 devices",
        "experts gate/up",
        "whole on every device",
        "Which device count fits",
        "NCCL library",
        "Device contexts",
    ] {
        assert!(text.contains(expected), "no {expected:?} in\n{text}");
    }
    // One table row per size dividing the 32 heads.
    let rows = text
        .lines()
        .skip_while(|l| !l.starts_with("Which device count fits"))
        .skip(2)
        .filter(|l| !l.trim().is_empty())
        .count();
    assert_eq!(rows, 4, "{text}");
}

#[test]
fn invalid_sizes_exit_1_naming_the_flag_and_what_is_valid() {
    let dir = TempDir::new("tp-bad");
    let gguf = dir.0.join("qwen3moe-q4_k.gguf");
    fx::write_gguf(
        &fx::qwen3_30b_a3b(),
        &gguf,
        GgufTensorType::Q4_K,
        Data::Sparse,
    )
    .unwrap();
    let model = gguf.to_str().unwrap();
    let refuse = |extra: &[&str], expected: &[&str]| {
        let out = fathom(&[&["inspect", model][..], extra].concat(), &[]);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {}", stderr(&out));
        let err = stderr(&out);
        for e in expected {
            assert!(err.contains(e), "{extra:?}: no {e:?} in {err}");
        }
    };
    refuse(
        &args(&["--tensor-parallel", "3"]),
        &[
            "--tensor-parallel is 3",
            "32 attention heads",
            "1, 2, 4, 8, 16, 32",
        ],
    );
    refuse(&args(&["--tensor-parallel", "0"]), &["expected at least 1"]);
    refuse(
        &[
            "--device",
            "cpu",
            "--memory",
            "40G",
            "--tensor-parallel",
            "2",
        ],
        &["cuda devices only, not cpu"],
    );
    // Q4_K experts' down rows of 768 values halve into 384: not whole blocks.
    refuse(
        &args(&["-tp", "2"]),
        &[
            "blk.0.ffn_down_exps.weight is Q4_K",
            "block boundaries: 1, 3",
        ],
    );
    refuse(
        &args(&["--tensor-parallel", "2", "--recommend-quant"]),
        &["--recommend-quant"],
    );
}

/// The run commands take the same flag (and vLLM's `-tp`) and refuse what
/// the plan refuses before anything loads.
#[test]
fn run_commands_refuse_sizes_the_plan_refuses() {
    let dir = TempDir::new("tp-run");
    let gguf = dir.0.join("qwen3moe-q4_k.gguf");
    fx::write_runnable_gguf(
        &fx::qwen3_30b_a3b(),
        GgufTensorType::Q4_K,
        &gguf,
        Data::Sparse,
    )
    .unwrap();
    let model = gguf.to_str().unwrap();
    for command in [
        &["generate", model, "-p", "hi", "-n", "1"][..],
        &["serve", model, "--port", "0"],
        &["bench", model, "-r", "1"],
    ] {
        for (flag, size, expected) in [
            ("--tensor-parallel", "3", "32 attention heads"),
            ("-tp", "2", "block boundaries: 1, 3"),
        ] {
            let out = fathom(&[command, &args(&[flag, size])].concat(), &[]);
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(1), "{command:?} {flag}: {err}");
            assert!(err.contains(expected), "{command:?} {flag}: {err}");
        }
    }
}

#[test]
fn every_tensor_parallel_json_field_is_documented() {
    let dir = TempDir::new("tp-docs");
    fx::write_hf_dir(&fx::qwen3_30b_a3b(), &dir.0, 13, Data::Sparse).unwrap();
    let v = inspect_json(&dir.0, &args(&["--tensor-parallel", "2"]), &[]);
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/inspect-json.md"),
    )
    .unwrap();
    let tp = &v["tensor_parallel"];
    let objects = [
        ("tensor_parallel", tp),
        ("weights", &tp["weights"][0]),
        ("sizes", &tp["sizes"][0]),
    ];
    for (what, object) in objects {
        for key in object.as_object().unwrap().keys() {
            assert!(
                docs.contains(&format!("`{key}`")),
                "{what}.{key} is not in docs/inspect-json.md"
            );
        }
    }
    for term in v["terms"]
        .as_array()
        .unwrap()
        .iter()
        .chain(v["host"]["terms"].as_array().unwrap())
    {
        let name = term["name"].as_str().unwrap();
        assert!(
            docs.contains(&format!("`{name}`")),
            "term {name} is not documented"
        );
    }
}
