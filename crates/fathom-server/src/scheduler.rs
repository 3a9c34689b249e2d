//! The scheduler: one thread owns the engine and advances every job a
//! step at a time (continuous batching).
//!
//! Each step runs one token of every decoding sequence and fills the rest
//! of the step (`max_tokens_per_step`) with prompt chunks, oldest first.
//! New jobs join between steps. The KV pool is the plan's and never
//! grows: a job is admitted when its prompt's blocks can be reserved; a
//! decoding sequence that needs a block when none is free preempts the
//! newest sequence, which goes back to the head of the queue and is
//! recomputed later (mostly from the prefix cache).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use fathom_engine::{
    plan_step, Engine, OutputText, Sampler, ScoreRows, Segment, SeqKv, TokenLogprob, TokenMask,
};

use crate::job::{ConstraintStats, Event, FinishReason, Job, SubmitError};
use crate::masks::MaskWorker;
use crate::stats::SchedulerStats;

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Sequences decoded together (`--parallel`): the plan's batch.
    pub parallel: usize,
    /// Jobs that may wait for a slot (beyond those free slots take at
    /// once) before new ones get 503.
    pub queue_capacity: usize,
    /// Unheld blocks the prefix cache keeps (0: no prefix cache).
    pub prompt_cache_blocks: usize,
}

/// A handle to the scheduler thread; shared by every connection.
pub struct Scheduler {
    sender: Mutex<Option<mpsc::Sender<Job>>>,
    /// Jobs submitted and not yet running (in the channel or the queue).
    waiting: Arc<AtomicUsize>,
    stopping: AtomicBool,
    /// Set when shutdown begins: jobs still waiting for a slot are failed
    /// with [`Event::ShuttingDown`] at the next step.
    refuse_queued: Arc<AtomicBool>,
    stats: Arc<SchedulerStats>,
    capacity: usize,
    parallel: usize,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Scheduler {
    /// Starts the scheduler thread, which owns `engine` from now on.
    pub fn start(mut engine: Engine, config: SchedulerConfig) -> Scheduler {
        let (sender, receiver) = mpsc::channel::<Job>();
        let waiting = Arc::new(AtomicUsize::new(0));
        let stats = Arc::new(SchedulerStats::default());
        let cached = engine.enable_prefix_cache(config.prompt_cache_blocks);
        SchedulerStats::set(&stats.prefix_cache_enabled, u64::from(cached));
        // The pool's size is known now: /metrics shows it before the first step.
        SchedulerStats::set(&stats.kv_blocks_total, engine.block_counts().total as u64);
        let (capacity, parallel) = (config.queue_capacity, config.parallel);
        let refuse_queued = Arc::new(AtomicBool::new(false));
        let thread = {
            let (waiting, stats, refuse) = (waiting.clone(), stats.clone(), refuse_queued.clone());
            std::thread::Builder::new()
                .name("fathom-scheduler".into())
                .spawn(move || Loop::new(engine, config, &waiting, &stats, &refuse).run(&receiver))
                .expect("spawning the scheduler thread")
        };
        Scheduler {
            sender: Mutex::new(Some(sender)),
            waiting,
            stopping: AtomicBool::new(false),
            refuse_queued,
            stats,
            capacity,
            parallel,
            thread: Mutex::new(Some(thread)),
        }
    }

    /// Queues `job`, or refuses it when the server stops or when the jobs
    /// not yet running would be more than the free slots plus the queue.
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err(SubmitError::ShuttingDown);
        }
        // Jobs a free slot takes at the next step do not wait for one: a
        // burst of requests is refused only beyond free slots + queue.
        let running = SchedulerStats::get(&self.stats.running) as usize;
        let room = self
            .capacity
            .saturating_add(self.parallel.saturating_sub(running));
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= room {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::QueueFull);
        }
        let sender = self.sender.lock().expect("scheduler lock");
        match sender.as_ref().map(|s| s.send(job).is_ok()) {
            Some(true) => Ok(()),
            _ => {
                self.waiting.fetch_sub(1, Ordering::SeqCst);
                Err(SubmitError::ShuttingDown)
            }
        }
    }

    pub fn stats(&self) -> &SchedulerStats {
        &self.stats
    }

    /// Shutdown has begun: refuses new jobs, and fails the jobs waiting
    /// for a slot with [`Event::ShuttingDown`] at once; running ones go on.
    pub fn begin_shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.refuse_queued.store(true, Ordering::SeqCst);
        // Wakes an idle loop (it then finds nothing to refuse).
        self.sender.lock().expect("scheduler lock").take();
    }

    /// Refuses new jobs, lets the queued and running ones finish, and joins
    /// the scheduler thread.
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.sender.lock().expect("scheduler lock").take();
        if let Some(thread) = self.thread.lock().expect("scheduler lock").take() {
            let _ = thread.join();
        }
    }
}

