//! A member's task gate (`raft::runtime::TaskGate`): every task its `RaftNode` and
//! openraft spawn runs under it, and so does its answer to a peer's request. Closed, none
//! of them is polled, as none of a process's threads runs while it is stopped
//! (`SIGSTOP`): its timers still fall due, but what waits on them runs only when it
//! continues (`SIGCONT`), all of it then, in the order it was woken.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;
use stockgate_server::raft::runtime::TaskGate;

/// One member's gate, across its processes.
#[derive(Default)]
pub struct Gate {
    stopped: AtomicBool,
    /// The tasks that found it closed, in the order they did.
    waiting: Mutex<Vec<Waker>>,
}

impl Gate {
    /// An open gate.
    pub fn new() -> Arc<Gate> {
        Arc::new(Gate::default())
    }

    /// Stops the member's tasks.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
    }

    /// Lets them run again: every task that found the gate closed is woken, oldest
    /// first (no draw: the scheduler runs them in that order).
    pub fn resume(&self) {
        self.stopped.store(false, Ordering::Release);
        let waiting = std::mem::take(&mut *self.waiting.lock());
        for w in waiting {
            w.wake();
        }
    }

    /// Whether the member is stopped.
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }
}

impl TaskGate for Gate {
    fn poll_open(&self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.is_stopped() {
            return Poll::Ready(());
        }
        let mut waiting = self.waiting.lock();
        if !waiting.iter().any(|w| w.will_wake(cx.waker())) {
            waiting.push(cx.waker().clone());
        }
        Poll::Pending
    }
}
