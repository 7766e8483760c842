//! The leader's engine ahead of the group: its records, in LSN order, become Raft
//! entries; a reply waits until the entry holding its records is committed and applied.
//!
//! [`Speculation`] is the engine's [`EventSink`] on a group member. While this node
//! leads (`open`), `record` gives each record the next LSN and queues it; the proposer
//! ([`Speculation::propose`]) hands what has queued to Raft as one entry (a batch: group
//! commit, one entry per round of the event loop's work). The state machine calls
//! `committed_own` when such a batch is applied, which lets the waiting replies go.
//!
//! The invariant: `committed ≤ assigned`; they differ only while this node leads and has
//! records in flight ("speculation"). Losing the lead with speculation, or any record
//! written while not leading, **deposes** this node: no waiting reply is ever answered,
//! and the node restarts from its durable state (see `node::restart`).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use tokio::sync::{watch, Notify, Semaphore};

use super::{Batch, Raft};
use crate::engine::{EventRef, EventSink, Lsn};
use crate::session::NotDurable;
use crate::wal::record::encode_record;

/// A batch is closed once its records reach this size (the proposer may take it sooner).
/// Bounded so that an append of `max_payload_entries` of them reaches a follower within
/// the heartbeat interval, openraft's limit for one append (`raft::node`).
const BATCH_BYTES: usize = 256 << 10;
/// Entries handed to Raft and not yet answered, at most; beyond, the proposer waits
/// (and the engine's records queue up in memory, bounded by the connections' pipelines).
const MAX_IN_FLIGHT: usize = 64;

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

struct Open {
    writable: bool,
    term: u64,
    next: Lsn,
    cur: Vec<u8>,
    cur_first: Lsn,
    cur_count: u32,
    ready: VecDeque<Batch>,
}

/// Called once, with the reason, when this node is deposed, so the node can restart from its
/// durable state.
pub type DeposeHook = Box<dyn Fn(&str) + Send + Sync>;

/// The engine's event sink on a group member: numbers the leader's records, batches them into Raft
/// entries and lets replies go once their batch is committed (see the module doc).
pub struct Speculation {
    origin: u64,
    state: Mutex<Open>,
    assigned: AtomicU64,
    committed: watch::Sender<Lsn>,
    deposed: AtomicBool,
    wake: Notify,
    on_depose: OnceLock<DeposeHook>,
}

/// Why a follower's batch could not be applied here.
#[derive(Debug)]
pub struct Deposed;

impl Speculation {
    /// A node not leading, its WAL at `last_lsn`. `origin` names this process.
    pub fn new(origin: u64, last_lsn: Lsn) -> Speculation {
        Speculation {
            origin,
            state: Mutex::new(Open {
                writable: false,
                term: 0,
                next: last_lsn + 1,
                cur: Vec::new(),
                cur_first: 0,
                cur_count: 0,
                ready: VecDeque::new(),
            }),
            assigned: AtomicU64::new(last_lsn),
            committed: watch::Sender::new(last_lsn),
            deposed: AtomicBool::new(false),
            wake: Notify::new(),
            on_depose: OnceLock::new(),
        }
    }

    /// The id of this process, carried in each batch so a member can tell its own batches from
    /// another leader's.
    pub fn origin(&self) -> u64 {
        self.origin
    }

    /// Sets what runs when this node is deposed; only the first hook set is kept.
    pub fn set_depose_hook(&self, hook: DeposeHook) {
        let _ = self.on_depose.set(hook);
    }

    /// Whether the engine may write here: this node leads and is not deposed.
    pub fn writable(&self) -> bool {
        self.state.lock().writable && !self.is_deposed()
    }

    /// The Raft term this node last opened for writing in (0 before it ever led).
    pub fn term(&self) -> u64 {
        self.state.lock().term
    }

    /// Whether this node was deposed: its in-flight replies are never answered and it must restart.
    pub fn is_deposed(&self) -> bool {
        self.deposed.load(Ordering::Acquire)
    }

    /// The last LSN known committed and applied in the group: replies for records up to it may go.
    pub fn committed_lsn(&self) -> Lsn {
        *self.committed.borrow()
    }

