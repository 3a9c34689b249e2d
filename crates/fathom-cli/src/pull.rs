//! `fathom pull`: download a hub model into fathom's store, and where a
//! MODEL argument leads.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use fathom_hub::HubConfig;

#[derive(Args)]
pub struct PullArgs {
    /// A hub id: org/name, org/name:QUANT or org/name@REVISION (see docs/models.md).
    pub model: String,
}

fn hub_config() -> HubConfig {
    HubConfig::from_env(
        |name| std::env::var(name).ok(),
        std::env::var_os("HOME").map(PathBuf::from),
    )
}

/// A MODEL argument as a local path: an existing file or directory, or a
/// hub id found in the Hugging Face cache or fathom's store.
pub fn resolve(model: &str) -> Result<PathBuf> {
    Ok(fathom_hub::resolve(model, &hub_config())?)
}

pub fn run(args: &PullArgs) -> Result<ExitCode> {
    let mut stderr = std::io::stderr();
    let path = fathom_hub::download(&args.model, &hub_config(), &mut |done, total| {
        let _ = match total {
            Some(total) => write!(stderr, "\r{done} / {total} bytes"),
            None => write!(stderr, "\r{done} bytes"),
        };
    })?;
    eprintln!();
    println!("{}", path.display());
    Ok(ExitCode::SUCCESS)
}
