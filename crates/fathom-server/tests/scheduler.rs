//! The scheduler on the real SmolLM2 GGUF, without HTTP: concurrent jobs
//! equal sequential ones (constrained ones too, their masks computed by
//! the mask worker), preemption under a small pool, prefix reuse,
//! cancellation, the bounded queue, and logprobs equal to what
//! `fathom perplexity` computes.

use std::path::Path;

use fathom_checkpoint::Checkpoint;
use fathom_engine::logprob::{log_prob, TokenLogprob};
use fathom_engine::{Engine, SamplingParams};
use fathom_plan::serve::{KvBudget, PromptCache, ServePlan};
use fathom_plan::{Available, Device, KvDtype, PlanInputs};
use fathom_server::constraint::{Constraints, Grammar};
use fathom_server::{Event, FinishReason, Job, Logprobs, Scheduler, SchedulerConfig, SubmitError};
use fathom_spec::ModelSpec;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

fn serve_plan(parallel: u64, context: u64, budget: KvBudget, step: u64) -> (Engine, ServePlan) {
    let model =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(model.exists(), "run scripts/fetch-model.sh first");
    let checkpoint = Checkpoint::open(&model).unwrap();
    let spec = ModelSpec::from_checkpoint(&checkpoint).unwrap();
    let inputs = PlanInputs {
        context,
        batch: parallel,
        device: Device::Cpu,
        kv_dtype: KvDtype::F16,
        max_tokens_per_step: step,
        threads: 2,
        headroom_factor: 1.0,
        rocm_inflight_raw: None,
        host_available: None,
        available: Available {
            bytes: 8 << 30,
            source: "test".into(),
        },
    };
    let plan = ServePlan::new(&spec, inputs, budget, PromptCache::Bytes(0)).unwrap();
    let tokenizer = fathom_engine::load_tokenizer(&checkpoint).unwrap();
    let engine = Engine::load(&checkpoint, spec, plan.plan.clone(), tokenizer).unwrap();
    (engine, plan)
}

fn start(parallel: u64, context: u64, budget: KvBudget, queue: usize) -> (Scheduler, Encoder) {
    let (engine, plan) = serve_plan(parallel, context, budget, 64);
    let encoder = Encoder(engine.tokenizer.clone());
    let config = SchedulerConfig {
        parallel: parallel as usize,
        queue_capacity: queue,
        prompt_cache_blocks: plan.prompt_cache_blocks as usize,
    };
    (Scheduler::start(engine, config), encoder)
}

/// Two slots, a queue of 8, and a prompt cache that may take the whole pool.
fn start_prefix_cached() -> (Scheduler, Encoder) {
    let (engine, plan) = serve_plan(2, 512, KvBudget::Workload, 64);
    let encoder = Encoder(engine.tokenizer.clone());
    let config = SchedulerConfig {
        parallel: 2,
        queue_capacity: 8,
        prompt_cache_blocks: plan.kv_blocks as usize,
    };
    (Scheduler::start(engine, config), encoder)
}

struct Encoder(std::sync::Arc<fathom_engine::Tokenizer>);

impl Encoder {
    fn job(&self, text: &str, max_tokens: usize) -> (Job, UnboundedReceiver<Event>) {
        let (events, receiver) = unbounded_channel();
        let job = Job {
            prompt: self.0.encode(text, self.0.add_bos(), true),
            max_tokens,
            sampling: SamplingParams {
                temperature: 0.0,
                ..SamplingParams::default()
            },
            stop: vec![],
            logprobs: None,
            constraint: None,
            events,
        };
        (job, receiver)
    }
}

/// The text and the final event of a job.
fn collect(mut receiver: UnboundedReceiver<Event>) -> (String, Event) {
    let mut text = String::new();
    while let Some(event) = receiver.blocking_recv() {
        match event {
            Event::Text { text: t, .. } => text.push_str(&t),
            last => return (text, last),
        }
    }
    panic!("the scheduler dropped a job without a final event");
}