/// One job's sequence, running or waiting.
struct Slot {
    job: Job,
    /// Prompt and generated tokens (capacity: prompt + max_tokens).
    tokens: Vec<u32>,
    prompt_len: usize,
    /// The KV while running; `None` while waiting.
    kv: Option<SeqKv>,
    sampler: Sampler,
    text: OutputText,
    generated: usize,
    cached_tokens: usize,
    /// Counted in the prompt-token and prefix stats (once, not again on
    /// a recompute after preemption).
    counted: bool,
    /// The prompt's logprobs while they are collected (an echo with
    /// logprobs); `None` once sent, or when not asked for.
    prompt_score: Option<PromptScore>,
    /// Logprobs of generated tokens whose text is still held back.
    held: Vec<TokenLogprob>,
}

/// The prompt's logprobs, collected as its chunks run: position p's logits
/// give token p + 1's.
struct PromptScore {
    top: usize,
    /// Positions scored so far (their KV must not come from the prefix
    /// cache on a recompute, which computes no logits).
    scored: usize,
    entries: Vec<TokenLogprob>,
}

impl Slot {
    fn new(job: Job) -> Slot {
        let mut tokens = Vec::with_capacity(job.prompt.len() + job.max_tokens);
        tokens.extend_from_slice(&job.prompt);
        let prompt_score = job.logprobs.filter(|l| l.prompt).map(|l| PromptScore {
            top: l.top,
            scored: 0,
            entries: Vec::with_capacity(job.prompt.len().saturating_sub(1)),
        });
        Slot {
            prompt_score,
            held: Vec::new(),
            prompt_len: job.prompt.len(),
            sampler: Sampler::new(job.sampling.clone()),
            text: OutputText::new(job.stop.clone()),
            tokens,
            kv: None,
            generated: 0,
            cached_tokens: 0,
            counted: false,
            job,
        }
    }

    /// Tokens whose KV is not computed yet.
    fn pending(&self) -> usize {
        self.tokens.len() - self.kv.as_ref().map_or(0, |kv| kv.len)
    }

    /// The tokens whose KV may come from the prefix cache: all, unless
    /// prompt positions are still to be scored, which must be computed.
    fn reusable(&self) -> &[u32] {
        match &self.prompt_score {
            // A sequence opened on n tokens reuses at most n - 1 positions.
            Some(score) => &self.tokens[..score.scored + 1],
            None => &self.tokens,
        }
    }
}

/// How a step left a slot.
enum Outcome {
    Running,
    Finished(FinishReason),
    /// The client went away.
    Cancelled,
    Failed(String),
}

