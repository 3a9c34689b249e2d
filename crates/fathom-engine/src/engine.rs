//! A loaded model ready to generate: weights mapped, the KV pool, the
//! activation arena and the worker pool allocated from the plan, once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fathom_checkpoint::Checkpoint;
use fathom_kernels::Pool;
use fathom_plan::MemoryPlan;
use fathom_spec::ModelSpec;
use fathom_tokenizer::Tokenizer;

use crate::arena::Arena;
use crate::kv::{BlockCounts, KvPool, SeqKv};
use crate::model::{Model, Segment};
use crate::sampler::Sampler;
use crate::stop::OutputText;
use crate::EngineError;

pub struct Engine {
    pub model: Model,
    /// Shared with whoever tokenizes requests (the server's connections).
    pub tokenizer: Arc<Tokenizer>,
    pub plan: MemoryPlan,
    pool: Pool,
    kv: KvPool,
    arena: Arena,
    /// Token ids of each sequence of a batch, sized for the plan's context
    /// (the plan's `token_ids`).
    histories: Vec<Vec<u32>>,
}

/// The checkpoint's tokenizer: GGUF metadata, or the HF directory's
/// `tokenizer.json` and `tokenizer_config.json`.
pub fn load_tokenizer(checkpoint: &Checkpoint) -> Result<Tokenizer, EngineError> {
    Ok(match checkpoint {
        Checkpoint::Gguf(file) => Tokenizer::from_gguf(file)?,
        Checkpoint::Hf(hf) => Tokenizer::from_hf_dir(&hf.dir)?,
    })
}

/// One sequence of [`Engine::generate_batch`] in flight.
struct Live {
    index: usize,
    kv: SeqKv,
    /// Prompt tokens prefilled so far.
    done: usize,
    /// The sampled token not yet emitted.
    next: u32,
    generated: usize,
    text: OutputText,
    reason: Option<StopReason>,
}

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// The requested number of tokens.
    Length,
    /// The callback asked to stop (a client went away).
    Cancelled,
}

#[derive(Debug, Clone)]
pub struct GenerateStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill: Duration,
    pub decode: Duration,
    pub reason: StopReason,
}

impl Engine {
    /// Maps the weights and allocates exactly what `plan` lists.
    pub fn load(
        checkpoint: &Checkpoint,
        spec: ModelSpec,
        plan: MemoryPlan,
        tokenizer: Tokenizer,
    ) -> Result<Self, EngineError> {
        let model = Model::load(checkpoint, spec)?;
        let i = &plan.inputs;
        let kv = KvPool::new(&plan.kv_detail, i.kv_dtype, &model.layer_groups());
        let step = plan
            .activation_detail
            .iter()
            .find(|b| b.name == "residual")
            .map_or(1, |b| b.rows);
        let arena = Arena::new(step, &plan.activation_detail);
        let pool = Pool::new(i.threads as usize);
        let histories = (0..i.batch)
            .map(|_| Vec::with_capacity(i.max_tokens as usize))
            .collect();
        Ok(Engine {
            model,
            tokenizer: Arc::new(tokenizer),
            pool,
            kv,
            arena,
            histories,
            plan,
        })
    }

    /// Runs `prompt` and then samples up to `max_new` tokens, passing the
    /// text to `on_text` as it becomes whole UTF-8; `on_text` returns false
    /// to cancel.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        sampler: &mut Sampler,
        stop: &[String],
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<GenerateStats, EngineError> {
        self.generate_batch(
            &[prompt],
            max_new,
            std::slice::from_mut(sampler),
            stop,
            &mut |_, text| on_text(text),
        )
    }

