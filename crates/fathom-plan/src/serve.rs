//! The server's plan: how big the shared KV block pool and the prompt
//! cache are, read from the same terms as every other plan.
//!
//! A server holds `parallel` slots of `max_tokens` context each, plus a
//! prompt cache of finished sequences' blocks, in one pool. The pool is
//! sized here once; the scheduler never asks for more.

use fathom_spec::ModelSpec;
use serde::Serialize;

use crate::cuda::DeviceLayout;
use crate::kv::{KvGroup, KV_BLOCK_TOKENS};
use crate::placement::PlacementRequest;
use crate::size::{format_binary, parse_size};
use crate::{device, Device, MemoryPlan, PlanError, PlanInputs, Term};

/// The prompt cache is never smaller than this when it is on (`auto` or
/// a size): room for a few system prompts of a small model.
pub const DEFAULT_PROMPT_CACHE_BYTES: u64 = 32 << 20;
/// `auto` caps the prompt cache at this many full-context sequences.
pub const PROMPT_CACHE_MAX_ENTRIES: u64 = 6;

/// `--kv-cache-budget`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvBudget {
    /// What memory allows, capped by what the workload can use.
    Auto,
    /// A fixed size.
    Bytes(u64),
    /// What the workload can use, whatever memory says (`none`).
    Workload,
}

/// `--prompt-cache`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptCache {
    Auto,
    Bytes(u64),
    Off,
}

pub fn parse_kv_budget(text: &str) -> Result<KvBudget, PlanError> {
    match text.trim().to_ascii_lowercase().as_str() {
        "auto" => Ok(KvBudget::Auto),
        "none" => Ok(KvBudget::Workload),
        _ => match parse_size(text, "--kv-cache-budget") {
            Ok(Some(bytes)) => Ok(KvBudget::Bytes(bytes)),
            _ => Err(PlanError::InvalidChoice {
                what: "--kv-cache-budget".into(),
                value: text.into(),
                valid: "auto, none, or a size such as 2G".into(),
            }),
        },
    }
}

pub fn parse_prompt_cache(text: &str) -> Result<PromptCache, PlanError> {
    match text.trim().to_ascii_lowercase().as_str() {
        "auto" => Ok(PromptCache::Auto),
        "off" | "0" | "none" => Ok(PromptCache::Off),
        _ => match parse_size(text, "--prompt-cache") {
            Ok(Some(bytes)) => Ok(PromptCache::Bytes(bytes)),
            _ => Err(PlanError::InvalidChoice {
                what: "--prompt-cache".into(),
                value: text.into(),
                valid: "auto, off, or a size such as 512M".into(),
            }),
        },
    }
}

/// Request bodies held at once, and what each may take while it is read,
/// parsed and tokenized: the serve plan's `requests` term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RequestBuffers {
    /// Bodies that may be held at once, read or being processed (the
    /// server gives `--parallel`): they share `slots` x the body limit.
    pub slots: u64,
    /// Bodies parsed and tokenized at once (at most [`PROCESSING_SLOTS`]).
    pub processors: u64,
    /// The largest body (`--max-body-size`).
    pub max_body_bytes: u64,
    /// The most input bytes one token stands for (the tokenizer's longest
    /// token): tokenizing stops after context x this many bytes.
    pub max_token_bytes: u64,
}

/// Bodies parsed and tokenized at once: the work is CPU-bound and bounded
/// by the context, so more at once would only hold more memory.
pub const PROCESSING_SLOTS: u64 = 2;
/// Bytes per parsed JSON value (a 32-byte value, its slot in a growing
/// array or map, and a key), times the values a body may hold.
pub const JSON_VALUE_BYTES: u64 = 128;
/// JSON values a body may hold beyond a prompt's token ids (the server
/// refuses bodies with more before parsing them).
pub const STRUCTURE_VALUES: u64 = 16_384;
/// Copies of a body, beyond the body itself, alive while it is processed:
/// the parsed message texts, the rendered prompt and its check against
/// the template's placeholders.
pub const BODY_COPIES: u64 = 3;
/// Bytes of tokenizer work per input byte, at most: measured 105 for one
/// word as long as the limit allows (the pre-tokenizer's code points, the
/// word's merge symbols and their queue), 28 to 66 for text, digits and
/// UTF-8 (SmolLM2, `-c 512`).
pub const TOKENIZER_BYTES_PER_BYTE: u64 = 128;

