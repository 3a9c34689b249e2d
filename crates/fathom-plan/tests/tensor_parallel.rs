//! Tensor-parallel plans on header-only checkpoints with the published
//! shapes of Llama-3.1-70B and Qwen3-30B-A3B, read by the real readers.
//! Every expected figure is derived by hand in the comments beside it.

use std::path::{Path, PathBuf};

use fathom_checkpoint::Checkpoint;
use fathom_fixtures::{self as fx, Data, GgufTensorType, ModelDef};
use fathom_plan::tensor_parallel::{Split, NCCL_FIXED_BYTES};
use fathom_plan::{Available, Device, KvDtype, MemoryPlan, PlanInputs};
use fathom_spec::ModelSpec;

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let path =
            std::env::temp_dir().join(format!("fathom-plan-tp-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn spec_of(path: &Path) -> ModelSpec {
    ModelSpec::from_checkpoint(&Checkpoint::open(path).unwrap()).unwrap()
}

/// The BF16 safetensors checkpoint, headers only.
fn safetensors(model: &ModelDef, tag: &str) -> (TempDir, ModelSpec) {
    let dir = TempDir::new(tag);
    fx::write_hf_dir(model, &dir.0, 4, Data::Sparse).unwrap();
    let spec = spec_of(&dir.0);
    (dir, spec)
}

fn gguf(model: &ModelDef, tag: &str, ty: GgufTensorType) -> (TempDir, ModelSpec) {
    let dir = TempDir::new(tag);
    let path = dir.0.join("model.gguf");
    fx::write_gguf(model, &path, ty, Data::Sparse).unwrap();
    let spec = spec_of(&path);
    (dir, spec)
}

const GIB: u64 = 1 << 30;

fn inputs(device: Device, per_device: u64) -> PlanInputs {
    PlanInputs {
        context: 8192,
        batch: 1,
        device,
        kv_dtype: KvDtype::F16,
        max_tokens_per_step: 512,
        threads: 2,
        headroom_factor: 1.0,
        rocm_inflight_raw: None,
        host_available: None,
        available: Available {
            bytes: per_device,
            source: "--memory".into(),
        },
    }
}

fn plan(spec: &ModelSpec, size: u64, per_device: u64) -> MemoryPlan {
    MemoryPlan::with_tensor_parallel(spec, inputs(Device::Cuda, per_device), size)
        .unwrap_or_else(|e| panic!("size {size}: {e}"))
}

fn term(plan: &MemoryPlan, name: &str) -> u64 {
    plan.terms
        .iter()
        .find(|t| t.name == name)
        .map_or(0, |t| t.bytes)
}

fn width(plan: &MemoryPlan, name: &str) -> u64 {
    plan.activation_detail
        .iter()
        .find(|b| b.name == name)
        .unwrap_or_else(|| panic!("no {name} buffer"))
        .width
}

/// What every device plan must satisfy whatever the model.
fn check_device_plan(p: &MemoryPlan, size: u64) {
    let sum = p.terms.iter().map(|t| t.bytes).sum::<u64>();
    assert_eq!(p.total_bytes, sum, "total is the sum of the terms");
    let tp = p.tensor_parallel.as_ref().expect("a tensor-parallel plan");
    assert_eq!(tp.size, size);
    assert_eq!(term(p, "nccl"), tp.nccl_bytes);
    assert_eq!(
        tp.weights.iter().map(|w| w.device_bytes).sum::<u64>(),
        p.weights_bytes,
        "the groups add up to the device's weights"
    );
    for w in &tp.weights {
        match w.split {
            Split::Replicated => assert_eq!(w.device_bytes, w.bytes, "{}", w.name),
            _ if w.name == "attention k/v" => assert!(w.device_bytes >= w.bytes / size),
            _ => assert_eq!(w.device_bytes * size, w.bytes, "{}", w.name),
        }
    }
    let host = p.host.as_ref().expect("cuda has a host budget");
    let names: Vec<&str> = host.terms.iter().map(|t| t.name).collect();
    assert!(names.contains(&"nccl_library") && names.contains(&"device_contexts"));
    let contexts = host.terms.iter().find(|t| t.name == "device_contexts");
    assert_eq!(contexts.unwrap().bytes, (size - 1) * (64 << 20));
}

// Llama-3.1-70B, BF16 (2 bytes a parameter). Per layer: q 8192x8192 =
// 67,108,864; k, v 1024x8192 = 8,388,608 each; o 67,108,864; gate, up,
// down 28672x8192 = 234,881,024 each; two norms of 8192. So a layer's
// split parameters are 855,638,016 (k/v split too: 8 KV heads cover
// N <= 8) and its whole ones 16,384. Model-wide, whole: embeddings and the
// output head 128256x8192 = 1,050,673,152 each, the final norm 8192.
//
// Whole on each device: 2 x 1,050,673,152 + 8192 + 80 x 16,384 =
// 2,102,665,216 parameters = 4,205,330,432 bytes.
// Split: 80 x 855,638,016 = 68,451,041,280 parameters = 136,902,082,560
// bytes, divided by N.
//
// N   weights per device                              KV at 8192 (f16)
// 1   136,902,082,560 + 4,205,330,432 = 141,107,412,992   80 x 2 x 8 x 128 x 2 B x 8192 = 2,684,354,560
// 2    68,451,041,280 + ...           =  72,656,371,712   1,342,177,280 (4 KV heads each)
// 4    34,225,520,640 + ...           =  38,430,851,072     671,088,640 (2 each)
// 8    17,112,760,320 + ...           =  21,318,090,752     335,544,320 (1 each)
const LLAMA_70B: [(u64, u64, u64); 4] = [
    (1, 141_107_412_992, 2_684_354_560),
    (2, 72_656_371_712, 1_342_177_280),
    (4, 38_430_851_072, 671_088_640),
    (8, 21_318_090_752, 335_544_320),
];

#[test]
fn llama_3_1_70b_per_device_by_hand() {
    let (_dir, spec) = safetensors(&fx::llama_3_1_70b(), "llama70b");
    assert_eq!(spec.params(), 70_553_706_496, "the published count");
    for (n, weights, kv) in LLAMA_70B {
        let p = plan(&spec, n, 80 * GIB);
        assert_eq!((p.weights_bytes, p.kv_bytes), (weights, kv), "N = {n}");
        if n == 1 {
            assert!(p.tensor_parallel.is_none());
            continue;
        }
        check_device_plan(&p, n);
        let tp = p.tensor_parallel.as_ref().unwrap();
        assert_eq!(
            (tp.heads_per_device, tp.kv_heads_per_device, tp.kv_replicas),
            (64 / n, 8 / n, 1)
        );
        assert_eq!(tp.ffn_per_device, 28_672 / n);
        // The arena holds this device's heads and FFN columns, and the
        // whole hidden width and vocabulary.
        assert_eq!(width(&p, "q"), 64 / n * 128);
        assert_eq!(width(&p, "k"), 8 / n * 128);
        assert_eq!(width(&p, "ffn_gate"), 28_672 / n);
        assert_eq!(width(&p, "residual"), 8192);
        assert_eq!(width(&p, "logits"), 128_256);
        // NCCL: 32 channels x (ring 1 + tree 1 for two devices, 2 beyond)
        // x 10 MiB + the measured 580 MiB = 1,220 MiB at N = 2, 1,540 MiB at N = 4 and 8.
        let connections = if n == 2 { 2 } else { 3 };
        assert_eq!(
            term(&p, "nccl"),
            32 * connections * (10 << 20) + NCCL_FIXED_BYTES
        );
        let whole: u64 = tp
            .weights
            .iter()
            .filter(|w| w.split == Split::Replicated)
            .map(|w| w.device_bytes)
            .sum();
        assert_eq!(whole, 4_205_330_432);
        // The host copies one row-split share at a time: the largest is a
        // down projection's, 28672 x 8192 BF16 / N.
        let host = p.host.as_ref().unwrap();
        let copy = host
            .terms
            .iter()
            .find(|t| t.name == "row_split_copy")
            .unwrap();
        assert_eq!(copy.bytes, 234_881_024 * 2 / n, "N = {n}");
        assert!(
            copy.derivation.contains("mlp.down_proj"),
            "{}",
            copy.derivation
        );
    }
}

#[test]
fn llama_3_1_70b_which_size_fits_40_gib_per_device() {
    let (_dir, spec) = safetensors(&fx::llama_3_1_70b(), "llama70b-fit");
    let p = plan(&spec, 4, 40 * GIB);
    let sizes = &p.tensor_parallel.as_ref().unwrap().sizes;
    let row = |n: u64| sizes.iter().find(|s| s.size == n).unwrap();
    assert_eq!(
        sizes.iter().map(|s| s.size).collect::<Vec<_>>(),
        [1, 2, 4, 8]
    );
    // 141 GB and 73 GB of weights cannot fit 42.9 GB; 38.4 GB + 0.67 GB KV
    // + 1 GiB NCCL + the CUDA terms do.
    assert!(!row(1).fits && !row(2).fits && row(4).fits && row(8).fits);
    assert_eq!(
        (row(1).max_context_that_fits, row(2).max_context_that_fits),
        (0, 0)
    );
    assert_eq!(row(4).total_bytes, p.total_bytes, "the row is this plan");
    assert_eq!(row(4).max_context_that_fits, p.max_context_that_fits);
    // What is left of 40 GiB at N = 4 holds this many tokens of 81,920 KV
    // bytes each (327,680 / 4), give or take the arena's growth and the
    // rounding to whole 16-token blocks.
    let slack_tokens = p.slack_bytes / 81_920;
    assert!(p.max_context_that_fits > 8192 + slack_tokens * 9 / 10);
    assert!(
        p.max_context_that_fits <= 8192 + slack_tokens + 16,
        "{} tokens fit, {} slack tokens",
        p.max_context_that_fits,
        slack_tokens
    );
    // At N = 8, 21 GB of weights leave room for the trained 131,072 tokens
    // (5.4 GB of KV per device).
    assert_eq!(row(8).max_context_that_fits, 131_072);
    for s in sizes {
        assert!(s.error.is_none());
    }
}

// Qwen3-30B-A3B, BF16. Per layer: q 4096x2048 = 8,388,608 and o the same
// (split 1/N); k, v 512x2048 = 1,048,576 each (4 KV heads: split
// 1/min(N, 4)); 128 experts x (gate, up, down) 768x2048 = 603,979,776
// (each expert's columns split 1/N); whole: router 128x2048 = 262,144, two
// norms of 2048, q/k norms of 128: 266,496. Model-wide, whole: embeddings
// and output head 151936x2048 = 311,164,928 each, the final norm 2048.
//
// Whole per device: 48 x 266,496 + 2 x 311,164,928 + 2048 = 635,123,712.
// Split 1/N: 48 x (2 x 8,388,608 + 603,979,776) = 29,796,335,616.
// K/V: 48 x 2,097,152 = 100,663,296, split 1/min(N, 4).
//
// N   parameters per device                                   bytes
// 1   635,123,712 + 29,796,335,616 + 100,663,296 = 30,532,122,624   61,064,245,248
// 2   635,123,712 + 14,898,167,808 +  50,331,648 = 15,583,623,168   31,167,246,336
// 4   635,123,712 +  7,449,083,904 +  25,165,824 =  8,109,373,440   16,218,746,880
// 8   635,123,712 +  3,724,541,952 +  25,165,824 =  4,384,831,488    8,769,662,976
//
// KV at 8192, f16: 48 layers x 2 x kv heads x 128 x 2 B x 8192 =
// 201,326,592 per KV head: 805,306,368 (N = 1), 402,653,184 (2),
// 201,326,592 (4), and 201,326,592 at 8 as well: one KV head on each
// device, every head held by two.
const QWEN3_30B_A3B: [(u64, u64, u64); 4] = [
    (1, 61_064_245_248, 805_306_368),
    (2, 31_167_246_336, 402_653_184),
    (4, 16_218_746_880, 201_326_592),
    (8, 8_769_662_976, 201_326_592),
];

#[test]
fn qwen3_30b_a3b_per_device_by_hand() {
    let (_dir, spec) = safetensors(&fx::qwen3_30b_a3b(), "qwen3moe");
    assert_eq!(spec.params(), 30_532_122_624);
    for (n, weights, kv) in QWEN3_30B_A3B {
        let p = plan(&spec, n, 80 * GIB);
        assert_eq!((p.weights_bytes, p.kv_bytes), (weights, kv), "N = {n}");
        if n == 1 {
            continue;
        }
        check_device_plan(&p, n);
        let tp = p.tensor_parallel.as_ref().unwrap();
        assert_eq!(
            (tp.kv_heads_per_device, tp.kv_replicas),
            ((4 / n).max(1), (n / 4).max(1))
        );
        assert_eq!(tp.expert_ffn_per_device, 768 / n);
        // The arena's FFN buffers take the wider of the config's dense
        // FFN (6144) and an expert's (768), both split.
        assert_eq!(width(&p, "ffn_gate"), 6144 / n);
        assert_eq!(width(&p, "router_logits"), 128, "routing is whole");
        assert_eq!(width(&p, "moe_in"), 2048);
        let experts = tp.weights.iter().find(|w| w.name == "experts gate/up");
        assert_eq!(experts.unwrap().tensors, 48 * 128 * 2);
        if n == 8 {
            assert!(p.terms[0]
                .derivation
                .contains("each KV head held by 2 devices"));
        }
    }
}

#[test]
fn gguf_blocks_split_on_block_boundaries_or_say_which_sizes_do() {
    // Llama-70B in Q4_K: rows of 8192 (o) and 28672 (down) split 8 ways
    // into 1024 and 3584 values, whole 256-value blocks: the split groups
    // divide exactly.
    let (_dir, spec) = gguf(&fx::llama_3_1_70b(), "llama70b-q4k", GgufTensorType::Q4_K);
    let p = plan(&spec, 8, 80 * GIB);
    check_device_plan(&p, 8);

    // Qwen3-30B-A3B in Q4_K: an expert's down projection has rows of 768
    // values (three blocks), which halve into 384: no split but 3 ways.
    let (_dir, spec) = gguf(&fx::qwen3_30b_a3b(), "qwen3moe-q4k", GgufTensorType::Q4_K);
    let err = MemoryPlan::with_tensor_parallel(&spec, inputs(Device::Cuda, 80 * GIB), 2)
        .unwrap_err()
        .to_string();
    assert!(err.contains("--tensor-parallel is 2"), "{err}");
    assert!(err.contains("blk.0.ffn_down_exps.weight is Q4_K"), "{err}");
    assert!(err.contains("would be 384 values"), "{err}");
    assert!(
        err.contains("sizes that split it on block boundaries: 1, 3"),
        "{err}"
    );
    // In Q8_0 (blocks of 32) every size splits it.
    let q8 = gguf(&fx::qwen3_30b_a3b(), "qwen3moe-q8", GgufTensorType::Q8_0);
    let p = plan(&q8.1, 2, 80 * GIB);
    let sizes = p.tensor_parallel.unwrap().sizes;
    assert!(sizes.iter().all(|s| s.error.is_none()));

    // 8 heads of 64 give attention output rows of 512 Q4_K values: halved
    // they are 256 (one block), quartered 128. So 2 devices plan, and the
    // table says why 4 and 8 cannot.
    let model = fx::reshaped(
        &fx::tiny_llama(),
        serde_json::json!({"num_attention_heads": 8}),
    );
    let (_dir, spec) = gguf(&model, "tiny-q4k", GgufTensorType::Q4_K);
    let p = plan(&spec, 2, GIB);
    let sizes = p.tensor_parallel.unwrap().sizes;
    let errors: Vec<(u64, bool)> = sizes.iter().map(|s| (s.size, s.error.is_some())).collect();
    assert_eq!(errors, [(1, false), (2, false), (4, true), (8, true)]);
    let four = &sizes[2];
    assert!(four
        .error
        .as_ref()
        .unwrap()
        .contains("blk.0.attn_output.weight is Q4_K"));
    assert_eq!((four.total_bytes, four.fits), (0, false));
}

#[test]
fn size_one_is_exactly_the_plan_without_tensor_parallelism() {
    let (_dir, spec) = safetensors(&fx::qwen3_30b_a3b(), "qwen3moe-one");
    for device in [Device::Cuda, Device::Cpu] {
        let i = inputs(device, 80 * GIB);
        assert_eq!(
            MemoryPlan::with_tensor_parallel(&spec, i.clone(), 1).unwrap(),
            MemoryPlan::new(&spec, i).unwrap()
        );
    }
}

#[test]
fn invalid_sizes_are_clear_errors() {
    let (_dir, spec) = safetensors(&fx::llama_3_1_70b(), "llama70b-bad");
    let err = |device, n| {
        MemoryPlan::with_tensor_parallel(&spec, inputs(device, 80 * GIB), n)
            .unwrap_err()
            .to_string()
    };
    let three = err(Device::Cuda, 3);
    assert!(
        three.contains("64 attention heads do not split over 3 devices")
            && three.contains("1, 2, 4, 8, 16, 32, 64"),
        "{three}"
    );
    assert!(err(Device::Cuda, 0).contains("expected at least 1"));
    let cpu = err(Device::Cpu, 2);
    assert!(cpu.contains("cuda devices only, not cpu"), "{cpu}");
    // 16 devices divide the 64 heads; the 8 KV heads are each held by 2.
    let p = plan(&spec, 16, 80 * GIB);
    assert_eq!(p.tensor_parallel.unwrap().kv_replicas, 2);

    // 3 KV heads neither split over 2 devices nor divide them; an FFN of
    // 510 columns does not split 4 ways.
    let odd = |overrides| {
        let dir = TempDir::new("odd");
        let model = fx::reshaped(&fx::tiny_llama(), overrides);
        fx::write_hf_dir(&model, &dir.0, 1, Data::Sparse).unwrap();
        spec_of(&dir.0)
    };
    let kv3 = odd(serde_json::json!({"num_attention_heads": 12, "num_key_value_heads": 3}));
    let e = MemoryPlan::with_tensor_parallel(&kv3, inputs(Device::Cuda, GIB), 2)
        .unwrap_err()
        .to_string();
    assert!(e.contains("3 KV heads neither split over 2 devices"), "{e}");
    let ffn = odd(serde_json::json!({"intermediate_size": 510}));
    let e = MemoryPlan::with_tensor_parallel(&ffn, inputs(Device::Cuda, GIB), 4)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("FFN width 510 does not split over 4 devices") && e.contains("1, 2, 3, 5, 6"),
        "{e}"
    );
}