    /// Records given an LSN and not yet committed.
    pub fn in_flight(&self) -> u64 {
        self.assigned
            .load(Ordering::Acquire)
            .saturating_sub(self.committed_lsn())
    }

    /// This node now leads `term` and its WAL (every earlier entry applied) ends at
    /// `last_lsn`: records from here on are its own.
    pub fn open(&self, term: u64, last_lsn: Lsn) {
        let mut state = self.state.lock();
        assert!(!state.writable, "opened twice");
        assert!(
            state.cur_count == 0 && state.ready.is_empty(),
            "records queued while not leading"
        );
        state.writable = true;
        state.term = term;
        state.next = last_lsn + 1;
        self.assigned.store(last_lsn, Ordering::Release);
        self.committed.send_replace(last_lsn);
    }

    /// This node no longer leads. With records in flight it is deposed (they may or may
    /// not commit under the next leader; its engine holds them either way).
    pub fn close(&self, why: &str) {
        let mut state = self.state.lock();
        if !state.writable {
            return;
        }
        state.writable = false;
        let pending = self.assigned.load(Ordering::Acquire) > self.committed_lsn();
        drop(state);
        if pending {
            self.depose(&format!(
                "{why} with {} record(s) not yet committed",
                self.in_flight()
            ));
        } else {
            tracing::warn!("raft: {why}; nothing was in flight");
        }
    }

    /// No reply waiting here is answered any more; the hook restarts the node.
    pub fn depose(&self, why: &str) {
        if self.deposed.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::error!("raft: deposed: {why}; restarting from the durable log");
        // Wakes every waiter, which now sees `deposed`.
        self.committed.send_modify(|_| {});
        if let Some(h) = self.on_depose.get() {
            h(why);
        }
    }

    /// A batch this node wrote is committed and in its WAL.
    pub fn committed_own(&self, last: Lsn) {
        debug_assert!(last <= self.assigned.load(Ordering::Acquire));
        self.committed.send_if_modified(|c| {
            let moved = last > *c;
            *c = (*c).max(last);
            moved
        });
    }

    /// Another leader's batch ending at `last` is about to be applied here: allowed only
    /// while this node has nothing of its own in flight (else it is deposed).
    pub fn follow_to(&self, last: Lsn) -> Result<(), Deposed> {
        let mut state = self.state.lock();
        // Leading with nothing in flight: just stop (a record after this deposes).
        if state.writable
            && state.cur_count == 0
            && state.ready.is_empty()
            && self.assigned.load(Ordering::Acquire) <= self.committed_lsn()
        {
            state.writable = false;
            tracing::warn!("raft: another leader's batch arrived; this node stops leading");
        }
        let pending = state.writable
            || state.cur_count > 0
            || !state.ready.is_empty()
            || self.assigned.load(Ordering::Acquire) > self.committed_lsn();
        if pending {
            let why = format!(
                "a batch of another leader (LSN ..={last}) arrived while this node {} (assigned {}, committed {}, queued {})",
                if state.writable { "was leading" } else { "had records in flight" },
                self.assigned.load(Ordering::Acquire),
                self.committed_lsn(),
                state.cur_count as usize + state.ready.len()
            );
            drop(state);
            self.depose(&why);
            return Err(Deposed);
        }
        state.next = last + 1;
        self.assigned.store(last, Ordering::Release);
        drop(state);
        self.committed.send_replace(last);
        Ok(())
    }

    /// Resolves once `lsn` is committed; `Err` if this node was deposed first.
    pub async fn wait(&self, lsn: Lsn) -> Result<(), NotDurable> {
        let mut rx = self.committed.subscribe();
        loop {
            if self.is_deposed() {
                return Err(NotDurable::LostLeadership);
            }
            if *rx.borrow_and_update() >= lsn {
                return Ok(());
            }
            if rx.changed().await.is_err() {
                return Err(NotDurable::Log("raft stopped".into()));
            }
        }
    }