struct Loop<'a> {
    engine: Engine,
    config: SchedulerConfig,
    /// Admitted, oldest first (the newest is preempted first).
    running: Vec<Slot>,
    /// Preempted slots first, then new jobs in arrival order.
    queue: VecDeque<Slot>,
    waiting: &'a AtomicUsize,
    stats: &'a SchedulerStats,
    refuse_queued: &'a AtomicBool,
    /// Per running slot, the tokens it runs this step (reused each step).
    chunk: Vec<usize>,
    /// Slots that finished this step, with how (reused each step).
    finished: Vec<(usize, Outcome)>,
    /// Prompt rows scored this step (reused each step).
    wanted: Vec<ScoreRows>,
    /// Computes the constrained rows' masks while the step runs.
    masks: MaskWorker,
    /// Whether sampled rows' masks go to the worker before the step: on a
    /// device, whose steps leave the host's cores idle (the CPU backend's
    /// keep them busy, and its rows check their likeliest tokens instead).
    masks_ahead: bool,
    /// Mask buffers of the slots (one each, allocated here once): a
    /// constrained slot holds one while it runs.
    mask_pool: Vec<TokenMask>,
    /// The running slots whose constraints are with the worker this
    /// step, in the order handed over (reused each step).
    masking: Vec<usize>,
}

impl<'a> Loop<'a> {
    fn new(
        engine: Engine,
        config: SchedulerConfig,
        waiting: &'a AtomicUsize,
        stats: &'a SchedulerStats,
        refuse_queued: &'a AtomicBool,
    ) -> Self {
        let mask_len = engine.tokenizer.vocab_size();
        Loop {
            masks: MaskWorker::start(config.parallel),
            masks_ahead: engine.device().0 != "cpu",
            mask_pool: (0..config.parallel)
                .map(|_| TokenMask::new(mask_len))
                .collect(),
            masking: Vec::with_capacity(config.parallel),
            running: Vec::with_capacity(config.parallel),
            queue: VecDeque::with_capacity(config.queue_capacity + config.parallel),
            chunk: Vec::with_capacity(config.parallel),
            finished: Vec::with_capacity(config.parallel),
            wanted: Vec::with_capacity(config.parallel),
            engine,
            config,
            waiting,
            stats,
            refuse_queued,
        }
    }

    fn run(&mut self, receiver: &mpsc::Receiver<Job>) {
        let mut open = true;
        loop {
            if self.running.is_empty() && self.queue.is_empty() {
                if !open {
                    return;
                }
                // Idle: sleep until a job arrives or the sender closes.
                match receiver.recv() {
                    Ok(job) => self.queue.push_back(Slot::new(job)),
                    Err(_) => open = false,
                }
            }
            loop {
                match receiver.try_recv() {
                    Ok(job) => self.queue.push_back(Slot::new(job)),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            self.drop_cancelled();
            if self.refuse_queued.load(Ordering::SeqCst) {
                self.refuse_new();
            }
            self.fill_slots();
            if let Err(message) = self.step() {
                let mut failed = std::mem::take(&mut self.running);
                for mut slot in failed.drain(..) {
                    if let Some(mut kv) = slot.kv.take() {
                        self.engine.release(&mut kv);
                    }
                    self.return_mask(&mut slot);
                    let _ = slot.job.events.send(Event::Failed(message.clone()));
                }
                self.running = failed;
            }
            self.publish();
        }
    }

    /// Frees the blocks of every job whose client went away.
    fn drop_cancelled(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].job.events.is_closed() {
                let slot = self.running.remove(i);
                self.finish(slot, Outcome::Cancelled);
            } else {
                i += 1;
            }
        }
        let mut gone_new = 0;
        self.queue.retain(|slot| {
            let gone = slot.job.events.is_closed();
            gone_new += usize::from(gone && !slot.counted);
            !gone
        });
        self.waiting.fetch_sub(gone_new, Ordering::SeqCst);
    }

    /// Fails every queued job that has not run yet (preempted ones, which
    /// have sent text already, stay queued and finish).
    fn refuse_new(&mut self) {
        let mut refused = 0;
        self.queue.retain(|slot| {
            if slot.counted {
                return true;
            }
            let _ = slot.job.events.send(Event::ShuttingDown);
            refused += 1;
            false
        });
        self.waiting.fetch_sub(refused, Ordering::SeqCst);
    }

