//! The engine room: turns a ModelSpec and its memory plan into tokens.
//!
//! It allocates what the plan lists — the KV block pool, the activation
//! arena, the sampler's candidates — once at load, reads weights in place
//! through the mmap, and allocates nothing that grows with tokens while
//! generating.

mod arena;
mod attention;
mod engine;
mod error;
mod kv;
mod model;
mod names;
mod prefix;
mod sampler;
mod stop;
mod weights;

pub use engine::{load_tokenizer, Engine, GenerateStats, StopReason};
pub use error::EngineError;
pub use fathom_tokenizer::{ChatTemplate, Message, Tokenizer};
pub use kv::{BlockCounts, SeqKv};
pub use model::Segment;
pub use sampler::{Sampler, SamplingParams};
pub use stop::OutputText;
