//! A loaded model ready to generate: weights mapped, the KV pool, the
//! activation arena and the worker pool allocated from the plan, once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fathom_checkpoint::Checkpoint;
use fathom_kernels::Pool;
use fathom_plan::MemoryPlan;
use fathom_spec::ModelSpec;
use fathom_tokenizer::{StreamDecoder, Tokenizer};

use crate::arena::Arena;
use crate::kv::{KvPool, SeqKv};
use crate::model::Model;
use crate::sampler::Sampler;
use crate::stop::StopMatcher;
use crate::EngineError;

pub struct Engine {
    pub model: Model,
    /// Shared with whoever tokenizes requests (the server's connections).
    pub tokenizer: Arc<Tokenizer>,
    pub plan: MemoryPlan,
    pool: Pool,
    kv: KvPool,
    arena: Arena,
    /// Token ids of the sequence, sized for the plan's context.
    history: Vec<u32>,
}

/// The checkpoint's tokenizer: GGUF metadata, or the HF directory's
/// `tokenizer.json` and `tokenizer_config.json`.
pub fn load_tokenizer(checkpoint: &Checkpoint) -> Result<Tokenizer, EngineError> {
    Ok(match checkpoint {
        Checkpoint::Gguf(file) => Tokenizer::from_gguf(file)?,
        Checkpoint::Hf(hf) => Tokenizer::from_hf_dir(&hf.dir)?,
    })
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
        let kv = KvPool::new(
            &plan.kv_detail,
            i.kv_dtype,
            &model.layer_groups(),
        );
        let step = plan
            .activation_detail
            .iter()
            .find(|b| b.name == "residual")
            .map_or(1, |b| b.rows);
        let arena = Arena::new(step, &plan.activation_detail);
        let pool = Pool::new(i.threads as usize);
        let history = Vec::with_capacity(i.max_tokens as usize);
        Ok(Engine {
            model,
            tokenizer: Arc::new(tokenizer),
            pool,
            kv,
            arena,
            history,
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
        let mut seq = self.sequence(prompt.len(), max_new)?;
        self.history.clear();
        self.history.extend_from_slice(prompt);
        let started = Instant::now();
        for chunk in prompt.chunks(self.arena.step_tokens) {
            self.model
                .forward(&self.pool, &mut self.arena, &mut self.kv, &mut seq, chunk)?;
        }
        let prefill = started.elapsed();
        let decode_start = Instant::now();
        let mut decoder = StreamDecoder::new();
        let mut stops = StopMatcher::new(stop);
        let mut generated = 0;
        let mut reason = StopReason::Length;
        while generated < max_new {
            let vocab = self.model.spec.vocab as usize;
            let token = sampler.sample(
                &mut self.arena.logits[..vocab],
                &self.history,
                &mut self.arena.sampler,
            );
            generated += 1;
            if self.tokenizer.end_of_generation(token) {
                reason = StopReason::Stop;
                break;
            }
            self.history.push(token);
            let text = decoder.push(&self.tokenizer, token);
            let (emit, hit) = stops.push(text);
            if !emit.is_empty() && !on_text(emit) {
                reason = StopReason::Cancelled;
                break;
            }
            if hit {
                reason = StopReason::Stop;
                break;
            }
            if generated < max_new {
                self.model.forward(
                    &self.pool,
                    &mut self.arena,
                    &mut self.kv,
                    &mut seq,
                    &[token],
                )?;
            }
        }
        if reason == StopReason::Length {
            let rest = decoder.finish();
            let (emit, _) = stops.push(rest);
            if !emit.is_empty() {
                on_text(emit);
            }
            let tail = stops.flush();
            if !tail.is_empty() {
                on_text(&tail);
            }
        }
        self.kv.release(&mut seq);
        Ok(GenerateStats {
            prompt_tokens: prompt.len(),
            generated_tokens: generated,
            prefill,
            decode: decode_start.elapsed(),
            reason,
        })
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
            self.model.forward(
                &self.pool,
                &mut self.arena,
                &mut self.kv,
                &mut seq,
                &[token],
            )?;
            token = fathom_kernels::ops::argmax(&self.arena.logits[..vocab]) as u32;
        }
        let elapsed = started.elapsed();
        self.kv.release(&mut seq);
        Ok(elapsed)
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

    /// The last sequence's tokens: its prompt and what was generated.
    pub fn tokens(&self) -> &[u32] {
        &self.history
    }

    /// Runs `tokens` through a fresh sequence and returns the last position's
    /// logits (for checking against a reference implementation).
    pub fn logits(&mut self, tokens: &[u32]) -> Result<&[f32], EngineError> {
        let mut seq = self.sequence(tokens.len(), 0)?;
        for chunk in tokens.chunks(self.arena.step_tokens) {
            self.model
                .forward(&self.pool, &mut self.arena, &mut self.kv, &mut seq, chunk)?;
        }
        self.kv.release(&mut seq);
        Ok(&self.arena.logits[..self.model.spec.vocab as usize])
    }
}
