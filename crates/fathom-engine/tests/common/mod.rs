//! Loading the real model and running the independent numpy reference.

#![allow(dead_code)] // each test file uses its own subset

pub mod families;
pub mod schedule;

use std::path::{Path, PathBuf};
use std::process::Command;

use fathom_checkpoint::{Checkpoint, GgmlType, GgufFile, GgufTensor};
use fathom_engine::{Engine, Sampler, SamplingParams, Tokenizer};
use fathom_fixtures::{self as fx, Data, GgufTensorType};
use fathom_plan::{Available, Device, KvDtype, MemoryPlan, PlanInputs};
use fathom_spec::ModelSpec;

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn smollm2() -> PathBuf {
    let path = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch-model.sh",
        path.display()
    );
    path
}

pub fn inputs(max_tokens: u64, kv_dtype: KvDtype) -> PlanInputs {
    PlanInputs {
        context: max_tokens,
        batch: 1,
        device: Device::Cpu,
        kv_dtype,
        max_tokens_per_step: 512,
        threads: 2,
        headroom_factor: 1.0,
        rocm_inflight_raw: None,
        host_available: None,
        available: Available {
            bytes: 8 << 30,
            source: "test".into(),
        },
    }
}

/// An engine for `model` with `tokenizer` (the GGUF's own when `None`).
pub fn engine(model: &Path, inputs: PlanInputs, tokenizer: Option<Tokenizer>) -> Engine {
    let checkpoint = Checkpoint::open(model).unwrap();
    let spec = ModelSpec::from_checkpoint(&checkpoint).unwrap();
    let tokenizer =
        tokenizer.unwrap_or_else(|| fathom_engine::load_tokenizer(&checkpoint).unwrap());
    let plan = MemoryPlan::new(&spec, inputs).unwrap();
    Engine::load(&checkpoint, spec, plan, tokenizer).unwrap()
}

