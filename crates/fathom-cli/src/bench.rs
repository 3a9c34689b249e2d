//! `fathom bench`: prompt processing and generation speed, measured as
//! llama-bench measures them (pp: a prompt of random tokens in one go; tg:
//! single-token decode steps), so the two tools' figures compare directly.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use crate::planning::{PlacementArgs, PlanArgs};
use crate::session;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    /// A .gguf file, or a Hugging Face / MLX directory.
    #[arg(required = true)]
    pub model: Option<String>,
    /// Prompt tokens for the prompt-processing test (0 skips it).
    #[arg(long, short = 'p', visible_alias = "n-prompt", default_value_t = 512)]
    pub prompt: usize,
    /// Tokens for the generation test (0 skips it).
    #[arg(long, short = 'n', visible_alias = "n-gen", default_value_t = 128)]
    pub generate: usize,
    /// Tokens of context before the generation test (as llama-bench's
    /// `-d`): tg runs at this depth.
    #[arg(long, short = 'd', visible_alias = "n-depth", default_value_t = 0)]
    pub depth: usize,
    /// Repetitions; the median is reported.
    #[arg(long, short = 'r', visible_alias = "repetitions", default_value_t = 5)]
    pub repetitions: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub plan: PlanArgs,
    #[command(flatten)]
    pub placement: PlacementArgs,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Measure the plan against the peak memory of real runs, cell by cell
    /// over a grid of models, contexts and KV types (see docs/benchmarks.md).
    Memory(crate::bench_memory::MemoryArgs),
    /// Write a GGUF of a real model's shapes with random weights (for GPU
    /// benchmarks and memory checks on machines without the real file).
    Fixture(FixtureArgs),
    /// Serve a model and measure it under concurrent streaming clients:
    /// aggregate tok/s, TTFT and inter-token latency per level, and a load
    /// test (see docs/benchmarks.md).
    Serve(crate::bench_serve::ServeBenchArgs),
}

#[derive(Args)]
pub struct FixtureArgs {
    /// The shape: smollm2-135m, llama-3.1-8b, llama-3.1-70b, qwen3-32b,
    /// qwen3-30b-a3b, gemma3-1b, gemma-4-31b, qwen3.5-4b, qwen3.5-35b-a3b,
    /// gpt-oss-20b or
    /// gpt-oss-120b (whose experts are MXFP4 whatever --type says).
    #[arg(long)]
    pub like: String,
    /// Weight type of the matrices (F32, F16, BF16, Q4_0 ... Q8_0, Q2_K ... Q6_K).
    #[arg(long = "type", default_value = "F16")]
    pub weight_type: String,
    /// Keep only the first N layers.
    #[arg(long)]
    pub layers: Option<u64>,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Take the tokenizer (every `tokenizer.*` key) from this GGUF, e.g.
    /// llama.cpp's `models/ggml-vocab-qwen35.gguf` or
    /// `ggml-vocab-gemma-4.gguf`, padding its token list
    /// to the model's vocabulary with unused tokens; without it the
    /// vocabulary is `t0`, `t1`, ... with no merges.
    #[arg(long)]
    pub vocab: Option<std::path::PathBuf>,
    /// gpt-oss only: the experts' type (default MXFP4, as gpt-oss GGUFs
    /// store them; another isolates the MXFP4 kernels in a comparison).
    #[arg(long)]
    pub experts_type: Option<String>,
    /// Where to write the .gguf.
    pub out: std::path::PathBuf,
}

fn write_fixture(args: &FixtureArgs) -> Result<ExitCode> {
    use fathom_fixtures as fx;
    if args.like.starts_with("gpt-oss") {
        return write_gpt_oss_fixture(args);
    }
    anyhow::ensure!(
        args.experts_type.is_none(),
        "--experts-type: only the gpt-oss shapes take it"
    );
    let Some((_, shape)) = fx::LIKE.iter().find(|(n, _)| *n == args.like) else {
        anyhow::bail!(
            "--like {:?}: expected one of {}",
            args.like,
            fx::LIKE
                .iter()
                .map(|(n, _)| *n)
                .chain(fx::GPT_OSS_LIKE.iter().map(|(n, _)| *n))
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    let ty = fx::GgufTensorType::ALL
        .into_iter()
        .find(|t| t.name().eq_ignore_ascii_case(&args.weight_type))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--type {:?}: expected one of {}",
                args.weight_type,
                fx::GgufTensorType::ALL.map(|t| t.name()).join(", ")
            )
        })?;
    let mut model = shape();
    if let Some(layers) = args.layers {
        model = fx::reshaped(&model, serde_json::json!({ "num_hidden_layers": layers }));
    }
    let data = fx::Data::Random { seed: args.seed };
    let bytes = match &args.vocab {
        None => fx::write_runnable_gguf(&model, ty, &args.out, data),
        Some(vocab) => {
            let kvs = vocab_kvs(vocab, model.text_config()["vocab_size"].as_u64())?;
            let writer = fx::gguf_writer(&model, ty)
                .with_context(|| format!("describing {}", args.out.display()))?;
            kvs.into_iter()
                .fold(
                    writer.retain_kvs(|k| !k.starts_with("tokenizer.")),
                    |w, (k, v)| w.kv(k, v),
                )
                .write(&args.out, data)
        }
    }
    .with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!(
        "wrote {} ({} like {}, {} bytes)",
        args.out.display(),
        ty.name(),
        args.like,
        bytes
    );
    Ok(ExitCode::SUCCESS)
}

