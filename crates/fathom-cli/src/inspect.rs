//! `fathom inspect`: the memory plan from headers alone.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use fathom_checkpoint::Checkpoint;
use fathom_plan::{env, quant, rocm, Device, KvDtype, MemoryPlan, PlanInputs};
use fathom_spec::ModelSpec;
use serde::Serialize;

use crate::{machine, render};

#[derive(Args)]
pub struct InspectArgs {
    /// A .gguf file, or a Hugging Face / MLX directory (config.json + safetensors).
    pub model: PathBuf,
    /// Tokens of context per sequence (prompt + generated) [default: the model's context, at most 8192]
    #[arg(long, short = 'c', visible_alias = "ctx-size")]
    pub max_tokens: Option<u64>,
    /// Sequences held at once.
    #[arg(long, short = 'b', default_value_t = 1)]
    pub batch: u64,
    /// Device to plan for: cpu, cuda, rocm or metal.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Memory to plan against, e.g. 8G or 1.5GiB [default: FATHOM_MEMORY_LIMIT, else the cgroup limit, else MemAvailable; free GPU memory for cuda]
    #[arg(long)]
    pub memory: Option<String>,
    /// KV cache dtype: f16, bf16, f32 or q8_0.
    #[arg(long, default_value = "f16")]
    pub kv_dtype: String,
    /// Tokens processed in one forward step (the prefill chunk).
    #[arg(long, default_value_t = fathom_plan::DEFAULT_MAX_TOKENS_PER_STEP)]
    pub max_tokens_per_step: u64,
    /// Worker threads [default: one per core]
    #[arg(long, short = 't')]
    pub threads: Option<u64>,
    /// Print one JSON object (schema in docs/inspect-json.md) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also list F16 .. Q4_0 weights with the KV at this context, and recommend the most precise that fits.
    #[arg(long)]
    pub recommend_quant: bool,
}

/// The `--json` document: the plan's fields with the model's identity.
#[derive(Serialize)]
struct InspectJson<'a> {
    version: &'static str,
    model: String,
    format: &'static str,
    family: &'a str,
    architecture: &'a str,
    params: u64,
    context_length: u64,
    notes: &'a [String],
    #[serde(flatten)]
    plan: &'a MemoryPlan,
    #[serde(skip_serializing_if = "Option::is_none")]
    quant_advice: Option<&'a quant::QuantAdvice>,
}

pub fn run(args: &InspectArgs) -> Result<ExitCode> {
    let checkpoint = Checkpoint::open(&args.model)?;
    let spec = ModelSpec::from_checkpoint(&checkpoint)?;
    let device = Device::parse(&args.device)?;
    let headroom_factor = fathom_plan::parse_headroom_factor(
        machine::env_text(env::HEADROOM_FACTOR_VAR)?.as_deref(),
    )?;
    let inputs = PlanInputs {
        max_tokens: args.max_tokens.unwrap_or(match spec.context_length {
            0 => fathom_plan::DEFAULT_MAX_TOKENS_CAP,
            n => n.min(fathom_plan::DEFAULT_MAX_TOKENS_CAP),
        }),
        batch: args.batch,
        device,
        kv_dtype: KvDtype::parse(&args.kv_dtype)?,
        max_tokens_per_step: args.max_tokens_per_step,
        threads: args.threads.unwrap_or_else(machine::default_threads),
        headroom_factor,
        rocm_inflight_raw: machine::env_bytes(rocm::ROCM_INFLIGHT_VAR),
        available: machine::available_memory(device, args.memory.as_deref())?,
    };
    let plan = MemoryPlan::new(&spec, inputs).context("computing the memory plan")?;
    let advice = args
        .recommend_quant
        .then(|| quant::advise(&spec, plan.kv_bytes, plan.available_bytes));

    if args.json {
        let doc = InspectJson {
            version: env!("CARGO_PKG_VERSION"),
            model: args.model.display().to_string(),
            format: checkpoint.format_name(),
            family: spec.family.name(),
            architecture: &spec.architecture,
            params: spec.params(),
            context_length: spec.context_length,
            notes: &spec.notes,
            plan: &plan,
            quant_advice: advice.as_ref(),
        };
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!(
            "{}",
            render::plan_text(&args.model, checkpoint.format_name(), &spec, &plan)
        );
        if let Some(advice) = &advice {
            print!("{}", render::quant_text(advice, plan.inputs.max_tokens));
        }
    }
    Ok(ExitCode::SUCCESS)
}
