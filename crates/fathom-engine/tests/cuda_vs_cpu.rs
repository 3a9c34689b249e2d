//! The CUDA backend end to end against the CPU backend, on the same files
//! in the same process: last-position logits for every family and weight
//! format, and greedy tokens where the CPU's choice is clear. Runs where a
//! GPU is present; elsewhere it says so and passes, unless
//! `FATHOM_REQUIRE_GPU=1` (then it fails). scripts/test-gpu.sh runs it on
//! the GPU machine.

mod common;

use std::path::{Path, PathBuf};

use common::compare;
use common::families::{family, qwen3_5_shaped, Format, FAMILIES, HF_FORMATS};
use common::schedule::schedule_logits;
use fathom_backend::hybrid::STREAM_ROWS;
use fathom_checkpoint::Checkpoint;
use fathom_engine::{Engine, Sampler, ScoreRows, Segment, Tokenizer};
use fathom_fixtures::{self as fx, Data, GgufTensorType as T};
use fathom_plan::placement::{GpuLayers, PlacementRequest, TensorOverride};
use fathom_plan::{Available, Device, KvDtype, MemoryPlan, PlanInputs};
use fathom_spec::ModelSpec;

/// Largest |cuda − cpu| over the largest |cpu logit|, by weight format.
/// F32: both backends multiply f32 values and differ by summation order
/// (measured on the H200: at most 1.8e-5). F16 and BF16: the GPU's prefill
/// GEMM takes its activations in the weights' half format (f32
/// accumulation), a relative rounding of 2^-11 (f16) or 2^-8 (bf16) per
/// value (measured: at most 3.7e-4 and 2.2e-3). Quantized: the CPU rounds
/// activations to 8 bits (as llama.cpp does) and the GPU does not, which
/// the CPU alone shows as 2.6–3.1% of the largest logit against the
/// unrounded numpy reference on SmolLM2 (measured here: at most 2.6e-2,
/// and 4.3e-2 on a MoE, where a near-tie in the router can pick another
/// expert). A wrong block decode, rope or norm moves logits by tens of
/// percent.
fn tolerance(format: &str) -> f32 {
    match format {
        "F32" => 1e-4,
        "F16" => 1e-3,
        "BF16" => 5e-3,
        _ => 5e-2,
    }
}

/// The KV cache a comparison runs: f16, what serving runs, except for
/// Gemma 4 in F32, which runs f32. Gemma 4's scores are unscaled (its q
/// and k are normed) over heads of 256 and 512 values, so a key or value
/// that lies within the backends' ~1e-6 difference of an f16 rounding
/// boundary, rounded up on one side and down on the other, moves its
/// logits past F32's tolerance: on an H100 (2026-12-07) the same steps
/// differed by 1.7e-4 with an f16 cache and 2.5e-6 with an f32 one.
fn cache_of(family: &str, format: T) -> KvDtype {
    match (family, format) {
        ("gemma4", T::F32) => KvDtype::F32,
        _ => KvDtype::F16,
    }
}

