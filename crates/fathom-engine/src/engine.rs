//! A loaded model ready to generate: the backend holding the weights, the
//! KV storage and the activation arena, and the host-side bookkeeping, all
//! allocated from the plan, once.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fathom_backend::{Backend, Buf, KvLayout};
use fathom_checkpoint::Checkpoint;
use fathom_plan::placement::{Place, Placement};
use fathom_plan::MemoryPlan;
use fathom_spec::ModelSpec;
use fathom_tokenizer::Tokenizer;

use crate::kv::{BlockCounts, KvBlocks, SeqKv};
use crate::logprob::TokenLogprob;
use crate::mask::TokenMask;
use crate::model::{Model, Segment};
use crate::sampler::Sampler;
use crate::step::plan_step;
use crate::stop::OutputText;
use crate::EngineError;

pub struct Engine {
    pub model: Model,
    /// Shared with whoever tokenizes requests (the server's connections).
    pub tokenizer: Arc<Tokenizer>,
    pub plan: MemoryPlan,
    backend: Box<dyn Backend>,
    kv: KvBlocks,
    /// Tokens one step may run: the plan's prefill chunk.
    step_tokens: usize,
    /// Sampling candidates (the plan's `sampler` buffer).
    candidates: Vec<(u32, f32)>,
    /// Token ids of each sequence of a batch, sized for the plan's context
    /// (the plan's `token_ids`).
    histories: Vec<Vec<u32>>,
    scratch: StepScratch,
    /// The tokens `ignore_eos` bans.
    end_of_generation: Vec<u32>,
}

/// A step's token ids and each segment's last row (capacity: a step).
struct StepScratch {
    ids: Vec<u32>,
    last_rows: Vec<usize>,
    /// Rows projected to logits at once: the plan's logits rows (its batch).
    group: usize,
    /// Each segment's greedy picks from its last logits, `[plain, without
    /// the end-of-generation ids]` (`Backend::greedy`), one per batch row.
    greedy: Vec<[u32; 2]>,
}

/// Rows of one segment of a step whose logits the step hands out before
/// its own last-position logits: positions `rows` (counted within the
/// segment's tokens) of segment `segment`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScoreRows {
    pub segment: usize,
    pub rows: Range<usize>,
}

/// Projects rows `rows` of the last step's residual to logits, `group`
/// rows at a time (the plan's logits rows), and hands each row's logits
/// to `on_logits(i, logits)` with i counted from `rows.start`. Scoring
/// every position of a prompt so needs no memory beyond the plan.
fn project_rows(
    model: &Model,
    backend: &mut dyn Backend,
    scratch: &mut Vec<usize>,
    group: usize,
    rows: Range<usize>,
    on_logits: &mut dyn FnMut(usize, &[f32]),
) -> Result<(), EngineError> {
    let vocab = model.spec.vocab as usize;
    for lo in rows.clone().step_by(group) {
        scratch.clear();
        scratch.extend(lo..(lo + group).min(rows.end));
        model.project(backend, scratch);
        let n = scratch.len();
        backend.logits(n, vocab);
        if let Some(e) = backend.take_error() {
            return Err(e.into());
        }
        for (i, row) in backend.logits(n, vocab).chunks_exact(vocab).enumerate() {
            on_logits(lo - rows.start + i, row);
        }
    }
    Ok(())
}