/// The --type argument as a weight type.
fn fixture_type(name: &str) -> Result<fathom_fixtures::GgufTensorType> {
    use fathom_fixtures::GgufTensorType;
    GgufTensorType::ALL
        .into_iter()
        .find(|t| t.name().eq_ignore_ascii_case(name))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--type {name:?}: expected one of {}",
                GgufTensorType::ALL.map(|t| t.name()).join(", ")
            )
        })
}

/// `--like gpt-oss-20b|gpt-oss-120b`: written as GGUF directly
/// (`fathom_fixtures::gpt_oss_writer`), experts in MXFP4, the other
/// matrices in --type.
fn write_gpt_oss_fixture(args: &FixtureArgs) -> Result<ExitCode> {
    use fathom_fixtures as fx;
    let Some((_, shape)) = fx::GPT_OSS_LIKE.iter().find(|(n, _)| *n == args.like) else {
        anyhow::bail!(
            "--like {:?}: expected {}",
            args.like,
            fx::GPT_OSS_LIKE.map(|(n, _)| n).join(" or ")
        );
    };
    let mut shape = shape();
    let ty = fixture_type(&args.weight_type)?;
    if let Some(experts) = &args.experts_type {
        shape.experts_type = fixture_type(experts)?;
    }
    if let Some(layers) = args.layers {
        anyhow::ensure!(layers > 0, "--layers 0: a model needs a layer");
        shape.layers = layers;
    }
    let data = fx::Data::Random { seed: args.seed };
    let describe = || format!("writing {}", args.out.display());
    let bytes = match &args.vocab {
        None => fx::write_gpt_oss_gguf(&shape, ty, &args.out, data),
        Some(vocab) => {
            let kvs = vocab_kvs(vocab, Some(shape.vocab))?;
            let writer = fx::gpt_oss_writer(&shape, ty).with_context(describe)?;
            kvs.into_iter()
                .fold(
                    writer.retain_kvs(|k| !k.starts_with("tokenizer.")),
                    |w, (k, v)| w.kv(k, v),
                )
                .write(&args.out, data)
        }
    }
    .with_context(describe)?;
    eprintln!(
        "wrote {} (MXFP4 experts, {} matrices, like {}, {} bytes)",
        args.out.display(),
        ty.name(),
        args.like,
        bytes
    );
    Ok(ExitCode::SUCCESS)
}

/// The `tokenizer.*` keys of the GGUF at `path`, its token list (and the
/// per-token arrays beside it) padded with unused tokens to `vocab`.
fn vocab_kvs(
    path: &std::path::Path,
    vocab: Option<u64>,
) -> Result<Vec<(String, fathom_fixtures::GgufValue)>> {
    use fathom_checkpoint::{GgufFile, MetaValue};
    use fathom_fixtures::GgufValue;
    let file = GgufFile::open(path).with_context(|| format!("--vocab {}", path.display()))?;
    let tokens = file
        .get("tokenizer.ggml.tokens")
        .and_then(MetaValue::as_array)
        .map_or(0, |t| t.len() as u64);
    let vocab = vocab.unwrap_or(tokens);
    if tokens == 0 || tokens > vocab {
        anyhow::bail!(
            "--vocab {}: {tokens} tokens in tokenizer.ggml.tokens; expected 1 to the model's {vocab}",
            path.display()
        );
    }
    fn convert(v: &MetaValue) -> Option<GgufValue> {
        Some(match v {
            MetaValue::U8(x) => GgufValue::U8(*x),
            MetaValue::I8(x) => GgufValue::I8(*x),
            MetaValue::U16(x) => GgufValue::U16(*x),
            MetaValue::I16(x) => GgufValue::I16(*x),
            MetaValue::U32(x) => GgufValue::U32(*x),
            MetaValue::I32(x) => GgufValue::I32(*x),
            MetaValue::U64(x) => GgufValue::U64(*x),
            MetaValue::I64(x) => GgufValue::I64(*x),
            MetaValue::F32(x) => GgufValue::F32(*x),
            MetaValue::F64(x) => GgufValue::F64(*x),
            MetaValue::Bool(x) => GgufValue::Bool(*x),
            MetaValue::Str(x) => GgufValue::String(x.clone()),
            MetaValue::Array(ty, items) => {
                GgufValue::Array(*ty, items.iter().map(convert).collect::<Option<_>>()?)
            }
        })
    }
    // llama.cpp's token type of a padding entry: unused.
    const UNUSED: i32 = 5;
    let mut out = Vec::new();
    for (key, value) in file
        .metadata
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
    {
        let mut value = convert(value)
            .ok_or_else(|| anyhow::anyhow!("--vocab {}: {key} is unreadable", path.display()))?;
        if let GgufValue::Array(_, items) = &mut value {
            let pad = (tokens..vocab).map(|i| match key.as_str() {
                "tokenizer.ggml.tokens" => Some(GgufValue::String(format!("[PAD{i}]"))),
                "tokenizer.ggml.token_type" => Some(GgufValue::I32(UNUSED)),
                "tokenizer.ggml.scores" => Some(GgufValue::F32(0.0)),
                _ => None,
            });
            if items.len() as u64 == tokens {
                items.extend(pad.flatten());
            }
        }
        out.push((key.clone(), value));
    }
    Ok(out)
}

