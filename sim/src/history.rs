//! The run's history: every fault, client outcome, leadership change and final state,
//! stamped with simulated time, hashed as it is written. The digest of two runs of one
//! seed is equal exactly when their histories are, on any machine.

use std::sync::Arc;

use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

/// Shared by every task of a run.
#[derive(Clone)]
pub struct History(Arc<Mutex<Inner>>);

struct Inner {
    start: Instant,
    hash: Sha256,
    lines: u64,
    verbose: bool,
}

impl History {
    /// A history starting now (simulated); `verbose` also prints each line.
    pub fn new(verbose: bool) -> History {
        History(Arc::new(Mutex::new(Inner {
            start: Instant::now(),
            hash: Sha256::new(),
            lines: 0,
            verbose,
        })))
    }

    /// Milliseconds of simulated time since the run began.
    pub fn now_ms(&self) -> u64 {
        self.0.lock().start.elapsed().as_millis() as u64
    }

    /// Appends one event.
    pub fn note(&self, what: impl AsRef<str>) {
        let mut g = self.0.lock();
        let line = format!("{:>8} {}\n", g.start.elapsed().as_millis(), what.as_ref());
        g.hash.update(line.as_bytes());
        g.lines += 1;
        if g.verbose {
            print!("  {line}");
        }
    }

    /// The digest so far (hex) and how many events it covers.
    pub fn digest(&self) -> (String, u64) {
        let g = self.0.lock();
        let d = g.hash.clone().finalize();
        let hex = d.iter().map(|b| format!("{b:02x}")).collect::<String>();
        (hex, g.lines)
    }
}