/// Bytes of the constraint engine's tables per vocabulary token: the token
/// trie and its JSON slices, built once at the first constrained request
/// (measured: VmRSS grew 24.2 MB for SmolLM2's 49,152 tokens, 492 bytes a
/// token).
pub const CONSTRAINT_TRIE_BYTES_PER_TOKEN: u64 = 512;
/// Compiled constraints kept for reuse, each with its lexer.
pub const CONSTRAINT_CACHE_ENTRIES: u64 = 8;
/// Lexer states one constraint may build (the engine's limit; past it the
/// request fails).
pub const CONSTRAINT_LEXER_STATES: u64 = 4096;
/// Bytes of one lexer state, at most (llguidance documents 1 to 2 kB).
pub const CONSTRAINT_LEXER_STATE_BYTES: u64 = 2048;
/// Bytes of a constraint's parser state per generated token (Earley rows;
/// JSON schemas keep a handful of items a row).
pub const CONSTRAINT_PARSER_BYTES_PER_TOKEN: u64 = 256;

/// The stack of the server's one mask worker, the thread that computes the
/// constrained rows' token masks while a step runs (Rust's default thread
/// stack, which the hostile schemas' tests run within: 60-deep nesting, a
/// 12,000-value enum, pathological regexes).
pub const MASK_WORKER_STACK_BYTES: u64 = 2 << 20;

/// What one slot's constraint holds while it decodes `context` tokens over
/// a vocabulary of `vocab` ids: the slot's mask buffer (allocated once, at
/// start-up) and the engine's own bit set of the allowed tokens, the lexer
/// at its limit, the parser's rows.
pub fn constraint_state_bytes(vocab: u64, context: u64) -> u64 {
    vocab
        .div_ceil(32)
        .saturating_mul(4 * 2)
        .saturating_add(CONSTRAINT_LEXER_STATES * CONSTRAINT_LEXER_STATE_BYTES)
        .saturating_add(context.saturating_mul(CONSTRAINT_PARSER_BYTES_PER_TOKEN))
}

/// The serve plan's `constraints` term: the engine's tables, one state per
/// slot, the cache's compiled constraints and the mask worker's stack.
pub fn constraints_bytes(vocab: u64, context: u64, slots: u64) -> u64 {
    vocab
        .saturating_mul(CONSTRAINT_TRIE_BYTES_PER_TOKEN)
        .saturating_add(slots.saturating_mul(constraint_state_bytes(vocab, context)))
        .saturating_add(
            CONSTRAINT_CACHE_ENTRIES * CONSTRAINT_LEXER_STATES * CONSTRAINT_LEXER_STATE_BYTES,
        )
        .saturating_add(MASK_WORKER_STACK_BYTES)
}

impl RequestBuffers {
    /// No request buffers (plans that serve no HTTP).
    pub const NONE: RequestBuffers = RequestBuffers {
        slots: 0,
        processors: 0,
        max_body_bytes: 0,
        max_token_bytes: 0,
    };

    /// Bodies as they arrive: `slots` x the body limit.
    pub fn body_bytes(&self) -> u64 {
        self.slots.saturating_mul(self.max_body_bytes)
    }

    /// What processing one body may hold beyond the body, at a context of
    /// `context` tokens.
    pub fn per_processor(&self, context: u64) -> u64 {
        let copies = self.max_body_bytes.saturating_mul(BODY_COPIES);
        let values = context
            .saturating_add(STRUCTURE_VALUES)
            .saturating_mul(JSON_VALUE_BYTES);
        let tokenizer = context
            .saturating_mul(self.max_token_bytes)
            .saturating_mul(TOKENIZER_BYTES_PER_BYTE);
        let tokens = context.saturating_mul(4);
        copies
            .saturating_add(values)
            .saturating_add(tokenizer)
            .saturating_add(tokens)
    }