    /// Hands queued records to Raft, in LSN order, forever.
    pub async fn propose(self: Arc<Self>, raft: Raft) {
        let permits = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        loop {
            self.wake.notified().await;
            while let Some(batch) = self.take_batch() {
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return;
                };
                match raft.client_write_ff(batch).await {
                    Ok(rx) => {
                        let me = self.clone();
                        tokio::spawn(super::runtime::gated(async move {
                            let r = rx.await;
                            drop(permit);
                            match r {
                                Ok(Ok(_)) => {}
                                Ok(Err(e)) => me.depose(&format!("raft refused a batch: {e}")),
                                Err(_) => me.depose("raft dropped a batch"),
                            }
                        }));
                    }
                    Err(e) => self.depose(&format!("raft stopped: {e}")),
                }
            }
        }
    }

    fn take_batch(&self) -> Option<Batch> {
        let mut state = self.state.lock();
        if state.ready.is_empty() && state.cur_count > 0 {
            self.close_batch(&mut state);
        }
        state.ready.pop_front()
    }

    fn close_batch(&self, state: &mut Open) {
        let records = std::mem::take(&mut state.cur);
        let b = Batch {
            origin: self.origin,
            first_lsn: state.cur_first,
            count: state.cur_count,
            records: records.into(),
        };
        state.cur_count = 0;
        state.ready.push_back(b);
    }
}

impl EventSink for Speculation {
    fn record(&self, event: &EventRef<'_>) -> Lsn {
        SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            scratch.clear();
            let encoded = encode_record(*event, &mut scratch);
            let mut state = self.state.lock();
            let lsn = state.next;
            state.next += 1;
            self.assigned.store(lsn, Ordering::Release);
            if state.cur_count == 0 {
                state.cur_first = lsn;
            }
            state.cur.extend_from_slice(&scratch);
            state.cur_count += 1;
            if state.cur.len() >= BATCH_BYTES {
                self.close_batch(&mut state);
            }
            let writable = state.writable;
            drop(state);
            if let Err(e) = encoded {
                self.depose(&format!("cannot encode the record at LSN {lsn}: {e}"));
            } else if !writable {
                // The engine changed after this node stopped leading: that state can
                // never commit here.
                self.depose("a write ran after this node stopped leading");
            }
            self.wake.notify_one();
            if scratch.capacity() > 1 << 16 {
                *scratch = Vec::new();
            }
            lsn
        })
    }

    fn last_lsn(&self) -> Lsn {
        self.assigned.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn released(token: &str) -> EventRef<'_> {
        EventRef::Released {
            token,
            at_ms: 5,
            user: "u",
            request_id: "r",
            qty: 1,
            reason: crate::engine::ReleaseReason::Cancel,
        }
    }

    #[test]
    fn raft_speculation_batches_in_lsn_order_and_commits_in_order() {
        let s = Speculation::new(9, 10);
        s.open(3, 10);
        assert_eq!(s.record(&released("a")), 11);
        assert_eq!(s.record(&released("b")), 12);
        let b = s.take_batch().expect("a batch");
        assert_eq!((b.first_lsn, b.count, b.origin), (11, 2, 9));
        assert!(s.take_batch().is_none());
        assert_eq!(s.in_flight(), 2);
        s.committed_own(12);
        assert_eq!(s.in_flight(), 0);
        s.close("stepped down");
        assert!(!s.is_deposed(), "nothing was in flight");
    }

    #[test]
    fn raft_speculation_deposes_on_losing_the_lead_with_records_in_flight() {
        let s = Speculation::new(1, 0);
        let hooked = Arc::new(AtomicBool::new(false));
        let h = hooked.clone();
        s.set_depose_hook(Box::new(move |_| h.store(true, Ordering::SeqCst)));
        s.open(2, 0);
        s.record(&released("a"));
        s.close("a higher term");
        assert!(s.is_deposed() && hooked.load(Ordering::SeqCst));
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("rt");
        assert!(
            rt.block_on(s.wait(1)).is_err(),
            "a waiting reply is never answered"
        );
    }

    #[test]
    fn raft_speculation_deposes_on_a_write_while_not_leading_and_on_a_foreign_batch() {
        let s = Speculation::new(1, 4);
        s.follow_to(6).expect("nothing in flight");
        assert_eq!(s.committed_lsn(), 6);
        s.record(&released("late"));
        assert!(s.is_deposed());
        let t = Speculation::new(1, 0);
        t.open(1, 0);
        t.record(&released("a"));
        assert!(t.follow_to(1).is_err());
        assert!(t.is_deposed());
    }
}
