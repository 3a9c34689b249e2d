//! `fathom inspect`: the memory plan from headers alone.

use std::ffi::OsString;
use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::Args;
use fathom_checkpoint::Checkpoint;
use fathom_plan::{quant, MemoryPlan};
use fathom_spec::ModelSpec;
use serde::Serialize;

use crate::planning::{self, PlacementArgs, PlanArgs};
use crate::render;

#[derive(Args)]
pub struct InspectArgs {
    /// A .gguf file, or a Hugging Face / MLX directory (config.json + safetensors).
    pub model: String,
    /// Tokens of context per sequence (prompt + generated) [default: the model's context, at most 8192]
    #[arg(long, short = 'c', visible_alias = "ctx-size")]
    pub max_tokens: Option<u64>,
    /// Sequences held at once.
    #[arg(long, short = 'b', default_value_t = 1)]
    pub batch: u64,
    #[command(flatten)]
    pub plan: PlanArgs,
    #[command(flatten)]
    pub placement: PlacementArgs,
    /// Print one JSON object (schema in docs/inspect-json.md) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also list F16 .. Q4_0 weights with the KV at this context, and recommend the most precise that fits.
    #[arg(long)]
    pub recommend_quant: bool,
}

/// vLLM's `-tp N` (and `-tp=N`) for every command that plans, and
/// llama.cpp's `-ngl` and `-ot` for inspect: clap cannot take a short flag
/// of several letters, and would read `-tp` as `-t p` (threads).
pub fn rewrite_vllm_flags(mut args: Vec<OsString>) -> Vec<OsString> {
    for command in ["inspect", "generate", "run", "bench", "serve", "perplexity"] {
        args = crate::flags::rewrite_short(args, command, "-tp", "--tensor-parallel");
    }
    // llama.cpp's placement flags, for the commands that place a model.
    for command in ["inspect", "generate", "run", "bench", "serve"] {
        args = crate::flags::rewrite_short(args, command, "-ngl", "--gpu-layers");
        args = crate::flags::rewrite_short(args, command, "-ot", "--override-tensor");
    }
    args
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
    let path = crate::pull::resolve(&args.model)?;
    let checkpoint = Checkpoint::open(&path)?;
    let spec = ModelSpec::from_checkpoint(&checkpoint)?;
    let max_tokens = args
        .max_tokens
        .unwrap_or_else(|| planning::default_context(&spec));
    let inputs = args.plan.inputs(max_tokens, args.batch)?;
    let n = args.plan.tensor_parallel;
    if args.recommend_quant && n != 1 {
        bail!("--recommend-quant weighs whole-model weights against one device's memory: drop it, or --tensor-parallel {n}");
    }
    let plan = args.placement.plan(&args.plan, &spec, inputs)?;
    let advice = args.recommend_quant.then(|| {
        quant::advise(
            &spec,
            plan.kv_bytes,
            plan.recurrent_bytes,
            plan.available_bytes,
        )
    });

    if args.json {
        let doc = InspectJson {
            version: env!("CARGO_PKG_VERSION"),
            model: args.model.clone(),
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
            render::plan_text(&path, checkpoint.format_name(), &spec, &plan)
        );
        if let Some(advice) = &advice {
            print!("{}", render::quant_text(advice, plan.inputs.context));
        }
    }
    Ok(ExitCode::SUCCESS)
}
