//! A persistent pool of worker threads.
//!
//! Decode calls [`Pool::run`] hundreds of times per token, each job a few
//! microseconds long, so a hand-off must cost well under a microsecond: the
//! job is published by bumping an epoch counter that idle workers spin on,
//! and only after [`SPIN`] and [`YIELD`] without work does a worker park
//! (and then costs a futex wake). Nothing is allocated per call: the job
//! is a borrowed closure whose lifetime `run` outlives by waiting for
//! every worker.

use std::cell::UnsafeCell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How long a waiting thread re-checks in a tight loop before it starts
/// yielding. Short: when the pool's threads share a core (another process
/// holds the other), a spinning waiter keeps the thread it waits for off
/// that core until the spin ends, which cost ~100 us per hand-off with a
/// 50 us spin. Once yielding, a waiter on a core of its own still sees
/// work within one `sched_yield` (under a microsecond).
const SPIN: Duration = Duration::from_micros(4);

/// How long an idle worker then keeps yielding its core before it parks:
/// long enough to bridge a step of sampling and scheduling, short enough
/// that an idle server gives its cores back almost at once.
const YIELD: Duration = Duration::from_micros(1000);

type Job = dyn Fn(usize, usize) + Sync;

/// Keeps hot atomics on their own cache lines.
#[repr(align(128))]
struct Padded<T>(T);

struct Shared {
    /// Bumped once per job (and at shutdown); workers run a job when they
    /// see a value they have not seen.
    epoch: Padded<AtomicUsize>,
    /// Workers yet to finish the current job.
    pending: Padded<AtomicUsize>,
    /// The current job, written by `run` before it bumps `epoch` and read
    /// by workers after they see the bump. Lifetime erased: see `run`.
    job: UnsafeCell<Option<*const Job>>,
    /// Per worker: parked (or about to), so `run` must unpark it.
    sleeping: Vec<Padded<AtomicBool>>,
    panicked: AtomicBool,
    shutdown: AtomicBool,
}

// SAFETY: `job` is written only by `run` while no worker reads it (all are
// between jobs: `pending` is 0) and published by the Release/Acquire pair
// on `epoch`; everything else is atomic.
unsafe impl Sync for Shared {}
// SAFETY: as above; the job pointer refers to a `Sync` closure.
unsafe impl Send for Shared {}

/// A fixed set of worker threads; the thread calling [`Pool::run`] is
/// worker 0.
pub struct Pool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// Serializes `run` calls from different threads.
    running: Mutex<()>,
}

impl Pool {
    /// A pool of `n_threads` workers in all (at least 1), spawning
    /// `n_threads - 1` threads.
    pub fn new(n_threads: usize) -> Pool {
        let n = n_threads.max(1);
        let shared = Arc::new(Shared {
            epoch: Padded(AtomicUsize::new(0)),
            pending: Padded(AtomicUsize::new(0)),
            job: UnsafeCell::new(None),
            sleeping: (1..n).map(|_| Padded(AtomicBool::new(false))).collect(),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
        });
        let threads = (1..n)
            .map(|i| {
                let shared = Arc::clone(&shared);
                thread::Builder::new()
                    .name(format!("fathom-worker-{i}"))
                    .spawn(move || worker(&shared, i, n))
                    .expect("spawning a pool worker thread")
            })
            .collect();
        Pool {
            shared,
            threads,
            running: Mutex::new(()),
        }
    }

    pub fn n_threads(&self) -> usize {
        self.threads.len() + 1
    }

    /// Runs `f(worker, n_workers)` once on every worker, the calling thread
    /// being worker 0, and returns when all are done. `f` must not call
    /// `run` on the same pool. A panic in any worker is re-raised here.
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        let n = self.n_threads();
        if n == 1 {
            f(0, 1);
            return;
        }
        let _one_at_a_time = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY: no worker reads `job` now (the previous `run` waited for
        // `pending` to reach 0), and this `run` clears it again only after
        // every worker is done with it, so erasing the borrow's lifetime
        // cannot let a worker see a dangling closure.
        unsafe {
            let erased: *const Job =
                std::mem::transmute::<&(dyn Fn(usize, usize) + Sync), &'static Job>(f);
            *s.job.get() = Some(erased);
        }
        s.pending.0.store(n - 1, Ordering::Relaxed);
        // SeqCst pairs with the worker's store to `sleeping` then load of
        // `epoch`: either it sees this bump or we see it asleep.
        s.epoch.0.fetch_add(1, Ordering::SeqCst);
        for (flag, t) in s.sleeping.iter().zip(&self.threads) {
            if flag.0.load(Ordering::SeqCst) {
                t.thread().unpark();
            }
        }
        let mine = panic::catch_unwind(AssertUnwindSafe(|| f(0, n)));
        let mut backoff = Backoff::new();
        while s.pending.0.load(Ordering::Acquire) != 0 {
            // Workers are busy or about to be: never park here.
            let _ = backoff.wait();
        }
        // SAFETY: every worker has finished with the job (pending is 0).
        unsafe { *s.job.get() = None };
        if let Err(p) = mine {
            panic::resume_unwind(p);
        }
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a fathom pool worker panicked");
        }
    }
}

