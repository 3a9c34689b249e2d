//! The engine room: turns a ModelSpec and its memory plan into tokens.
//!
//! It runs the forward pass on a backend (`fathom-backend`) that holds
//! what the plan lists for its device — weights, KV storage, the
//! activation arena — and keeps the host side itself: KV block
//! bookkeeping, the step planner, sampling and the tokenizer. Everything
//! is allocated once at load; nothing grows with tokens while generating.

mod checked_pick;
mod engine;
mod error;
mod kv;
pub mod logprob;
mod mask;
mod model;
mod names;
mod prefix;
mod sampler;
mod step;
mod stop;
mod weights;

pub use engine::{load_tokenizer, Engine, GenerateStats, ScoreRows, StopReason};
pub use error::EngineError;
pub use fathom_tokenizer::{ChatTemplate, Message, Tokenizer};
pub use kv::{BlockCounts, SeqKv};
pub use logprob::TokenLogprob;
pub use mask::TokenMask;
pub use model::{check_runs, Segment};
pub use sampler::{Sampler, SamplingParams};
pub use step::plan_step;
pub use stop::OutputText;