    /// Moves queued jobs into free slots while their prompts' blocks can
    /// be reserved; the queue is FIFO, so the head blocks the rest.
    fn fill_slots(&mut self) {
        while self.running.len() < self.config.parallel {
            let Some(mut slot) = self.queue.pop_front() else {
                return;
            };
            if let Some(outcome) = self.refusal(&slot) {
                self.uncount_if_new(&slot);
                self.finish(slot, outcome);
                continue;
            }
            let mut kv = self.engine.open_sequence(slot.reusable());
            if !self.engine.reserve(&mut kv, slot.tokens.len()) {
                self.engine.release(&mut kv);
                if self.running.is_empty() {
                    // Nothing will free blocks: the pool cannot hold it.
                    let outcome = Outcome::Failed(format!(
                        "the KV pool ({} blocks) cannot hold a {}-token prompt: raise --kv-cache-budget or lower --parallel",
                        self.engine.block_counts().total,
                        slot.tokens.len()
                    ));
                    self.uncount_if_new(&slot);
                    self.finish(slot, outcome);
                    continue;
                }
                self.queue.push_front(slot);
                return;
            }
            // Counted as running before it stops counting as waiting, so
            // admission (free slots + queue) never sees a slot twice free.
            SchedulerStats::set(&self.stats.running, self.running.len() as u64 + 1);
            self.uncount_if_new(&slot);
            if !slot.counted {
                slot.counted = true;
                slot.cached_tokens = kv.len;
                SchedulerStats::add(&self.stats.prompt_tokens, slot.prompt_len as u64);
                if kv.len > 0 {
                    SchedulerStats::add(&self.stats.prefix_cache_hits, 1);
                    SchedulerStats::add(&self.stats.prefix_cache_hit_tokens, kv.len as u64);
                }
            }
            slot.kv = Some(kv);
            if let Some(c) = slot.job.constraint.as_deref_mut() {
                if let Some(mask) = self.mask_pool.pop() {
                    if let Err(mask) = c.attach_mask(mask) {
                        self.mask_pool.push(mask);
                    }
                }
            }
            self.running.push(slot);
        }
    }

    /// What ends a job before it runs: nothing to run, nothing asked for,
    /// or more than a slot's context (the HTTP side checks these first).
    fn refusal(&self, slot: &Slot) -> Option<Outcome> {
        let context = self.engine.plan.inputs.context as usize;
        let job = &slot.job;
        if job.prompt.is_empty() {
            Some(Outcome::Failed("the prompt is empty".into()))
        } else if job.max_tokens == 0 && slot.prompt_score.is_none() {
            Some(Outcome::Finished(FinishReason::Length))
        } else if job.prompt.len() + job.max_tokens > context {
            Some(Outcome::Failed(format!(
                "{} prompt tokens + {} max tokens exceed the context of {context}",
                job.prompt.len(),
                job.max_tokens
            )))
        } else {
            None
        }
    }