    /// Runs several prompts as sequences decoded together (at most the
    /// plan's batch): prompts are prefilled in chunks of the plan's step,
    /// then every live sequence advances one token per step. `on_text`
    /// gets each sequence's index and text; returning false stops that
    /// sequence. The stats add up all sequences; `reason` is the first's.
    pub fn generate_batch(
        &mut self,
        prompts: &[&[u32]],
        max_new: usize,
        samplers: &mut [Sampler],
        stop: &[String],
        on_text: &mut dyn FnMut(usize, &str) -> bool,
    ) -> Result<GenerateStats, EngineError> {
        assert!(
            prompts.len() == samplers.len() && prompts.len() <= self.histories.len(),
            "{} prompts, {} samplers, batch {}",
            prompts.len(),
            samplers.len(),
            self.histories.len()
        );
        let mut live = Vec::with_capacity(prompts.len());
        for (i, prompt) in prompts.iter().enumerate() {
            let kv = self.sequence(prompt.len(), max_new)?;
            self.histories[i].clear();
            self.histories[i].extend_from_slice(prompt);
            live.push(Live {
                index: i,
                kv,
                done: 0,
                next: 0,
                generated: 0,
                text: OutputText::new(stop.to_vec()),
                reason: (max_new == 0).then_some(StopReason::Length),
            });
        }
        let started = Instant::now();
        // Prefill, packing chunks of several prompts into one step; a
        // sequence samples its first token as soon as its prompt is in.
        while live.iter().any(|l| l.done < prompts[l.index].len()) {
            let mut budget = self.arena.step_tokens;
            let mut segments = Vec::with_capacity(live.len());
            let mut rows = Vec::with_capacity(live.len());
            for l in live.iter_mut() {
                let prompt = prompts[l.index];
                let n = (prompt.len() - l.done).min(budget);
                if n == 0 {
                    continue;
                }
                budget -= n;
                segments.push(Segment {
                    seq: &mut l.kv,
                    tokens: &prompt[l.done..l.done + n],
                });
                l.done += n;
                rows.push((l.index, l.done == prompt.len()));
            }
            self.model
                .forward(&self.pool, &mut self.arena, &mut self.kv, &mut segments)?;
            drop(segments);
            for (row, &(index, complete)) in rows.iter().enumerate() {
                if complete {
                    let l = live.iter_mut().find(|l| l.index == index).expect("live");
                    l.next = self.sample_batch(row, &mut samplers[index], index);
                }
            }
        }
        let prefill = started.elapsed();
        let decode_start = Instant::now();
        loop {
            // Emit each sequence's pending token; those that go on decode it.
            for l in live.iter_mut().filter(|l| l.reason.is_none()) {
                l.generated += 1;
                let token = l.next;
                if self.tokenizer.end_of_generation(token) {
                    l.reason = Some(StopReason::Stop);
                    continue;
                }
                self.histories[l.index].push(token);
                let (emit, hit) = l.text.push(&self.tokenizer, token);
                if !emit.is_empty() && !on_text(l.index, emit) {
                    l.reason = Some(StopReason::Cancelled);
                } else if hit {
                    l.reason = Some(StopReason::Stop);
                } else if l.generated >= max_new {
                    l.reason = Some(StopReason::Length);
                }
            }
            let mut segments = Vec::with_capacity(live.len());
            let mut rows = Vec::with_capacity(live.len());
            for l in live.iter_mut().filter(|l| l.reason.is_none()) {
                segments.push(Segment {
                    seq: &mut l.kv,
                    tokens: std::slice::from_ref(&l.next),
                });
                rows.push(l.index);
            }
            if segments.is_empty() {
                break;
            }
            self.model
                .forward(&self.pool, &mut self.arena, &mut self.kv, &mut segments)?;
            drop(segments);
            for (row, &index) in rows.iter().enumerate() {
                let next = self.sample_batch(row, &mut samplers[index], index);
                let l = live.iter_mut().find(|l| l.index == index).expect("live");
                l.next = next;
            }
        }
        for l in live.iter_mut() {
            if l.reason == Some(StopReason::Length) {
                let tail = l.text.finish();
                if !tail.is_empty() {
                    on_text(l.index, &tail);
                }
            }
            self.kv.release(&mut l.kv);
        }
        Ok(GenerateStats {
            prompt_tokens: prompts.iter().map(|p| p.len()).sum(),
            generated_tokens: live.iter().map(|l| l.generated).sum(),
            prefill,
            decode: decode_start.elapsed(),
            reason: live[0].reason.unwrap_or(StopReason::Length),
        })
    }

    /// Samples sequence `index` of a batch from logits row `row`.
    fn sample_batch(&mut self, row: usize, sampler: &mut Sampler, index: usize) -> u32 {
        // Moved out and back (no copy) so the history and the logits can
        // be borrowed together.
        let history = std::mem::take(&mut self.histories[index]);
        let token = self.sample(row, sampler, &history);
        self.histories[index] = history;
        token
    }

