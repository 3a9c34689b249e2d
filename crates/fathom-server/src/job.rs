//! What the HTTP side and the scheduler exchange: a request to generate,
//! and the events that come back while it runs.

use fathom_engine::{SamplingParams, TokenLogprob};

use crate::constraint::ConstraintState;
use tokio::sync::mpsc::UnboundedSender;

/// One generation request, already tokenized and checked against the
/// per-slot context (prompt + max_tokens ≤ context) by the HTTP side.
pub struct Job {
    pub prompt: Vec<u32>,
    /// Most tokens to generate: at least 1, or 0 to only score the prompt
    /// (with `logprobs.prompt`).
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Stop strings: generation ends before the first match, which is not sent.
    pub stop: Vec<String>,
    /// Log-probabilities to report; `None`: none.
    pub logprobs: Option<Logprobs>,
    /// The constraint the answer must satisfy (a JSON schema, a grammar),
    /// compiled: each sampled token is drawn from its mask.
    pub constraint: Option<Box<ConstraintState>>,
    /// Where the scheduler sends this job's events. Dropping the receiver
    /// (the client went away) cancels the job and frees its KV blocks
    /// within one step.
    pub events: UnboundedSender<Event>,
}

/// What log-probabilities a job reports: each generated token's, and
/// with `prompt` also the prompt's (an echo), with the `top` most likely
/// tokens at each position. They are the model's distribution
/// ([`fathom_engine::logprob`]), before bias, penalties and sampling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Logprobs {
    pub top: usize,
    pub prompt: bool,
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

/// Events of one job, in order: `PromptLogprobs` when asked for, any
/// number of `Text`, then exactly one of `Finished` or `Failed`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The prompt's tokens: the first (which nothing predicts, so it has
    /// no logprob) and each later one's logprob at its position.
    PromptLogprobs { first: u32, rest: Vec<TokenLogprob> },
    /// Generated text, whole UTF-8 and with stop strings held back, with
    /// the logprobs (when asked for) of the tokens it completes: a token
    /// whose text is held back (part of a character, or maybe of a stop
    /// string) comes with the text that releases it; tokens of a matched
    /// stop string and the end-of-generation token are not reported.
    Text {
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    Finished {
        reason: FinishReason,
        /// The constraint's mask time over the answer, and how many masks.
        constraint: Option<ConstraintStats>,
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

/// What a constrained job's masks cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConstraintStats {
    pub masks: u64,
    pub mask_seconds: f64,
    pub compile_seconds: f64,
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