    /// A new job leaving the queue stops counting against its capacity.
    fn uncount_if_new(&self, slot: &Slot) {
        if !slot.counted {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Gives a decoding sequence its next block, preempting the newest
    /// other sequences while the pool is out. Returns false when the
    /// sequence itself had to be preempted.
    fn grow(&mut self, i: usize) -> bool {
        loop {
            let slot = &mut self.running[i];
            let end = slot.tokens.len();
            let kv = slot.kv.as_mut().expect("running slots hold KV");
            if self.engine.reserve(kv, end) {
                return true;
            }
            let newest = self.running.len() - 1;
            self.preempt(newest);
            if newest == i {
                return false;
            }
        }
    }

    /// Frees slot `i`'s blocks and puts it at the head of the queue; it
    /// is recomputed from its tokens when readmitted.
    fn preempt(&mut self, i: usize) {
        let mut slot = self.running.remove(i);
        if let Some(mut kv) = slot.kv.take() {
            self.engine.release(&mut kv);
        }
        self.return_mask(&mut slot);
        SchedulerStats::add(&self.stats.preemptions, 1);
        self.queue.push_front(slot);
    }

    /// One forward step over every running sequence; then samples those
    /// whose tokens are all in.
    fn step(&mut self) -> Result<(), String> {
        // Decoding sequences first (one token each), so long prompts do
        // not stall them; each needs room for its next position.
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].pending() == 1 && !self.grow(i) {
                continue;
            }
            i += 1;
        }
        // Tokens each running sequence runs this step, by the engine's one
        // batching policy: decoding ones first, then prompt chunks.
        plan_step(
            self.running.iter().map(Slot::pending),
            self.engine.step_tokens(),
            &mut self.chunk,
        );
        // On a device, the constraints of the slots that sample after this
        // step go to the mask worker, which computes their masks while the
        // step runs (the host's cores are idle then); each comes back just
        // before its row is sampled. A greedy row's never goes: its pick
        // is checked (see below). On the CPU the step keeps the cores
        // busy, and every row checks its likeliest tokens first.
        self.masking.clear();
        for (i, (slot, &n)) in self.running.iter_mut().zip(&self.chunk).enumerate() {
            let samples = self.masks_ahead
                && n > 0
                && n == slot.pending()
                && slot.generated < slot.job.max_tokens
                && !slot.sampler.is_plain_greedy();
            let Some(c) = slot.job.constraint.take_if(|c| samples && !c.is_stopped()) else {
                continue;
            };
            match self.masks.submit(c) {
                Ok(()) => self.masking.push(i),
                // No worker: the mask is computed when the row is sampled.
                Err(c) => slot.job.constraint = Some(c),
            }
        }
        let mut segments = Vec::with_capacity(self.running.len());
        // Per entry of `wanted`: the prompt being scored, its tokens and
        // the segment's first position.
        let mut scoring = Vec::new();
        self.wanted.clear();
        for (slot, &n) in self.running.iter_mut().zip(&self.chunk) {
            if n == 0 {
                continue;
            }
            let Slot {
                kv,
                tokens,
                prompt_score,
                prompt_len,
                ..
            } = slot;
            let kv = kv.as_mut().expect("running slots hold KV");
            let start = kv.len;
            if let Some(score) = prompt_score {
                // Positions before the prompt's last predict its tokens.
                let from = start.max(score.scored);
                let end = (start + n).min(*prompt_len - 1);
                if from < end {
                    self.wanted.push(ScoreRows {
                        segment: segments.len(),
                        rows: from - start..end - start,
                    });
                    scoring.push((score, &tokens[..], start));
                }
            }
            segments.push(Segment {
                seq: kv,
                tokens: &tokens[start..start + n],
            });
        }
        if segments.is_empty() {
            return Ok(());
        }
        let stepped =
            self.engine
                .step_scoring(&mut segments, &self.wanted, &mut |k, row, logits| {
                    let (score, tokens, start) = &mut scoring[k];
                    let p = *start + row;
                    let entry = TokenLogprob::new(logits, tokens[p + 1], score.top);
                    score.entries.push(entry);
                    score.scored = p + 1;
                });
        drop(scoring);
        drop(segments);
        if let Err(e) = stepped {
            // The constraints come back before the slots are failed.
            for k in 0..self.masking.len() {
                self.take_back_mask(k);
            }
            return Err(e.to_string());
        }
        let mut row = 0;
        let mut masked = 0;
        for i in 0..self.running.len() {
            if self.masking.get(masked) == Some(&i) {
                // Waits for this row's mask alone: the rows before it were
                // sampled while the worker went on.
                if !self.take_back_mask(masked) {
                    self.finished.push((
                        i,
                        Outcome::Failed(
                            "the answer's constraint was lost: its mask worker stopped".into(),
                        ),
                    ));
                    masked += 1;
                    row += 1;
                    continue;
                }
                masked += 1;
            }
            if self.chunk[i] == 0 {
                continue;
            }
            row += 1;
            let slot = &mut self.running[i];
            let kv = slot.kv.as_mut().expect("running slots hold KV");
            self.engine.commit(kv, &slot.tokens);
            let prompt_len = slot.prompt_len;
            if let Some(score) = slot.prompt_score.take_if(|s| s.scored + 1 >= prompt_len) {
                let event = Event::PromptLogprobs {
                    first: slot.tokens[0],
                    rest: score.entries,
                };
                if slot.job.events.send(event).is_err() {
                    self.finished.push((i, Outcome::Cancelled));
                    continue;
                }
            }
            if slot.pending() > 0 {
                continue;
            }
            if slot.generated >= slot.job.max_tokens {
                // max_tokens 0: the prompt was all there was to do.
                self.finished
                    .push((i, Outcome::Finished(FinishReason::Length)));
                continue;
            }
            let mut mask = None;
            let mut allowed_pick = None;
            if let Some(c) = slot.job.constraint.as_deref_mut() {
                if c.is_stopped() {
                    // The answer is complete: nothing more may follow.
                    self.finished
                        .push((i, Outcome::Finished(FinishReason::Stop)));
                    continue;
                }
                // Unless the worker computed its mask, a row asks the
                // constraint about its likeliest tokens first: mostly
                // they decide the pick and no mask over the vocabulary
                // is needed.
                let checked = if c.has_fresh_mask() {
                    Ok(None)
                } else {
                    self.engine
                        .sample_checked(row - 1, &mut slot.sampler, &slot.tokens, &mut |t| {
                            c.allows(t)
                        })
                };
                match checked {
                    Ok(Some(token)) => allowed_pick = Some(token),
                    Ok(None) => match c.mask_ready() {
                        Ok(()) => mask = Some(c.mask()),
                        Err(e) => {
                            self.finished.push((i, Outcome::Failed(e)));
                            continue;
                        }
                    },
                    Err(e) => {
                        self.finished.push((i, Outcome::Failed(e)));
                        continue;
                    }
                }
            }
            let token = match allowed_pick {
                Some(token) => token,
                None => self
                    .engine
                    .sample(row - 1, &mut slot.sampler, &slot.tokens, mask),
            };
            let logprob = slot
                .job
                .logprobs
                .map(|l| self.engine.token_logprob(row - 1, token, l.top));
            let outcome = self.emit(i, token, logprob);
            if !matches!(outcome, Outcome::Running) {
                self.finished.push((i, outcome));
            }
        }
        let mut finished = std::mem::take(&mut self.finished);
        for (i, outcome) in finished.drain(..).rev() {
            let slot = self.running.remove(i);
            self.finish(slot, outcome);
        }
        self.finished = finished;
        Ok(())
    }

