//! Counters the scheduler keeps and `/metrics` reads: plain atomics, so a
//! scrape never waits for a step.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct SchedulerStats {
    /// Jobs waiting for a slot or for KV blocks.
    pub queue_depth: AtomicU64,
    /// Sequences being prefilled or decoded.
    pub running: AtomicU64,
    /// Blocks in the KV pool (fixed at start).
    pub kv_blocks_total: AtomicU64,
    /// Blocks held by running sequences.
    pub kv_blocks_used: AtomicU64,
    /// Blocks held only by the prefix cache (free to evict).
    pub kv_blocks_cached: AtomicU64,
    /// 1 when finished prompts' blocks are kept for reuse; 0 when the
    /// cache is off, or impossible (a hybrid model's recurrent state is
    /// not in the blocks).
    pub prefix_cache_enabled: AtomicU64,
    /// Jobs that reused at least one cached prefix block.
    pub prefix_cache_hits: AtomicU64,
    /// Prompt tokens whose KV came from the prefix cache.
    pub prefix_cache_hit_tokens: AtomicU64,
    /// Prompt tokens of every job started.
    pub prompt_tokens: AtomicU64,
    /// Tokens generated.
    pub generated_tokens: AtomicU64,
    /// Sequences preempted (blocks freed, re-queued, recomputed).
    pub preemptions: AtomicU64,
    /// Jobs decoded under a constraint (structured output, tool calls).
    pub constrained_jobs: AtomicU64,
    /// Of those, the ones whose compiled constraint came from the cache.
    pub constraint_cache_hits: AtomicU64,
    /// Token masks computed, and the microseconds they took.
    pub constraint_masks: AtomicU64,
    pub constraint_mask_micros: AtomicU64,
    /// Microseconds spent compiling constraints (or cloning cached ones).
    pub constraint_compile_micros: AtomicU64,
}

impl SchedulerStats {
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    pub(crate) fn set(counter: &AtomicU64, value: u64) {
        counter.store(value, Ordering::Relaxed);
    }

    pub(crate) fn add(counter: &AtomicU64, value: u64) {
        counter.fetch_add(value, Ordering::Relaxed);
    }
}
