//! `fathom inspect` on the real SmolLM2-135M-Instruct Q4_1 GGUF.

mod common;

use common::{fathom, inspect_json, smollm2, stderr, stdout, u};

/// Σ tensor n_bytes of the file as the Python `gguf` package (0.19) reports
/// it: `sum(t.n_bytes for t in gguf.GGUFReader(path).tensors)`.
const SMOLLM2_TENSOR_BYTES: u64 = 96_576_768;

// SmolLM2-135M: 30 layers, 3 KV heads of 64 dims.
const LAYERS: u64 = 30;
const KV_WIDTH: u64 = 3 * 64;

#[test]
fn json_has_every_documented_field() {
    let v = inspect_json(&smollm2(), &["--memory", "8G", "-t", "2"], &[]);
    for key in [
        "version",
        "model",
        "format",
        "family",
        "inputs",
        "weights_bytes",
        "weights_source",
        "kv_bytes_per_token",
        "kv_bytes",
        "kv_detail",
        "activation_bytes",
        "runtime_overhead_bytes",
        "backend_inflight_bytes",
        "headroom_bytes",
        "headroom_factor",
        "available_bytes",
        "available_source",
        "total_bytes",
        "fits",
        "slack_bytes",
        "overflow_bytes",
        "max_context_that_fits",
        "terms",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    for key in [
        "max_tokens",
        "batch",
        "device",
        "kv_dtype",
        "max_tokens_per_step",
    ] {
        assert!(v["inputs"].get(key).is_some(), "missing inputs.{key}");
    }
    assert_eq!(v["format"], "gguf");
    assert_eq!(v["family"], "llama");
    assert_eq!(
        v["inputs"]["max_tokens"], 8192,
        "defaults to the trained context, capped at 8192"
    );
    assert_eq!(v["inputs"]["device"], "cpu");
    assert_eq!(v["inputs"]["kv_dtype"], "f16");
    assert_eq!(v["available_source"], "--memory");
    assert_eq!(u(&v, "available_bytes"), 8 << 30);
    assert_eq!(u(&v, "backend_inflight_bytes"), 0);
    let terms = v["terms"].as_array().unwrap();
    let names: Vec<&str> = terms.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "weights",
            "converted",
            "kv",
            "activations",
            "runtime",
            "backend"
        ]
    );
    // The 61 F32 norms (30 layers x 2 + the output norm) of 576 values, copied to f32.
    assert_eq!(u(&v, "converted_bytes"), 61 * 576 * 4);
    let sum: u64 = terms.iter().map(|t| t["bytes"].as_u64().unwrap()).sum();
    assert_eq!(sum, u(&v, "total_bytes"));
    assert!(terms
        .iter()
        .all(|t| !t["derivation"].as_str().unwrap().is_empty()));
    assert_eq!(v["fits"], true);
    assert_eq!(u(&v, "slack_bytes"), (8 << 30) - u(&v, "total_bytes"));
    assert_eq!(u(&v, "overflow_bytes"), 0);
}

#[test]
fn weights_equal_the_tensor_data_sizes() {
    let v = inspect_json(&smollm2(), &["--memory", "8G"], &[]);
    assert_eq!(u(&v, "weights_bytes"), SMOLLM2_TENSOR_BYTES);
    let file_len = std::fs::metadata(smollm2()).unwrap().len();
    assert!(SMOLLM2_TENSOR_BYTES < file_len);
}

