//! The scheduler: one thread owns the engine and runs every job.
//!
//! First version: jobs run one at a time, in arrival order (continuous
//! batching replaces this behind the same interface).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use fathom_engine::{Engine, Sampler, StopReason};

use crate::job::{Event, FinishReason, Job, SubmitError};
use crate::stats::SchedulerStats;

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Sequences decoded together (`--parallel`).
    pub parallel: usize,
    /// Jobs that may wait for a slot before new ones get 503.
    pub queue_capacity: usize,
}

/// A handle to the scheduler thread; shared by every connection.
pub struct Scheduler {
    sender: Mutex<Option<mpsc::Sender<Job>>>,
    waiting: Arc<AtomicUsize>,
    stopping: AtomicBool,
    stats: Arc<SchedulerStats>,
    capacity: usize,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Scheduler {
    /// Starts the scheduler thread, which owns `engine` from now on.
    pub fn start(engine: Engine, config: SchedulerConfig) -> Scheduler {
        let (sender, receiver) = mpsc::channel::<Job>();
        let waiting = Arc::new(AtomicUsize::new(0));
        let stats = Arc::new(SchedulerStats::default());
        let thread = {
            let (waiting, stats) = (waiting.clone(), stats.clone());
            std::thread::Builder::new()
                .name("fathom-scheduler".into())
                .spawn(move || run(engine, receiver, &waiting, &stats))
                .expect("spawning the scheduler thread")
        };
        Scheduler {
            sender: Mutex::new(Some(sender)),
            waiting,
            stopping: AtomicBool::new(false),
            stats,
            capacity: config.queue_capacity,
            thread: Mutex::new(Some(thread)),
        }
    }

    /// Queues `job`, or refuses it when the queue is full or the server stops.
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err(SubmitError::ShuttingDown);
        }
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.capacity {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::QueueFull);
        }
        SchedulerStats::set(
            &self.stats.queue_depth,
            self.waiting.load(Ordering::SeqCst) as u64,
        );
        let sender = self.sender.lock().expect("scheduler lock");
        match sender.as_ref().map(|s| s.send(job)) {
            Some(Ok(())) => Ok(()),
            _ => {
                self.waiting.fetch_sub(1, Ordering::SeqCst);
                Err(SubmitError::ShuttingDown)
            }
        }
    }

    pub fn stats(&self) -> &SchedulerStats {
        &self.stats
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

fn run(
    mut engine: Engine,
    receiver: mpsc::Receiver<Job>,
    waiting: &AtomicUsize,
    stats: &SchedulerStats,
) {
    while let Ok(job) = receiver.recv() {
        waiting.fetch_sub(1, Ordering::SeqCst);
        SchedulerStats::set(&stats.queue_depth, waiting.load(Ordering::SeqCst) as u64);
        if job.events.is_closed() {
            continue;
        }
        SchedulerStats::set(&stats.running, 1);
        SchedulerStats::add(&stats.prompt_tokens, job.prompt.len() as u64);
        let mut sampler = Sampler::new(job.sampling.clone());
        let events = job.events.clone();
        let result = engine.generate(
            &job.prompt,
            job.max_tokens,
            &mut sampler,
            &job.stop,
            &mut |text| events.send(Event::Text(text.to_string())).is_ok(),
        );
        let event = match result {
            Ok(stats_) => {
                SchedulerStats::add(&stats.generated_tokens, stats_.generated_tokens as u64);
                let reason = match stats_.reason {
                    StopReason::Length => FinishReason::Length,
                    StopReason::Stop | StopReason::Cancelled => FinishReason::Stop,
                };
                Event::Finished {
                    reason,
                    prompt_tokens: stats_.prompt_tokens,
                    completion_tokens: stats_.generated_tokens,
                    cached_tokens: 0,
                }
            }
            Err(err) => Event::Failed(err.to_string()),
        };
        let _ = job.events.send(event);
        SchedulerStats::set(&stats.running, 0);
    }
}
