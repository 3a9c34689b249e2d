//! The `fathom` command.

mod inspect;
mod machine;
mod render;

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
}

fn main() -> ExitCode {
    // Usage errors exit 1 like every other error: 2 is reserved for a
    // preflight that refuses a load which does not fit.
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            let _ = err.print();
            return ExitCode::from(if err.use_stderr() { 1 } else { 0 });
        }
    };
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(1)
        }
    }
}