    pub fn bytes(&self, context: u64) -> u64 {
        self.body_bytes()
            .saturating_add(self.processors.saturating_mul(self.per_processor(context)))
    }
}

/// The plan a server runs with.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServePlan {
    /// What the engine allocates: `inputs.batch` is the number of slots,
    /// `inputs.context` the context of each, and the `kv` term is the
    /// pool (its `kv_detail` groups hold the pool's bytes).
    pub plan: MemoryPlan,
    pub kv_budget: KvBudget,
    /// Bytes of one block: `KV_BLOCK_TOKENS` positions of every
    /// full-attention layer.
    pub kv_block_bytes: u64,
    /// Blocks in the pool's full-attention groups.
    pub kv_blocks: u64,
    /// Blocks one full-context sequence needs.
    pub kv_blocks_per_sequence: u64,
    /// Bytes of the sliding-window rings, one per slot (not shareable, so
    /// not part of the block count).
    pub sliding_bytes: u64,
    /// Prompt-cache capacity in bytes and in blocks (0 when off).
    pub prompt_cache_bytes: u64,
    pub prompt_cache_blocks: u64,
    /// KV of one full-context sequence: the unit of the prompt cache.
    pub prompt_cache_entry_bytes: u64,
    /// The request buffers counted in the `requests` term.
    pub requests: RequestBuffers,
}

/// Bytes of the sliding-window rings (one per slot).
fn sliding_bytes(groups: &[KvGroup]) -> u64 {
    groups
        .iter()
        .filter(|g| g.window.is_some())
        .fold(0u64, |sum, g| sum.saturating_add(g.bytes))
}

/// Blocks one full-context sequence holds in the full-attention groups.
fn full_blocks_per_sequence(groups: &[KvGroup]) -> u64 {
    groups
        .iter()
        .find(|g| g.window.is_none())
        .map_or(0, |g| g.blocks_per_sequence)
}

fn full_block_bytes(groups: &[KvGroup]) -> u64 {
    groups
        .iter()
        .filter(|g| g.window.is_none())
        .fold(0u64, |sum, g| {
            sum.saturating_add(
                g.layers
                    .saturating_mul(KV_BLOCK_TOKENS)
                    .saturating_mul(g.bytes_per_token_per_layer),
            )
        })
}

/// Prompt-cache capacity for `auto`: an entry is one full-context
/// sequence's KV; the ceiling is a quarter of a batch-1 plan's slack;
/// capacity is the smaller of six entries and the ceiling, at least one
/// entry when an entry is at most half the slack, and never below
/// [`DEFAULT_PROMPT_CACHE_BYTES`].
pub fn auto_prompt_cache_bytes(entry: u64, batch1_slack: u64) -> u64 {
    let ceiling = batch1_slack / 4;
    let mut capacity = entry.saturating_mul(PROMPT_CACHE_MAX_ENTRIES).min(ceiling);
    if entry <= batch1_slack / 2 {
        capacity = capacity.max(entry);
    }
    capacity.max(DEFAULT_PROMPT_CACHE_BYTES)
}

impl ServePlan {
    /// `inputs.batch` is the number of parallel slots and
    /// `inputs.context` the context of each.
    pub fn new(
        spec: &ModelSpec,
        inputs: PlanInputs,
        kv_budget: KvBudget,
        prompt_cache: PromptCache,
    ) -> Result<ServePlan, PlanError> {
        ServePlan::with_requests(
            spec,
            inputs,
            kv_budget,
            prompt_cache,
            RequestBuffers::NONE,
            1,
        )
    }