const PROMPTS: [&str; 8] = [
    "The capital of France is",
    "Water boils at a temperature of",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "To make a cup of tea, first",
    "The largest planet in the solar system is",
    "1, 2, 3, 4, 5,",
];

/// One schema per job: a mask handed to the wrong slot shows.
fn schema_job(
    encoder: &Encoder,
    constraints: &Constraints,
    k: usize,
) -> (Job, UnboundedReceiver<Event>) {
    let (mut job, rx) = encoder.job(PROMPTS[k % PROMPTS.len()], 60);
    if k % 3 != 2 {
        let schema = serde_json::json!({"type": "object", "properties": {
            "job": {"const": k}, "words": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}},
            "required": ["job", "words"], "additionalProperties": false});
        job.constraint = Some(Box::new(
            constraints.compile(&Grammar::JsonSchema(schema)).unwrap(),
        ));
    }
    (job, rx)
}

/// Constrained and plain jobs together on a pool that preempts, twice
/// over on one scheduler: each answer equals the same job's alone, every
/// constrained one its own schema's (so each state came back from the
/// mask worker to its own slot).
#[test]
fn constrained_jobs_under_preemption_equal_the_same_jobs_one_at_a_time() {
    let jobs = 9;
    let (scheduler, encoder) = start(1, 256, KvBudget::Workload, 64);
    let constraints = Constraints::new(&encoder.0, encoder.0.vocab_size()).unwrap();
    let alone: Vec<(String, Event)> = (0..jobs)
        .map(|k| {
            let (job, rx) = schema_job(&encoder, &constraints, k);
            scheduler.submit(job).unwrap();
            collect(rx)
        })
        .collect();
    scheduler.shutdown();
    // 6 blocks of 16 tokens: one job (at most 70 tokens) fits, four do not.
    let block = 30 * 16 * 2 * 192 * 2; // layers x tokens x K,V x width x f16
    let (scheduler, encoder) = start(4, 256, KvBudget::Bytes(6 * block), 64);
    for round in 0..2 {
        let receivers: Vec<_> = (0..jobs)
            .map(|k| {
                let (job, rx) = schema_job(&encoder, &constraints, k);
                scheduler.submit(job).unwrap();
                rx
            })
            .collect();
        for (k, rx) in receivers.into_iter().enumerate() {
            let (text, last) = collect(rx);
            assert!(matches!(last, Event::Finished { .. }), "job {k}: {last:?}");
            assert_eq!(text, alone[k].0, "round {round}, job {k}");
            if k % 3 != 2 {
                if let Event::Finished {
                    reason: FinishReason::Stop,
                    ..
                } = last
                {
                    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                    assert_eq!(v["job"], k, "{text}");
                }
            }
        }
    }
    let preempted = fathom_server::SchedulerStats::get(&scheduler.stats().preemptions);
    assert!(preempted > 0, "the pool was large enough not to preempt");
    scheduler.shutdown();
}

fn sequential(texts: &[String], max_tokens: usize) -> Vec<String> {
    let (scheduler, encoder) = start(1, 256, KvBudget::Workload, 64);
    let outs = texts
        .iter()
        .map(|t| {
            let (job, rx) = encoder.job(t, max_tokens);
            scheduler.submit(job).unwrap();
            collect(rx).0
        })
        .collect();
    scheduler.shutdown();
    outs
}

