//! Placement between GPU and host on header-only GGUF checkpoints of the
//! published Llama-3.1-70B and Qwen3-30B-A3B shapes (Q4_K), read by the real
//! readers. Figures are derived by hand in the comments beside them.

use std::path::PathBuf;

use fathom_checkpoint::Checkpoint;
use fathom_fixtures::{self as fx, Data, GgufTensorType, ModelDef};
use fathom_plan::placement::{GpuLayers, Place, PlacementRequest, TensorOverride};
use fathom_plan::{Available, Device, KvDtype, MemoryPlan, PlanInputs};
use fathom_spec::ModelSpec;

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn gguf(model: &ModelDef, tag: &str) -> (TempDir, ModelSpec) {
    let dir = std::env::temp_dir().join(format!("fathom-plan-place-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.gguf");
    fx::write_gguf(model, &path, GgufTensorType::Q4_K, Data::Sparse).unwrap();
    let spec = ModelSpec::from_checkpoint(&Checkpoint::open(&path).unwrap()).unwrap();
    (TempDir(dir), spec)
}

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn inputs(device_bytes: u64) -> PlanInputs {
    PlanInputs {
        context: 8192,
        batch: 1,
        device: Device::Cuda,
        kv_dtype: KvDtype::F16,
        max_tokens_per_step: 512,
        threads: 2,
        headroom_factor: 1.0,
        rocm_inflight_raw: None,
        host_available: Some(Available {
            bytes: 256 * GIB,
            source: "test".into(),
        }),
        available: Available {
            bytes: device_bytes,
            source: "--memory".into(),
        },
    }
}

fn placed(spec: &ModelSpec, device_bytes: u64, request: &PlacementRequest) -> MemoryPlan {
    MemoryPlan::with_placement(spec, inputs(device_bytes), request).unwrap()
}

fn host_term(plan: &MemoryPlan, name: &str) -> u64 {
    let host = plan.host.as_ref().expect("a cuda plan has a host side");
    host.terms
        .iter()
        .find(|t| t.name == name)
        .map_or(0, |t| t.bytes)
}

fn gpu_layers(n: u64) -> PlacementRequest {
    PlacementRequest {
        gpu_layers: GpuLayers::Count(n),
        ..PlacementRequest::default()
    }
}

#[test]
fn llama_70b_under_24_gib_keeps_the_last_layers_that_fit() {
    let (_dir, spec) = gguf(&fx::llama_3_1_70b(), "llama70b");
    let whole = spec.weights_bytes();
    let p = placed(&spec, 24 * GIB, &PlacementRequest::default());
    let placed_at = p.placement.as_ref().unwrap();
    let n = placed_at.gpu_layers;
    assert!(p.fits, "auto fits the device");
    assert!(
        n > 0 && n < 80,
        "a 70B Q4_K (~40 GB) splits under 24 GiB: {n}"
    );
    assert_eq!(placed_at.chosen_by, "auto");
    // Maximal: one more layer on the GPU no longer fits.
    assert!(!placed(&spec, 24 * GIB, &gpu_layers(n + 1)).fits);
    let mut fixed = placed(&spec, 24 * GIB, &gpu_layers(n));
    assert_eq!(
        fixed.placement.as_ref().unwrap().chosen_by,
        format!("--gpu-layers {n}")
    );
    fixed.placement.as_mut().unwrap().chosen_by = "auto".into();
    assert!(fixed == p, "auto is --gpu-layers {n}");
    // The host runs the first 80 − n layers, the GPU the last n.
    for l in &placed_at.layers {
        let want = if l.layer < 80 - n {
            Place::Cpu
        } else {
            Place::Cuda
        };
        assert_eq!(l.place, want, "layer {}", l.layer);
    }
    // Untied embeddings go to the host with the first layers; the output
    // head stays on the GPU.
    assert_eq!(placed_at.embeddings, Place::Cpu);
    assert_eq!(placed_at.output, Place::Cuda);
    // Every byte is somewhere, once.
    assert_eq!(
        placed_at.device_weights_bytes + placed_at.host_weights_bytes,
        whole
    );
    assert_eq!(p.weights_bytes, placed_at.device_weights_bytes);
    // KV by hand: 8 KV heads × 128 dims × (K + V) × 2 bytes = 4 KiB a
    // token a layer, × 8192 tokens = 32 MiB a layer.
    assert_eq!(p.kv_bytes, n * 32 * MIB);
    assert_eq!(host_term(&p, "host_kv"), (80 - n) * 32 * MIB);
    // The host keeps the whole file mapped while loading (its share stays).
    assert_eq!(host_term(&p, "weights_staging"), whole);
    assert!(host_term(&p, "host_activations") > 0);
    // The table of layer counts: all, this one, 3/4, 1/2, 1/4, none; the
    // row of this plan is the plan; more layers than auto's do not fit.
    let counts: Vec<u64> = placed_at.options.iter().map(|o| o.gpu_layers).collect();
    assert_eq!(counts, [80, 60, n, 40, 20, 0]);
    let row = placed_at
        .options
        .iter()
        .find(|o| o.gpu_layers == n)
        .unwrap();
    assert_eq!(row.device_total_bytes, p.total_bytes);
    assert_eq!(row.host_total_bytes, p.host.as_ref().unwrap().total_bytes);
    for o in &placed_at.options {
        assert_eq!(o.fits, o.gpu_layers <= n, "{o:?}");
    }
}

#[test]
fn a_split_plans_device_room_for_the_largest_host_matrix() {
    let (_dir, spec) = gguf(&fx::llama_3_1_70b(), "llama70b-stream");
    let room = |p: &MemoryPlan| p.device_layout.as_ref().unwrap().streamed.bytes;
    let ffn = spec
        .tensors
        .iter()
        .find(|t| t.name == "blk.0.ffn_down.weight")
        .unwrap();
    assert_eq!(
        (ffn.shape.as_slice(), ffn.dtype.as_str()),
        (&[28672, 8192][..], "Q4_K")
    );
    // The FFN's matrices are the largest: 8,192 rows of 28,672 Q4_K values
    // (or the transpose), 112 blocks of 144 bytes = 16,128 bytes a row, ×
    // 8,192 = 132,120,576 bytes, a multiple of 16 (no padding).
    let split = placed(&spec, 24 * GIB, &gpu_layers(40));
    assert_eq!(room(&split), 132_120_576);
    let backend = split.terms.iter().find(|t| t.name == "backend").unwrap();
    assert!(
        backend
            .derivation
            .contains("streamed host matrices 126.00 MiB"),
        "{}",
        backend.derivation
    );
    // Nothing on the host, nothing streamed.
    assert_eq!(room(&placed(&spec, 80 * GIB, &gpu_layers(80))), 0);
    // The MoE: a layer's routed experts are streamed together. Each
    // expert's gate and up are 768 rows of 2,048 Q4_K values (8 blocks ×
    // 144 = 1,152 bytes a row: 884,736 bytes), its down 2,048 rows of 768
    // (3 × 144 = 432 bytes a row: 884,736), so 128 experts × 3 × 884,736 =
    // 339,738,624 bytes, more than a host layer's largest matrix
    // (attention's 4,096 × 2,048: 4,718,592).
    let (_moe_dir, moe) = gguf(&fx::qwen3_30b_a3b(), "qwen3moe-stream");
    let experts_only = PlacementRequest {
        gpu_layers: GpuLayers::All,
        cpu_moe_layers: 48,
        overrides: Vec::new(),
    };
    let experts_streamed = placed(&moe, 80 * GIB, &experts_only);
    assert_eq!(room(&experts_streamed), 339_738_624);
    assert_eq!(room(&placed(&moe, 80 * GIB, &gpu_layers(40))), 339_738_624);
    // With them it plans the expert grouping the streamed experts run
    // through, as it does with every expert on the GPU.
    let grouping = |p: &MemoryPlan| p.device_layout.as_ref().unwrap().moe_grouping.bytes;
    assert!(grouping(&experts_streamed) > 0);
    assert_eq!(
        grouping(&experts_streamed),
        grouping(&placed(&moe, 80 * GIB, &gpu_layers(48)))
    );
}

#[test]
fn all_layers_on_a_small_device_does_not_fit_and_says_so() {
    let (_dir, spec) = gguf(&fx::llama_3_1_70b(), "llama70b-all");
    let all = PlacementRequest {
        gpu_layers: GpuLayers::All,
        ..PlacementRequest::default()
    };
    let p = placed(&spec, 24 * GIB, &all);
    assert!(!p.fits);
    let placed_at = p.placement.as_ref().unwrap();
    assert_eq!(placed_at.gpu_layers, 80);
    assert_eq!(placed_at.host_weights_bytes, 0);
    assert_eq!(placed_at.chosen_by, "--gpu-layers all");
    // On a device that holds it, auto is everything on the GPU: the plan
    // of no placement at all.
    let roomy = placed(&spec, 80 * GIB, &PlacementRequest::default());
    assert_eq!(roomy.placement.as_ref().unwrap().gpu_layers, 80);
    assert!(!roomy.placement.as_ref().unwrap().is_split());
    let plain = MemoryPlan::new(&spec, inputs(80 * GIB)).unwrap();
    assert_eq!(roomy.total_bytes, plain.total_bytes);
    assert_eq!(roomy.host, plain.host);
}

#[test]
fn qwen3_30b_a3b_under_12_gib_moves_experts_first() {
    let (_dir, spec) = gguf(&fx::qwen3_30b_a3b(), "qwen3moe");
    let p = placed(&spec, 12 * GIB, &PlacementRequest::default());
    let placed_at = p.placement.as_ref().unwrap();
    let k = placed_at.cpu_moe_layers;
    assert!(p.fits);
    // Attention, norms, router and KV of all 48 layers stay on the GPU.
    assert_eq!(placed_at.gpu_layers, 48);
    assert!(k > 0 && k <= 48, "{k}");
    for l in &placed_at.layers {
        let want = if l.layer < k { Place::Cpu } else { Place::Cuda };
        assert_eq!(l.experts, Some(want), "layer {}", l.layer);
    }
    // KV by hand: 4 KV heads × 128 dims × 2 × 2 bytes = 2 KiB a token a
    // layer, 16 MiB at 8192 tokens, all 48 layers on the GPU.
    assert_eq!(p.kv_bytes, 48 * 16 * MIB);
    assert_eq!(host_term(&p, "host_kv"), 0);
    // Minimal: experts of one layer fewer on the host do not fit.
    let fewer = PlacementRequest {
        gpu_layers: GpuLayers::All,
        cpu_moe_layers: k - 1,
        overrides: Vec::new(),
    };
    assert!(!placed(&spec, 12 * GIB, &fewer).fits);
    // Host-side weights are exactly the k layers' experts: 3 stacked
    // tensors of 128 experts a layer.
    let experts_of = |layer: u64| -> u64 {
        spec.tensors
            .iter()
            .filter(|t| t.name.starts_with(&format!("blk.{layer}.")) && t.name.contains("_exps"))
            .map(|t| t.bytes)
            .sum()
    };
    assert_eq!(
        placed_at.host_weights_bytes,
        (0..k).map(experts_of).sum::<u64>()
    );
}

#[test]
fn override_tensor_exps_to_cpu_equals_cpu_moe() {
    let (_dir, spec) = gguf(&fx::qwen3_30b_a3b(), "qwen3moe-ot");
    let by_flag = placed(
        &spec,
        80 * GIB,
        &PlacementRequest {
            gpu_layers: GpuLayers::All,
            cpu_moe_layers: u64::MAX,
            overrides: Vec::new(),
        },
    );
    let by_regex = placed(
        &spec,
        80 * GIB,
        &PlacementRequest {
            gpu_layers: GpuLayers::All,
            cpu_moe_layers: 0,
            overrides: TensorOverride::parse("exps=cpu").unwrap(),
        },
    );
    let (a, b) = (
        by_flag.placement.as_ref().unwrap(),
        by_regex.placement.as_ref().unwrap(),
    );
    assert_eq!(a.cpu_moe_layers, 48);
    assert_eq!(a.device_weights_bytes, b.device_weights_bytes);
    assert_eq!(a.host_weights_bytes, b.host_weights_bytes);
    assert_eq!(by_flag.total_bytes, by_regex.total_bytes);
    // 48 layers × 3 stacked expert tensors matched.
    assert_eq!(b.overrides, vec![("exps".to_string(), Place::Cpu, 144)]);
}

#[test]
fn bad_placement_flags_are_clear_errors() {
    let err = GpuLayers::parse("most").unwrap_err().to_string();
    assert!(
        err.contains("--gpu-layers") && err.contains("auto, all, or a layer count"),
        "{err}"
    );
    let err = TensorOverride::parse("exps").unwrap_err().to_string();
    assert!(err.contains("REGEX=cpu") && err.contains("no '='"), "{err}");
    let err = TensorOverride::parse("exps=tpu").unwrap_err().to_string();
    assert!(err.contains("\"tpu\" is not cpu or cuda"), "{err}");
    let err = TensorOverride::parse("(exps=cpu").unwrap_err().to_string();
    assert!(err.contains("not a regular expression"), "{err}");
    // llama.cpp's spellings and comma-joined rules.
    let rules = TensorOverride::parse("exps=CPU,attn=CUDA0").unwrap();
    assert_eq!(rules.len(), 2);
    assert_eq!((rules[0].place, rules[1].place), (Place::Cpu, Place::Cuda));
    assert_eq!(GpuLayers::parse("ALL").unwrap(), GpuLayers::All);
    assert_eq!(GpuLayers::parse("12").unwrap(), GpuLayers::Count(12));
}

/// `fathom serve` of a model larger than the GPU: the placement is chosen
/// for every slot at full context, and the pool is that workload on both
/// sides. Llama-3.1-70B Q4_K, 4 slots of 4,096 tokens under 24 GiB: each
/// full-context slot is 4096 / 16 = 256 blocks, so the pool is 1,024
/// blocks; a block of the device's N layers is N x 16 tokens x 4,096 B
/// (8 KV heads x 128 dims x (K + V) x f16 bytes), the device's KV N x
/// 4 slots x 4,096 tokens x 4,096 B, and the host's the other 80 − N
/// layers' (together the whole model's 10 GiB).
#[test]
fn serving_a_split_model_pools_the_workload_on_both_sides() {
    use fathom_plan::serve::{RequestBuffers, ServePlan};
    let (_dir, spec) = gguf(&fx::llama_3_1_70b(), "llama70b-serve");
    let inputs = PlanInputs {
        context: 4096,
        batch: 4,
        ..inputs(24 * GIB)
    };
    let served = ServePlan::placed(
        &spec,
        inputs,
        &PlacementRequest::default(),
        RequestBuffers::NONE,
    )
    .unwrap();
    let plan = &served.plan;
    let placed = plan.placement.as_ref().unwrap();
    assert!(plan.fits && placed.is_split(), "{placed:?}");
    let n = placed.gpu_layers;
    assert!((1..80).contains(&n), "{n} GPU layers");
    assert_eq!(served.kv_blocks_per_sequence, 256);
    assert_eq!(served.kv_blocks, 1024);
    assert_eq!(served.prompt_cache_blocks, 0);
    // 8 KV heads x 128 dims x 2 (K and V) x 2 bytes = 4,096 B a token a layer.
    let per_token_layer = 8 * 128 * 2 * 2;
    assert_eq!(served.kv_block_bytes, n * 16 * per_token_layer);
    assert_eq!(plan.kv_bytes, n * 4 * 4096 * per_token_layer);
    assert_eq!(
        host_term(plan, "host_kv"),
        (80 - n) * 4 * 4096 * per_token_layer
    );
}

/// A hybrid model's recurrent state stays with its layer. Qwen3.5-4B
/// (Q4_K), 32 layers, every 4th (3, 7, …, 31) full attention; 2 sequences
/// of 8,192 tokens, `--gpu-layers 20`: the host runs layers 0–11 (9
/// linear, 3 full), the GPU layers 12–31 (15 linear; 5 full: 15, 19, 23,
/// 27, 31). A linear layer's state is (3 × 8,192 conv + 32 × 128 × 128
/// delta) f32 values = 2,195,456 bytes a sequence (plan_rules.rs derives
/// it), so the device's `recurrent_state` is 15 × 2,195,456 × 2 =
/// 65,863,680 bytes and the host's `host_recurrent_state` 9 × 2,195,456 ×
/// 2 = 39,518,208: together the unsplit plan's 24 layers' 105,381,888. The
/// full layers' KV is 4 KV heads × (256 + 256) × 2 B = 4,096 B a token: 5 ×
/// 4,096 × 8,192 × 2 on the device, 3 × on the host. The device's carve
/// holds exactly its state; each side's total is the sum of its terms.
#[test]
fn qwen3_5_recurrent_state_is_planned_on_the_side_of_its_layer() {
    let (_dir, spec) = gguf(&fx::qwen3_5_4b(), "qwen35-state");
    let two = |device_bytes| PlanInputs {
        batch: 2,
        ..inputs(device_bytes)
    };
    let per_layer = 2_195_456u64;
    let p = MemoryPlan::with_placement(&spec, two(64 * GIB), &gpu_layers(20)).unwrap();
    let placed_at = p.placement.as_ref().unwrap();
    assert_eq!(placed_at.gpu_layers, 20);
    assert_eq!(p.recurrent_bytes, 15 * per_layer * 2);
    assert_eq!(p.recurrent_bytes, 65_863_680);
    let r = p.recurrent_detail.as_ref().unwrap();
    assert_eq!((r.layers, r.sequences), (15, 2));
    assert_eq!(host_term(&p, "host_recurrent_state"), 9 * per_layer * 2);
    assert_eq!(host_term(&p, "host_recurrent_state"), 39_518_208);
    let whole = MemoryPlan::new(&spec, two(64 * GIB)).unwrap();
    assert_eq!(whole.recurrent_bytes, 105_381_888);
    assert_eq!(
        p.recurrent_bytes + host_term(&p, "host_recurrent_state"),
        whole.recurrent_bytes
    );
    assert_eq!(p.kv_bytes, 5 * 4096 * 8192 * 2);
    assert_eq!(host_term(&p, "host_kv"), 3 * 4096 * 8192 * 2);
    let layout = p.device_layout.as_ref().unwrap();
    assert_eq!(layout.recurrent.bytes, p.recurrent_bytes);
    let device_sum: u64 = p.terms.iter().map(|t| t.bytes).sum();
    assert_eq!(p.total_bytes, device_sum);
    let host = p.host.as_ref().unwrap();
    assert_eq!(
        host.total_bytes,
        host.terms.iter().map(|t| t.bytes).sum::<u64>()
    );
    let derivation = &host
        .terms
        .iter()
        .find(|t| t.name == "host_recurrent_state")
        .unwrap()
        .derivation;
    assert!(
        derivation.contains("9 linear-attention layers"),
        "{derivation}"
    );

    // At every boundary the two sides' states make the whole model's; with
    // no linear layer on a side, that side has no state term at all.
    for g in 0..=32u64 {
        let p = MemoryPlan::with_placement(&spec, two(64 * GIB), &gpu_layers(g)).unwrap();
        let host = host_term(&p, "host_recurrent_state");
        assert_eq!(p.recurrent_bytes + host, whole.recurrent_bytes, "-ngl {g}");
        let linear_on_gpu = (32 - g..32).filter(|i| (i + 1) % 4 != 0).count() as u64;
        assert_eq!(p.recurrent_bytes, linear_on_gpu * per_layer * 2, "-ngl {g}");
        assert_eq!(
            p.terms.iter().any(|t| t.name == "recurrent_state"),
            linear_on_gpu > 0,
            "-ngl {g}"
        );
    }

    // auto under a device that holds half the model moves whole layers,
    // their states with them.
    let auto = MemoryPlan::with_placement(
        &spec,
        two(whole.total_bytes / 2),
        &PlacementRequest::default(),
    )
    .unwrap();
    let n = auto.placement.as_ref().unwrap().gpu_layers;
    assert!(auto.fits && (1..32).contains(&n), "{n} GPU layers");
    let linear_on_gpu = (32 - n..32).filter(|i| (i + 1) % 4 != 0).count() as u64;
    assert_eq!(auto.recurrent_bytes, linear_on_gpu * per_layer * 2);
    assert_eq!(
        host_term(&auto, "host_recurrent_state"),
        (24 - linear_on_gpu) * per_layer * 2
    );
}

/// Qwen3.5-35B-A3B's experts on the host (`--cpu-moe`): every layer runs on
/// the GPU, so the device holds all 30 linear layers' states and the host
/// none (no `host_recurrent_state` term), while the host holds the experts.
#[test]
fn qwen3_5_moe_experts_on_the_host_leave_every_state_on_the_gpu() {
    let (_dir, spec) = gguf(&fx::qwen3_5_35b_a3b(), "qwen35moe-state");
    let cpu_moe = PlacementRequest {
        cpu_moe_layers: u64::MAX,
        ..PlacementRequest::default()
    };
    let p = placed(&spec, 64 * GIB, &cpu_moe);
    let placed_at = p.placement.as_ref().unwrap();
    assert_eq!((placed_at.gpu_layers, placed_at.cpu_moe_layers), (40, 40));
    assert!(placed_at.host_weights_bytes > placed_at.device_weights_bytes);
    let whole = MemoryPlan::new(&spec, inputs(64 * GIB)).unwrap();
    assert_eq!(p.recurrent_detail.as_ref().unwrap().layers, 30);
    assert_eq!(p.recurrent_bytes, whole.recurrent_bytes);
    let host = p.host.as_ref().unwrap();
    assert!(!host.terms.iter().any(|t| t.name == "host_recurrent_state"));
}

/// A Hugging Face Qwen3.5 checkpoint's multi-token-prediction layer
/// (`mtp.layers.0.*`, counted, never run) belongs to no decoder layer:
/// layer 0's bytes and place stay its own, and a rule that moves the MTP
/// tensors moves nothing else. (Its tensors are added here, HF-named, to
/// the 4B shape's header-only GGUF spec.)
#[test]
fn a_multi_token_prediction_layer_is_not_layer_0() {
    let (_dir, spec) = gguf(&fx::qwen3_5_4b(), "qwen35-mtp");
    let q = spec
        .tensors
        .iter()
        .find(|t| t.name == "blk.3.attn_q.weight")
        .expect("layer 3 is a full-attention layer")
        .clone();
    let mut with_mtp = spec.clone();
    for name in [
        "mtp.layers.0.self_attn.q_proj.weight",
        "mtp.layers.0.mlp.down_proj.weight",
    ] {
        with_mtp.tensors.push(fathom_spec::TensorEntry {
            name: name.into(),
            ..q.clone()
        });
    }
    let mtp_bytes = 2 * q.bytes;
    let layer_0 = |p: &MemoryPlan| p.placement.as_ref().unwrap().layers[0].clone();
    let (plain, mtp) = (
        placed(&spec, 64 * GIB, &gpu_layers(31)),
        placed(&with_mtp, 64 * GIB, &gpu_layers(31)),
    );
    assert_eq!(layer_0(&plain), layer_0(&mtp));
    assert_eq!(layer_0(&mtp).place, Place::Cpu);
    let (a, b) = (
        plain.placement.as_ref().unwrap(),
        mtp.placement.as_ref().unwrap(),
    );
    assert_eq!(b.device_weights_bytes, a.device_weights_bytes + mtp_bytes);
    assert_eq!(b.host_weights_bytes, a.host_weights_bytes);

    let moved = placed(
        &with_mtp,
        64 * GIB,
        &PlacementRequest {
            gpu_layers: GpuLayers::All,
            overrides: TensorOverride::parse("^mtp\\.=cpu").unwrap(),
            ..PlacementRequest::default()
        },
    );
    let m = moved.placement.as_ref().unwrap();
    assert_eq!(m.gpu_layers, 32);
    assert_eq!(layer_0(&moved).place, Place::Cuda);
    assert_eq!(layer_0(&moved).host_bytes, 0);
    assert_eq!(m.host_weights_bytes, mtp_bytes);
    assert_eq!(m.overrides, vec![("^mtp\\.".to_string(), Place::Cpu, 2)]);
}

/// The MoE grouping region (steps grouped by expert on the GPU) of the
/// Qwen3-30B-A3B shape, by hand: 512-row steps × 8 routes = 4,096 routed
/// rows; per routed row its row, expert and place (3 × 16,384 B), the
/// tiles (1 + 3 × (4,096 / 16 + 128) u32 = 4,612 B, aligned to 4,864),
/// the inputs as f16 (4,096 × 2,048 × 2 = 16,777,216) and their scales
/// (16,384), gate and up (2 × 4,096 × 768 × 4 = 25,165,824), act(gate) ×
/// up as f16 (6,291,456) and its scales (16,384), the down products
/// (4,096 × 2,048 × 4 = 33,554,432): 81,875,712 B. The whole model on the
/// GPU holds it, and so does a placement with some layer's experts on the
/// host, whose large steps run those experts on the GPU streamed.
#[test]
fn qwen3_30b_a3b_plans_its_expert_grouping_on_the_gpu_whatever_the_placement() {
    let (_dir, spec) = gguf(&fx::qwen3_30b_a3b(), "qwen3moe-grouping");
    let whole = MemoryPlan::new(&spec, inputs(64 * GIB)).unwrap();
    let layout = whole.device_layout.as_ref().unwrap();
    let g = layout.moe;
    assert_eq!(
        (g.routed, g.experts, g.width, g.ffn),
        (4096, 128, 2048, 768)
    );
    assert_eq!(3 * 16_384 + 4_864 + 16_777_216 + 16_384, g.gate);
    assert_eq!(g.bytes, 81_875_712);
    assert_eq!(layout.moe_grouping.bytes, g.bytes);
    let backend = whole.terms.iter().find(|t| t.name == "backend").unwrap();
    assert!(
        backend.derivation.contains("MoE grouping 78.08 MiB"),
        "{}",
        backend.derivation
    );
    let p = placed(&spec, 12 * GIB, &PlacementRequest::default());
    assert!(p.placement.as_ref().unwrap().cpu_moe_layers > 0);
    assert_eq!(
        p.device_layout.as_ref().unwrap().moe_grouping.bytes,
        81_875_712
    );
    // Whole layers on the host, every device layer with its experts: held.
    let dense_split = placed(&spec, 64 * GIB, &gpu_layers(40));
    assert_eq!(dense_split.placement.as_ref().unwrap().cpu_moe_layers, 8);
    let held = dense_split.device_layout.as_ref().unwrap().moe_grouping;
    assert_eq!(held.bytes, 81_875_712);
}
