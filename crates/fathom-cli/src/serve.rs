//! `fathom serve`: an OpenAI-compatible HTTP server over the scheduler.
//!
//! The plan is computed and (with `--estimate-memory`) checked first; the
//! listener is bound before the weights load, so `/health` answers
//! `loading` meanwhile.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use fathom_engine::ChatTemplate;
use fathom_plan::serve::{
    parse_kv_budget, parse_prompt_cache, KvBudget, RequestBuffers, ServePlan, PROCESSING_SLOTS,
};
use fathom_plan::size::{format_binary, format_bytes, parse_size};
use fathom_plan::Device;
use fathom_server::http::{LoadedModel, ServerConfig};
use fathom_server::{Scheduler, SchedulerConfig};

use crate::planning::{self, PlacementArgs, PlanArgs};
use crate::render::{self, row};
use crate::session::{self, PreflightArgs};

#[derive(Args)]
pub struct ServeArgs {
    /// A .gguf file, a Hugging Face / MLX directory, or a hub id in the cache or store.
    pub model: String,
    /// Address to listen on.
    #[arg(long, env = "FATHOM_HOST", default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 picks a free one, printed at start).
    #[arg(long, env = "FATHOM_PORT", default_value_t = 8080)]
    pub port: u16,
    /// Sequences decoded together (`-np N` works too, as in llama-server).
    #[arg(long, env = "FATHOM_PARALLEL", default_value_t = 4)]
    pub parallel: u64,
    /// Context per request: prompt + max_tokens [default: the model's trained context, at most 8192]
    #[arg(long = "ctx-size", short = 'c', env = "FATHOM_CTX_SIZE")]
    pub ctx_size: Option<u64>,
    /// KV block pool: auto (from the plan), a SIZE such as 2G, or none (every slot's full context).
    #[arg(long, env = "FATHOM_KV_CACHE_BUDGET", default_value = "auto")]
    pub kv_cache_budget: String,
    /// Prefix-cache capacity: auto, a SIZE such as 512M, or off.
    #[arg(long, env = "FATHOM_PROMPT_CACHE", default_value = "auto")]
    pub prompt_cache: String,
    /// Require `Authorization: Bearer KEY` on every route but /health.
    #[arg(long, env = "FATHOM_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Comma-separated origins that get CORS headers (`*` for any) [default: no CORS headers]
    #[arg(long, env = "FATHOM_ALLOWED_ORIGINS")]
    pub allowed_origins: Option<String>,
    /// The model id /v1/models lists and requests name [default: the model's file name]
    #[arg(long, short = 'a')]
    pub alias: Option<String>,
    /// Requests that may wait for a slot before new ones get 503 (those free slots take at once do not wait).
    #[arg(long, default_value_t = 64)]
    pub queue_size: usize,
    /// Largest request body, e.g. 4M (413 above).
    #[arg(long, default_value = "4M")]
    pub max_body_size: String,
    /// Seconds a request body may take to arrive after its headers (408 after).
    #[arg(long, env = "FATHOM_BODY_TIMEOUT", default_value_t = 30)]
    pub body_timeout: u64,
    /// Seconds in-flight requests may run after SIGINT/SIGTERM.
    #[arg(long, env = "FATHOM_SHUTDOWN_TIMEOUT", default_value_t = 30)]
    pub shutdown_timeout: u64,
    #[command(flatten)]
    pub plan: PlanArgs,
    #[command(flatten)]
    pub placement: PlacementArgs,
    #[command(flatten)]
    pub preflight: PreflightArgs,
}

/// llama-server spells --parallel `-np`; clap cannot take a two-letter
/// short flag, so it is rewritten before parsing.
pub fn rewrite_llama_server_flags(args: Vec<OsString>) -> Vec<OsString> {
    crate::flags::rewrite_short(args, "serve", "-np", "--parallel")
}