    /// Samples from logits row `row` of the last step (segment `row`),
    /// with `history` (the sequence so far) for the penalties.
    pub fn sample(&mut self, row: usize, sampler: &mut Sampler, history: &[u32]) -> u32 {
        let vocab = self.model.spec.vocab as usize;
        let logits = &mut self.arena.logits[row * vocab..(row + 1) * vocab];
        if sampler.params.ignore_eos {
            for id in self.tokenizer.end_of_generation_ids() {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        sampler.sample(logits, history, &mut self.arena.sampler)
    }

    /// Runs one step of several sequences (see [`Model::forward`]): at
    /// most [`Engine::step_tokens`] tokens and the plan's batch of
    /// segments, each with blocks reserved for its tokens.
    pub fn step(&mut self, segments: &mut [Segment]) -> Result<(), EngineError> {
        self.model
            .forward(&self.pool, &mut self.arena, &mut self.kv, segments)
    }

    /// Tokens one step may run (the plan's prefill chunk).
    pub fn step_tokens(&self) -> usize {
        self.arena.step_tokens
    }

    /// A sequence for `tokens`, starting after the longest cached prefix.
    pub fn start_sequence(&mut self, tokens: &[u32]) -> SeqKv {
        self.kv.start_sequence(tokens)
    }

    /// Blocks for `seq` up to position `end`; false when the pool is out.
    pub fn reserve(&mut self, seq: &mut SeqKv, end: usize) -> bool {
        self.kv.reserve(seq, end)
    }

    /// Names `seq`'s newly filled blocks for prefix reuse.
    pub fn commit(&mut self, seq: &mut SeqKv, tokens: &[u32]) {
        self.kv.commit(seq, tokens)
    }

    pub fn release(&mut self, seq: &mut SeqKv) {
        self.kv.release(seq)
    }

    /// Turns on the prefix cache (see [`KvPool::enable_prefix_cache`]).
    pub fn enable_prefix_cache(&mut self, capacity_blocks: usize) -> bool {
        self.kv.enable_prefix_cache(capacity_blocks)
    }

    pub fn block_counts(&self) -> BlockCounts {
        self.kv.block_counts()
    }

    /// Times `n` single-token decode steps in a fresh sequence, feeding each
    /// step's argmax back, as llama-bench's tg test does; returns the time
    /// of the decode steps alone.
    pub fn time_decode(&mut self, first: u32, n: usize) -> Result<Duration, EngineError> {
        let mut seq = self.sequence(n, 0)?;
        let vocab = self.model.spec.vocab as usize;
        let mut token = first;
        let started = Instant::now();
        for _ in 0..n {
            self.run_one(&mut seq, &[token])?;
            token = fathom_kernels::ops::argmax(&self.arena.logits[..vocab]) as u32;
        }
        let elapsed = started.elapsed();
        self.kv.release(&mut seq);
        Ok(elapsed)
    }

    /// One step of one sequence.
    fn run_one(&mut self, seq: &mut SeqKv, tokens: &[u32]) -> Result<(), EngineError> {
        self.step(&mut [Segment { seq, tokens }])
    }

    /// A fresh sequence with blocks for `prompt + generate` tokens, which
    /// must fit the planned context.
    fn sequence(&mut self, prompt: usize, generate: usize) -> Result<SeqKv, EngineError> {
        let context = self.plan.inputs.max_tokens as usize;
        if prompt == 0 || prompt + generate > context {
            return Err(EngineError::ContextExceeded {
                prompt,
                generate,
                context,
                trained: self.model.spec.context_length,
            });
        }
        let mut seq = self.kv.new_sequence();
        let reserved = self.kv.reserve(&mut seq, prompt + generate);
        assert!(reserved, "the planned pool holds one full-context sequence");
        Ok(seq)
    }

    /// The last (first of a batch) sequence's tokens: its prompt and what
    /// was generated.
    pub fn tokens(&self) -> &[u32] {
        &self.histories[0]
    }

    /// Runs `tokens` through a fresh sequence and returns the last position's
    /// logits (for checking against a reference implementation).
    pub fn logits(&mut self, tokens: &[u32]) -> Result<&[f32], EngineError> {
        let mut seq = self.sequence(tokens.len(), 0)?;
        for chunk in tokens.chunks(self.arena.step_tokens) {
            self.run_one(&mut seq, chunk)?;
        }
        self.kv.release(&mut seq);
        Ok(&self.arena.logits[..self.model.spec.vocab as usize])
    }
}