pub fn run(args: &BenchArgs) -> Result<ExitCode> {
    match &args.command {
        Some(BenchCommand::Memory(memory)) => return crate::bench_memory::run(memory),
        Some(BenchCommand::Fixture(fixture)) => return write_fixture(fixture),
        Some(BenchCommand::Serve(serve)) => return crate::bench_serve::run(serve),
        None => {}
    }
    let Some(name) = &args.model else {
        anyhow::bail!("fathom bench needs a MODEL (or the memory subcommand)");
    };
    let model = crate::pull::resolve(name)?;
    let opened = session::open(&model)?;
    let context = args.prompt.max(args.depth + args.generate).max(1) as u64;
    let inputs = args.plan.inputs(context, 1)?;
    let plan = args.placement.plan(&args.plan, &opened.spec, inputs)?;
    let threads = plan.inputs.threads;
    // The CPU kernel family, so figures say which path they measured.
    let kernels = (plan.inputs.device == fathom_plan::Device::Cpu)
        .then(fathom_backend::cpu::kernels)
        .transpose()?;
    let (mut engine, _) = session::load(opened, plan)?;
    let prompt = fathom_fixtures::random_token_ids(args.prompt, engine.model.spec.vocab);
    let depth = fathom_fixtures::random_token_ids(args.depth, engine.model.spec.vocab);
    let rate = |n: usize, d: Duration| n as f64 / d.as_secs_f64().max(1e-9);
    // One warm-up of each, then the measured repetitions.
    let reps = args.repetitions.max(1);
    let mut pp = Vec::new();
    let mut tg = Vec::new();
    for rep in 0..=reps {
        if args.prompt > 0 {
            let started = std::time::Instant::now();
            engine.logits(&prompt)?;
            if rep > 0 {
                pp.push(rate(args.prompt, started.elapsed()));
            }
        }
        if args.generate > 0 {
            let first = prompt.first().copied().unwrap_or(1);
            let elapsed = engine.time_decode(&depth, first, args.generate)?;
            if rep > 0 {
                tg.push(rate(args.generate, elapsed));
            }
        }
    }
    let pp = (!pp.is_empty()).then(|| median(pp));
    let tg = (!tg.is_empty()).then(|| median(tg));
    if args.json {
        let doc = serde_json::json!({
            "model": name,
            "threads": threads,
            "kernels": kernels,
            "repetitions": reps,
            "pp": args.prompt,
            "tg": args.generate,
            "depth": args.depth,
            "pp_tokens_per_second": pp,
            "tg_tokens_per_second": tg,
        });
        println!("{doc}");
    } else {
        let kernels = kernels
            .map(|k| format!(", {k} kernels"))
            .unwrap_or_default();
        println!("fathom bench {name} ({threads} threads{kernels}, median of {reps})");
        if let Some(pp) = pp {
            println!("  pp{:<5} {pp:>9.2} tok/s", args.prompt);
        }
        if let Some(tg) = tg {
            let at = if args.depth > 0 {
                format!(" @ d{}", args.depth)
            } else {
                String::new()
            };
            println!("  tg{}{at:<8} {tg:>9.2} tok/s", args.generate);
        }
    }
    Ok(ExitCode::SUCCESS)
}
