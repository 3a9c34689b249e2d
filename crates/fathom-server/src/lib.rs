//! The server room: a continuous-batching scheduler over the engine's KV
//! block pool, with a prefix cache, behind OpenAI-compatible HTTP routes.

pub mod job;
pub mod scheduler;
pub mod stats;

pub use job::{Event, FinishReason, Job, SubmitError};
pub use scheduler::{Scheduler, SchedulerConfig};
pub use stats::SchedulerStats;