#[test]
fn sixteen_concurrent_greedy_jobs_equal_the_same_jobs_one_at_a_time() {
    let texts: Vec<String> = (0..16)
        .map(|i| {
            format!("{} {}", PROMPTS[i % 8], ["", "and"][i / 8])
                .trim()
                .to_string()
        })
        .collect();
    let alone = sequential(&texts, 24);
    let (scheduler, encoder) = start(16, 256, KvBudget::Workload, 64);
    let receivers: Vec<_> = texts
        .iter()
        .map(|t| {
            let (job, rx) = encoder.job(t, 24);
            scheduler.submit(job).unwrap();
            rx
        })
        .collect();
    for (i, rx) in receivers.into_iter().enumerate() {
        let (text, last) = collect(rx);
        assert!(matches!(last, Event::Finished { .. }), "{last:?}");
        assert_eq!(text, alone[i], "job {i}: {:?}", texts[i]);
    }
    assert_eq!(
        fathom_server::SchedulerStats::get(&scheduler.stats().generated_tokens),
        16 * 24
    );
    scheduler.shutdown();
}

#[test]
fn a_full_pool_preempts_the_newest_and_outputs_stay_the_same() {
    let texts: Vec<String> = PROMPTS[..4].iter().map(|s| s.to_string()).collect();
    let alone = sequential(&texts, 96);
    // 4 slots of 256 tokens, but blocks for only ~2 sequences of 110.
    let block = 30 * 16 * 2 * 192 * 2; // layers x tokens x K,V x width x f16
    let (scheduler, encoder) = start(4, 256, KvBudget::Bytes(15 * block), 64);
    let receivers: Vec<_> = texts
        .iter()
        .map(|t| {
            let (job, rx) = encoder.job(t, 96);
            scheduler.submit(job).unwrap();
            rx
        })
        .collect();
    for (i, rx) in receivers.into_iter().enumerate() {
        let (text, last) = collect(rx);
        assert!(
            matches!(
                last,
                Event::Finished {
                    reason: FinishReason::Length,
                    ..
                } | Event::Finished {
                    reason: FinishReason::Stop,
                    ..
                }
            ),
            "{last:?}"
        );
        assert_eq!(text, alone[i], "job {i}");
    }
    let preempted = fathom_server::SchedulerStats::get(&scheduler.stats().preemptions);
    assert!(preempted > 0, "the pool was large enough not to preempt");
    scheduler.shutdown();
}

#[test]
fn a_shared_prefix_is_reused_and_gives_the_same_output() {
    let (scheduler, encoder) = start_prefix_cached();
    let system = "You are a helpful assistant who answers briefly and precisely. ".repeat(6);
    let first = format!("{system}Question: what is the capital of France?");
    let (job, rx) = encoder.job(&first, 16);
    scheduler.submit(job).unwrap();
    let (a, last_a) = collect(rx);
    assert!(
        matches!(
            last_a,
            Event::Finished {
                cached_tokens: 0,
                ..
            }
        ),
        "{last_a:?}"
    );
    // The same prompt again: every whole block but the last token's.
    let (job, rx) = encoder.job(&first, 16);
    let prompt_len = job.prompt.len();
    scheduler.submit(job).unwrap();
    let (b, last_b) = collect(rx);
    assert_eq!(a, b);
    let Event::Finished { cached_tokens, .. } = last_b else {
        panic!("{last_b:?}")
    };
    assert_eq!(cached_tokens, (prompt_len - 1) / 16 * 16);
    // A different question after the same system text reuses its blocks.
    let (job, rx) = encoder.job(&format!("{system}Question: name a red fruit."), 8);
    scheduler.submit(job).unwrap();
    let (_, last_c) = collect(rx);
    let Event::Finished { cached_tokens, .. } = last_c else {
        panic!("{last_c:?}")
    };
    assert!(cached_tokens >= 16 * 4, "{cached_tokens}");
    let stats = scheduler.stats();
    assert_eq!(
        fathom_server::SchedulerStats::get(&stats.prefix_cache_hits),
        2
    );
    scheduler.shutdown();
}

