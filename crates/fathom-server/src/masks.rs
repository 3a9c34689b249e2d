//! The token masks' worker: one long-lived thread, started with the
//! scheduler, that computes the next masks of a step's constrained rows
//! while the step's forward pass runs.
//!
//! The scheduler hands each constrained slot's [`ConstraintState`] over
//! (a `Box` moved through a bounded channel, so nothing is allocated per
//! step) before the forward pass, and takes each back, its mask computed,
//! just before that row is sampled: rows without a constraint, and rows
//! whose masks came first, are sampled while later masks are still being
//! computed. The states come back in the order they went, so the scheduler
//! knows whose each is. The mask buffers are the slots' own (the
//! scheduler's pool, one per slot, allocated at start-up): the worker
//! holds nothing but its stack between steps.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::JoinHandle;

use crate::constraint::ConstraintState;

/// The worker's stack: the plan's `constraints` term counts it
/// ([`fathom_plan::serve::MASK_WORKER_STACK_BYTES`]).
pub const STACK_BYTES: usize = fathom_plan::serve::MASK_WORKER_STACK_BYTES as usize;

/// A handle to the worker thread; owned by the scheduler's loop.
pub struct MaskWorker {
    jobs: Option<SyncSender<Box<ConstraintState>>>,
    done: Receiver<Box<ConstraintState>>,
    /// States handed over and not yet taken back.
    in_flight: usize,
    thread: Option<JoinHandle<()>>,
}

impl MaskWorker {
    /// Starts the worker for up to `slots` states in flight at once (the
    /// channels' capacity: handing over never waits). A worker that could
    /// not be spawned leaves every mask to be computed when its row is
    /// sampled.
    pub fn start(slots: usize) -> MaskWorker {
        let (jobs, inbox) = mpsc::sync_channel::<Box<ConstraintState>>(slots.max(1));
        let (outbox, done) = mpsc::sync_channel::<Box<ConstraintState>>(slots.max(1));
        let thread = std::thread::Builder::new()
            .name("fathom-masks".into())
            .stack_size(STACK_BYTES)
            .spawn(move || {
                for mut state in inbox {
                    // A panic in the constraint engine fails that request,
                    // not the worker (nor the other requests' masks).
                    if catch_unwind(AssertUnwindSafe(|| state.update_mask())).is_err() {
                        state.fail_mask("the constraint engine failed computing the mask");
                    }
                    if outbox.send(state).is_err() {
                        return;
                    }
                }
            });
        match thread {
            Ok(thread) => MaskWorker {
                jobs: Some(jobs),
                done,
                in_flight: 0,
                thread: Some(thread),
            },
            Err(e) => {
                eprintln!("warning: no mask worker ({e}): masks are computed as rows are sampled");
                MaskWorker {
                    jobs: None,
                    done,
                    in_flight: 0,
                    thread: None,
                }
            }
        }
    }

    /// Hands `state` over to have its next mask computed; gives it back
    /// when the worker is gone (its mask is then computed when sampled).
    pub fn submit(&mut self, state: Box<ConstraintState>) -> Result<(), Box<ConstraintState>> {
        let Some(jobs) = &self.jobs else {
            return Err(state);
        };
        match jobs.try_send(state) {
            Ok(()) => {
                self.in_flight += 1;
                Ok(())
            }
            Err(mpsc::TrySendError::Full(state) | mpsc::TrySendError::Disconnected(state)) => {
                Err(state)
            }
        }
    }

    /// The oldest state handed over, its mask computed (waiting for it);
    /// `None` when none is in flight or the worker is gone.
    pub fn receive(&mut self) -> Option<Box<ConstraintState>> {
        if self.in_flight == 0 {
            return None;
        }
        let state = self.done.recv().ok()?;
        self.in_flight -= 1;
        Some(state)
    }
}

impl Drop for MaskWorker {
    fn drop(&mut self) {
        // Closing the channel ends the worker's loop.
        self.jobs.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
