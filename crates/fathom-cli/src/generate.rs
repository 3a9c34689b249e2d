//! `fathom generate`: complete a raw prompt, streaming tokens to stdout.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use fathom_engine::{Sampler, SamplingParams};

use crate::planning::{PlacementArgs, PlanArgs};
use crate::session::{self, PreflightArgs, SamplingArgs};

#[derive(Args)]
pub struct GenerateArgs {
    /// A .gguf file, or a Hugging Face / MLX directory.
    pub model: String,
    /// The prompt, used as is (no chat template; special tokens are parsed).
    #[arg(long, short = 'p', required_unless_present = "random_prompt")]
    pub prompt: Option<String>,
    /// Instead of -p: a prompt of N pseudo-random token ids (fixed seed, as
    /// `fathom bench` uses), e.g. to fill a context for a memory measurement.
    #[arg(long, value_name = "N", conflicts_with = "prompt")]
    pub random_prompt: Option<usize>,
    /// Tokens to generate.
    #[arg(long, short = 'n', visible_alias = "n-predict", default_value_t = 128)]
    pub tokens: usize,
    /// Context to plan and allocate [default: prompt + -n]
    #[arg(long, short = 'c', visible_alias = "ctx-size")]
    pub max_tokens: Option<u64>,
    /// Decode N copies of the prompt together as N sequences (the plan's
    /// batch); copy i samples with seed + i. Only the first is printed; the
    /// stats count all.
    #[arg(long, visible_alias = "np", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub parallel: u64,
    /// Never sample an end-of-generation token: run to -n tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub plan: PlanArgs,
    #[command(flatten)]
    pub placement: PlacementArgs,
    #[command(flatten)]
    pub preflight: PreflightArgs,
}

pub fn run(args: &GenerateArgs) -> Result<ExitCode> {
    let model = crate::pull::resolve(&args.model)?;
    let opened = session::open(&model)?;
    let tokenizer = &opened.tokenizer;
    let prompt = match (&args.prompt, args.random_prompt) {
        (_, Some(n)) => fathom_fixtures::random_token_ids(n, opened.spec.vocab),
        (Some(text), None) => tokenizer.encode(text, tokenizer.add_bos(), true),
        (None, None) => anyhow::bail!("pass a prompt with -p PROMPT or --random-prompt N"),
    };
    let context = args
        .max_tokens
        .unwrap_or((prompt.len() + args.tokens) as u64);
    let inputs = args.plan.inputs(context, args.parallel)?;
    let plan = args.placement.plan(&args.plan, &opened.spec, inputs)?;
    if let Some(code) = session::preflight(&model, &opened, &plan, &args.preflight) {
        return Ok(code);
    }
    let watch = session::DeviceWatch::start(&plan);
    let (mut engine, load) = session::load(opened, plan)?;
    let free_after_load = engine.device().1.free;
    let params = args.sampling.params();
    let mut samplers: Vec<Sampler> = (0..args.parallel)
        .map(|i| {
            Sampler::new(SamplingParams {
                seed: params.seed.wrapping_add(i),
                ignore_eos: args.ignore_eos,
                ..params.clone()
            })
        })
        .collect();
    let prompts = vec![prompt.as_slice(); samplers.len()];
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let stats = engine.generate_batch(
        &prompts,
        args.tokens,
        &mut samplers,
        &args.sampling.stop,
        &mut |sequence, text| {
            // A closed pipe ends generation rather than the process.
            sequence > 0
                || out
                    .write_all(text.as_bytes())
                    .and_then(|()| out.flush())
                    .is_ok()
        },
    )?;
    let _ = writeln!(out);
    session::report(load, &stats, &engine.plan);
    if let Some(watch) = watch {
        let free_at_end = engine.device().1.free;
        session::report_device(&engine.plan, &watch.finish(), free_after_load, free_at_end);
    }
    Ok(ExitCode::SUCCESS)
}
