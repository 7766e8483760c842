//! openraft's async runtime for the group: tokio, as `openraft::TokioRuntime`, except
//! where openraft draws its random numbers (the election timeouts).
//!
//! Why it exists: the deterministic simulation (`sim/`) runs a whole group on one
//! thread and must make the same elections for the same seed, so a thread may install a
//! seeded generator ([`seed_thread_rng`]). A server never does: every draw then comes
//! from `rand::thread_rng()`, exactly as with `TokioRuntime`. Time is tokio's
//! (`tokio::time`), which the simulation pauses and advances itself.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use openraft::async_runtime::TokioOneShotSender;
use openraft::{AsyncRuntime, OptionalSend, TokioInstant};
use rand::rngs::{StdRng, ThreadRng};
use rand::{RngCore, SeedableRng};

thread_local! {
    static SEEDED: RefCell<Option<StdRng>> = const { RefCell::new(None) };
    /// The gate of the task being polled on this thread, if it runs under one.
    static GATE: RefCell<Option<Arc<dyn TaskGate>>> = const { RefCell::new(None) };
}

/// Whether the tasks of one member may run now. A server installs none: its tasks are
/// always polled. The simulation runs several members in one process and stops one as
/// `SIGSTOP` stops a process, by not polling its tasks: openraft's, `RaftNode`'s and
/// what they spawn in turn, each spawned through [`gated`].
pub trait TaskGate: Send + Sync + 'static {
    /// `Ready` when the tasks may run; `Pending` while they may not, having kept the
    /// waker to wake when they may again.
    fn poll_open(&self, cx: &mut Context<'_>) -> Poll<()>;
}

pin_project_lite::pin_project! {
    /// A task's future under the gate of the task that spawned it (see [`TaskGate`]);
    /// with none, it is polled as it is.
    pub struct Gated<F> {
        gate: Option<Arc<dyn TaskGate>>,
        #[pin]
        inner: F,
    }
}

/// `f` under the gate of the task spawning it, if that task runs under one. Every task
/// a member spawns goes through this, so that the tasks it spawns later carry the
/// member's gate too.
pub fn gated<F: Future>(inner: F) -> Gated<F> {
    let gate = GATE.with(|g| g.borrow().clone());
    Gated { gate, inner }
}

/// `f` under `gate`: the tasks it spawns through [`gated`] run under it too.
pub fn under_gate<F: Future>(gate: Arc<dyn TaskGate>, inner: F) -> Gated<F> {
    Gated {
        gate: Some(gate),
        inner,
    }
}

impl<F: Future> Future for Gated<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let Some(gate) = this.gate else {
            return this.inner.poll(cx);
        };
        if gate.poll_open(cx).is_pending() {
            return Poll::Pending;
        }
        let _current = Current::enter(gate.clone());
        this.inner.poll(cx)
    }
}

/// The gate current on this thread while a gated future is polled; the one before it
/// again afterwards (a gated future may poll another, as a call polls its peer's answer).
struct Current(Option<Arc<dyn TaskGate>>);

impl Current {
    fn enter(gate: Arc<dyn TaskGate>) -> Current {
        Current(GATE.with(|g| g.replace(Some(gate))))
    }
}

impl Drop for Current {
    fn drop(&mut self) {
        let before = self.0.take();
        GATE.with(|g| *g.borrow_mut() = before);
    }
}

/// From now on, openraft's random draws on this thread come from a generator seeded
/// with `seed` (the simulation's); `None` goes back to `rand::thread_rng()`.
pub fn seed_thread_rng(seed: Option<u64>) {
    SEEDED.with(|s| *s.borrow_mut() = seed.map(StdRng::seed_from_u64));
}

/// This thread's generator for openraft: the seeded one if the thread installed one.
pub struct RaftRng(ThreadRng);

impl RaftRng {
    fn seeded<T>(f: impl FnOnce(&mut StdRng) -> T) -> Option<T> {
        SEEDED.with(|s| s.borrow_mut().as_mut().map(f))
    }
}

