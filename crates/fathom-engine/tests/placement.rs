//! A model split between a device and the host by the plan's placement
//! must give the logits of the unsplit model.
//!
//! On any machine both sides are CPU backends ("device" is a second CPU
//! backend standing in for the GPU): the engine's placement, the weight
//! groups each side loads, the residual crossing at the boundary, a MoE
//! layer's crossing to its experts and back, and each side's own KV are
//! the code a CUDA + CPU split runs. Each op runs the same kernels on the
//! same values as unsplit, so the logits must be equal to the bit. The
//! CUDA + CPU split against the all-GPU run and the CPU is a GPU test
//! (cuda_vs_cpu.rs).

mod common;

use std::path::{Path, PathBuf};

use common::families::{Format, FAMILIES};
use common::schedule::schedule_logits;
use fathom_backend::cpu::CpuBackend;
use fathom_backend::hybrid::Hybrid;
use fathom_checkpoint::Checkpoint;
use fathom_engine::{Engine, Tokenizer};
use fathom_fixtures::{GgufTensorType as T, ModelDef};
use fathom_plan::placement::{GpuLayers, PlacementRequest, TensorOverride};
use fathom_plan::{Available, Device, KvDtype, MemoryPlan, PlanInputs};
use fathom_spec::ModelSpec;

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fathom-place-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Small steps, so that later chunks read the KV each side holds.
fn inputs(device: Device) -> PlanInputs {
    PlanInputs {
        device,
        max_tokens_per_step: 16,
        available: Available {
            bytes: 16 << 30,
            source: "test".into(),
        },
        ..common::inputs(64, KvDtype::F16)
    }
}

/// The tokenizer of a GGUF of the same vocabulary (an HF fixture has none).
fn tokenizer(gguf: &Path) -> Tokenizer {
    fathom_engine::load_tokenizer(&Checkpoint::open(gguf).unwrap()).unwrap()
}

fn whole(path: &Path, gguf: &Path) -> Engine {
    common::engine(path, inputs(Device::Cpu), Some(tokenizer(gguf)))
}

/// The engine of `path` placed as `request` asks, both sides on the CPU.
fn split(path: &Path, gguf: &Path, request: &PlacementRequest) -> Result<Engine, String> {
    split_with(path, gguf, request, inputs)
}

/// [`split`] planned with `inputs`.
fn split_with(
    path: &Path,
    gguf: &Path,
    request: &PlacementRequest,
    inputs: fn(Device) -> PlanInputs,
) -> Result<Engine, String> {
    let checkpoint = Checkpoint::open(path).unwrap();
    let spec = ModelSpec::from_checkpoint(&checkpoint).unwrap();
    let plan = MemoryPlan::with_placement(&spec, inputs(Device::Cuda), request).unwrap();
    let placed = plan.placement.clone().expect("a cuda plan is placed");
    assert!(placed.is_split(), "{request:?} put nothing on the host");
    let device_kv = Engine::kv_layout(&spec, &plan);
    let host_kv = Engine::host_kv_layout(&spec, &plan).expect("a split plan has a host KV layout");
    // The host arena is the CPU's whole-step arena: the stand-in device
    // takes the same (a CUDA arena has no CPU scratch).
    // It streams host matrices as the GPU would, into the planned room.
    let room = plan.device_layout.as_ref().map_or(0, |l| l.streamed.bytes);
    let host = CpuBackend::new(2, &placed.host_arena, host_kv).unwrap();
    let device = CpuBackend::new(2, &placed.host_arena, device_kv)
        .unwrap()
        .standing_in_with_stream_room(room);
    let backend = Box::new(Hybrid::new(host, device));
    Engine::load_on(&checkpoint, spec, plan, tokenizer(gguf), backend).map_err(|e| e.to_string())
}

/// Prefill, then decode steps through each side's KV.
fn greedy(engine: &mut Engine, prompt: &[u32]) -> Vec<u32> {
    common::generated(engine, prompt, 8)
}