    /// [`ServePlan::new`] with a `requests` term for the HTTP side's
    /// request buffers (when `requests.slots` > 0), counted before the
    /// `auto` KV pool takes what memory leaves. On a discrete GPU the
    /// bodies are host memory: the term goes to the host budget, and the
    /// pool is what the device's memory leaves. Over `devices` CUDA
    /// devices (tensor parallelism) every figure is one device's: each
    /// holds a share of every block's KV heads, and the pool's blocks are
    /// the same on each.
    pub fn with_requests(
        spec: &ModelSpec,
        inputs: PlanInputs,
        kv_budget: KvBudget,
        prompt_cache: PromptCache,
        requests: RequestBuffers,
        devices: u64,
    ) -> Result<ServePlan, PlanError> {
        let batch1 = MemoryPlan::with_tensor_parallel(
            spec,
            PlanInputs {
                batch: 1,
                ..inputs.clone()
            },
            devices,
        )?;
        let mut base = MemoryPlan::with_tensor_parallel(spec, inputs, devices)?;
        base.add_request_terms(&requests, spec.vocab);
        let block_bytes = full_block_bytes(&base.kv_detail);
        let sliding_bytes = sliding_bytes(&base.kv_detail);
        let per_sequence = full_blocks_per_sequence(&base.kv_detail);
        let entry = batch1.kv_bytes;
        let prompt_cache_bytes = match prompt_cache {
            // A linear-attention layer's state after a prefix is not in
            // the KV blocks a prompt cache keeps, so a hybrid model cannot
            // resume from them: no cache rather than a wrong state.
            _ if spec.linear.is_some() => 0,
            PromptCache::Off => 0,
            PromptCache::Bytes(b) => b.max(DEFAULT_PROMPT_CACHE_BYTES),
            PromptCache::Auto => auto_prompt_cache_bytes(entry, batch1.slack_bytes),
        };
        let blocks_of = |bytes: u64| bytes.checked_div(block_bytes).unwrap_or(0);
        let prompt_cache_blocks = blocks_of(prompt_cache_bytes);
        let workload_blocks = per_sequence
            .saturating_mul(base.inputs.batch)
            .saturating_add(prompt_cache_blocks);
        let mut kv_blocks = match kv_budget {
            KvBudget::Workload => workload_blocks,
            KvBudget::Bytes(bytes) => blocks_of(bytes.saturating_sub(sliding_bytes)),
            KvBudget::Auto => {
                // Everything but weights and KV, then what is left, as
                // weights + KV, undoing the headroom factor.
                let weights_and_kv = base.weights_bytes.saturating_add(base.kv_bytes);
                let others = base
                    .total_bytes
                    .saturating_sub(scaled(weights_and_kv, base.headroom_factor));
                let left = base.available_bytes.saturating_sub(others);
                let unscaled = (left as f64 / base.headroom_factor).floor() as u64;
                let kv = unscaled
                    .saturating_sub(base.weights_bytes)
                    .saturating_sub(sliding_bytes);
                blocks_of(kv).min(workload_blocks)
            }
        };
        if block_bytes > 0 && kv_blocks == 0 {
            return Err(PlanError::InvalidInput {
                what: "the KV pool".into(),
                value: "0 blocks".into(),
                expected: format!(
                    "each block holds {} tokens in {}; lower --ctx-size or --parallel, use --kv-dtype q8_0, raise --memory, or set --kv-cache-budget to a size",
                    KV_BLOCK_TOKENS,
                    format_binary(block_bytes)
                ),
            });
        }
        let mut plan = base.clone().with_kv_pool(kv_blocks, &kv_budget);
        // On a GPU the pool's regions are carved from the one allocation,
        // whose alignment and 2 MiB rounding move with the pool: an auto
        // pool that overshot is the most blocks that fit (total grows with
        // the blocks, so by bisection), at least one.
        if kv_budget == KvBudget::Auto && !plan.fits && kv_blocks > 1 {
            let (mut lo, mut hi) = (1, kv_blocks - 1);
            while lo < hi {
                let mid = lo + (hi - lo).div_ceil(2);
                if base.clone().with_kv_pool(mid, &kv_budget).fits {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            kv_blocks = lo;
            plan = base.clone().with_kv_pool(kv_blocks, &kv_budget);
        }
        Ok(ServePlan {
            plan,
            kv_budget,
            kv_block_bytes: block_bytes,
            kv_blocks,
            kv_blocks_per_sequence: per_sequence,
            sliding_bytes,
            prompt_cache_bytes,
            prompt_cache_blocks,
            prompt_cache_entry_bytes: entry,
            requests,
        })
    }
}

impl ServePlan {
    /// The serve plan of a model placed between the GPU and the host
    /// (`fathom serve --device cuda` when the model does not fit, or with
    /// placement flags): the placement is chosen for the workload (every
    /// slot at its full context), and the pool is that workload on both
    /// sides, each side holding its layers' share of every block; no
    /// prompt cache, so no block outlives its sequence.
    pub fn placed(
        spec: &ModelSpec,
        inputs: PlanInputs,
        request: &PlacementRequest,
        requests: RequestBuffers,
    ) -> Result<ServePlan, PlanError> {
        let mut plan = MemoryPlan::with_placement(spec, inputs, request)?;
        plan.add_request_terms(&requests, spec.vocab);
        let whole = crate::kv::plan(
            spec,
            plan.inputs.context,
            plan.inputs.batch,
            plan.inputs.kv_dtype,
        );
        let per_sequence = full_blocks_per_sequence(&whole.groups);
        Ok(ServePlan {
            kv_budget: KvBudget::Workload,
            kv_block_bytes: full_block_bytes(&plan.kv_detail),
            kv_blocks: per_sequence.saturating_mul(plan.inputs.batch),
            kv_blocks_per_sequence: per_sequence,
            sliding_bytes: sliding_bytes(&plan.kv_detail),
            prompt_cache_bytes: 0,
            prompt_cache_blocks: 0,
            prompt_cache_entry_bytes: 0,
            requests,
            plan,
        })
    }
}

/// weights + KV times the headroom factor, as the plan rounds it.
pub(crate) fn scaled(bytes: u64, factor: f64) -> u64 {
    if factor == 1.0 {
        bytes
    } else {
        (bytes as f64 * factor).ceil() as u64
    }
}

impl MemoryPlan {
    /// The HTTP side's request buffers (when `requests.slots` > 0) and
    /// the constraint engine's state, as host terms.
    fn add_request_terms(&mut self, requests: &RequestBuffers, vocab: u64) {
        if requests.slots == 0 {
            return;
        }
        let (context, slots) = (self.inputs.context, self.inputs.batch);
        self.add_host_term(Term {
            name: "requests",
            bytes: requests.bytes(context),
            derivation: format!(
                "{} bodies of up to {} + {} parsed and tokenized at once x {} ({BODY_COPIES} copies, {} JSON values, {} tokens of up to {} bytes)",
                requests.slots,
                format_binary(requests.max_body_bytes),
                requests.processors,
                format_binary(requests.per_processor(context)),
                context.saturating_add(STRUCTURE_VALUES),
                context,
                requests.max_token_bytes
            ),
        });
        // Structured output and tool calls: what constrained decoding holds.
        self.add_host_term(Term {
            name: "constraints",
            bytes: constraints_bytes(vocab, context, slots),
            derivation: format!(
                "{vocab} tokens x {CONSTRAINT_TRIE_BYTES_PER_TOKEN} B (token trie) + {slots} slots x {} (mask, {CONSTRAINT_LEXER_STATES} lexer states, {context} tokens of parser rows) + {CONSTRAINT_CACHE_ENTRIES} cached lexers + {} mask worker stack",
                format_binary(constraint_state_bytes(vocab, context)),
                format_binary(MASK_WORKER_STACK_BYTES),
            ),
        });
    }

    /// Adds a term of host memory outside weights and KV, and recomputes
    /// the totals: a discrete GPU's host budget takes it, else the plan.
    fn add_host_term(&mut self, term: Term) {
        if let Some(host) = &mut self.host {
            host.total_bytes = host.total_bytes.saturating_add(term.bytes);
            host.fits =
                self.inputs.host_available.is_none() || host.total_bytes <= host.available_bytes;
            host.terms.push(term);
            return;
        }
        self.total_bytes = self.total_bytes.saturating_add(term.bytes);
        self.fits = self.total_bytes <= self.available_bytes;
        self.slack_bytes = self.available_bytes.saturating_sub(self.total_bytes);
        self.overflow_bytes = self.total_bytes.saturating_sub(self.available_bytes);
        self.terms.push(term);
    }

    /// This plan with its full-attention KV groups holding `blocks` blocks
    /// each (sliding groups keep one ring per sequence), and every total
    /// recomputed.
    fn with_kv_pool(mut self, blocks: u64, budget: &KvBudget) -> MemoryPlan {
        let old_weights_and_kv = self.weights_bytes.saturating_add(self.kv_bytes);
        let old_backend = self.backend_bytes;
        for g in self.kv_detail.iter_mut().filter(|g| g.window.is_none()) {
            g.bytes = g
                .layers
                .saturating_mul(KV_BLOCK_TOKENS)
                .saturating_mul(g.bytes_per_token_per_layer)
                .saturating_mul(blocks);
        }
        self.kv_bytes = self
            .kv_detail
            .iter()
            .fold(0u64, |sum, g| sum.saturating_add(g.bytes));
        // A GPU carves the pool from its one allocation: the backend term
        // (alignment, the allocation's rounding) follows the pool's regions.
        if self.inputs.device == Device::Cuda {
            let resident = self.weights_bytes.saturating_add(self.converted_bytes);
            // The step's rows are the plan's: its expert grouping stands, as
            // does the room for streamed host matrices.
            let (moe, streamed) = self
                .device_layout
                .as_ref()
                .map_or_else(Default::default, |l| (l.moe, l.streamed.bytes));
            let layout = DeviceLayout::new(
                resident,
                &self.activation_detail,
                &self.kv_detail,
                self.recurrent_bytes,
                moe,
                streamed,
            );
            let backend = device::backend(Device::Cuda, None, Some((&layout, resident)));
            self.device_layout = Some(layout);
            self.backend_bytes = backend.fixed_bytes;
            if let Some(term) = self.terms.iter_mut().find(|t| t.name == "backend") {
                term.bytes = backend.fixed_bytes;
                term.derivation = backend.fixed_derivation;
            }
        }
        let weights_and_kv = self.weights_bytes.saturating_add(self.kv_bytes);
        let scaled_new = scaled(weights_and_kv, self.headroom_factor);
        let others = self
            .total_bytes
            .saturating_sub(scaled(old_weights_and_kv, self.headroom_factor))
            .saturating_sub(old_backend)
            .saturating_add(self.backend_bytes);
        self.total_bytes = others.saturating_add(scaled_new);
        self.headroom_bytes = (i128::from(scaled_new) - i128::from(weights_and_kv))
            .clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
        self.fits = self.total_bytes <= self.available_bytes;
        self.slack_bytes = self.available_bytes.saturating_sub(self.total_bytes);
        self.overflow_bytes = self.total_bytes.saturating_sub(self.available_bytes);
        let budget = match budget {
            KvBudget::Auto => "auto: what memory leaves, at most the workload".to_string(),
            KvBudget::Bytes(b) => format!("--kv-cache-budget {}", format_binary(*b)),
            KvBudget::Workload => "none: slots x context + prompt cache".to_string(),
        };
        let kv_bytes = self.kv_bytes;
        let headroom = self.headroom_bytes;
        for term in &mut self.terms {
            match term.name {
                "kv" => {
                    term.bytes = kv_bytes;
                    term.derivation = format!(
                        "shared pool of {blocks} blocks of {KV_BLOCK_TOKENS} tokens ({budget})"
                    );
                }
                "headroom" => term.bytes = headroom.unsigned_abs(),
                _ => {}
            }
        }
        self.terms.retain(|t| t.name != "headroom" || t.bytes != 0);
        if headroom != 0 && !self.terms.iter().any(|t| t.name == "headroom") {
            self.terms.push(Term {
                name: "headroom",
                bytes: headroom.unsigned_abs(),
                derivation: format!("(weights + kv) x ({} - 1)", self.headroom_factor),
            });
        }
        self
    }
}
