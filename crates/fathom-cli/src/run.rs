//! `fathom run`: chat with a model, keeping the history and applying its
//! chat template; one answer with `-p`.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args;
use fathom_engine::{ChatTemplate, Message, Sampler};
use fathom_tokenizer::encode_chat;

use crate::planning::{self, PlacementArgs, PlanArgs};
use crate::session::{self, PreflightArgs, SamplingArgs};

/// The model `run` uses when none is named: the README's default, as
/// `scripts/fetch-model.sh` places it.
pub const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Args)]
pub struct RunArgs {
    /// A .gguf file or HF / MLX directory [default: models/SmolLM2-135M-Instruct.Q4_1.gguf]
    pub model: Option<String>,
    /// Answer this one message and exit.
    #[arg(long, short = 'p')]
    pub prompt: Option<String>,
    /// A system message.
    #[arg(long)]
    pub system: Option<String>,
    /// Turn the chat template's thinking switch (`enable_thinking`) on or
    /// off: Gemma 4 and Qwen3 think before answering when it is on; without
    /// the flag the template's default holds.
    #[arg(long, value_name = "on|off", value_parser = parse_switch)]
    pub think: Option<bool>,
    /// Most tokens per answer.
    #[arg(long, short = 'n', visible_alias = "n-predict", default_value_t = 512)]
    pub tokens: usize,
    /// Context for the whole conversation [default: the model's, at most 8192]
    #[arg(long, short = 'c', visible_alias = "ctx-size")]
    pub max_tokens: Option<u64>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub plan: PlanArgs,
    #[command(flatten)]
    pub placement: PlacementArgs,
    #[command(flatten)]
    pub preflight: PreflightArgs,
}

fn parse_switch(text: &str) -> Result<bool, String> {
    match text {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("{other:?}: expected on or off")),
    }
}

pub fn run(args: &RunArgs) -> Result<ExitCode> {
    let model = match &args.model {
        Some(model) => crate::pull::resolve(model)?,
        None => PathBuf::from(DEFAULT_MODEL),
    };
    if args.model.is_none() && !model.exists() {
        bail!("the default model {DEFAULT_MODEL} is missing: run scripts/fetch-model.sh, or name a model");
    }
    let opened = session::open(&model)?;
    let Some(source) = opened.tokenizer.chat_template().map(str::to_string) else {
        bail!(
            "{} has no chat template: use `fathom generate` for raw prompts",
            model.display()
        );
    };
    let piece = |id: Option<u32>| {
        id.map(|id| String::from_utf8_lossy(opened.tokenizer.token_bytes(id)).into_owned())
            .unwrap_or_default()
    };
    let mut template = ChatTemplate::new(
        &source,
        &piece(opened.tokenizer.bos()),
        &piece(opened.tokenizer.eos()),
    )?;
    if let Some(on) = args.think {
        template.set_thinking(on);
    }
    let context = args
        .max_tokens
        .unwrap_or_else(|| planning::default_context(&opened.spec));
    let inputs = args.plan.inputs(context, 1)?;
    let plan = args.placement.plan(&args.plan, &opened.spec, inputs)?;
    if let Some(code) = session::preflight(&model, &opened, &plan, &args.preflight) {
        return Ok(code);
    }
    let (mut engine, _) = session::load(opened, plan)?;
    let mut sampler = Sampler::new(args.sampling.params());
    let mut history: Vec<Message> = Vec::new();
    if let Some(system) = &args.system {
        history.push(Message::new("system", system.clone()));
    }
    let interactive = args.prompt.is_none() && std::io::stdin().is_terminal();
    let mut lines = std::io::stdin().lock().lines();
    loop {
        let user = match &args.prompt {
            Some(p) => p.clone(),
            None => {
                if interactive {
                    print!("> ");
                    std::io::stdout().flush()?;
                }
                match lines.next() {
                    Some(line) => line.context("reading stdin")?,
                    None => break,
                }
            }
        };
        if user.trim().is_empty() {
            continue;
        }
        history.push(Message::new("user", user));
        // Typed text is text: only the template's markers are special tokens.
        let prompt = encode_chat(&engine.tokenizer, &template, &history, true, usize::MAX)?;
        let room = (engine.plan.inputs.context as usize).saturating_sub(prompt.len());
        if room == 0 {
            bail!("the conversation fills the context of {} tokens: start a new one or raise --ctx-size", engine.plan.inputs.context);
        }
        let mut answer = String::new();
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        engine.generate(
            &prompt,
            args.tokens.min(room),
            &mut sampler,
            &args.sampling.stop,
            &mut |piece| {
                answer.push_str(piece);
                out.write_all(piece.as_bytes())
                    .and_then(|()| out.flush())
                    .is_ok()
            },
        )?;
        writeln!(out)?;
        history.push(Message::new("assistant", answer));
        if args.prompt.is_some() {
            break;
        }
    }
    Ok(ExitCode::SUCCESS)
}