#[test]
fn kv_matches_the_formula_by_hand() {
    // f16: K and V each 3 heads x 64 dims x 2 bytes, per layer, per token.
    let v = inspect_json(&smollm2(), &["--memory", "8G", "--max-tokens", "4096"], &[]);
    assert_eq!(u(&v, "kv_bytes_per_token"), LAYERS * 2 * KV_WIDTH * 2);
    assert_eq!(u(&v, "kv_bytes"), LAYERS * 2 * KV_WIDTH * 2 * 4096);

    // Rounded up to whole blocks of 16 tokens: 1000 tokens hold 63 blocks.
    let v = inspect_json(&smollm2(), &["--memory", "8G", "--max-tokens", "1000"], &[]);
    assert_eq!(u(&v, "kv_bytes"), LAYERS * 2 * KV_WIDTH * 2 * 1008);

    // q8_0: 192 values are 6 blocks of 34 bytes; batch multiplies.
    let v = inspect_json(
        &smollm2(),
        &[
            "--memory",
            "8G",
            "--max-tokens",
            "640",
            "--kv-dtype",
            "q8_0",
            "--batch",
            "4",
        ],
        &[],
    );
    assert_eq!(u(&v, "kv_bytes"), LAYERS * 2 * 6 * 34 * 640 * 4);

    // f32 and bf16.
    let v = inspect_json(
        &smollm2(),
        &["--memory", "8G", "-c", "640", "--kv-dtype", "f32"],
        &[],
    );
    assert_eq!(u(&v, "kv_bytes"), LAYERS * 2 * KV_WIDTH * 4 * 640);
    let v = inspect_json(
        &smollm2(),
        &["--memory", "8G", "-c", "640", "--kv-dtype", "bf16"],
        &[],
    );
    assert_eq!(u(&v, "kv_bytes"), LAYERS * 2 * KV_WIDTH * 2 * 640);
}

#[test]
fn activations_hold_logits_for_the_last_position_only() {
    let one = inspect_json(&smollm2(), &["--memory", "8G", "-c", "640", "-t", "2"], &[]);
    let four = inspect_json(
        &smollm2(),
        &["--memory", "8G", "-c", "640", "-t", "2", "-b", "4"],
        &[],
    );
    let logits = |v: &serde_json::Value| {
        v["activation_detail"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == "logits")
            .map(|b| b["bytes"].as_u64().unwrap())
            .unwrap()
    };
    assert_eq!(logits(&one), 49_152 * 4);
    assert_eq!(logits(&four), 4 * 49_152 * 4);
    // A smaller step shrinks every per-token buffer.
    let small = inspect_json(
        &smollm2(),
        &[
            "--memory",
            "8G",
            "-c",
            "640",
            "-t",
            "2",
            "--max-tokens-per-step",
            "64",
        ],
        &[],
    );
    assert!(u(&small, "activation_bytes") < u(&one, "activation_bytes"));
    let sum: u64 = one["activation_detail"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(sum, u(&one, "activation_bytes"));
}

#[test]
fn text_output_lists_every_term_and_the_verdict() {
    let out = fathom(
        &["inspect", smollm2().to_str().unwrap(), "--memory", "8G"],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for label in [
        "Weights",
        "KV cache",
        "Activations",
        "Runtime overhead",
        "Backend",
        "Total",
        "Available",
    ] {
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(label)),
            "no {label} line in\n{text}"
        );
    }
    assert!(
        text.contains(&format!("({SMOLLM2_TENSOR_BYTES} bytes)")),
        "{text}"
    );
    let available = text
        .lines()
        .find(|l| l.trim_start().starts_with("Available"))
        .unwrap();
    assert!(
        available.contains("8.00 GiB") && available.contains("(8589934592 bytes)"),
        "{available}"
    );
    assert!(text.contains("FITS: "), "{text}");
    assert!(
        text.contains("Largest context that fits at batch 1: 8192 tokens"),
        "{text}"
    );
    assert!(
        !text.contains("Backend in-flight"),
        "cpu has no in-flight reserve:\n{text}"
    );
}

#[test]
fn a_model_that_does_not_fit_exits_zero_with_the_overflow() {
    let out = fathom(
        &["inspect", smollm2().to_str().unwrap(), "--memory", "200M"],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("DOES NOT FIT: "), "{text}");
    let v = inspect_json(&smollm2(), &["--memory", "200M"], &[]);
    assert_eq!(v["fits"], false);
    assert_eq!(u(&v, "overflow_bytes"), u(&v, "total_bytes") - (200 << 20));
    assert_eq!(u(&v, "slack_bytes"), 0);
    // The largest context that fits does fit, and one more token does not.
    let ctx = u(&v, "max_context_that_fits");
    assert!(ctx > 0 && ctx < 8192, "{ctx}");
    let at = |c: u64| inspect_json(&smollm2(), &["--memory", "200M", "-c", &c.to_string()], &[]);
    assert_eq!(at(ctx)["fits"], true);
    assert_eq!(at(ctx + 1)["fits"], false);
}

