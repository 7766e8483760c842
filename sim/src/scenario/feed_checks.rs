//! The checks of `Settings::feed` (the consumers: `feed.rs`), from the rules of
//! docs/replication.md, "The feed":
//!
//! - every member's feed shows committed entries only, so an entry id names the same
//!   entry on every member: each entry read anywhere is kept by id with its fields, and
//!   a second, different content for an id is a FAIL, when read and at the end;
//! - nothing read is ever lost: at quiescence every entry read is on every member whose
//!   log still reaches back to it, with the same content;
//! - a snapshot never covers what a registered consumer group may still read: its
//!   pending entries and the entry after its last-delivered id. After every consumer
//!   step, at every member's start and at quiescence, the groups of each member that
//!   has applied the whole log are held to it against that member's own log, and a
//!   group command that finds its position trimmed (`FeedError::Trimmed`) while the
//!   group is registered is a FAIL.

use stockgate_server::engine::Lsn;
use stockgate_server::feed::{Entry, Feed, FeedError};
use stockgate_server::raft::NodeId;

use super::Cluster;
pub(crate) use crate::feed_rules::Seen;
use crate::feed_rules::{self, fingerprint};

/// The materializer's hold group (a materializer's `hold.<consumer>`).
pub(super) const HOLD: &str = "hold.m";
/// The group the group consumer reads through.
pub(super) const ORDERS: &str = "orders";

/// `entries`, read on member `on` by `what`: each must show what it showed before.
pub(super) fn saw(c: &Cluster, on: NodeId, entries: &[Entry], what: &str) {
    let read = entries.iter().map(|e| (e.lsn, fingerprint(e)));
    let bad = c.consumers.lock().seen.saw(on, read, what);
    for b in bad {
        c.fail(b);
    }
}

/// A group command's read failed: a trimmed position of a registered group is a FAIL,
/// anything else goes into the history.
pub(super) fn read_failed(c: &Cluster, group: &'static str, what: &str, e: &FeedError) {
    let registered = c.consumers.lock().registered.get(group).copied() == Some(true);
    match e {
        FeedError::Trimmed { .. } if registered => {
            c.fail(format!("{what}: consumer group {group} registered: {e}"))
        }
        _ => c.env.history.note(format!("{what}: {e}")),
    }
}

/// A pending entry of `group` on member `id` is gone from its log.
pub(super) fn pending_lost(c: &Cluster, (id, feed): (NodeId, &Feed), group: &'static str, l: Lsn) {
    c.fail(format!(
        "n{id}: pending entry {l}-0 of consumer group {group} trimmed (the log starts at {})",
        feed.first_lsn()
    ));
}

/// Each member's registered groups against its own log: no pending entry trimmed, and
/// the entry after the last-delivered id still there (unless nothing follows it).
pub(super) fn check_groups(c: &Cluster) {
    let registered: Vec<&'static str> = {
        let st = c.consumers.lock();
        [HOLD, ORDERS]
            .into_iter()
            .filter(|g| st.registered.get(g).copied() == Some(true))
            .collect()
    };
    let mut found = Vec::new();
    let live = c.live.lock();
    // A member behind holds its groups as of where it is: after installing a snapshot
    // they are as of the snapshot (the state file), whose builder let the log go by its
    // newer state, which the entries after the snapshot bring. So only the members that
    // applied every entry known committed so far (the WAL holds committed records only,
    // so the newest WAL end seen in the run) are held to it.
    let newest = {
        let mut st = c.consumers.lock();
        let now = live.values().map(|m| m.dur.wal.last_lsn()).max();
        st.newest = st.newest.max(now.unwrap_or(0));
        st.newest
    };
    for m in live.values() {
        if m.dur.wal.last_lsn() != newest {
            continue;
        }
        for &name in &registered {
            if let Some(what) = feed_rules::trimmed_position(&m.feed, name) {
                found.push((m.id, name, what, m.feed.first_lsn()));
            }
        }
    }
    drop(live);
    for (id, name, (at, what), first) in found {
        if c.consumers.lock().seen.first_report(id, name, at) {
            c.fail(format!(
                "n{id}: consumer group {name} finds its {what} trimmed (the log starts at {first})"
            ));
        }
    }
}

/// At quiescence: every entry read is on every member whose log reaches back to it,
/// with the content read; the members' feeds agree where they overlap.
pub(super) fn check_final(c: &Cluster) {
    check_groups(c);
    let members: Vec<_> = c
        .live
        .lock()
        .values()
        .map(|m| (m.id, m.feed.clone()))
        .collect();
    let (bad, n) = {
        let st = c.consumers.lock();
        (
            feed_rules::final_failures(&st.seen, &members),
            st.seen.len(),
        )
    };
    for b in bad {
        c.fail(b);
    }
    c.env.history.note(format!("feed: {n} entries read"));
}