#[test]
fn a_dropped_client_frees_its_blocks_and_a_full_queue_refuses() {
    let (scheduler, encoder) = start(1, 512, KvBudget::Workload, 1);
    let (job, rx) = encoder.job("Once upon a time", 400);
    scheduler.submit(job).unwrap();
    let (queued, _queued_rx) = encoder.job("The capital of France is", 4);
    // The first job runs; wait until it does, then fill the queue.
    let stats = scheduler.stats();
    while fathom_server::SchedulerStats::get(&stats.running) == 0 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    scheduler.submit(queued).unwrap();
    let (extra, _extra_rx) = encoder.job("More", 4);
    assert_eq!(scheduler.submit(extra).unwrap_err(), SubmitError::QueueFull);
    drop(rx);
    let started = std::time::Instant::now();
    loop {
        let used = fathom_server::SchedulerStats::get(&stats.kv_blocks_used);
        let running = fathom_server::SchedulerStats::get(&stats.running);
        if running <= 1 && used <= 1 {
            break;
        }
        assert!(
            started.elapsed().as_secs() < 10,
            "blocks still held: {used} used, {running} running"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    scheduler.shutdown();
    assert_eq!(fathom_server::SchedulerStats::get(&stats.kv_blocks_used), 0);
}

#[test]
fn a_burst_is_refused_only_beyond_the_free_slots_and_the_queue() {
    // Four free slots, a queue of one: five jobs submitted at once (before
    // the scheduler takes any) are accepted, the sixth is refused.
    let (scheduler, encoder) = start(4, 256, KvBudget::Workload, 1);
    let receivers: Vec<_> = (0..5)
        .map(|i| {
            let (job, rx) = encoder.job(PROMPTS[i], 8);
            scheduler
                .submit(job)
                .unwrap_or_else(|e| panic!("job {i}: {e:?}"));
            rx
        })
        .collect();
    let (extra, _rx) = encoder.job("More", 8);
    assert_eq!(scheduler.submit(extra).unwrap_err(), SubmitError::QueueFull);
    for rx in receivers {
        assert!(matches!(collect(rx).1, Event::Finished { .. }));
    }
    scheduler.shutdown();
}

#[test]
fn jobs_that_cannot_run_end_with_a_clear_event() {
    let (scheduler, encoder) = start(1, 64, KvBudget::Workload, 4);
    let (mut empty, rx) = encoder.job("x", 4);
    empty.prompt.clear();
    scheduler.submit(empty).unwrap();
    assert_eq!(collect(rx).1, Event::Failed("the prompt is empty".into()));
    let (zero, rx) = encoder.job("The capital of France is", 0);
    scheduler.submit(zero).unwrap();
    let (text, last) = collect(rx);
    assert_eq!(text, "");
    assert!(
        matches!(
            last,
            Event::Finished {
                reason: FinishReason::Length,
                completion_tokens: 0,
                ..
            }
        ),
        "{last:?}"
    );
    let (long, rx) = encoder.job("The capital of France is", 64);
    scheduler.submit(long).unwrap();
    let Event::Failed(message) = collect(rx).1 else {
        panic!("a job over the context ran")
    };
    assert!(message.contains("exceed the context of 64"), "{message}");
    // The scheduler keeps serving.
    let (ok, rx) = encoder.job("The capital of France is", 4);
    scheduler.submit(ok).unwrap();
    assert!(matches!(collect(rx).1, Event::Finished { .. }));
    scheduler.shutdown();
}

/// The reference: every position's logprob of the next token and its top
/// alternatives, from `Engine::score` and the one log-softmax helper, as
/// `fathom perplexity` computes them.
fn scored(tokens: &[u32], top: usize) -> Vec<TokenLogprob> {
    let (mut engine, _) = serve_plan(1, 512, KvBudget::Workload, 64);
    let mut out = Vec::new();
    engine
        .score(tokens, 0, &mut |pos, logits| {
            if let Some(&next) = tokens.get(pos + 1) {
                let entry = TokenLogprob::new(logits, next, top);
                assert_eq!(entry.logprob, log_prob(logits, next as usize));
                out.push(entry);
            } else {
                out.push(TokenLogprob::new(logits, u32::MAX, top));
            }
        })
        .unwrap();
    out
}

#[test]
fn echoed_prompt_logprobs_equal_the_perplexity_computation_at_every_position() {
    let (scheduler, encoder) = start_prefix_cached();
    let text = PROMPTS.join(" ").repeat(3);
    // A plain job first fills the prefix cache with the same prompt: the
    // scored job must compute its positions anyway.
    let (plain, rx) = encoder.job(&text, 2);
    scheduler.submit(plain).unwrap();
    collect(rx);
    let (mut job, rx) = encoder.job(&text, 3);
    let tokens = job.prompt.clone();
    assert!(
        tokens.len() > 3 * 64,
        "several step chunks: {}",
        tokens.len()
    );
    job.logprobs = Some(Logprobs {
        top: 5,
        prompt: true,
    });
    // Another job in the same steps, so scored rows share steps with
    // another sequence's.
    let (other, other_rx) = encoder.job(PROMPTS[2], 40);
    scheduler.submit(other).unwrap();
    scheduler.submit(job).unwrap();
    let mut rx = rx;
    let Some(Event::PromptLogprobs { first, rest }) = rx.blocking_recv() else {
        panic!("the prompt's logprobs come first")
    };
    let mut generated = Vec::new();
    let last = loop {
        match rx.blocking_recv().expect("a final event") {
            Event::Text { logprobs, .. } => generated.extend(logprobs),
            last => break last,
        }
    };
    collect(other_rx);
    let Event::Finished {
        reason,
        completion_tokens,
        cached_tokens,
        ..
    } = last
    else {
        panic!("{last:?}")
    };
    assert_eq!(
        (reason, completion_tokens, cached_tokens),
        (FinishReason::Length, 3, 0)
    );
    assert_eq!(first, tokens[0]);
    assert_eq!(rest.len(), tokens.len() - 1);
    let want = scored(&tokens, 5);
    let mut max_diff = 0.0f64;
    for (p, (got, want)) in rest.iter().zip(&want).enumerate() {
        assert_eq!(got.token, tokens[p + 1], "position {p}");
        max_diff = max_diff.max((got.logprob - want.logprob).abs());
        let ids = |e: &TokenLogprob| e.top.iter().map(|t| t.0).collect::<Vec<_>>();
        assert_eq!(ids(got), ids(want), "position {p}");
    }
    eprintln!(
        "{} prompt positions: max |logprob - perplexity's| = {max_diff:e}",
        rest.len()
    );
    assert_eq!(max_diff, 0.0, "the same logits, the same helper");
    // Greedy: each generated token is its position's most likely, and its
    // logprob is the model's; the first follows the prompt's last position.
    assert_eq!(generated.len(), 3);
    for g in &generated {
        assert_eq!(g.top[0], (g.token, g.logprob), "{g:?}");
    }
    let after_prompt = want.last().unwrap();
    assert_eq!(generated[0].top, after_prompt.top);

    // max_tokens 0: the prompt scored, nothing generated.
    let (mut job, mut rx) = encoder.job(PROMPTS[0], 0);
    job.logprobs = Some(Logprobs {
        top: 0,
        prompt: true,
    });
    let short = job.prompt.clone();
    scheduler.submit(job).unwrap();
    let Some(Event::PromptLogprobs { rest, .. }) = rx.blocking_recv() else {
        panic!("the prompt's logprobs")
    };
    assert_eq!(rest.len(), short.len() - 1);
    assert!(rest.iter().all(|e| e.top.is_empty() && e.logprob < 0.0));
    let last = rx.blocking_recv();
    assert!(
        matches!(
            last,
            Some(Event::Finished {
                reason: FinishReason::Length,
                completion_tokens: 0,
                ..
            })
        ),
        "{last:?}"
    );
    scheduler.shutdown();
}