/// Whether a GPU is there; a skip message (or a failure when required)
/// when not.
fn gpu() -> bool {
    let found = fathom_backend::cuda::nvml::Nvml::open().and_then(|n| n.memory(0));
    if found.is_none() {
        assert!(
            std::env::var("FATHOM_REQUIRE_GPU").as_deref() != Ok("1"),
            "FATHOM_REQUIRE_GPU=1 but NVML finds no GPU"
        );
        eprintln!("cuda_vs_cpu: skipped: no NVIDIA GPU (NVML found none)");
    }
    found.is_some()
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fathom-cuda-vs-cpu-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn engine(path: &Path, device: Device, context: u64, tokenizer: Tokenizer) -> Engine {
    engine_of(path, device, context, 1, tokenizer)
}

/// An engine planned for `batch` sequences.
fn engine_of(
    path: &Path,
    device: Device,
    context: u64,
    batch: u64,
    tokenizer: Tokenizer,
) -> Engine {
    placed_engine(path, inputs(device, context, batch, 512), None, tokenizer)
}

fn inputs(device: Device, context: u64, batch: u64, step: u64) -> PlanInputs {
    PlanInputs {
        context,
        batch,
        device,
        kv_dtype: KvDtype::F16,
        max_tokens_per_step: step,
        threads: 4,
        headroom_factor: 1.0,
        rocm_inflight_raw: None,
        host_available: None,
        available: Available {
            bytes: 64 << 30,
            source: "test".into(),
        },
    }
}

/// An engine of `inputs`, placed between the GPU and the host as
/// `placement` asks when given.
fn placed_engine(
    path: &Path,
    inputs: PlanInputs,
    placement: Option<&PlacementRequest>,
    tokenizer: Tokenizer,
) -> Engine {
    let checkpoint = Checkpoint::open(path).unwrap();
    let spec = ModelSpec::from_checkpoint(&checkpoint).unwrap();
    let plan = match placement {
        Some(request) => MemoryPlan::with_placement(&spec, inputs, request).unwrap(),
        None => MemoryPlan::new(&spec, inputs).unwrap(),
    };
    Engine::load(&checkpoint, spec, plan, tokenizer)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A tokenizer for fixtures without one of their own (ids are fed
/// directly; it only decodes).
fn tokenizer(dir: &Path) -> Tokenizer {
    let path = dir.join("vocab.gguf");
    fx::write_runnable_gguf(&fx::tiny_llama(), T::F32, &path, Data::Sparse).unwrap();
    fathom_engine::load_tokenizer(&Checkpoint::open(&path).unwrap()).unwrap()
}

/// Logits of `tokens` on the CPU and on CUDA, and how they differ.
fn both(path: &Path, d: &Path, tokens: &[u32]) -> common::Agreement {
    let cpu = engine(path, Device::Cpu, 64, tokenizer(d))
        .logits(tokens)
        .unwrap()
        .to_vec();
    let mut cuda = engine(path, Device::Cuda, 64, tokenizer(d));
    let gpu = cuda.logits(tokens).unwrap().to_vec();
    compare(&gpu, &cpu)
}

#[test]
fn logits_match_the_cpu_for_every_family_and_weight_format() {
    if !gpu() {
        return;
    }
    let d = dir("logits");
    // Longer than tiny-gemma3's window of 16, so local layers slide.
    let tokens: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 1000).collect();
    let mut failures = Vec::new();
    let mut check = |label: String, path: &Path, tol: f32| {
        let a = both(path, &d, &tokens);
        println!(
            "{label:<28} max_rel {:.2e}  rms_rel {:.2e}",
            a.max_rel, a.rms_rel
        );
        if a.max_rel.is_nan() || a.max_rel >= tol {
            failures.push(format!("{label}: {a:?} (tolerance {tol})"));
        }
    };
    for family in &FAMILIES {
        let model = family.real_shaped();
        for ty in family.gguf_types() {
            let path = d.join(format!("{}-{}.gguf", family.name, ty.name()));
            Format::Gguf(ty).write(&model, &path, 7);
            check(
                format!("{} {}", family.name, ty.name()),
                &path,
                tolerance(ty.name()),
            );
        }
    }
    // Safetensors F32, and MLX affine 4- and 8-bit, on llama.
    let llama = family("llama").real_shaped();
    for format in HF_FORMATS {
        let label = format!("llama {}", format.name());
        let hf = d.join(label.replace(' ', "-"));
        format.write(&llama, &hf, 3);
        let tol = tolerance(match format {
            Format::Mlx(_) => "mlx",
            _ => "F32",
        });
        check(label, &hf, tol);
    }
    let _ = std::fs::remove_dir_all(&d);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Greedy tokens on CUDA equal the CPU's over 32 steps where the CPU's
/// top-two margin stays clear: 4 prompts one at a time (matrix-vector
/// kernels, the step replayed as a CUDA graph), then 12 decoded together
/// (more rows than the matrix-vector kernel takes: cuBLAS on f16
/// activations, its calls captured into the step's graph and replayed).
#[test]
fn greedy_tokens_match_the_cpu_where_its_margin_is_clear() {
    if !gpu() {
        return;
    }
    const TOKENS: usize = 32;
    const BATCH: usize = 12;
    let d = dir("greedy");
    // F16 weights: on quantized ones the CPU rounds activations to 8 bits
    // and the GPU does not, about 1% of the largest logit (the logits test
    // bounds it); here the two differ by summation order, far below the
    // 0.5 margin, so equal tokens are a fair demand.
    let path = d.join("smollm2-shape-f16.gguf");
    common::sharpened_smollm2(&path);
    let load = |device| {
        let tok = fathom_engine::load_tokenizer(&Checkpoint::open(&path).unwrap()).unwrap();
        engine(&path, device, 256, tok)
    };
    let (mut cpu, mut cuda) = (load(Device::Cpu), load(Device::Cuda));
    let vocab = cpu.model.spec.vocab as u32;
    let mut clear = 0;
    let mut batch: Vec<(Vec<u32>, Vec<u32>)> = Vec::new();
    for candidate in 0..96u32 {
        let prompt = common::candidate_prompt(candidate, vocab);
        let (want, margin) = common::greedy(&mut cpu, &prompt, TOKENS);
        if margin < 0.5 {
            continue;
        }
        if clear == 4 {
            batch.push((prompt, want));
            if batch.len() == BATCH {
                break;
            }
            continue;
        }
        let got = common::generated(&mut cuda, &prompt, TOKENS);
        println!(
            "prompt {candidate}: CPU margin ≥ {margin:.2}, {TOKENS} tokens equal: {}",
            got == want
        );
        assert_eq!(got, want, "prompt {candidate} (CPU margin ≥ {margin})");
        clear += 1;
    }
    assert_eq!(
        (clear, batch.len()),
        (4, BATCH),
        "fewer than 4 + {BATCH} of 96 prompts had a CPU margin ≥ 0.5 throughout"
    );
    let tok = fathom_engine::load_tokenizer(&Checkpoint::open(&path).unwrap()).unwrap();
    let mut batched = engine_of(&path, Device::Cuda, 256, BATCH as u64, tok);
    let prompts: Vec<&[u32]> = batch.iter().map(|(p, _)| &p[..]).collect();
    let mut samplers: Vec<Sampler> = (0..BATCH).map(|_| common::greedy_sampler()).collect();
    batched
        .generate_batch(&prompts, TOKENS, &mut samplers, &[], &mut |_, _| true)
        .unwrap();
    for (i, (prompt, want)) in batch.iter().enumerate() {
        let got = &batched.tokens_of(i)[prompt.len()..];
        assert_eq!(got, &want[..], "sequence {i} of {BATCH} decoded together");
    }
    println!("{BATCH} sequences decoded together: every one equals the CPU's tokens");
    let _ = std::fs::remove_dir_all(&d);
}

/// Gemma 4 on CUDA against the CPU, step by step (gemma-4-31B's head
/// shapes at hidden 512, 4 layers: sliding ones of 32 heads over 16 KV
/// heads of 256 with a 32-token window, global ones of 32 heads over 4 KV
/// heads of 512 whose values are the keys' projection and whose rope takes
/// the factors; unscaled scores, values normed without a weight, layer
/// output scales, the logit softcap), in F32 (an f32 cache, [`cache_of`])
/// and Q8_0: [`chunked_steps`], each within the format's tolerance
/// ([`tolerance`]) with the same argmax.
#[test]
fn gemma4_prefill_and_decode_match_the_cpu() {
    if !gpu() {
        return;
    }
    let d = dir("gemma4");
    let model = fx::reshaped(
        &common::families::gemma4_shaped(),
        serde_json::json!({"sliding_window": 32}),
    );
    let mut failures = Vec::new();
    for ty in [T::F32, T::Q8_0] {
        let path = d.join(format!("gemma4-{}.gguf", ty.name()));
        Format::Gguf(ty).write(&model, &path, 9);
        let kv = cache_of("gemma4", ty);
        let label = format!("gemma4 {} ({} cache)", ty.name(), kv.name());
        steps_agree(&label, &path, &d, tolerance(ty.name()), kv, &mut failures);
    }
    let _ = std::fs::remove_dir_all(&d);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// gpt-oss on CUDA against the CPU, step by step (`gpt_oss_tiny`: 64-value
/// heads, 8 query heads over 2 KV heads, a window of 8 on layers 0 and 2,
/// attention sinks, q/k/v/o biases, YaRN, 4 experts with biases, 2 used,
/// through the clamped SwiGLU; a vocabulary of 1,024 for the steps'
/// tokens): [`chunked_steps`]. All in F32 within F32's tolerance (sinks,
/// YaRN, biases, routing and the SwiGLU with nothing rounded but the f16
/// cache); then as gpt-oss GGUFs store it — MXFP4 experts, Q8_0 for the
/// rest — within the quantized tolerance, with the same argmax.
#[test]
fn gpt_oss_prefill_and_decode_match_the_cpu() {
    if !gpu() {
        return;
    }
    let d = dir("gpt-oss");
    let mut failures = Vec::new();
    for (experts, matrices, tol) in [
        (T::F32, T::F32, tolerance("F32")),
        (T::MXFP4, T::Q8_0, tolerance("MXFP4")),
    ] {
        let shape = fx::GptOssShape {
            vocab: 1024,
            experts_type: experts,
            ..fx::gpt_oss_tiny()
        };
        let label = format!("gpt-oss {} experts, {}", experts.name(), matrices.name());
        let path = d.join(format!("{}.gguf", label.replace([' ', ','], "-")));
        fx::write_gpt_oss_gguf(&shape, matrices, &path, Data::Random { seed: 5 }).unwrap();
        steps_agree(&label, &path, &d, tol, KvDtype::F16, &mut failures);
    }
    let _ = std::fs::remove_dir_all(&d);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// [`chunked_steps`] of the file at `path` on the CPU and on CUDA (a step
/// of 24 tokens, 2 sequences, a context of 128): a failure for each step
/// whose logits differ by `tol` of the largest or in their argmax; prints
/// the worst.
fn steps_agree(
    label: &str,
    path: &Path,
    d: &Path,
    tol: f32,
    kv_dtype: KvDtype,
    failures: &mut Vec<String>,
) {
    let run = |device| {
        let inputs = PlanInputs {
            kv_dtype,
            ..inputs(device, 128, 2, 24)
        };
        let mut e = placed_engine(path, inputs, None, tokenizer(d));
        chunked_steps(&mut e)
    };
    let (cpu, cuda) = (run(Device::Cpu), run(Device::Cuda));
    let mut worst = 0f32;
    for ((step, want), (_, got)) in cpu.iter().zip(&cuda) {
        let a = compare(got, want);
        worst = worst.max(a.max_rel);
        if a.max_rel.is_nan() || a.max_rel >= tol || !a.same_argmax {
            failures.push(format!("{label} {step}: {a:?} (tolerance {tol})"));
        }
    }
    println!(
        "{label}: {} steps' logits: max_rel at most {worst:.2e} (tolerance {tol})",
        cpu.len()
    );
}

/// Two prompts (70 and 41 tokens) prefilled in chunks of the engine's
/// step (24 in [`steps_agree`]: well past a sliding window, the rings
/// wrapping, a chunk straddling the wrap), the first decoded alone, then
/// both decoded together: each step's label and the logits of each of its
/// sequences' last row, in order.
fn chunked_steps(engine: &mut Engine) -> Vec<(String, Vec<f32>)> {
    const DECODE: usize = 5;
    let prompts: [Vec<u32>; 2] = [
        (0..70).map(|i| (i * 37 + 11) % 1000).collect(),
        (0..41).map(|i| (i * 53 + 5) % 1000).collect(),
    ];
    let mut seqs = [engine.open_sequence(&[]), engine.open_sequence(&[])];
    for (seq, prompt) in seqs.iter_mut().zip(&prompts) {
        assert!(engine.reserve(seq, prompt.len() + 2 * DECODE));
    }
    let mut out = Vec::new();
    let mut run = |engine: &mut Engine, label: String, segments: &mut [Segment]| {
        let wanted: Vec<ScoreRows> = segments
            .iter()
            .enumerate()
            .map(|(segment, s)| ScoreRows {
                segment,
                rows: s.tokens.len() - 1..s.tokens.len(),
            })
            .collect();
        engine
            .step_scoring(segments, &wanted, &mut |k, _, logits| {
                out.push((format!("{label} sequence {k}"), logits.to_vec()));
            })
            .unwrap();
    };
    let chunk = engine.step_tokens();
    for (i, prompt) in prompts.iter().enumerate() {
        for (c, tokens) in prompt.chunks(chunk).enumerate() {
            let segment = Segment {
                seq: &mut seqs[i],
                tokens,
            };
            run(engine, format!("prefill {i} chunk {c}"), &mut [segment]);
        }
    }
    let next = |t: usize| [(t * 71 + 3) as u32 % 1000];
    for t in 0..DECODE {
        let token = next(t);
        let segment = Segment {
            seq: &mut seqs[0],
            tokens: &token,
        };
        run(engine, format!("decode {t} alone"), &mut [segment]);
    }
    for t in DECODE..2 * DECODE {
        let tokens = [next(t), next(t + 100)];
        let [a, b] = &mut seqs;
        let mut segments = [
            Segment {
                seq: a,
                tokens: &tokens[0],
            },
            Segment {
                seq: b,
                tokens: &tokens[1],
            },
        ];
        run(engine, format!("decode {t} together"), &mut segments);
    }
    for seq in &mut seqs {
        engine.release(seq);
    }
    out
}

/// A model split between the GPU and the host (the first layer, or every
/// layer's experts, on the CPU backend) against the same model all on the
/// GPU: prefill in chunks and one-token steps (graphs, the residual
/// crossing each step), within the CPU-vs-GPU tolerance of the format
/// (the host layers round activations to 8 bits on quantized weights).
/// The 40-token step multiplies the host layer's matrices (or runs the
/// host's experts) on the GPU, streamed (`STREAM_ROWS` is 32); the others
/// on the host.
#[test]
fn gpu_and_host_split_matches_the_all_gpu_run() {
    if !gpu() {
        return;
    }
    let d = dir("split");
    let tokens: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 1000).collect();
    let mut failures = Vec::new();
    for f in &FAMILIES {
        for ty in [T::F32, T::Q8_0] {
            let path = d.join(format!("{}-{}.gguf", f.name, ty.name()));
            Format::Gguf(ty).write(&f.real_shaped(), &path, 5);
            let mut requests = vec![(
                "-ngl 1",
                PlacementRequest {
                    gpu_layers: GpuLayers::Count(1),
                    ..PlacementRequest::default()
                },
            )];
            if f.name == "qwen3_moe" {
                requests.push((
                    "--cpu-moe",
                    PlacementRequest {
                        cpu_moe_layers: u64::MAX,
                        ..PlacementRequest::default()
                    },
                ));
            }
            for step in [40, 16, 1] {
                let all = placed_engine(
                    &path,
                    inputs(Device::Cuda, 64, 1, step),
                    None,
                    tokenizer(&d),
                )
                .logits(&tokens)
                .unwrap()
                .to_vec();
                for (name, request) in &requests {
                    let mut split = placed_engine(
                        &path,
                        inputs(Device::Cuda, 64, 1, step),
                        Some(request),
                        tokenizer(&d),
                    );
                    let got = split.logits(&tokens).unwrap().to_vec();
                    // A host layer's matrices, or a layer's experts.
                    let streamed = split.streamed_matrices();
                    let streams = step as usize >= STREAM_ROWS;
                    if streams != (streamed > 0) {
                        failures.push(format!(
                            "{} {} {name} step {step}: {streamed} host matrices streamed",
                            f.name,
                            ty.name()
                        ));
                    }
                    let a = compare(&got, &all);
                    println!(
                        "{:<10} {:<5} {name:<9} step {step:>2}: max_rel {:.2e} rms_rel {:.2e}",
                        f.name,
                        ty.name(),
                        a.max_rel,
                        a.rms_rel
                    );
                    if !(a.max_rel < tolerance(ty.name()) && a.same_argmax) {
                        failures.push(format!(
                            "{} {} {name} step {step}: {a:?}",
                            f.name,
                            ty.name()
                        ));
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&d);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The largest max_rel over the rows of `gpu` against `cpu` (NaN if any
/// is) and their mean KL divergence from the CPU's.
fn rows_agreement(gpu: &[Vec<f32>], cpu: &[Vec<f32>]) -> (f32, f64) {
    assert_eq!(cpu.len(), gpu.len());
    let (mut worst, mut kld) = (0f32, 0f64);
    for (g, c) in gpu.iter().zip(cpu) {
        let a = compare(g, c);
        worst = if a.max_rel.is_nan() {
            f32::NAN
        } else {
            worst.max(a.max_rel)
        };
        kld += kl_divergence(c, g) / cpu.len() as f64;
    }
    (worst, kld)
}

/// Mean KL divergence of the GPU's rows from the CPU's that a format
/// allows: F32 differs by summation order, Q8_0 by the CPU's 8-bit
/// activations.
fn kld_tolerance(ty: T) -> f64 {
    if ty == T::F32 {
        1e-4
    } else {
        5e-3
    }
}

/// KL divergence of softmax(`q`) from softmax(`p`), in nats.
fn kl_divergence(p: &[f32], q: &[f32]) -> f64 {
    let log_softmax = |x: &[f32]| -> Vec<f64> {
        let m = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
        let z = x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln() + m;
        x.iter().map(|&v| v as f64 - z).collect()
    };
    let (lp, lq) = (log_softmax(p), log_softmax(q));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}

/// Qwen3.5 (in Qwen3.5-4B's head shapes: gated full attention with a
/// quarter-head rope, linear layers of 16/32 heads of 128) and Qwen3.5 MoE
/// (routed experts and the gated shared expert) on CUDA against the CPU,
/// every logits row of a schedule of chunked prefills beside each other
/// and batched decode of three sequences (their states in three slots, a
/// recurrence carried over 5 to 24 tokens), in F32 GGUFs and F32 Hugging
/// Face directories (value heads in grouped order, experts stacked): each
/// row within F32's `tolerance` of the largest CPU logit, mean KL
/// divergence below 1e-4 nats. Then in Q8_0 ([`hybrid_q8_0_models`]),
/// against the CPU on the same weights dequantized
/// ([`HYBRID_Q8_0_TOLERANCE`]). A wrong tap, gate, head or slot moves
/// logits by tens of percent.
#[test]
fn hybrid_models_match_the_cpu_through_chunks_and_batched_decode() {
    if !gpu() {
        return;
    }
    let d = dir("hybrid");
    let mut failures = Vec::new();
    let mut check = |label: String, gpu: &Path, cpu: &Path, (tol, kld_tol): (f32, f64)| {
        let cpu = hybrid_rows(cpu, Device::Cpu, KvDtype::F16, &d);
        let (worst, kld) = rows_agreement(&hybrid_rows(gpu, Device::Cuda, KvDtype::F16, &d), &cpu);
        println!(
            "{label:<32} {} rows: max_rel {worst:.2e} (tolerance {tol}), mean KLD {kld:.2e} (tolerance {kld_tol})",
            cpu.len()
        );
        if !(worst < tol && kld < kld_tol) {
            failures.push(format!("{label}: max_rel {worst:e}, mean KLD {kld:e}"));
        }
    };
    let models = [
        ("qwen35", qwen3_5_shaped()),
        ("qwen35moe", fx::tiny_qwen3_5_moe()),
    ];
    for (name, model) in &models {
        for format in [Format::Gguf(T::F32), Format::Safetensors] {
            let path = match format {
                Format::Gguf(ty) => d.join(format!("{name}-{}.gguf", ty.name())),
                _ => d.join(format!("{name}-hf")),
            };
            format.write(model, &path, 7);
            let f32 = (tolerance("F32"), kld_tolerance(T::F32));
            check(format!("{name} {}", format.name()), &path, &path, f32);
        }
    }
    for (name, model) in hybrid_q8_0_models() {
        let (q8, exact) = q8_0_and_dequantized(name, &model, &d);
        let label = format!("{name} Q8_0 (CPU: dequantized)");
        check(label, &q8, &exact, HYBRID_Q8_0_TOLERANCE);
    }
    let _ = std::fs::remove_dir_all(&d);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The Qwen3.5 fixtures the hybrid test runs in Q8_0: the dense one, and
/// the MoE with every expert routed ([`qwen3_5_moe_every_expert`]).
fn hybrid_q8_0_models() -> [(&'static str, fx::ModelDef); 2] {
    [
        ("qwen35", qwen3_5_shaped()),
        ("qwen35moe, every expert", qwen3_5_moe_every_expert()),
    ]
}

/// tiny Qwen3.5 MoE with all 4 of its experts routed, for the Q8_0
/// checks. Top-2 routing is not continuous: where two experts nearly tie,
/// any rounding can swap them, and measured on the CPU rounding the top-2
/// MoE's dequantized weights to f16 alone moves its logits by 0.10 of the
/// largest (8.0e-3 with every expert routed). Which experts are chosen is
/// checked in F32.
fn qwen3_5_moe_every_expert() -> fx::ModelDef {
    fx::reshaped(
        &fx::tiny_qwen3_5_moe(),
        serde_json::json!({"num_experts_per_tok": 4}),
    )
}

/// Largest relative difference and mean KL divergence allowed between
/// CUDA on a Qwen3.5 Q8_0 GGUF and the CPU on an F32 copy of its
/// dequantized weights ([`q8_0_and_dequantized`]).
///
/// Not the CPU on the Q8_0 file: the CPU rounds every Q8_0 matmul's
/// activations to 8 bits per 32 values, and these fixtures (norms near one,
/// logits spread over about ten units, as a trained model's) are sensitive
/// to it — measured on the CPU against the dequantized copy, 6.4e-2 and
/// KLD 6.9e-3 (qwen35), 0.35 and 1.9e-2 (the top-2 MoE), the very
/// figures the H100 run of 2026-12-07 gave for CUDA against the CPU on the
/// Q8_0 file; the llama, qwen3 and qwen3_moe fixtures, their norms in
/// [-0.1, 0.1) and their logits under 0.25, measure 1.3–1.5e-2 and KLD
/// about 1e-7. CUDA runs this schedule's steps (3 to 8 rows) on the
/// tensor-core kernels, weights and activations in f16: against the exact
/// weights, its error is about √2 times that of the weights alone in
/// f16, measured on the CPU as 2.9e-3 and KLD 1.4e-5 (qwen35), 8.0e-3
/// and 2.6e-5 (the MoE, every expert routed). These bounds leave at
/// least twice that, and fail 8-bit rounding by 2.5 times or more
/// (max_rel) and 30 times or more (KLD):
/// [`hybrid_q8_0_tolerance_tells_f16_from_8_bit_rounding`] measures both
/// on every run.
const HYBRID_Q8_0_TOLERANCE: (f32, f64) = (2.5e-2, 2e-4);

/// `model` as the Q8_0 GGUF the hybrid test writes, and an F32 copy of
/// its dequantized weights (paths in `d`).
fn q8_0_and_dequantized(name: &str, model: &fx::ModelDef, d: &Path) -> (PathBuf, PathBuf) {
    let file = name.replace([' ', ','], "-");
    let (q8, exact) = (
        d.join(format!("{file}-Q8_0.gguf")),
        d.join(format!("{file}-dequantized-F32.gguf")),
    );
    Format::Gguf(T::Q8_0).write(model, &q8, 7);
    common::dequantized_copy(model, &q8, T::F32, &exact);
    (q8, exact)
}

/// The hybrid test's rows: [`schedule_logits`] of the file at `path` on
/// `device` with a `kv_dtype` cache, planned for 3 sequences of 64 tokens
/// in steps of 8.
fn hybrid_rows(path: &Path, device: Device, kv_dtype: KvDtype, d: &Path) -> Vec<Vec<f32>> {
    let inputs = PlanInputs {
        kv_dtype,
        ..inputs(device, 64, 3, 8)
    };
    let mut e = placed_engine(path, inputs, None, tokenizer(d));
    schedule_logits(&mut e, 1024)
}

/// On the CPU, what [`HYBRID_Q8_0_TOLERANCE`] rests on: for each of
/// [`hybrid_q8_0_models`], the dequantized weights rounded to f16 (as
/// CUDA's tensor-core kernels round them; its f16 activations add an
/// error of the same size) stay within half its max_rel and a quarter of
/// its KLD of the exact run, and the CPU's own 8-bit activations on the
/// Q8_0 file fall outside it, so the CUDA check tells the two apart.
#[test]
fn hybrid_q8_0_tolerance_tells_f16_from_8_bit_rounding() {
    let d = dir("hybrid-q8-0");
    let (tol, kld_tol) = HYBRID_Q8_0_TOLERANCE;
    for (name, model) in hybrid_q8_0_models() {
        let (q8, exact) = q8_0_and_dequantized(name, &model, &d);
        let half = d.join("dequantized-F16.gguf");
        common::dequantized_copy(&model, &q8, T::F16, &half);
        let want = hybrid_rows(&exact, Device::Cpu, KvDtype::F16, &d);
        let (f16, f16_kld) =
            rows_agreement(&hybrid_rows(&half, Device::Cpu, KvDtype::F16, &d), &want);
        let (int8, int8_kld) =
            rows_agreement(&want, &hybrid_rows(&q8, Device::Cpu, KvDtype::F16, &d));
        println!(
            "{name:<24} against the exact weights: f16 weights max_rel {f16:.2e}, KLD {f16_kld:.2e}; 8-bit activations max_rel {int8:.2e}, KLD {int8_kld:.2e}"
        );
        assert!(
            f16 < tol / 2.0 && f16_kld < kld_tol / 4.0,
            "{name}: f16 weights leave too little room: max_rel {f16:e}, KLD {f16_kld:e}"
        );
        assert!(
            int8 > tol && int8_kld > kld_tol,
            "{name}: 8-bit activations pass the CUDA check: max_rel {int8:e}, KLD {int8_kld:e}"
        );
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// Qwen3.5 dense and MoE and Gemma 4 split between the GPU and the host
/// against the CPU backend unsplit, in F32 and Q8_0: at the middle layer
/// boundary (`-ngl 2`: the first two layers on the host, Qwen3.5's two
/// linear layers there with their recurrent states, Gemma 4's sliding and
/// global layer with their KV), one middle layer alone on the host
/// (`-ot blk.1.=cpu`: each side numbers its linear layers apart), and the
/// MoE's experts on the host (`--cpu-moe`). Every logits row of the
/// chunked-prefill and batched-decode schedule (three sequences, prefill
/// chunks of up to 8 tokens, one-token decode steps replayed as graphs),
/// run twice on the split engine (the second reusing the released state
/// slots on both sides; Gemma 4 in F32 on an f32 cache, [`cache_of`]), is
/// within the format's `tolerance` of the largest
/// CPU logit, and the mean KL divergence within [`kld_tolerance`]. Qwen3.5
/// in Q8_0 (the MoE with [`qwen3_5_moe_every_expert`]) is judged against
/// the CPU on an F32 copy of its dequantized weights instead: the split
/// rounds activations to 8 bits in its host layers alone, the CPU's Q8_0
/// run in every layer, so the split is to be no further from the exact
/// weights than that run, measured here, with half as much again of room
/// (KLD: twice, about its square). The CPU's own rounding sets the bound
/// because these fixtures are sensitive to it ([`HYBRID_Q8_0_TOLERANCE`]):
/// 6.4e-2 and KLD 6.9e-3 for qwen35, which a split with most layers on the
/// GPU could not meet against the CPU's Q8_0 run (the H100 run of
/// 2026-12-07 measured about that with blk.1 or the experts on the host).
#[test]
fn split_hybrid_and_gemma4_models_match_the_cpu() {
    if !gpu() {
        return;
    }
    let d = dir("split-families");
    let mut failures = Vec::new();
    let models = [
        ("qwen35", qwen3_5_shaped(), false),
        ("qwen35moe", fx::tiny_qwen3_5_moe(), true),
        ("gemma4", common::families::gemma4_shaped(), false),
    ];
    for (name, model, moe) in &models {
        let mut requests = vec![
            (
                "-ngl 2",
                PlacementRequest {
                    gpu_layers: GpuLayers::Count(2),
                    ..PlacementRequest::default()
                },
            ),
            (
                "-ot blk.1.=cpu",
                PlacementRequest {
                    overrides: TensorOverride::parse("blk\\.1\\.=cpu").unwrap(),
                    ..PlacementRequest::default()
                },
            ),
        ];
        if *moe {
            requests.push((
                "--cpu-moe",
                PlacementRequest {
                    cpu_moe_layers: u64::MAX,
                    ..PlacementRequest::default()
                },
            ));
        }
        for ty in [T::F32, T::Q8_0] {
            let hybrid_q8_0 = ty == T::Q8_0 && *name != "gemma4";
            let model = match *moe && hybrid_q8_0 {
                true => qwen3_5_moe_every_expert(),
                false => model.clone(),
            };
            let path = d.join(format!("{name}-{}.gguf", ty.name()));
            Format::Gguf(ty).write(&model, &path, 7);
            let kv = cache_of(name, ty);
            let engine = |device, request| {
                let inputs = PlanInputs {
                    kv_dtype: kv,
                    ..inputs(device, 64, 3, 8)
                };
                placed_engine(&path, inputs, request, tokenizer(&d))
            };
            let mut cpu = hybrid_rows(&path, Device::Cpu, kv, &d);
            let (mut tol, mut kld_tol) = (tolerance(ty.name()), kld_tolerance(ty));
            if hybrid_q8_0 {
                let exact = d.join(format!("{name}-dequantized-F32.gguf"));
                common::dequantized_copy(&model, &path, T::F32, &exact);
                let want = hybrid_rows(&exact, Device::Cpu, kv, &d);
                let (own, own_kld) = rows_agreement(&cpu, &want);
                (tol, kld_tol, cpu) = (1.5 * own, 2.0 * own_kld, want);
            }
            for (flag, request) in &requests {
                let mut split = engine(Device::Cuda, Some(request));
                for round in ["first run", "second run"] {
                    let gpu = schedule_logits(&mut split, 1024);
                    let (worst, kld) = rows_agreement(&gpu, &cpu);
                    let against = if hybrid_q8_0 { ", CPU dequantized" } else { "" };
                    println!(
                        "{name:<10} {:<5} {flag:<15} {round:<10}: {} rows{against}, max_rel {worst:.2e} (tolerance {tol:.2e}), mean KLD {kld:.2e} (tolerance {kld_tol:.2e})",
                        ty.name(),
                        cpu.len()
                    );
                    if !(worst < tol && kld < kld_tol) {
                        failures.push(format!(
                            "{name} {} {flag} {round}: max_rel {worst:e}, mean KLD {kld:e}",
                            ty.name()
                        ));
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&d);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
