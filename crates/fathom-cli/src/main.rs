//! The `fathom` command.

mod bench;
mod bench_memory;
mod bench_serve;
mod flags;
mod generate;
mod inspect;
mod kld;
mod machine;
mod perplexity;
mod planning;
mod pull;
mod render;
mod run;
mod serve;
mod session;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// fathom: an LLM runtime that knows how much memory a model takes before
/// it loads it.
#[derive(Parser)]
#[command(name = "fathom", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the memory plan for a model from its headers alone (no weights are read).
    Inspect(inspect::InspectArgs),
    /// Complete a raw prompt, streaming tokens to stdout; timings and memory to stderr.
    Generate(generate::GenerateArgs),
    /// Chat with a model (its chat template applied); one answer with -p.
    Run(run::RunArgs),
    /// Download a model from the hub into fathom's store.
    Pull(pull::PullArgs),
    /// Measure prompt processing and generation speed (as llama-bench does); `bench memory`: plan vs measured peak.
    Bench(bench::BenchArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions).
    #[command(
        args_override_self = true,
        after_help = "Routes: POST /v1/chat/completions, POST /v1/completions (streamed with \"stream\": true), \
GET /v1/models, GET /health (open even with --api-key), GET /metrics (Prometheus).\n\
SIGINT or SIGTERM stops accepting, lets requests in flight finish (--shutdown-timeout) and exits 0.\n\
Parameters, defaults, error codes and metrics: docs/server.md"
    )]
    Serve(serve::ServeArgs),
    /// Perplexity over a text file, and KL divergence against a base-logits file, as llama-perplexity computes them.
    Perplexity(perplexity::PerplexityArgs),
}

fn main() -> ExitCode {
    // Usage errors exit 1 like every other error: 2 is reserved for a
    // preflight that refuses a load which does not fit.
    let args = serve::rewrite_llama_server_flags(std::env::args_os().collect());
    let args = inspect::rewrite_vllm_flags(args);
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(err) => {
            let _ = err.print();
            return ExitCode::from(if err.use_stderr() { 1 } else { 0 });
        }
    };
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(&args),
        Command::Generate(args) => generate::run(&args),
        Command::Run(args) => run::run(&args),
        Command::Pull(args) => pull::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Perplexity(args) => perplexity::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(1)
        }
    }
}
