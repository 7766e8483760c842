//! Time is injected so tests (and the deterministic simulation) can move it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::types::Millis;

/// Where the engine reads the time: injected so tests and replays control it.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch. Must never go backwards for one clock.
    fn now_ms(&self) -> Millis;
}

/// Wall clock, made monotonic: a step of the system clock backwards must not make a
/// reservation live again or expire one early.
#[derive(Debug, Default)]
pub struct SystemClock {
    last: AtomicU64,
}

impl SystemClock {
    /// A clock that starts at the system time.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> Millis {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        // Read first and write only when the millisecond moved on: `fetch_max` always
        // writes, so every RESERVE on every core would take this cache line exclusive.
        let prev = self.last.load(Ordering::Relaxed);
        if wall <= prev {
            return prev;
        }
        let prev = self.last.fetch_max(wall, Ordering::Relaxed);
        prev.max(wall)
    }
}

/// A clock that only moves when told to. Used by tests and simulations.
#[derive(Debug)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    /// A clock standing at `start_ms`.
    pub fn new(start_ms: Millis) -> Self {
        ManualClock {
            now: AtomicU64::new(start_ms),
        }
    }
    /// Moves the clock `ms` forward.
    pub fn advance(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }
    /// Moves the clock to `ms`; never backwards (an earlier `ms` leaves it where it is).
    pub fn set(&self, ms: Millis) {
        self.now.fetch_max(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> Millis {
        self.now.load(Ordering::SeqCst)
    }
}