/// Last-position logits from scripts/reference/forward.py (numpy, weights
/// dequantized by the `gguf` package): shares no code with the engine.
/// With `emulate_ggml` the reference rounds activations as ggml's CPU
/// matmuls do (8-bit blocks) and keeps an f16 KV cache, as fathom does.
pub fn numpy_logits(model: &Path, tokens: &[u32], emulate_ggml: bool) -> Vec<f32> {
    let script = root().join("scripts/reference/forward.py");
    let ids = serde_json::to_string(tokens).unwrap();
    let mut cmd = Command::new("python3");
    cmd.arg(&script).arg(model).args(["--tokens", &ids]);
    if emulate_ggml {
        cmd.arg("--emulate-ggml");
    }
    let out = cmd
        .output()
        .expect("run python3 (scripts/test.sh installs numpy and gguf)");
    assert!(
        out.status.success(),
        "forward.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// How two logit vectors differ.
#[derive(Debug)]
pub struct Agreement {
    /// Largest |a - b| over the largest |b|.
    pub max_rel: f32,
    /// Root mean square of a - b over that of b.
    pub rms_rel: f32,
    pub same_argmax: bool,
}

pub fn compare(ours: &[f32], reference: &[f32]) -> Agreement {
    assert_eq!(ours.len(), reference.len());
    let scale = reference.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = ours
        .iter()
        .zip(reference)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    let sq = |it: &mut dyn Iterator<Item = f32>| {
        it.map(|x| (x as f64) * (x as f64)).sum::<f64>().sqrt() as f32
    };
    let rms_diff = sq(&mut ours.iter().zip(reference).map(|(a, b)| a - b));
    let rms_ref = sq(&mut reference.iter().copied());
    let argmax = |x: &[f32]| {
        x.iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0
    };
    Agreement {
        max_rel: worst / scale,
        rms_rel: rms_diff / rms_ref,
        same_argmax: argmax(ours) == argmax(reference),
    }
}

/// Random weights spread a model's logits over a few units, so its
/// top-two margins are mostly under 0.5; scaling the output norm's gain
/// until the logits' standard deviation is `std` makes its choices clear
/// (the shapes stay the real model's). Rewrites `output_norm.weight` in
/// place.
pub fn sharpen(path: &Path, std: f32) {
    let mut cpu = engine(path, inputs(64, KvDtype::F16), None);
    let logits = cpu.logits(&[1, 2, 3, 4]).unwrap();
    let n = logits.len() as f32;
    let mean = logits.iter().sum::<f32>() / n;
    let sd = (logits.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / n).sqrt();
    let file = gguf(path);
    let t = file
        .tensors
        .iter()
        .find(|t| t.name == "output_norm.weight")
        .expect("the fixture has an output norm");
    let gains: Vec<f32> = f32_values(&file, t).iter().map(|x| x * std / sd).collect();
    write_values(&file, t, &gains);
}

/// Writes at `to` a GGUF of `model` in `ty` (as [`families::Format::Gguf`]
/// writes it) holding the values the GGUF of `model` at `from`
/// dequantizes to: exactly in F32 (the CPU multiplies F32 weights by f32
/// activations, so against `from` only the activations' rounding
/// differs), rounded once more to f16 in F16.
pub fn dequantized_copy(model: &fx::ModelDef, from: &Path, ty: GgufTensorType, to: &Path) {
    fx::write_runnable_gguf(model, ty, to, Data::Sparse).unwrap();
    let (quantized, copy) = (gguf(from), gguf(to));
    assert_eq!(quantized.tensors.len(), copy.tensors.len(), "tensor counts");
    for t in &copy.tensors {
        let q = quantized
            .tensors
            .iter()
            .find(|q| q.name == t.name)
            .unwrap_or_else(|| panic!("{} has no {}", from.display(), t.name));
        assert_eq!(q.dims, t.dims, "{}", t.name);
        write_values(&copy, t, &f32_values(&quantized, q));
    }
}

fn gguf(path: &Path) -> GgufFile {
    let Checkpoint::Gguf(file) = Checkpoint::open(path).unwrap() else {
        panic!("{} is not a GGUF", path.display());
    };
    file
}

/// Tensor `t` of `file`, dequantized.
fn f32_values(file: &GgufFile, t: &GgufTensor) -> Vec<f32> {
    use std::os::unix::fs::FileExt;
    let mut bytes = vec![0u8; t.n_bytes as usize];
    std::fs::File::open(&file.path)
        .unwrap()
        .read_exact_at(&mut bytes, file.data_offset + t.offset)
        .unwrap();
    let ty = GgufTensorType::from_ggml(t.ggml_type).expect("a type the kernels run");
    let mut values = vec![0f32; t.n_elements as usize];
    fathom_kernels::dequantize_row(ty, &bytes, &mut values);
    values
}

/// Overwrites the F32 or F16 tensor `t` of `file` with `values`.
fn write_values(file: &GgufFile, t: &GgufTensor, values: &[f32]) {
    use std::os::unix::fs::FileExt;
    assert_eq!(t.n_elements, values.len() as u64, "{}", t.name);
    let bytes: Vec<u8> = match t.ggml_type {
        GgmlType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => {
            let mut b = vec![0u8; 2 * values.len()];
            fathom_kernels::ops::f32_to_f16_bytes_row(values, &mut b);
            b
        }
        other => panic!("{}: cannot write {other:?} values", t.name),
    };
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file.path)
        .unwrap()
        .write_all_at(&bytes, file.data_offset + t.offset)
        .unwrap();
}

/// `engine`'s greedy continuation of `prompt` (each step's logits computed
/// afresh over the whole sequence) and the smallest top-1/top-2 logit
/// margin along it.
pub fn greedy(engine: &mut Engine, prompt: &[u32], n: usize) -> (Vec<u32>, f32) {
    let mut seq = prompt.to_vec();
    let mut margin = f32::INFINITY;
    for _ in 0..n {
        let logits = engine.logits(&seq).unwrap();
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        margin = margin.min(logits[order[0]] - logits[order[1]]);
        seq.push(order[0] as u32);
    }
    (seq[prompt.len()..].to_vec(), margin)
}

/// Greedy sampling that never stops at an end-of-generation token.
pub fn greedy_sampler() -> Sampler {
    Sampler::new(SamplingParams {
        temperature: 0.0,
        ignore_eos: true,
        ..SamplingParams::default()
    })
}

/// `engine`'s own greedy generation of `n` tokens after `prompt` (prefill,
/// then decode steps through the KV cache).
pub fn generated(engine: &mut Engine, prompt: &[u32], n: usize) -> Vec<u32> {
    engine
        .generate(prompt, n, &mut greedy_sampler(), &[], &mut |_| true)
        .unwrap();
    engine.tokens()[prompt.len()..].to_vec()
}

/// Candidate prompt `c`: 8 token ids spread over a vocabulary of `vocab`.
pub fn candidate_prompt(c: u32, vocab: u32) -> Vec<u32> {
    (0..8).map(|i| (c * 7919 + i * 104_729) % vocab).collect()
}

/// SmolLM2's shape in F16 cut to 4 layers, random weights, its logits
/// sharpened ([`sharpen`]) so that greedy choices are clear: written to
/// `path`. Four layers keep a reference that recomputes every prefix
/// cheap.
pub fn sharpened_smollm2(path: &Path) {
    let model = fx::reshaped(
        &fx::smollm2_135m(),
        serde_json::json!({"num_hidden_layers": 4}),
    );
    fx::write_runnable_gguf(&model, GgufTensorType::F16, path, Data::Random { seed: 11 }).unwrap();
    sharpen(path, 50.0);
}