pub fn run(args: &ServeArgs) -> Result<ExitCode> {
    if args.parallel == 0 {
        bail!("--parallel is 0: at least one sequence must be served");
    }
    let kv_budget = parse_kv_budget(&args.kv_cache_budget)?;
    let prompt_cache = parse_prompt_cache(&args.prompt_cache)?;
    let max_body = parse_size(&args.max_body_size, "--max-body-size")?
        .filter(|&b| b > 0)
        .context("--max-body-size must be a size above 0, e.g. 4M")?;
    let model = crate::pull::resolve(&args.model)?;
    let opened = session::open(&model)?;
    let template = match opened.tokenizer.chat_template() {
        Some(source) => {
            let piece = |id: Option<u32>| {
                id.map(|id| String::from_utf8_lossy(opened.tokenizer.token_bytes(id)).into_owned())
                    .unwrap_or_default()
            };
            Some(ChatTemplate::new(
                source,
                &piece(opened.tokenizer.bos()),
                &piece(opened.tokenizer.eos()),
            )?)
        }
        None => None,
    };
    let context = args
        .ctx_size
        .unwrap_or_else(|| planning::default_context(&opened.spec));
    if args.body_timeout == 0 {
        bail!("--body-timeout is 0: give the seconds a request body may take, e.g. 30");
    }
    // Bodies held at once share --parallel x the body limit; at most
    // PROCESSING_SLOTS of them are parsed and tokenized at once.
    let requests = RequestBuffers {
        slots: args.parallel,
        processors: args.parallel.min(PROCESSING_SLOTS),
        max_body_bytes: max_body,
        max_token_bytes: opened.tokenizer.max_token_bytes() as u64,
    };
    let inputs = args.plan.inputs(context, args.parallel)?;
    let served = match args.placement.request_for(&args.plan, &inputs)? {
        Some(request) => {
            let unsplit = ServePlan::with_requests(
                &opened.spec,
                inputs.clone(),
                kv_budget,
                prompt_cache,
                requests,
                1,
            );
            // A model that leaves room for at least one full-context slot
            // on the GPU (with the auto pool; a pool of a size given is the
            // user's) keeps every layer there; otherwise the plan places it
            // between the GPU and the host, sized for every slot.
            let auto = kv_budget == KvBudget::Auto;
            match unsplit {
                Ok(s) if request.is_default() && fits_unsplit(&s, auto) => s,
                _ => ServePlan::placed(&opened.spec, inputs, &request, requests)
                    .context("computing the serve plan")?,
            }
        }
        None => ServePlan::with_requests(
            &opened.spec,
            inputs,
            kv_budget,
            prompt_cache,
            requests,
            args.plan.tensor_parallel,
        )
        .context("computing the serve plan")?,
    };
    planning::check_runs(&opened.spec, &served.plan.inputs, args.plan.tensor_parallel)?;
    if let Some(code) = session::preflight(&model, &opened, &served.plan, &args.preflight) {
        return Ok(code);
    }
    eprint!("{}", serve_plan_text(&model, &served));

    let listener = TcpListener::bind((args.host.as_str(), args.port))
        .with_context(|| format!("listening on {}:{}", args.host, args.port))?;
    let address = listener.local_addr()?;
    eprintln!("fathom serve: listening on http://{address} (loading the model)");

    let file_name = model
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| args.model.clone());
    let model_id = args.alias.clone().unwrap_or_else(|| file_name.clone());
    let config = ServerConfig {
        model_aliases: [file_name, args.model.clone()]
            .into_iter()
            .filter(|n| *n != model_id)
            .collect(),
        model_id,
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        allowed_origins: args
            .allowed_origins
            .iter()
            .flat_map(|l| l.split(','))
            .map(|o| o.trim().trim_end_matches('/').to_string())
            .filter(|o| !o.is_empty())
            .collect(),
        max_body_bytes: usize::try_from(max_body).unwrap_or(usize::MAX),
        body_slots: usize::try_from(requests.slots).unwrap_or(usize::MAX),
        processing_slots: usize::try_from(requests.processors).unwrap_or(1),
        body_timeout: Duration::from_secs(args.body_timeout),
        shutdown_timeout: Duration::from_secs(args.shutdown_timeout),
    };
    let scheduler_config = SchedulerConfig {
        parallel: args.parallel as usize,
        queue_capacity: args.queue_size,
        prompt_cache_blocks: usize::try_from(served.prompt_cache_blocks).unwrap_or(usize::MAX),
    };
    let plan_terms = plan_terms(&served);
    let host_plan = host_plan_terms(&served);
    let device_memory = (served.plan.inputs.device == Device::Cuda)
        .then(session::device_probe)
        .flatten();
    let plan = served.plan;
    let load = move || -> Result<LoadedModel, String> {
        let (engine, took) = session::load(opened, plan).map_err(|e| format!("{e:#}"))?;
        eprintln!(
            "fathom serve: model loaded in {:.1} ms; ready on http://{address}",
            took.as_secs_f64() * 1e3
        );
        let tokenizer = engine.tokenizer.clone();
        let context = engine.plan.inputs.context as usize;
        Ok(LoadedModel {
            scheduler: Scheduler::start(engine, scheduler_config),
            tokenizer,
            template,
            context,
            plan: plan_terms,
            host_plan,
            device_memory,
        })
    };
    fathom_server::http::serve(listener, config, load, || {})?;
    eprintln!("fathom serve: stopped");
    Ok(ExitCode::SUCCESS)
}

