//! Time is injected so tests (and the deterministic simulation) can move it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::types::Millis;

/// Where the engine reads the time: injected so tests and replays control it.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch. Must never go backwards for one clock.
    fn now_ms(&self) -> Millis;
}

/// A wall clock as it is read, free to step either way (an NTP step, an operator's
/// `date`): [`Monotonic`] makes a [`Clock`] of it.
pub trait WallSource: Send + Sync {
    /// Milliseconds since the Unix epoch, as read now.
    fn wall_ms(&self) -> Millis;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemWall;

impl WallSource for SystemWall {
    fn wall_ms(&self) -> Millis {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// A wall source made monotonic: a step of it backwards must not make a reservation
/// live again or expire one early, so the clock stays at the newest reading until the
/// source passes it again. The newest reading lives in this value only: a new process
/// starts a new one, from whatever the source then says.
#[derive(Debug, Default)]
pub struct Monotonic<W> {
    wall: W,
    last: AtomicU64,
}

impl<W: WallSource> Monotonic<W> {
    /// A clock that starts at what `wall` reads.
    pub fn over(wall: W) -> Self {
        Monotonic {
            wall,
            last: AtomicU64::new(0),
        }
    }

    /// The source it reads.
    pub fn wall(&self) -> &W {
        &self.wall
    }
}

impl<W: WallSource> Clock for Monotonic<W> {
    fn now_ms(&self) -> Millis {
        let wall = self.wall.wall_ms();
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

/// Wall clock, made monotonic: a step of the system clock backwards must not make a
/// reservation live again or expire one early.
pub type SystemClock = Monotonic<SystemWall>;

impl Monotonic<SystemWall> {
    /// A clock that starts at the system time.
    pub fn new() -> Self {
        Self::over(SystemWall)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A wall source set by hand, free to go backwards.
    #[derive(Default)]
    struct Stepped(AtomicU64);

    impl WallSource for Stepped {
        fn wall_ms(&self) -> Millis {
            self.0.load(Ordering::SeqCst)
        }
    }

    #[test]
    fn a_backward_step_of_the_wall_holds_the_clock_until_the_wall_passes_it() {
        let c = Monotonic::over(Stepped::default());
        c.wall().0.store(1_000, Ordering::SeqCst);
        assert_eq!(c.now_ms(), 1_000);
        c.wall().0.store(400, Ordering::SeqCst);
        assert_eq!(c.now_ms(), 1_000);
        c.wall().0.store(1_001, Ordering::SeqCst);
        assert_eq!(c.now_ms(), 1_001);
    }

    #[test]
    fn a_new_clock_over_a_stepped_back_wall_starts_behind_the_old_one() {
        // What a process restarted after a backward step sees: nothing carries over.
        let old = Monotonic::over(Stepped::default());
        old.wall().0.store(5_000, Ordering::SeqCst);
        assert_eq!(old.now_ms(), 5_000);
        let new = Monotonic::over(Stepped::default());
        new.wall().0.store(2_000, Ordering::SeqCst);
        assert_eq!(new.now_ms(), 2_000);
    }

    #[test]
    fn the_system_clock_never_goes_backwards() {
        let c = SystemClock::new();
        let a = c.now_ms();
        assert!(a > 0);
        assert!(c.now_ms() >= a);
    }
}
