//! The feed's checks in the `RaftNode` scenario (the consumers: `feed.rs`), the first
//! scenario's rules (`crate::feed_rules`) over the members' own feeds, and what the
//! consumers were acknowledged:
//!
//! - every entry read on any member is the same entry on every member that shows it
//!   (when read and at quiescence), and never lost; a read shows entries in order, each
//!   once, and an acknowledged `XREADGROUP >` is never followed by one delivering an
//!   entry it or an earlier one delivered;
//! - a group's acknowledged entries stay acknowledged: never pending again, on any
//!   member, across failovers; the materializer's acknowledged `XGROUP SETID` stays;
//! - a registered group's next position and pending entries are never trimmed by a
//!   snapshot (the hold): after every consumer step and at quiescence, on every member
//!   that applied the whole log; a group command answered "trimmed" is a failure.

use std::collections::BTreeSet;
use std::time::Duration;

use parking_lot::Mutex;
use stockgate_server::engine::Lsn;
use stockgate_server::feed::Stream;
use tokio::time::{sleep, Instant};

use super::Run;
use crate::feed_rules::{self, Seen};

/// The materializer's group (a materializer's `hold.<consumer>`).
pub(super) const HOLD: &str = "hold.m";
/// The group consumer's group.
pub(super) const ORDERS: &str = "orders";

/// What the consumers were acknowledged, for the checks.
#[derive(Default)]
pub(super) struct FeedLog {
    /// Every entry read.
    pub seen: Seen,
    /// Per group: its creation or a change of it was acknowledged (so it is in the
    /// group's committed state, and holds every member's snapshots back from then on).
    pub registered: BTreeSet<&'static str>,
    /// The newest WAL end seen on any member: every entry up to it is committed.
    pub newest: Lsn,
    /// Entries whose `XACK` was acknowledged: never pending again.
    pub acked: BTreeSet<Lsn>,
    /// The last entry an acknowledged `XREADGROUP >` delivered: the next one delivers
    /// only entries after it.
    pub delivered: Lsn,
    /// The materializer's last `XGROUP SETID` acknowledged.
    pub hold_at: Lsn,
    /// Entries the second worker's acknowledged claims took from the first: never
    /// pending for the first again.
    pub claimed: BTreeSet<Lsn>,
    /// Counts for the history: reads, deliveries, XACKs, trimmed reads, lags, commands
    /// given up, claims, pending listings, blocking reads.
    pub counts: [u64; 9],
}

/// Indices of [`FeedLog::counts`].
pub(super) mod count {
    pub const READ: usize = 0;
    pub const DELIVERED: usize = 1;
    pub const ACKED: usize = 2;
    pub const TRIMMED: usize = 3;
    pub const LAGS: usize = 4;
    pub const GIVEN_UP: usize = 5;
    pub const CLAIMED: usize = 6;
    pub const LISTED: usize = 7;
    pub const BLOCKED: usize = 8;
}

/// At quiescence, the members' WALs reach the same end within this.
const SAME_END_WITHIN: Duration = Duration::from_secs(10);

/// A command of a registered group (or the materializer's read) refused: trimmed is a
/// failure, anything else goes into the history.
pub(super) fn group_read_failed(r: &Run, group: &'static str, what: &str, e: &str) {
    if e.contains("was trimmed from the log") {
        r.fail(format!("{what}: consumer group {group} registered: {e}"));
    } else {
        r.note(format!("{what}: {e}"));
    }
}

/// Each member's registered groups against its own log: no pending entry trimmed, and
/// the entry after the last-delivered id still there. Only the members that applied
/// every entry known committed (the newest WAL end seen in the run) are held to it: one
/// behind holds its groups as of where it is.
pub(super) fn check_groups(r: &Run, log: &Mutex<FeedLog>) {
    let registered: Vec<&'static str> = {
        let l = log.lock();
        [HOLD, ORDERS]
            .into_iter()
            .filter(|g| l.registered.contains(g))
            .collect()
    };
    let mut found = Vec::new();
    {
        let live = r.live.lock();
        let now = live.values().map(|n| n.feed.last_lsn()).max().unwrap_or(0);
        let newest = {
            let mut l = log.lock();
            l.newest = l.newest.max(now);
            l.newest
        };
        for n in live.values().filter(|n| n.feed.last_lsn() == newest) {
            for &name in &registered {
                if let Some(what) = feed_rules::trimmed_position(&n.feed, name) {
                    found.push((n.id, name, what, n.feed.first_lsn()));
                }
            }
        }
    }
    for (id, name, (at, what), first) in found {
        if log.lock().seen.first_report(id, name, at) {
            r.fail(format!(
                "n{id}: consumer group {name} finds its {what} trimmed (the log starts at {first})"
            ));
        }
    }
}

/// At quiescence (every member up, every link healed): once the members' WALs end at
/// the same entry, the groups held to their logs, every entry read found as read on
/// every member, and the groups' acknowledged changes in force on every member.
pub(super) async fn check_final(r: &Run, log: &Mutex<FeedLog>) {
    let start = Instant::now();
    loop {
        let ends: Vec<u64> = r.live.lock().values().map(|n| n.feed.last_lsn()).collect();
        if ends.windows(2).all(|w| w[0] == w[1]) {
            break;
        }
        if start.elapsed() >= SAME_END_WITHIN {
            return r.fail(format!(
                "the members' WALs end at {ends:?} {SAME_END_WITHIN:?} after quiescence"
            ));
        }
        sleep(Duration::from_millis(50)).await;
    }
    check_groups(r, log);
    let members: Vec<_> = r
        .live
        .lock()
        .values()
        .map(|n| (n.id, n.feed.clone()))
        .collect();
    let l = log.lock();
    let mut bad = feed_rules::final_failures(&l.seen, &members);
    for (id, feed) in &members {
        if let Some(g) = feed.groups.get(&Stream::All, ORDERS) {
            let g = g.lock();
            if let Some(p) = g.pending.keys().find(|p| l.acked.contains(p)) {
                bad.push(format!(
                    "n{id}: entry {p}-0 of consumer group {ORDERS} pending again after its XACK was acknowledged"
                ));
            }
            if let Some((p, _)) = g
                .pending
                .iter()
                .find(|(p, n)| l.claimed.contains(p) && n.consumer != "w2")
            {
                bad.push(format!(
                    "n{id}: entry {p}-0 of consumer group {ORDERS} pending for another consumer than w2 after w2's claim of it was acknowledged"
                ));
            }
            if g.last < l.delivered {
                bad.push(format!(
                    "n{id}: consumer group {ORDERS} delivered up to {}-0, acknowledged up to {}-0",
                    g.last, l.delivered
                ));
            }
        } else if l.registered.contains(ORDERS) {
            bad.push(format!("n{id}: consumer group {ORDERS} is gone"));
        }
        let hold = feed.groups.get(&Stream::All, HOLD).map(|g| g.lock().last);
        if l.registered.contains(HOLD) && hold.is_none_or(|at| at < l.hold_at) {
            bad.push(format!(
                "n{id}: consumer group {HOLD} at {hold:?}, acknowledged at {}",
                l.hold_at
            ));
        }
    }
    let n = l.seen.len();
    drop(l);
    for b in bad {
        r.fail(b);
    }
    r.note(format!(
        "feed at quiescence: {n} entries read, as read on {} members",
        members.len()
    ));
}