#[test]
fn maximal_inputs_saturate_instead_of_wrapping() {
    let max = u64::MAX.to_string();
    let v = inspect_json(
        &smollm2(),
        &["--memory", "8G", "--max-tokens", &max, "--batch", &max],
        &[],
    );
    assert_eq!(u(&v, "total_bytes"), u64::MAX);
    assert_eq!(v["fits"], false);
    assert_eq!(u(&v, "max_context_that_fits"), 0);
}

#[test]
fn memory_comes_from_the_environment_when_no_flag() {
    let v = inspect_json(&smollm2(), &[], &[("FATHOM_MEMORY_LIMIT", "1.5GiB")]);
    assert_eq!(v["available_source"], "FATHOM_MEMORY_LIMIT");
    assert_eq!(u(&v, "available_bytes"), 3 << 29);
    // The flag wins over the variable.
    let v = inspect_json(
        &smollm2(),
        &["--memory", "2G"],
        &[("FATHOM_MEMORY_LIMIT", "1G")],
    );
    assert_eq!(u(&v, "available_bytes"), 2 << 30);
    // `none` means unset: the machine's own figure applies.
    let v = inspect_json(&smollm2(), &[], &[("FATHOM_MEMORY_LIMIT", "none")]);
    assert_ne!(v["available_source"], "FATHOM_MEMORY_LIMIT");
    let out = fathom(
        &["inspect", smollm2().to_str().unwrap()],
        &[("FATHOM_MEMORY_LIMIT", "lots")],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("FATHOM_MEMORY_LIMIT"),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("lots"), "{}", stderr(&out));
}

#[test]
fn headroom_factor_scales_weights_and_kv() {
    let base = inspect_json(&smollm2(), &["--memory", "8G"], &[]);
    let v = inspect_json(
        &smollm2(),
        &["--memory", "8G"],
        &[("FATHOM_HEADROOM_FACTOR", "1.5")],
    );
    let wkv = u(&base, "weights_bytes") + u(&base, "kv_bytes");
    assert_eq!(
        v["headroom_bytes"].as_i64().unwrap() as u64,
        wkv.div_ceil(2)
    );
    assert_eq!(
        u(&v, "total_bytes"),
        u(&base, "total_bytes") + wkv.div_ceil(2)
    );
    assert_eq!(base["headroom_bytes"], 0);
    assert_eq!(base["headroom_factor"], 1.0);
    for bad in ["0", "-1", "nan", "inf", "abc"] {
        let out = fathom(
            &["inspect", smollm2().to_str().unwrap(), "--memory", "8G"],
            &[("FATHOM_HEADROOM_FACTOR", bad)],
        );
        assert_eq!(out.status.code(), Some(1), "factor {bad}");
        assert!(
            stderr(&out).contains("FATHOM_HEADROOM_FACTOR"),
            "{}",
            stderr(&out)
        );
    }
}