/// `(term, bytes)` for `/metrics`: the plan's terms, then the pool's
/// block size, the prompt-cache capacity, the total and the budget.
/// Whether an unsplit serve plan fits, with an `auto` pool of at least one
/// full-context sequence.
fn fits_unsplit(served: &ServePlan, auto: bool) -> bool {
    served.plan.fits && (!auto || served.kv_blocks >= served.kv_blocks_per_sequence)
}

fn plan_terms(served: &ServePlan) -> Vec<(String, u64)> {
    let plan = &served.plan;
    let mut terms: Vec<(String, u64)> = plan
        .terms
        .iter()
        .map(|t| (t.name.to_string(), t.bytes))
        .collect();
    terms.push(("kv_block".into(), served.kv_block_bytes));
    terms.push(("prompt_cache".into(), served.prompt_cache_bytes));
    terms.push(("total".into(), plan.total_bytes));
    terms.push(("available".into(), plan.available_bytes));
    terms
}

/// `(term, bytes)` of a GPU plan's host budget for `/metrics`: its terms,
/// then `total` and `available`; empty on the CPU.
fn host_plan_terms(served: &ServePlan) -> Vec<(String, u64)> {
    let Some(host) = &served.plan.host else {
        return Vec::new();
    };
    let mut terms: Vec<(String, u64)> = host
        .terms
        .iter()
        .map(|t| (t.name.to_string(), t.bytes))
        .collect();
    terms.push(("total".into(), host.total_bytes));
    terms.push(("available".into(), host.available_bytes));
    terms
}

