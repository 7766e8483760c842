//! Snapshots in the `RaftNode` scenario. Some runs give every member a small
//! `--snapshot-records` (`Knobs`): the server's own trigger (`snapshot::trigger_loop`,
//! spawned by `RaftNode::start`) has openraft build a snapshot from the member's WAL,
//! record it in the Raft log and purge the log it covers. A member left far enough
//! behind (down, or cut off) is sent the leader's snapshot: `install_snapshot` stages
//! it and deposes the process, which starts again from its data dir and adopts it
//! (`boot::start`, as `node::prepare` does). What each member's Raft log records is
//! watched here, for the history; at the end every member's state must equal the
//! others' ([`check_equal`]), a member that adopted a snapshot included.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stockgate_server::engine::Engine;
use stockgate_server::raft::NodeId;
use tokio::time::{sleep, Instant};

use super::Run;

/// How often the Raft logs are looked at (the trigger's own period).
const EVERY: Duration = Duration::from_millis(250);
/// With every member up and every link healed, all members' states are equal within
/// this (the leader's last expiries committed and applied everywhere).
const EQUAL_WITHIN: Duration = Duration::from_secs(10);

/// Until `stop`: each change of the snapshot a member process's Raft log records (one
/// it built, or one installed from the leader) goes into the history. What was seen.
pub(super) async fn watch(r: Arc<Run>, stop: Arc<AtomicBool>) -> String {
    let mut seen: BTreeMap<u64, Option<u64>> = BTreeMap::new();
    let mut changes = 0u64;
    while !stop.load(Ordering::Acquire) {
        sleep(EVERY).await;
        let now: Vec<(NodeId, u64, Option<u64>, u64)> = {
            let live = r.live.lock();
            live.values()
                .map(|n| {
                    let s = n.store.snapshot();
                    let at = s.as_ref().and_then(|s| s.meta.last_log_id.map(|l| l.index));
                    (n.id, n.process, at, s.map_or(0, |s| s.lsn))
                })
                .collect()
        };
        for (id, process, at, lsn) in now {
            let before = seen.insert(process, at);
            // A process's first look is what it started with.
            if before.is_some_and(|b| b != at) {
                changes += 1;
                r.note(format!("n{id} records a snapshot: entry {at:?}, LSN {lsn}"));
            }
        }
    }
    format!("{changes} snapshots recorded by running members")
}

/// A member's state as the comparison sees it: every sale's counters and every hold.
fn summary(e: &Engine) -> String {
    let (snap, ()) = e.snapshot_with(|| ());
    let mut out = String::new();
    for v in &snap.sales {
        let _ = write!(
            out,
            "{} {} {} {} {};",
            v.sku, v.total, v.available, v.reserved, v.committed
        );
    }
    let mut holds: Vec<_> = snap.reservations.iter().collect();
    holds.sort_by(|a, b| a.token.cmp(&b.token));
    for h in holds {
        let _ = write!(
            out,
            "{} {:?} {} {} {};",
            h.token, h.state, h.qty, h.expires_at_ms, h.finished_at_ms
        );
    }
    out
}

/// With every member up and every link healed: waits (at most [`EQUAL_WITHIN`]) until
/// every member's sales and holds are the same; a failure naming the members that
/// differ if that never happens.
pub(super) async fn check_equal(r: &Run) {
    let start = Instant::now();
    loop {
        let states: Vec<(NodeId, String)> = {
            let live = r.live.lock();
            live.values().map(|n| (n.id, summary(&n.engine))).collect()
        };
        let differ: Vec<NodeId> = states
            .iter()
            .filter(|(_, s)| Some(s) != states.first().map(|(_, f)| f))
            .map(|(id, _)| *id)
            .collect();
        if differ.is_empty() {
            let ms = start.elapsed().as_millis();
            return r.note(format!(
                "every member's sales and holds equal after {ms} ms"
            ));
        }
        if start.elapsed() >= EQUAL_WITHIN {
            let first = states.first().map_or(0, |(id, _)| *id);
            return r.fail(format!(
                "members {differ:?} differ from n{first} after {EQUAL_WITHIN:?}"
            ));
        }
        sleep(Duration::from_millis(50)).await;
    }
}