    /// Takes the `k`th constraint handed to the mask worker this step back
    /// into its slot; false when the worker is gone with it.
    fn take_back_mask(&mut self, k: usize) -> bool {
        match self.masks.receive() {
            Some(c) => {
                self.running[self.masking[k]].job.constraint = Some(c);
                true
            }
            None => false,
        }
    }

    /// Handles a sampled token (with its logprob when asked for): the
    /// end, a stop string, text to send.
    fn emit(&mut self, i: usize, token: u32, logprob: Option<TokenLogprob>) -> Outcome {
        let slot = &mut self.running[i];
        slot.generated += 1;
        SchedulerStats::add(&self.stats.generated_tokens, 1);
        let tokenizer = &self.engine.tokenizer;
        if tokenizer.end_of_generation(token) {
            return Outcome::Finished(FinishReason::Stop);
        }
        let mut complete = false;
        if let Some(c) = slot.job.constraint.as_deref_mut() {
            if let Err(e) = c.commit(token) {
                return Outcome::Failed(format!("the answer's constraint failed: {e}"));
            }
            complete = c.is_stopped();
        }
        slot.tokens.push(token);
        slot.held.extend(logprob);
        let (text, hit) = slot.text.push(tokenizer, token);
        if !text.is_empty() {
            let event = Event::Text {
                text: text.to_string(),
                logprobs: std::mem::take(&mut slot.held),
            };
            if slot.job.events.send(event).is_err() {
                return Outcome::Cancelled;
            }
        }
        if hit {
            Outcome::Finished(FinishReason::Stop)
        } else if complete {
            // The grammar allows nothing more: what is held back is the
            // end of the answer.
            let text = slot.text.finish();
            if !text.is_empty() || !slot.held.is_empty() {
                let logprobs = std::mem::take(&mut slot.held);
                if slot
                    .job
                    .events
                    .send(Event::Text { text, logprobs })
                    .is_err()
                {
                    return Outcome::Cancelled;
                }
            }
            Outcome::Finished(FinishReason::Stop)
        } else if slot.generated >= slot.job.max_tokens {
            Outcome::Finished(FinishReason::Length)
        } else {
            Outcome::Running
        }
    }