/// The plan being served, in `inspect`'s row style: on a GPU the
/// device's budget (with the KV pool and prompt cache it holds), then the
/// host's.
fn serve_plan_text(model: &Path, served: &ServePlan) -> String {
    let plan = &served.plan;
    let mut out = String::new();
    let i = &plan.inputs;
    let _ = writeln!(
        out,
        "fathom {} serving {}: {} slots x {} tokens, KV {}, {} tokens per step, {} threads, device {}",
        env!("CARGO_PKG_VERSION"),
        model.display(),
        i.batch,
        i.context,
        i.kv_dtype.name(),
        i.max_tokens_per_step,
        i.threads,
        i.device.name()
    );
    if plan.host.is_some() {
        let _ = writeln!(out, "Device memory ({}):", i.device.name());
    }
    let term = |name: &str| plan.terms.iter().find(|t| t.name == name);
    row(
        &mut out,
        "Weights",
        plan.weights_bytes,
        &plan.weights_source,
    );
    if let Some(t) = term("converted").filter(|t| t.bytes > 0) {
        row(&mut out, "Converted at load", t.bytes, &t.derivation);
    }
    for (name, label) in [
        ("activations", "Activations"),
        ("runtime", "Runtime overhead"),
        ("requests", "Request buffers"),
        ("constraints", "Constraints"),
    ] {
        if let Some(t) = term(name) {
            row(&mut out, label, t.bytes, &t.derivation);
        }
    }
    match term("backend").filter(|_| plan.host.is_some()) {
        // A GPU's context, kernels, libraries and carve.
        Some(t) => row(&mut out, "Backend", t.bytes, &t.derivation),
        None => row(
            &mut out,
            "Backend in-flight",
            plan.backend_bytes
                .saturating_add(plan.backend_inflight_bytes),
            "device context and in-flight reserve",
        ),
    }
    let mut pool = format!(
        "{} blocks x {} ({} tokens of every full-attention layer; {} blocks per full-context slot)",
        served.kv_blocks,
        format_binary(served.kv_block_bytes),
        plan.kv_block_tokens,
        served.kv_blocks_per_sequence
    );
    if served.sliding_bytes > 0 {
        let _ = write!(
            pool,
            " + {} of sliding-window rings",
            format_binary(served.sliding_bytes)
        );
    }
    row(&mut out, "KV pool", plan.kv_bytes, &pool);
    if let Some(t) = term("recurrent_state") {
        row(&mut out, "Recurrent state", t.bytes, &t.derivation);
    }
    let cache = if served.prompt_cache_bytes == 0 && plan.recurrent_detail.is_some() {
        "off: a linear-attention layer's state is not in the KV blocks, so a cached prefix cannot be resumed".to_string()
    } else if served.prompt_cache_bytes == 0 {
        "off".to_string()
    } else {
        format!(
            "{} blocks of the pool kept for cached prefixes (one full-context entry is {})",
            served.prompt_cache_blocks,
            format_binary(served.prompt_cache_entry_bytes)
        )
    };
    row(&mut out, "Prompt cache", served.prompt_cache_bytes, &cache);
    if let Some(t) = term("headroom") {
        row(&mut out, "Headroom", t.bytes, &t.derivation);
    }
    row(
        &mut out,
        "Total",
        plan.total_bytes,
        "saturating sum of the terms",
    );
    row(
        &mut out,
        "Available",
        plan.available_bytes,
        &plan.available_source,
    );
    let _ = writeln!(
        out,
        "{}",
        if plan.fits {
            format!("FITS: {} of headroom", format_bytes(plan.slack_bytes))
        } else {
            format!(
                "DOES NOT FIT: {} over budget",
                format_bytes(plan.overflow_bytes)
            )
        }
    );
    if let Some(p) = plan.placement.as_ref().filter(|p| p.is_split()) {
        let _ = writeln!(
            out,
            "Placement ({}): {} of {} layers on the GPU, routed experts of {} layers on the host; the pool's blocks hold each side's layers (no prompt cache)",
            p.chosen_by, p.gpu_layers, p.n_layers, p.cpu_moe_layers
        );
    }
    if let Some(host) = &plan.host {
        out.push_str(&render::host_text(host));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn np_is_rewritten_only_for_serve() {
        let v = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            rewrite_llama_server_flags(v(&["fathom", "serve", "m", "-np", "2", "-np=3"])),
            v(&["fathom", "serve", "m", "--parallel", "2", "--parallel=3"])
        );
        assert_eq!(
            rewrite_llama_server_flags(v(&["fathom", "run", "-np"])),
            v(&["fathom", "run", "-np"])
        );
    }
}