impl RngCore for RaftRng {
    fn next_u32(&mut self) -> u32 {
        RaftRng::seeded(|r| r.next_u32()).unwrap_or_else(|| self.0.next_u32())
    }

    fn next_u64(&mut self) -> u64 {
        RaftRng::seeded(|r| r.next_u64()).unwrap_or_else(|| self.0.next_u64())
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        if RaftRng::seeded(|r| r.fill_bytes(dest)).is_none() {
            self.0.fill_bytes(dest);
        }
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

/// tokio, with [`RaftRng`] as openraft's generator (see the module's description).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Runtime;

impl AsyncRuntime for Runtime {
    type JoinError = tokio::task::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = tokio::task::JoinHandle<T>;
    type Sleep = tokio::time::Sleep;
    type Instant = TokioInstant;
    type TimeoutError = tokio::time::error::Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = tokio::time::Timeout<T>;
    type ThreadLocalRng = RaftRng;
    type OneshotSender<T: OptionalSend> = TokioOneShotSender<T>;
    type OneshotReceiver<T: OptionalSend> = tokio::sync::oneshot::Receiver<T>;
    type OneshotReceiverError = tokio::sync::oneshot::error::RecvError;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        tokio::task::spawn(gated(future))
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        tokio::time::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        tokio::time::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        tokio::time::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        tokio::time::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        join_error.is_panic()
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        RaftRng(rand::thread_rng())
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (TokioOneShotSender(tx), rx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::task::Waker;

    use parking_lot::Mutex;

    use super::*;

    /// A gate closed until opened, keeping the wakers of what found it closed.
    #[derive(Default)]
    struct Switch {
        closed: AtomicBool,
        waiting: Mutex<Vec<Waker>>,
    }

    impl Switch {
        fn open(&self) {
            self.closed.store(false, Ordering::Release);
            for w in std::mem::take(&mut *self.waiting.lock()) {
                w.wake();
            }
        }
    }

    impl TaskGate for Switch {
        fn poll_open(&self, cx: &mut Context<'_>) -> Poll<()> {
            if !self.closed.load(Ordering::Acquire) {
                return Poll::Ready(());
            }
            self.waiting.lock().push(cx.waker().clone());
            Poll::Pending
        }
    }

    async fn settle() {
        for _ in 0..16 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_closed_gate_stops_its_tasks_and_those_they_spawn() {
        let gate = Arc::new(Switch::default());
        let (outer, inner) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let (o, i) = (outer.clone(), inner.clone());
        let spawned = tokio::spawn(under_gate(gate.clone(), async move {
            o.fetch_add(1, Ordering::AcqRel);
            // Spawned from under the gate: runs under it too.
            tokio::spawn(gated(async move {
                loop {
                    i.fetch_add(1, Ordering::AcqRel);
                    tokio::task::yield_now().await;
                }
            }));
            loop {
                o.fetch_add(1, Ordering::AcqRel);
                tokio::task::yield_now().await;
            }
        }));
        settle().await;
        assert!(outer.load(Ordering::Acquire) > 0);
        assert!(inner.load(Ordering::Acquire) > 0);
        gate.closed.store(true, Ordering::Release);
        settle().await;
        let (o1, i1) = (outer.load(Ordering::Acquire), inner.load(Ordering::Acquire));
        settle().await;
        assert_eq!(
            outer.load(Ordering::Acquire),
            o1,
            "a task ran with its gate closed"
        );
        assert_eq!(inner.load(Ordering::Acquire), i1, "a task it spawned ran");
        gate.open();
        settle().await;
        assert!(outer.load(Ordering::Acquire) > o1);
        assert!(inner.load(Ordering::Acquire) > i1);
        spawned.abort();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn without_a_gate_a_task_spawns_ungated_tasks() {
        let ran = Arc::new(AtomicU32::new(0));
        let r = ran.clone();
        tokio::spawn(gated(async move {
            r.fetch_add(1, Ordering::AcqRel);
        }))
        .await
        .expect("the task ends");
        assert_eq!(ran.load(Ordering::Acquire), 1);
        assert!(GATE.with(|g| g.borrow().is_none()));
    }
}
