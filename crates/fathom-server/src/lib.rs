//! The server room: a continuous-batching scheduler over the engine's KV
//! block pool, with a prefix cache, behind OpenAI-compatible HTTP routes.

pub mod api;
mod bare_string;
pub mod constraint;
pub mod gbnf;
pub mod gemma4;
pub mod http;
pub mod job;
pub mod logprobs;
pub mod masks;
pub mod metrics;
pub mod reasoning;
pub mod scheduler;
pub mod stats;
mod string_format;
pub mod tools;
pub mod wire;

pub use job::{Event, FinishReason, Job, Logprobs, SubmitError};
pub use scheduler::{Scheduler, SchedulerConfig};
pub use stats::SchedulerStats;

/// Environment variables `fathom serve` reads (through its flags), with
/// their documented defaults: checked against
/// `docs/environment-variables.md`.
pub const ENV_VARS: &[(&str, &str)] = &[
    ("FATHOM_HOST", "127.0.0.1"),
    ("FATHOM_PORT", "8080"),
    ("FATHOM_PARALLEL", "4"),
    (
        "FATHOM_CTX_SIZE",
        "the model's trained context, at most 8192",
    ),
    ("FATHOM_KV_CACHE_BUDGET", "auto"),
    ("FATHOM_PROMPT_CACHE", "auto"),
    ("FATHOM_API_KEY", "unset"),
    ("FATHOM_ALLOWED_ORIGINS", "unset"),
    ("FATHOM_SHUTDOWN_TIMEOUT", "30"),
    ("FATHOM_BODY_TIMEOUT", "30"),
];
