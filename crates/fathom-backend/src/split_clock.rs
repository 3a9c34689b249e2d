//! Where a split model's time goes, kept when `FATHOM_SPLIT_PROFILE` is
//! set and printed to stderr when the split backend drops: wall time
//! charged to what the host was doing, phase by phase, separately for
//! large steps (from the stream threshold's rows: prefill chunks) and
//! small ones (decode).
//!
//! Device work is asynchronous, so its time shows where the host waits
//! for it: a streamed product ends with its rows read back (copy of the
//! matrix, the product and the read-back), and a crossing to the host
//! waits for the device's layers before it. Time between the backend's
//! calls (the engine's sampling, the bench's own work) goes to the phase
//! that was current.

use std::time::Instant;

/// What the host is doing (in the report's order: the discriminant
/// indexes [`NAMES`] and the clock's sums).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Attention and cache writes of the host's layers.
    HostAttention,
    /// The host's layers' matrix products and routed experts on the CPU.
    HostProducts,
    /// Host ops other than the ones above: norms, rope, the residual.
    HostOther,
    /// Host matrices multiplied on the device: copy, product, read-back.
    Streamed,
    /// Activation rows crossing between the sides (waiting for the
    /// device's work before them included).
    Crossing,
    /// Recording device ops (the device side is current).
    DeviceSide,
}

const NAMES: [&str; 6] = [
    "host attention",
    "host products",
    "other host ops",
    "streamed products",
    "crossings",
    "device side",
];

/// Nanoseconds per phase, for small and large steps.
pub(crate) struct SplitClock {
    /// Off: every call returns at once.
    on: bool,
    phase: Phase,
    large: bool,
    since: Instant,
    nanos: [[u64; 2]; NAMES.len()],
    /// Steps of at least this many rows count as large.
    large_rows: usize,
}

impl SplitClock {
    /// On when `FATHOM_SPLIT_PROFILE` is set to anything but `0`.
    pub(crate) fn from_env(large_rows: usize) -> Self {
        let on = std::env::var("FATHOM_SPLIT_PROFILE").is_ok_and(|v| v.trim() != "0");
        SplitClock {
            on,
            phase: Phase::DeviceSide,
            large: false,
            since: Instant::now(),
            nanos: [[0; 2]; NAMES.len()],
            large_rows,
        }
    }

    /// Starts over: what loading took is not a step's.
    pub(crate) fn restart(&mut self) {
        self.nanos = [[0; 2]; NAMES.len()];
        self.since = Instant::now();
    }

    /// Charges the time since the last change to the current phase.
    fn charge(&mut self) {
        let now = Instant::now();
        self.nanos[self.phase as usize][usize::from(self.large)] +=
            (now - self.since).as_nanos() as u64;
        self.since = now;
    }

    /// Makes `phase` current for a step of `rows`, the time before going
    /// to the phase it replaces, which it returns for [`Self::leave`].
    pub(crate) fn enter(&mut self, phase: Phase, rows: usize) -> Phase {
        if !self.on {
            return phase;
        }
        self.charge();
        self.large = rows >= self.large_rows;
        std::mem::replace(&mut self.phase, phase)
    }

    /// Back to the phase [`Self::enter`] replaced, in the same step.
    pub(crate) fn leave(&mut self, previous: Phase) {
        if self.on {
            self.charge();
            self.phase = previous;
        }
    }

    /// The table printed at the end, or `None` when off.
    pub(crate) fn report(&mut self) -> Option<String> {
        if !self.on {
            return None;
        }
        self.charge();
        let ms = |n: u64| n as f64 / 1e6;
        let mut out = format!(
            "split time (FATHOM_SPLIT_PROFILE), ms: steps of {} rows or more | fewer\n",
            self.large_rows
        );
        for (name, [small, large]) in NAMES.iter().zip(self.nanos) {
            out += &format!("  {name:<18} {:>10.1} | {:>10.1}\n", ms(large), ms(small));
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock(on: bool) -> SplitClock {
        SplitClock {
            on,
            ..SplitClock::from_env(32)
        }
    }

    /// Time goes to the phase that was current, by step size, and
    /// `leave` restores the phase `enter` replaced.
    #[test]
    fn time_goes_to_the_current_phase() {
        let mut c = clock(true);
        c.enter(Phase::HostOther, 512);
        let before = c.enter(Phase::Streamed, 512);
        assert_eq!(before, Phase::HostOther);
        std::thread::sleep(std::time::Duration::from_millis(20));
        c.leave(before);
        assert_eq!(c.phase, Phase::HostOther);
        c.enter(Phase::Crossing, 1);
        std::thread::sleep(std::time::Duration::from_millis(10));
        let report = c.report().unwrap();
        let at = |p: Phase| p as usize;
        assert!(c.nanos[at(Phase::Streamed)][1] >= 20_000_000, "{report}");
        assert_eq!(c.nanos[at(Phase::Streamed)][0], 0);
        assert!(c.nanos[at(Phase::Crossing)][0] >= 10_000_000, "{report}");
        assert_eq!(c.nanos[at(Phase::Crossing)][1], 0);
        assert!(report.contains("streamed products"), "{report}");
    }

    #[test]
    fn off_keeps_nothing() {
        let mut c = clock(false);
        c.enter(Phase::Streamed, 512);
        assert_eq!(c.report(), None);
        assert_eq!(c.nanos, [[0; 2]; NAMES.len()]);
    }
}