/// Runs one step: the layers, then the logits of the `wanted` rows (see
/// [`ScoreRows`]; `on_logits(k, row, logits)` gets entry k's rows), then
/// each segment's last logits and their greedy picks (`banned`: the ids
/// `ignore_eos` bans), which are read back (a GPU synchronizes here; the
/// logits themselves only when a sampler asks for them); any device
/// failure of the step becomes an error. A function of the parts it uses,
/// so a caller may lend the segments' tokens from the engine's histories.
fn run_step(
    model: &Model,
    backend: &mut dyn Backend,
    scratch: &mut StepScratch,
    segments: &mut [Segment],
    wanted: &[ScoreRows],
    banned: &[u32],
    on_logits: &mut dyn FnMut(usize, usize, &[f32]),
) -> Result<(), EngineError> {
    model.run_layers(backend, segments, &mut scratch.ids)?;
    for (k, w) in wanted.iter().enumerate() {
        let base: usize = segments[..w.segment].iter().map(|s| s.tokens.len()).sum();
        assert!(
            w.rows.end <= segments[w.segment].tokens.len(),
            "rows {:?} of a {}-token segment",
            w.rows,
            segments[w.segment].tokens.len()
        );
        let rows = base + w.rows.start..base + w.rows.end;
        let group = scratch.group;
        project_rows(
            model,
            backend,
            &mut scratch.last_rows,
            group,
            rows,
            &mut |i, l| on_logits(k, w.rows.start + i, l),
        )?;
    }
    model.project_last(backend, segments, &mut scratch.last_rows);
    let n = segments.len();
    backend.greedy(
        n,
        model.spec.vocab as usize,
        banned,
        &mut scratch.greedy[..n],
    );
    match backend.take_error() {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
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
    prompt: usize,
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
        let host_kv = Self::host_kv_layout(&spec, &plan);
        let backend = fathom_backend::open(&plan, Self::kv_layout(&spec, &plan), host_kv)?;
        Self::load_on(checkpoint, spec, plan, tokenizer, backend)
    }

    /// The KV layout `plan` gives one device (under a placement that puts
    /// layers on the host, the device's layers only).
    pub fn kv_layout(spec: &ModelSpec, plan: &MemoryPlan) -> KvLayout {
        match split_placement(plan) {
            Some(placed) => side_kv_layout(spec, plan, placed, Place::Cuda),
            None => KvLayout {
                groups: plan.kv_detail.clone(),
                dtype: plan.inputs.kv_dtype,
                layer_groups: fathom_plan::kv::layer_groups(spec),
                recurrent: plan.recurrent_detail.clone(),
            },
        }
    }

    /// The host layers' KV layout when `plan` puts part of the model on
    /// the host.
    pub fn host_kv_layout(spec: &ModelSpec, plan: &MemoryPlan) -> Option<KvLayout> {
        split_placement(plan).map(|placed| side_kv_layout(spec, plan, placed, Place::Cpu))
    }

    /// [`Engine::load`] onto a backend built from `plan` by the caller
    /// (tests build tensor-parallel groups of CPU ranks this way).
    pub fn load_on(
        checkpoint: &Checkpoint,
        spec: ModelSpec,
        plan: MemoryPlan,
        tokenizer: Tokenizer,
        mut backend: Box<dyn Backend>,
    ) -> Result<Self, EngineError> {
        let i = &plan.inputs;
        let model = Model::load(checkpoint, spec, backend.as_mut(), split_placement(&plan))?;
        let rows = |id: Buf| {
            plan.activation_detail
                .iter()
                .find(|b| b.id == id)
                .map_or(0, |b| (b.rows * b.width) as usize)
        };
        let step_tokens = plan
            .activation_detail
            .iter()
            .find(|b| b.id == Buf::Residual)
            .map_or(1, |b| b.rows as usize);
        // The page tables cover every layer's group; under a split each
        // side stores its own layers of those groups.
        let kv_groups = match split_placement(&plan) {
            Some(_) => fathom_plan::kv::plan(&model.spec, i.context, i.batch, i.kv_dtype).groups,
            None => plan.kv_detail.clone(),
        };
        Ok(Engine {
            // One state slot per sequence, the same id on both sides of a
            // split (each side holds its own layers' states there).
            kv: KvBlocks::new(
                &kv_groups,
                fathom_plan::recurrent::plan(&model.spec, i.batch).map(|r| r.sequences),
            ),
            candidates: vec![(0, 0.0); rows(Buf::Sampler)],
            histories: (0..i.batch)
                .map(|_| Vec::with_capacity(i.context as usize))
                .collect(),
            scratch: StepScratch {
                ids: Vec::with_capacity(step_tokens),
                last_rows: Vec::with_capacity(step_tokens),
                group: (i.batch as usize).max(1),
                greedy: vec![[0; 2]; (i.batch as usize).max(1)],
            },
            end_of_generation: tokenizer.end_of_generation_ids().collect(),
            step_tokens,
            model,
            tokenizer: Arc::new(tokenizer),
            backend,
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
    /// plan's batch), each step built by the one batching policy
    /// ([`plan_step`]): decoding sequences first, then prompt chunks.
    /// `on_text` gets each sequence's index and text; returning false
    /// stops that sequence. The stats add up all sequences; `reason` is
    /// the first's; `prefill` lasts until every prompt is in.
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
            let kv = self.reserved_sequence(prompt.len(), max_new)?;
            self.histories[i].clear();
            self.histories[i].extend_from_slice(prompt);
            live.push(Live {
                index: i,
                kv,
                prompt: prompt.len(),
                generated: 0,
                text: OutputText::new(stop.to_vec()),
                reason: (max_new == 0).then_some(StopReason::Length),
            });
        }
        let started = Instant::now();
        let mut prefill = None;
        let mut chunk = Vec::with_capacity(live.len());
        loop {
            // Prompts run even for a sequence asked for no tokens.
            let pending = |l: &Live| {
                let history = self.histories[l.index].len();
                if l.reason.is_none() || l.kv.len < l.prompt {
                    history - l.kv.len
                } else {
                    0
                }
            };
            if prefill.is_none() && live.iter().all(|l| l.kv.len >= l.prompt) {
                prefill = Some(started.elapsed());
            }
            plan_step(live.iter().map(pending), self.step_tokens, &mut chunk);
            if chunk.iter().all(|&n| n == 0) {
                break;
            }
            let mut segments = Vec::with_capacity(live.len());
            for (l, &n) in live.iter_mut().zip(&chunk) {
                if n > 0 {
                    let start = l.kv.len;
                    segments.push(Segment {
                        seq: &mut l.kv,
                        tokens: &self.histories[l.index][start..start + n],
                    });
                }
            }
            run_step(
                &self.model,
                self.backend.as_mut(),
                &mut self.scratch,
                &mut segments,
                &[],
                &self.end_of_generation,
                &mut |_, _, _| {},
            )?;
            drop(segments);
            let mut row = 0;
            for (l, &n) in live.iter_mut().zip(&chunk) {
                if n == 0 {
                    continue;
                }
                row += 1;
                if l.kv.len < self.histories[l.index].len() || l.reason.is_some() {
                    continue;
                }
                let token = self.sample_batch(row - 1, &mut samplers[l.index], l.index);
                l.generated += 1;
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
        }
        let prefill = prefill.unwrap_or_else(|| started.elapsed());
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
            decode: started.elapsed().saturating_sub(prefill),
            reason: live[0].reason.unwrap_or(StopReason::Length),
        })
    }

    /// Samples sequence `index` of a batch from logits row `row`.
    fn sample_batch(&mut self, row: usize, sampler: &mut Sampler, index: usize) -> u32 {
        // Moved out and back (no copy) so the history and the logits can
        // be borrowed together.
        let history = std::mem::take(&mut self.histories[index]);
        let token = self.sample(row, sampler, &history, None);
        self.histories[index] = history;
        token
    }

    /// Samples from logits row `row` of the last step (segment `row`),
    /// with `history` (the sequence so far) for the penalties. The row
    /// stays the model's: [`Engine::token_logprob`] reads it afterwards.
    /// A plain greedy sampler takes the step's greedy pick, so its logits
    /// are never read back.
    ///
    /// With a `mask` (a constraint's allowed tokens) the pick is among
    /// those alone. A plain greedy sampler still takes the step's greedy
    /// pick when the mask allows it (the argmax of the allowed tokens is
    /// then the same token); otherwise the row is read back and the
    /// masked argmax found on the host.
    pub fn sample(
        &mut self,
        row: usize,
        sampler: &mut Sampler,
        history: &[u32],
        mask: Option<&TokenMask>,
    ) -> u32 {
        if let Some(pick) = self.greedy_pick(row, sampler) {
            if mask.is_none_or(|m| m.allows(pick)) {
                return pick;
            }
        }
        let (logits, banned, candidates) = self.sampling_inputs(row, sampler);
        sampler.sample_masked(logits, history, candidates, banned, mask)
    }

    /// Logits row `row` of the last step, the tokens `sampler` never
    /// picks (end-of-generation ones under `ignore_eos`) and the planned
    /// candidate scratch.
    fn sampling_inputs(
        &mut self,
        row: usize,
        sampler: &Sampler,
    ) -> (&[f32], &[u32], &mut [(u32, f32)]) {
        let vocab = self.model.spec.vocab as usize;
        let logits = &self.backend.logits(row + 1, vocab)[row * vocab..];
        let banned: &[u32] = if sampler.params.ignore_eos {
            &self.end_of_generation
        } else {
            &[]
        };
        (logits, banned, &mut self.candidates)
    }

    /// [`Engine::sample`] under a constraint, found by asking `allows`
    /// (does the constraint take this token next?) about the likeliest
    /// tokens rather than by its mask (see [`Sampler::sample_checked`]);
    /// `None` when they do not decide the pick and the mask must. A plain
    /// greedy row asks about the step's pick first, so its logits are not
    /// read when the constraint takes it.
    pub fn sample_checked<E>(
        &mut self,
        row: usize,
        sampler: &mut Sampler,
        history: &[u32],
        allows: &mut impl FnMut(u32) -> Result<bool, E>,
    ) -> Result<Option<u32>, E> {
        if let Some(pick) = self.greedy_pick(row, sampler) {
            if allows(pick)? {
                return Ok(Some(pick));
            }
        }
        let (logits, banned, candidates) = self.sampling_inputs(row, sampler);
        sampler.sample_checked(logits, history, candidates, banned, allows)
    }

    /// The token a plain greedy `sampler` picks from logits row `row` of
    /// the last step when nothing constrains it (the step's greedy pick,
    /// end-of-generation tokens left out under `ignore_eos`); `None` for
    /// any other sampler.
    pub fn greedy_pick(&self, row: usize, sampler: &Sampler) -> Option<u32> {
        if !sampler.is_plain_greedy() {
            return None;
        }
        let [plain, unbanned] = self.scratch.greedy[row];
        Some(if sampler.params.ignore_eos {
            unbanned
        } else {
            plain
        })
    }

    /// `token`'s log-probability under logits row `row` of the last step
    /// (the model's distribution, before bias, penalties and sampling),
    /// with the `top` most likely tokens there.
    pub fn token_logprob(&mut self, row: usize, token: u32, top: usize) -> TokenLogprob {
        let vocab = self.model.spec.vocab as usize;
        let logits = &self.backend.logits(row + 1, vocab)[row * vocab..];
        TokenLogprob::new(logits, token, top)
    }

    /// Runs one step of several sequences (see [`Model::run_layers`]): at
    /// most [`Engine::step_tokens`] tokens and the plan's batch of
    /// segments, each with blocks reserved for its tokens. Afterwards
    /// row i of the logits holds segment i's last position.
    pub fn step(&mut self, segments: &mut [Segment]) -> Result<(), EngineError> {
        self.step_scoring(segments, &[], &mut |_, _, _| {})
    }

    /// [`Engine::step`], handing out the logits of the `wanted` rows
    /// first: `on_logits(k, row, logits)` for each row of `wanted[k]`, in
    /// order (the logits at a position predict the token after it). They
    /// are projected a group of the plan's logits rows at a time, so
    /// scoring a whole prompt needs no memory beyond the plan.
    pub fn step_scoring(
        &mut self,
        segments: &mut [Segment],
        wanted: &[ScoreRows],
        on_logits: &mut dyn FnMut(usize, usize, &[f32]),
    ) -> Result<(), EngineError> {
        let rows: usize = segments.iter().map(|s| s.tokens.len()).sum();
        assert!(
            rows <= self.step_tokens && segments.len() <= self.histories.len(),
            "{} segments of {rows} tokens, step {}",
            segments.len(),
            self.step_tokens
        );
        run_step(
            &self.model,
            self.backend.as_mut(),
            &mut self.scratch,
            segments,
            wanted,
            &self.end_of_generation,
            on_logits,
        )
    }

    /// The backend's name and its device's free and total memory.
    pub fn device(&self) -> (&'static str, fathom_backend::DeviceMemory) {
        (self.backend.name(), self.backend.memory())
    }

    /// Host matrices a split model's large steps multiplied on the device
    /// so far (0 unless split).
    pub fn streamed_matrices(&self) -> u64 {
        self.backend.streamed_matrices()
    }

    /// Tokens one step may run (the plan's prefill chunk).
    pub fn step_tokens(&self) -> usize {
        self.step_tokens
    }

    /// A sequence for `tokens`, starting after the longest cached prefix.
    pub fn open_sequence(&mut self, tokens: &[u32]) -> SeqKv {
        self.kv.open(tokens)
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

    /// Turns on the prefix cache (see [`KvBlocks::enable_prefix_cache`]).
    pub fn enable_prefix_cache(&mut self, capacity_blocks: usize) -> bool {
        self.kv.enable_prefix_cache(capacity_blocks)
    }

    pub fn block_counts(&self) -> BlockCounts {
        self.kv.block_counts()
    }

    /// Times `n` single-token decode steps in a fresh sequence that first
    /// takes `depth` tokens of context (untimed; llama-bench's `-d`),
    /// feeding each step's argmax back, as llama-bench's tg test does;
    /// returns the time of the decode steps alone.
    pub fn time_decode(
        &mut self,
        depth: &[u32],
        first: u32,
        n: usize,
    ) -> Result<Duration, EngineError> {
        let mut seq = self.reserved_sequence(depth.len() + n, 0)?;
        for chunk in depth.chunks(self.step_tokens) {
            self.step(&mut [Segment {
                seq: &mut seq,
                tokens: chunk,
            }])?;
        }
        let mut token = first;
        let started = Instant::now();
        for _ in 0..n {
            self.step(&mut [Segment {
                seq: &mut seq,
                tokens: &[token],
            }])?;
            token = self.scratch.greedy[0][0];
        }
        let elapsed = started.elapsed();
        self.kv.release(&mut seq);
        Ok(elapsed)
    }

    /// A fresh sequence with blocks for `prompt + generate` tokens, which
    /// must fit the planned context.
    fn reserved_sequence(&mut self, prompt: usize, generate: usize) -> Result<SeqKv, EngineError> {
        let context = self.plan.inputs.context as usize;
        if prompt == 0 || prompt + generate > context {
            return Err(EngineError::ContextExceeded {
                prompt,
                generate,
                context,
                trained: self.model.spec.context_length,
            });
        }
        let mut seq = self.kv.open(&[]);
        let reserved = self.kv.reserve(&mut seq, prompt + generate);
        assert!(reserved, "the planned pool holds one full-context sequence");
        Ok(seq)
    }

    /// The last (first of a batch) sequence's tokens: its prompt and what
    /// was generated.
    pub fn tokens(&self) -> &[u32] {
        self.tokens_of(0)
    }

    /// Sequence `i`'s tokens of the last batch.
    pub fn tokens_of(&self, i: usize) -> &[u32] {
        &self.histories[i]
    }

    /// Runs `tokens` through a fresh sequence and hands the logits of every
    /// position from `first` on to `on_logits(position, logits)`, in order:
    /// the logits at position p predict token p + 1 (perplexity, KL
    /// divergence). They are projected in groups of the plan's logits rows
    /// (its batch), so scoring needs no memory beyond the plan.
    pub fn score(
        &mut self,
        tokens: &[u32],
        first: usize,
        on_logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), EngineError> {
        let mut seq = self.reserved_sequence(tokens.len(), 0)?;
        let mut start = 0;
        for chunk in tokens.chunks(self.step_tokens) {
            let segments = [Segment {
                seq: &mut seq,
                tokens: chunk,
            }];
            let from = first.saturating_sub(start).min(chunk.len());
            let ran = self
                .model
                .run_layers(self.backend.as_mut(), &segments, &mut self.scratch.ids)
                .and_then(|()| {
                    project_rows(
                        &self.model,
                        self.backend.as_mut(),
                        &mut self.scratch.last_rows,
                        self.scratch.group,
                        from..chunk.len(),
                        &mut |i, logits| on_logits(start + from + i, logits),
                    )
                });
            if let Err(e) = ran {
                self.kv.release(&mut seq);
                return Err(e);
            }
            seq.len += chunk.len();
            start += chunk.len();
        }
        self.kv.release(&mut seq);
        Ok(())
    }

    /// Runs `tokens` through a fresh sequence and returns the last position's
    /// logits (for checking against a reference implementation).
    pub fn logits(&mut self, tokens: &[u32]) -> Result<&[f32], EngineError> {
        let mut seq = self.reserved_sequence(tokens.len(), 0)?;
        for chunk in tokens.chunks(self.step_tokens) {
            self.step(&mut [Segment {
                seq: &mut seq,
                tokens: chunk,
            }])?;
        }
        self.kv.release(&mut seq);
        let vocab = self.model.spec.vocab as usize;
        Ok(self.backend.logits(1, vocab))
    }
}

/// The plan's placement when it puts part of the model on the host.
fn split_placement(plan: &MemoryPlan) -> Option<&Placement> {
    plan.placement.as_ref().filter(|p| p.is_split())
}

/// One side's KV layout under a split: its own layers, in the whole
/// model's groups (the engine's page tables are per group of the whole
/// model; the side's spec numbers them alike).
fn side_kv_layout(
    spec: &ModelSpec,
    plan: &MemoryPlan,
    placed: &Placement,
    side: Place,
) -> KvLayout {
    let i = &plan.inputs;
    let side_spec = placed.side_spec(spec, side);
    KvLayout {
        groups: fathom_plan::kv::plan(&side_spec, i.context, i.batch, i.kv_dtype).groups,
        dtype: i.kv_dtype,
        layer_groups: fathom_plan::kv::layer_groups(&side_spec),
        // The recurrent states of the side's own linear-attention layers,
        // as its plan counts them.
        recurrent: fathom_plan::recurrent::plan(&side_spec, i.batch),
    }
}