fn worker(s: &Shared, index: usize, n: usize) {
    let mut seen = 0usize;
    loop {
        seen = wait_for_epoch(s, index, seen);
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        // SAFETY: `run` stored the job before the epoch bump we acquired,
        // and keeps it alive until `pending` reaches 0, which it cannot do
        // before our decrement below.
        let job = unsafe { (*s.job.get()).expect("a job is published with its epoch") };
        // SAFETY: as above, the closure outlives this call.
        let f = unsafe { &*job };
        if panic::catch_unwind(AssertUnwindSafe(|| f(index, n))).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.pending.0.fetch_sub(1, Ordering::Release);
    }
}

/// Where a waiting thread is in its wait.
enum Wait {
    Spin,
    Yield,
    Park,
}

/// Spin-then-yield backoff. The spin is a plain re-check without `pause`:
/// in a KVM guest a run of `pause` instructions trips pause-loop exiting,
/// which hands the virtual CPU back to the host and was measured here to
/// add about 15 us to every hand-off. After [`SPIN`] the waiter yields, so
/// that a core shared with another thread or process is handed over
/// rather than burnt; after [`YIELD`] more, an idle worker parks.
struct Backoff {
    /// Set at the first clock reading, so a wait that ends within a few
    /// dozen checks (the common case) never reads the clock.
    start: Option<Instant>,
    checks: u32,
}

impl Backoff {
    fn new() -> Backoff {
        Backoff {
            start: None,
            checks: 0,
        }
    }

    fn wait(&mut self) -> Wait {
        self.checks = self.checks.wrapping_add(1);
        // Reading the clock costs tens of nanoseconds; do it rarely.
        if !self.checks.is_multiple_of(64) {
            return Wait::Spin;
        }
        let waited = self.start.get_or_insert_with(Instant::now).elapsed();
        if waited < SPIN {
            Wait::Spin
        } else if waited < SPIN + YIELD {
            thread::yield_now();
            Wait::Yield
        } else {
            Wait::Park
        }
    }
}

/// Waits with [`Backoff`], parking at its end, until `epoch` moves past
/// `seen`; returns the new one.
fn wait_for_epoch(s: &Shared, index: usize, seen: usize) -> usize {
    let flag = &s.sleeping[index - 1].0;
    let mut backoff = Backoff::new();
    loop {
        let e = s.epoch.0.load(Ordering::Acquire);
        if e != seen {
            return e;
        }
        if !matches!(backoff.wait(), Wait::Park) {
            continue;
        }
        flag.store(true, Ordering::SeqCst);
        if s.epoch.0.load(Ordering::SeqCst) == seen {
            thread::park();
        }
        flag.store(false, Ordering::Relaxed);
        backoff = Backoff::new();
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.epoch.0.fetch_add(1, Ordering::SeqCst);
        for t in &self.threads {
            t.thread().unpark();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_every_worker_once_per_call() {
        for n in [1, 2, 3] {
            let pool = Pool::new(n);
            assert_eq!(pool.n_threads(), n);
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..1000 {
                pool.run(&|i, total| {
                    assert_eq!(total, n);
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
            }
            for h in &hits {
                assert_eq!(h.load(Ordering::Relaxed), 1000);
            }
        }
    }

    #[test]
    fn wakes_parked_workers() {
        let pool = Pool::new(2);
        let sum = AtomicUsize::new(0);
        pool.run(&|i, _| {
            sum.fetch_add(i + 1, Ordering::Relaxed);
        });
        thread::sleep((SPIN + YIELD) * 2);
        pool.run(&|i, _| {
            sum.fetch_add(i + 1, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 6);
    }

    #[test]
    fn worker_panic_reaches_the_caller_and_the_pool_survives() {
        let pool = Pool::new(2);
        let r = panic::catch_unwind(AssertUnwindSafe(|| {
            pool.run(&|i, _| {
                if i == 1 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        let count = AtomicUsize::new(0);
        pool.run(&|_, _| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn shared_between_threads() {
        let pool = Arc::new(Pool::new(2));
        let total = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let (pool, total) = (Arc::clone(&pool), Arc::clone(&total));
                thread::spawn(move || {
                    for _ in 0..200 {
                        pool.run(&|_, _| {
                            total.fetch_add(1, Ordering::Relaxed);
                        });
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(total.load(Ordering::Relaxed), 3 * 200 * 2);
    }
}