    /// Puts a slot's mask buffer back in the pool (a slot that leaves the
    /// running ones).
    fn return_mask(&mut self, slot: &mut Slot) {
        if let Some(c) = slot.job.constraint.as_deref_mut() {
            let mask = c.take_mask();
            if !mask.is_empty() && self.mask_pool.len() < self.config.parallel {
                self.mask_pool.push(mask);
            }
        }
    }

    /// Releases a slot's blocks and sends its last event.
    fn finish(&mut self, mut slot: Slot, outcome: Outcome) {
        if let Some(mut kv) = slot.kv.take() {
            self.engine.release(&mut kv);
        }
        self.return_mask(&mut slot);
        if let Some(c) = slot.job.constraint.as_deref() {
            let s = self.stats;
            SchedulerStats::add(&s.constrained_jobs, 1);
            SchedulerStats::add(&s.constraint_cache_hits, u64::from(c.cache_hit));
            SchedulerStats::add(&s.constraint_masks, c.masks);
            SchedulerStats::add(&s.constraint_mask_micros, c.mask_time.as_micros() as u64);
            SchedulerStats::add(
                &s.constraint_compile_micros,
                c.compile_time.as_micros() as u64,
            );
        }
        let event = match outcome {
            Outcome::Running | Outcome::Cancelled => return,
            Outcome::Failed(message) => Event::Failed(message),
            Outcome::Finished(reason) => {
                if reason == FinishReason::Length {
                    let text = slot.text.finish();
                    if !text.is_empty() || !slot.held.is_empty() {
                        let logprobs = std::mem::take(&mut slot.held);
                        let _ = slot.job.events.send(Event::Text { text, logprobs });
                    }
                }
                let constraint = slot.job.constraint.as_deref().map(|c| ConstraintStats {
                    masks: c.masks,
                    mask_seconds: c.mask_time.as_secs_f64(),
                    compile_seconds: c.compile_time.as_secs_f64(),
                });
                Event::Finished {
                    reason,
                    constraint,
                    prompt_tokens: slot.prompt_len,
                    completion_tokens: slot.generated,
                    cached_tokens: slot.cached_tokens,
                }
            }
        };
        let _ = slot.job.events.send(event);
    }

    /// Publishes the gauges for `/metrics`.
    fn publish(&self) {
        let s = self.stats;
        let blocks = self.engine.block_counts();
        SchedulerStats::set(&s.queue_depth, self.queue.len() as u64);
        SchedulerStats::set(&s.running, self.running.len() as u64);
        SchedulerStats::set(&s.kv_blocks_total, blocks.total as u64);
        SchedulerStats::set(&s.kv_blocks_used, blocks.used as u64);
        SchedulerStats::set(&s.kv_blocks_cached, blocks.cached as u64);
    }
}