fn layers(n: u64) -> PlacementRequest {
    PlacementRequest {
        gpu_layers: GpuLayers::Count(n),
        ..PlacementRequest::default()
    }
}

#[test]
fn split_runs_equal_the_unsplit_run_for_every_family() {
    let d = dir("families");
    // Longer than tiny-gemma3's window of 16, so local layers slide.
    let tokens: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 1000).collect();
    let mut failures = Vec::new();
    let mut runs = 0;
    for f in &FAMILIES {
        let model = f.real_shaped();
        // The HF gemma3 has a sliding and a full layer (its GGUF here
        // reads as all sliding): with the full one alone on the device,
        // that side holds only the whole model's second KV group.
        let mut formats = vec![Format::Gguf(T::F32), Format::Gguf(T::Q8_0)];
        if f.name == "gemma3" {
            formats.push(Format::Safetensors);
        }
        for format in formats {
            let path = match format {
                Format::Gguf(ty) => d.join(format!("{}-{}.gguf", f.name, ty.name())),
                _ => d.join(format!("{}-hf", f.name)),
            };
            format.write(&model, &path, 5);
            let gguf = d.join(format!("{}-F32.gguf", f.name));
            let mut one = whole(&path, &gguf);
            let expected = one.logits(&tokens).unwrap().to_vec();
            let expected_tokens = greedy(&mut one, &tokens[..12]);
            let n = ModelSpec::from_checkpoint(&Checkpoint::open(&path).unwrap())
                .unwrap()
                .layers
                .len() as u64;
            // Every boundary, everything on the host, and for MoE the
            // experts alone on the host (all layers, then the first).
            let mut requests: Vec<(String, PlacementRequest)> =
                (0..n).map(|g| (format!("-ngl {g}"), layers(g))).collect();
            if f.name == "qwen3_moe" {
                for (name, cpu_moe_layers) in [("--cpu-moe", u64::MAX), ("--n-cpu-moe 1", 1)] {
                    let request = PlacementRequest {
                        gpu_layers: GpuLayers::All,
                        cpu_moe_layers,
                        ..PlacementRequest::default()
                    };
                    requests.push((name.into(), request));
                }
            }
            for (name, request) in requests {
                let label = format!("{} {format:?} {name}", f.name);
                let mut engine =
                    split(&path, &gguf, &request).unwrap_or_else(|e| panic!("{label}: {e}"));
                runs += 1;
                println!("{label}: ran");
                let got = engine.logits(&tokens).unwrap().to_vec();
                if got != expected {
                    let a = common::compare(&got, &expected);
                    failures.push(format!("{label}: logits differ: {a:?}"));
                }
                let got_tokens = greedy(&mut engine, &tokens[..12]);
                if got_tokens != expected_tokens {
                    failures.push(format!(
                        "{label}: greedy {got_tokens:?}, unsplit {expected_tokens:?}"
                    ));
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&d);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(runs >= 26, "only {runs} split runs");
}

/// The error loading `model` (F32) placed as `request` asks gives.
fn refusal(name: &str, model: &ModelDef, request: &PlacementRequest) -> String {
    let d = dir(name);
    let path = d.join(format!("{name}.gguf"));
    Format::Gguf(T::F32).write(model, &path, 5);
    let e = match split(&path, &path, request) {
        Ok(_) => panic!("{name} placed as {request:?} loaded"),
        Err(e) => e,
    };
    let _ = std::fs::remove_dir_all(&d);
    e
}

#[test]
fn an_override_that_splits_a_layer_is_refused_by_name() {
    let request = PlacementRequest {
        overrides: TensorOverride::parse("blk\\.0\\.ffn_up=cpu").unwrap(),
        ..PlacementRequest::default()
    };
    let e = refusal("apart", &FAMILIES[0].real_shaped(), &request);
    assert!(
        e.contains("blk.0.ffn_up.weight") && e.contains("--override-tensor"),
        "{e}"
    );
}

/// Batch 3, steps of 8: the schedule's chunked prefills and batched decode.
fn schedule_inputs(device: Device) -> PlanInputs {
    PlanInputs {
        batch: 3,
        max_tokens_per_step: 8,
        ..inputs(device)
    }
}

/// The families beyond [`FAMILIES`] a split runs: (name, model — `None` for
/// gpt-oss, which has its own writer — whether it is a MoE).
fn more_families() -> [(&'static str, Option<ModelDef>, bool); 4] {
    [
        ("qwen35", Some(fathom_fixtures::tiny_qwen3_5()), false),
        ("qwen35moe", Some(fathom_fixtures::tiny_qwen3_5_moe()), true),
        ("gemma4", Some(fathom_fixtures::tiny_gemma4()), false),
        ("gpt_oss", None, true),
    ]
}

/// `model` (tiny gpt-oss when `None`) as a GGUF of `ty` at `path`.
fn write_model(model: Option<&ModelDef>, ty: T, path: &Path) {
    match model {
        Some(m) => Format::Gguf(ty).write(m, path, 5),
        None => {
            let data = fathom_fixtures::Data::Random { seed: 5 };
            let gpt_oss = fathom_fixtures::gpt_oss_tiny();
            fathom_fixtures::write_gpt_oss_gguf(&gpt_oss, ty, path, data).unwrap();
        }
    }
}

/// The families a split runs beyond [`FAMILIES`]: Qwen3.5 dense and MoE
/// (linear-attention layers, each side holding the recurrent states of its
/// own layers; gated attention; partial rope; the gated shared expert),
/// Gemma 4 (unweighted value norms, layer scalars, the logit softcap) and
/// gpt-oss (attention sinks, YaRN, expert biases, MXFP4 experts), in F32
/// and Q8_0: at every layer boundary, with one middle layer alone on the
/// host (so each side numbers its linear layers apart), and for the MoE
/// models with the experts on the host (all layers', the first's). Every
/// logits row of the chunked-prefill and batched-decode schedule equals the
/// unsplit run's to the bit, and again on a second run of the same engine,
/// whose sequences reuse the released state slots (each side must start a
/// sequence at position 0 from zero states, whatever the slot held).
#[test]
fn hybrid_gemma4_and_gpt_oss_splits_equal_the_unsplit_run() {
    let d = dir("more-families");
    let models = more_families();
    let mut failures = Vec::new();
    let mut runs = 0;
    for (name, model, moe) in &models {
        for ty in [T::F32, T::Q8_0] {
            let path = d.join(format!("{name}-{}.gguf", ty.name()));
            write_model(model.as_ref(), ty, &path);
            let spec = ModelSpec::from_checkpoint(&Checkpoint::open(&path).unwrap()).unwrap();
            let vocab = spec.vocab as u32;
            let n = spec.layers.len() as u64;
            let tokenizer = || tokenizer(&path);
            let mut one = common::engine(&path, schedule_inputs(Device::Cpu), Some(tokenizer()));
            let expected = schedule_logits(&mut one, vocab);
            let mut requests: Vec<(String, PlacementRequest)> =
                (0..n).map(|g| (format!("-ngl {g}"), layers(g))).collect();
            requests.push((
                "-ot blk.1.=cpu".into(),
                PlacementRequest {
                    overrides: TensorOverride::parse("blk\\.1\\.=cpu").unwrap(),
                    ..PlacementRequest::default()
                },
            ));
            if *moe {
                for (flag, cpu_moe_layers) in [("--cpu-moe", u64::MAX), ("--n-cpu-moe 1", 1)] {
                    let request = PlacementRequest {
                        gpu_layers: GpuLayers::All,
                        cpu_moe_layers,
                        ..PlacementRequest::default()
                    };
                    requests.push((flag.into(), request));
                }
            }
            for (flag, request) in requests {
                let label = format!("{name} {} {flag}", ty.name());
                let mut engine = split_with(&path, &path, &request, schedule_inputs)
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
                runs += 1;
                for round in ["first run", "second run (slots reused)"] {
                    let got = schedule_logits(&mut engine, vocab);
                    if got != expected {
                        let worst = got
                            .iter()
                            .zip(&expected)
                            .map(|(g, e)| common::compare(g, e).max_rel)
                            .fold(0f32, f32::max);
                        failures.push(format!("{label}, {round}: rows differ, max_rel {worst:e}"));
                    }
                }
                println!("{label}: {} rows equal twice", expected.len());
            }
        }
    }
    let _ = std::fs::remove_dir_all(&d);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(runs >= 40, "only {runs} split runs");
}

/// A Hugging Face Qwen3.5 MoE directory (experts stacked in
/// `gate_up_proj` / `down_proj`, value heads in grouped order) split as
/// its GGUF is: at the middle layer boundary, with every layer's experts
/// on the host, and with the first layer's: every logits row of the
/// chunked-prefill and batched-decode schedule equals the unsplit run's to
/// the bit. The placement reads the stacked tensors as experts.
#[test]
fn a_qwen3_5_moe_hf_directory_splits_as_its_gguf() {
    let d = dir("q35-hf-split");
    let model = fathom_fixtures::tiny_qwen3_5_moe();
    let (hf, gguf) = (d.join("hf"), d.join("tokenizer.gguf"));
    Format::Safetensors.write(&model, &hf, 5);
    Format::Gguf(T::F32).write(&model, &gguf, 5);
    let vocab = 1024;
    let mut one = common::engine(&hf, schedule_inputs(Device::Cpu), Some(tokenizer(&gguf)));
    let expected = schedule_logits(&mut one, vocab);
    let cpu_moe = |cpu_moe_layers| PlacementRequest {
        gpu_layers: GpuLayers::All,
        cpu_moe_layers,
        ..PlacementRequest::default()
    };
    for (flag, request) in [
        ("-ngl 2", layers(2)),
        ("--cpu-moe", cpu_moe(u64::MAX)),
        ("--n-cpu-moe 1", cpu_moe(1)),
    ] {
        let mut engine = split_with(&hf, &gguf, &request, schedule_inputs)
            .unwrap_or_else(|e| panic!("{flag}: {e}"));
        assert!(
            schedule_logits(&mut engine, vocab) == expected,
            "{flag}: rows differ from the unsplit run"
        );
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// A hybrid model still refuses tensor parallelism, at planning.
#[test]
fn a_hybrid_model_is_refused_tensor_parallelism() {
    let d = dir("hybrid-tp");
    let path = d.join("qwen35.gguf");
    Format::Gguf(T::F32).write(&fathom_fixtures::tiny_qwen3_5(), &path, 5);
    let spec = ModelSpec::from_checkpoint(&Checkpoint::open(&path).unwrap()).unwrap();
    let e = MemoryPlan::with_tensor_parallel(&spec, inputs(Device::Cuda), 2)
        .expect_err("tensor parallelism planned a hybrid model")
        .to_string();
    let _ = std::fs::remove_dir_all(&d);
    assert!(e.contains("linear-attention"), "{e}");
}

/// Plan = allocation on both sides for a split hybrid model: at every
/// layer boundary of Qwen3.5 (batch 3), the host's CPU backend allocates
/// exactly the host plan's `host_recurrent_state` and the device's KV
/// layout carries exactly the states the device plan carves (the CUDA
/// backend refuses a layout whose carve differs); together they are the
/// unsplit plan's `recurrent_state`.
#[test]
fn each_side_allocates_the_recurrent_state_its_plan_counts() {
    let d = dir("state-bytes");
    let path = d.join("qwen35.gguf");
    Format::Gguf(T::F32).write(&fathom_fixtures::tiny_qwen3_5(), &path, 5);
    let spec = ModelSpec::from_checkpoint(&Checkpoint::open(&path).unwrap()).unwrap();
    let whole = MemoryPlan::new(&spec, schedule_inputs(Device::Cuda)).unwrap();
    assert!(whole.recurrent_bytes > 0);
    for g in 0..spec.layers.len() as u64 {
        let plan =
            MemoryPlan::with_placement(&spec, schedule_inputs(Device::Cuda), &layers(g)).unwrap();
        let placed = plan.placement.clone().unwrap();
        let host_term = plan
            .host
            .as_ref()
            .unwrap()
            .terms
            .iter()
            .find(|t| t.name == "host_recurrent_state")
            .map_or(0, |t| t.bytes);
        let host_kv = Engine::host_kv_layout(&spec, &plan).unwrap();
        let host = CpuBackend::new(2, &placed.host_arena, host_kv).unwrap();
        assert_eq!(host.recurrent_bytes() as u64, host_term, "-ngl {g}");
        let device_kv = Engine::kv_layout(&spec, &plan);
        let device_states = device_kv.recurrent.as_ref().map_or(0, |r| r.bytes);
        let carve = plan.device_layout.as_ref().unwrap().recurrent.bytes;
        assert_eq!(device_states, carve, "-ngl {g}");
        assert_eq!(carve, plan.recurrent_bytes, "-ngl {g}");
        assert_eq!(carve + host_term, whole.recurrent_bytes, "-ngl {g}");
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// Steps of 40 rows: from 32 (`STREAM_ROWS`) a step multiplies the host
/// layers' matrices on the device, and runs a MoE layer's host experts
/// there, streamed into the planned room.
fn streaming_inputs(device: Device) -> PlanInputs {
    PlanInputs {
        max_tokens_per_step: 40,
        ..inputs(device)
    }
}

/// The streamed path on the stand-in device: a 60-token prompt prefilled
/// in a 40-row step that streams and a 20-row one that does not, every
/// family and format, with every layer on the host and (MoE) with every
/// layer's experts on the host. The crossings (inputs once for q, k and v
/// and for gate and up, products back, the gated activation on the
/// device, the down product reading what the device holds) and the
/// experts routed and run on the device must give the unsplit logits to
/// the bit, and the step must have streamed (gpt-oss's experts, which
/// carry biases, stay on the host).
#[test]
fn streamed_split_prefill_equals_the_unsplit_run() {
    let d = dir("streamed");
    // Within the smallest vocabulary (gpt-oss's tiny one: 512).
    let tokens: Vec<u32> = (0..60).map(|i| (i * 37 + 11) % 500).collect();
    let mut models: Vec<(&str, Option<ModelDef>, bool)> = FAMILIES
        .iter()
        .map(|f| (f.name, Some(f.real_shaped()), f.name == "qwen3_moe"))
        .collect();
    models.extend(more_families());
    let mut failures = Vec::new();
    for (name, model, moe) in &models {
        for ty in [T::F32, T::Q8_0] {
            let path = d.join(format!("{name}-{}.gguf", ty.name()));
            write_model(model.as_ref(), ty, &path);
            let mut one =
                common::engine(&path, streaming_inputs(Device::Cpu), Some(tokenizer(&path)));
            let expected = one.logits(&tokens).unwrap().to_vec();
            let mut requests = vec![("-ngl 0", layers(0), true)];
            if *moe {
                let cpu_moe = PlacementRequest {
                    gpu_layers: GpuLayers::All,
                    cpu_moe_layers: u64::MAX,
                    ..PlacementRequest::default()
                };
                requests.push(("--cpu-moe", cpu_moe, *name != "gpt_oss"));
            }
            for (flag, request, streams) in requests {
                let label = format!("{name} {} {flag}", ty.name());
                let mut engine = split_with(&path, &path, &request, streaming_inputs)
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
                let got = engine.logits(&tokens).unwrap().to_vec();
                let streamed = engine.streamed_matrices();
                println!("{label}: {streamed} host matrices streamed");
                if got != expected {
                    let a = common::compare(&got, &expected);
                    failures.push(format!("{label}: logits differ: {a:?}"));
                }
                if streams != (streamed > 0) {
                    failures.push(format!("{label}: {streamed} host matrices streamed"));
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&d);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
