//! What the HTTP side and the scheduler exchange: a request to generate,
//! and the events that come back while it runs.

use fathom_engine::SamplingParams;
use tokio::sync::mpsc::UnboundedSender;

/// One generation request, already tokenized and checked against the
/// per-slot context (prompt + max_tokens ≤ context) by the HTTP side.
pub struct Job {
    pub prompt: Vec<u32>,
    /// Most tokens to generate (at least 1).
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Stop strings: generation ends before the first match, which is not sent.
    pub stop: Vec<String>,
    /// Where the scheduler sends this job's events. Dropping the receiver
    /// (the client went away) cancels the job and frees its KV blocks
    /// within one step.
    pub events: UnboundedSender<Event>,
}

/// Why a job finished, as OpenAI's `finish_reason` spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Events of one job, in order: any number of `Text`, then exactly one of
/// `Finished` or `Failed`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Generated text, whole UTF-8 and with stop strings held back.
    Text(String),
    Finished {
        reason: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
        /// Prompt tokens whose KV came from the prefix cache.
        cached_tokens: usize,
    },
    /// The engine failed on this job (a message for a 500 response).
    Failed(String),
    /// The server began shutting down while the job waited for a slot:
    /// it never ran (a 503 response).
    ShuttingDown,
}

/// Why the scheduler did not take a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The waiting queue is full: answer 503 with `Retry-After`.
    #[error("the server is busy: the request queue is full")]
    QueueFull,
    /// The scheduler is stopping: answer 503.
    #[error("the server is shutting down")]
    ShuttingDown,
}