#[test]
fn rocm_inflight_reserve_is_its_own_term() {
    let model = smollm2();
    let cpu = inspect_json(&model, &["--memory", "8G"], &[]);
    let rocm = |value: Option<&str>| {
        let env: Vec<(&str, &str)> = value
            .map(|v| ("MLX_ROCM_MAX_INFLIGHT_MB", v))
            .into_iter()
            .collect();
        inspect_json(&model, &["--memory", "8G", "--device", "rocm"], &env)
    };
    let default = rocm(None);
    assert_eq!(u(&default, "backend_inflight_bytes"), 1024 << 20);
    assert_eq!(
        u(&default, "total_bytes"),
        u(&cpu, "total_bytes") + (1024 << 20)
    );
    assert_eq!(u(&rocm(Some("256")), "backend_inflight_bytes"), 256 << 20);
    assert_eq!(
        u(&rocm(Some("512MB")), "backend_inflight_bytes"),
        1024 << 20
    );
    assert_eq!(u(&rocm(Some(" -0")), "backend_inflight_bytes"), 0);
    assert_eq!(u(&rocm(Some("-0")), "backend_inflight_bytes"), 1024 << 20);
    let zero = rocm(Some("0"));
    assert_eq!(u(&zero, "backend_inflight_bytes"), 0);
    assert_eq!(u(&zero, "total_bytes"), u(&cpu, "total_bytes"));
    let largest = rocm(Some("17592186044415"));
    assert_eq!(u(&largest, "total_bytes"), u64::MAX);
    assert_eq!(largest["fits"], false);

    let text = |env: &[(&str, &str)]| {
        let out = fathom(
            &[
                "inspect",
                model.to_str().unwrap(),
                "--memory",
                "8G",
                "--device",
                "rocm",
            ],
            env,
        );
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    assert!(text(&[]).contains("Backend in-flight"));
    assert!(!text(&[("MLX_ROCM_MAX_INFLIGHT_MB", "0")]).contains("Backend in-flight"));
    let huge = text(&[("MLX_ROCM_MAX_INFLIGHT_MB", "17592186044415")]);
    assert!(huge.contains("DOES NOT FIT"), "{huge}");

    // Every other device ignores the variable.
    for device in ["cpu", "cuda", "metal"] {
        let v = inspect_json(
            &model,
            &["--memory", "8G", "--device", device],
            &[("MLX_ROCM_MAX_INFLIGHT_MB", "4096")],
        );
        assert_eq!(u(&v, "backend_inflight_bytes"), 0, "{device}");
    }
}

#[test]
fn cuda_plans_its_one_allocation_and_a_host_budget() {
    use fathom_plan::cuda;
    let v = inspect_json(&smollm2(), &["--memory", "80G", "--device", "cuda"], &[]);
    let term = |name: &str| {
        v["terms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap()["bytes"]
            .as_u64()
            .unwrap()
    };
    // The device holds the context, the kernels, cuBLAS's handle and
    // workspace, the decode graphs, the prefill staging and split
    // attention's partials besides
    // weights, KV and arena (SmolLM2: 512 rows x 1536 x 2 bytes of
    // activation staging; partials for 16 rows x 32 pieces x (9 heads x
    // (64 + 2)) f32; a few KiB of uploads; the allocation rounded to 2 MiB);
    // the host runtime is not on the device.
    let outside = cuda::CONTEXT_BYTES
        + cuda::MODULE_BYTES
        + cuda::BLAS_HANDLE_BYTES
        + cuda::MAX_GRAPHS as u64 * cuda::GRAPH_BYTES;
    let partials = cuda::ATTENTION_SPLIT_ROWS * cuda::ATTENTION_MAX_SPLITS * 9 * (64 + 2) * 4;
    let fixed = outside + cuda::BLAS_WORKSPACE + cuda::WEIGHT_STAGING + partials;
    assert!(term("backend") >= fixed + 512 * 1536 * 2);
    assert!(
        term("backend")
            < fixed + 512 * 1536 * 2 + cuda::WEIGHT_SLACK + cuda::ALLOCATION_GRANULE + (1 << 20)
    );
    assert_eq!(term("runtime"), 0);
    let device_terms: u64 = ["weights", "converted", "kv", "activations", "backend"]
        .into_iter()
        .map(term)
        .sum();
    assert_eq!(device_terms, u(&v, "total_bytes"));
    // The host side: sampler candidates and token ids leave the device arena.
    let host_side: u64 = v["activation_detail"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["name"] == "sampler" || b["name"] == "token_ids")
        .map(|b| u(b, "bytes"))
        .sum();
    let arena: u64 = v["activation_detail"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| u(b, "bytes"))
        .sum();
    assert_eq!(term("activations"), arena - host_side);
    let host = &v["host"];
    let names: Vec<&str> = host["terms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "runtime",
            "cuda_libraries",
            "cuda_kernels_and_graphs",
            "host_buffers",
            "weights_staging"
        ]
    );
    assert_eq!(
        u(&host["terms"][2], "bytes"),
        cuda::KERNELS_HOST_BYTES + cuda::MAX_GRAPHS as u64 * cuda::GRAPH_HOST_BYTES
    );
    let host_sum: u64 = host["terms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| u(t, "bytes"))
        .sum();
    assert_eq!(host_sum, u(host, "total_bytes"));
    assert_eq!(u(&host["terms"][4], "bytes"), u(&v, "weights_bytes"));
    // A cpu plan has no host section: its one budget is host memory.
    let cpu = inspect_json(&smollm2(), &["--memory", "8G", "--device", "cpu"], &[]);
    assert!(cpu.get("host").is_none());
}

#[test]
fn quant_advice_recommends_the_most_precise_that_fits() {
    let v = inspect_json(&smollm2(), &["--memory", "8G", "--recommend-quant"], &[]);
    let advice = &v["quant_advice"];
    let options = advice["options"].as_array().unwrap();
    let names: Vec<&str> = options
        .iter()
        .map(|o| o["quant"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["F16", "Q8_0", "Q6_K", "Q5_K", "Q4_K", "Q4_0"]);
    assert_eq!(advice["recommended"], "F16");
    assert_eq!(u(advice, "params"), u(&v, "params"));
    for o in options {
        assert_eq!(u(o, "kv_bytes"), u(&v, "kv_bytes"));
        assert_eq!(
            u(o, "total_bytes"),
            u(o, "weights_bytes") + u(o, "kv_bytes")
        );
    }
    // F16 is 2 bytes per parameter for every matrix, F32 for the norms.
    let f16 = u(&options[0], "weights_bytes");
    assert!(f16 > 2 * 134_000_000 && f16 < 2 * 135_000_000, "{f16}");
    // A budget between the Q4_0 and Q8_0 totals picks a 4-5 bit type.
    let q8 = u(&options[1], "total_bytes");
    let q4 = u(&options[5], "total_bytes");
    let mid = (q8 + q4) / 2;
    let v = inspect_json(
        &smollm2(),
        &["--memory", &mid.to_string(), "--recommend-quant"],
        &[],
    );
    let pick = v["quant_advice"]["recommended"]
        .as_str()
        .unwrap()
        .to_string();
    let fits: Vec<bool> = v["quant_advice"]["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["fits"].as_bool().unwrap())
        .collect();
    let first_fit = fits.iter().position(|&f| f).unwrap();
    assert_eq!(pick, names[first_fit]);
    assert!(!fits[0] && !fits[1], "{fits:?}");
    // Nothing fits in a tiny budget.
    let v = inspect_json(&smollm2(), &["--memory", "1M", "--recommend-quant"], &[]);
    assert!(v["quant_advice"]["recommended"].is_null());
}

#[test]
fn quant_advice_ignores_the_backend_term() {
    let cpu = inspect_json(&smollm2(), &["--memory", "1G", "--recommend-quant"], &[]);
    let rocm = inspect_json(
        &smollm2(),
        &["--memory", "1G", "--recommend-quant", "--device", "rocm"],
        &[("MLX_ROCM_MAX_INFLIGHT_MB", "17592186044415")],
    );
    assert_eq!(cpu["quant_advice"], rocm["quant_advice"]);
    assert_eq!(rocm["quant_advice"]["recommended"], "F16");
}

#[test]
fn bad_flags_are_clear_errors() {
    let model = smollm2();
    for (flag, value, needle) in [
        ("--device", "tpu", "cpu, cuda, rocm, metal"),
        ("--kv-dtype", "q4", "f16, bf16, f32, q8_0"),
        ("--memory", "12Q", "--memory"),
        ("--batch", "0", "--batch"),
        ("--max-tokens", "0", "--max-tokens"),
    ] {
        let out = fathom(&["inspect", model.to_str().unwrap(), flag, value], &[]);
        assert_eq!(out.status.code(), Some(1), "{flag} {value}");
        assert!(
            stderr(&out).contains(needle),
            "{flag} {value}: {}",
            stderr(&out)
        );
    }
}
