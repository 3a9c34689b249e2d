//! A model split between a device and the host by the plan's placement
//! must give the logits of the unsplit model.
//!
//! On any machine both sides are CPU backends ("device" is a second CPU
//! backend standing in for the GPU): the engine's placement, the weight
//! groups each side loads, the residual crossing at the boundary, a MoE
//! layer's crossing to its experts and back, and each side's own KV are
//! the code a CUDA + CPU split runs. Each op runs the same kernels on the
//! same values as unsplit, so the logits must be equal to the bit. The
//! CUDA + CPU split against the all-GPU run is a GPU test (cuda_vs_cpu.rs).

mod common;

use std::path::{Path, PathBuf};

use common::families::{Format, FAMILIES};
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
    let checkpoint = Checkpoint::open(path).unwrap();
    let spec = ModelSpec::from_checkpoint(&checkpoint).unwrap();
    let plan = MemoryPlan::with_placement(&spec, inputs(Device::Cuda), request).unwrap();
    let placed = plan.placement.clone().expect("a cuda plan is placed");
    assert!(placed.is_split(), "{request:?} put nothing on the host");
    let device_kv = Engine::kv_layout(&spec, &plan);
    let host_kv = Engine::host_kv_layout(&spec, &plan).expect("a split plan has a host KV layout");
    // The host arena is the CPU's whole-step arena: the stand-in device
    // takes the same (a CUDA arena has no CPU scratch).
    let host = CpuBackend::new(2, &placed.host_arena, host_kv).unwrap();
    let device = CpuBackend::new(2, &placed.host_arena, device_kv).unwrap();
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

/// A Gemma 4 model split between the GPU and the host is refused at load,
/// naming the family and what does run it (the GPU alone, the CPU).
#[test]
fn a_gemma4_split_is_refused_by_name() {
    let e = refusal("gemma4", &fathom_fixtures::tiny_gemma4(), &layers(2));
    assert!(
        e.contains("Gemma 4") && e.contains("split between the GPU and the host"),
        "{e}"
    );
}

/// Qwen3.5 runs wholly on the CPU or wholly on the GPU: a split between
/// the two is refused at load by name (before the split backend's lack of
/// the hybrid ops is), and tensor parallelism at planning.
#[test]
fn a_hybrid_model_is_refused_a_split_and_tensor_parallelism() {
    let d = dir("hybrid");
    let path = d.join("qwen35.gguf");
    Format::Gguf(T::F32).write(&fathom_fixtures::tiny_qwen3_5(), &path, 5);
    let e = match split(&path, &path, &layers(1)) {
        Ok(_) => panic!("a hybrid model ran split"),
        Err(e) => e,
    };
    assert!(
        e.contains("hybrid linear-attention model cannot be split"),
        "{e}"
    );
    let spec = ModelSpec::from_checkpoint(&Checkpoint::open(&path).unwrap()).unwrap();
    let e = MemoryPlan::with_tensor_parallel(&spec, inputs(Device::Cuda), 2)
        .expect_err("tensor parallelism planned a hybrid model")
        .to_string();
    let _ = std::fs::remove_dir_all(&d);
    assert!(e.contains("linear-attention"), "{e}");
}
