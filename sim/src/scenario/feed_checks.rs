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

use std::collections::{BTreeMap, BTreeSet};

use stockgate_server::engine::Lsn;
use stockgate_server::feed::{Entry, Feed, FeedError, Stream};
use stockgate_server::raft::NodeId;

use super::Cluster;

/// The materializer's hold group (a materializer's `hold.<consumer>`).
pub(super) const HOLD: &str = "hold.m";
/// The group the group consumer reads through.
pub(super) const ORDERS: &str = "orders";

/// Every entry read: its fields as shown, and the member it was first read on.
#[derive(Default)]
pub(crate) struct Seen {
    by_id: BTreeMap<Lsn, (String, NodeId)>,
    /// A group found trimmed on a member is reported once.
    reported: BTreeSet<(NodeId, &'static str, Lsn)>,
}

/// An entry's content as the checks compare it.
fn fingerprint(e: &Entry) -> String {
    format!("{:?}", e.fields)
}

/// Where two fingerprints differ: a stretch of each from shortly before the first
/// difference (the fields lead with the entry's type and token, alike in both).
fn apart(a: &str, b: &str) -> (String, String) {
    let at = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
    let from = at.saturating_sub(40);
    let cut = |s: &str| s.chars().skip(from).take(120).collect::<String>();
    (format!("…{}", cut(a)), format!("…{}", cut(b)))
}

/// `entries`, read on member `on` by `what`: each must show what it showed before.
pub(super) fn saw(c: &Cluster, on: NodeId, entries: &[Entry], what: &str) {
    let mut bad = Vec::new();
    {
        let mut st = c.consumers.lock();
        for e in entries {
            let fp = fingerprint(e);
            match st.seen.by_id.get(&e.lsn) {
                None => {
                    st.seen.by_id.insert(e.lsn, (fp, on));
                }
                Some((was, first)) if *was != fp => {
                    let (now, then) = apart(&fp, was);
                    bad.push(format!(
                        "feed entry {} differs: {what} shows {now}, n{first} showed {then}",
                        e.id()
                    ))
                }
                Some(_) => {}
            }
        }
    }
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
        let (first, readable) = (m.feed.first_lsn(), m.feed.readable_lsn());
        for &name in &registered {
            let Some(g) = m.feed.groups.get(&Stream::All, name) else {
                continue;
            };
            let g = g.lock();
            let next = g.next_unread();
            let what = match g.pending.keys().next().copied().filter(|&p| p < first) {
                Some(p) => (p, format!("pending entry {p}-0")),
                None if next < first && g.last < readable => {
                    (next, format!("next position {next}-0"))
                }
                None => continue,
            };
            found.push((m.id, name, what, first));
        }
    }
    drop(live);
    for (id, name, (at, what), first) in found {
        if c.consumers.lock().seen.reported.insert((id, name, at)) {
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
    let seen: BTreeMap<Lsn, (String, NodeId)> = c.consumers.lock().seen.by_id.clone();
    let mut bad = Vec::new();
    let mut base: Option<(NodeId, BTreeMap<Lsn, String>)> = None;
    for m in c.live.lock().values() {
        let (first, readable) = (m.feed.first_lsn(), m.feed.readable_lsn());
        let all = match m
            .feed
            .scan(&Stream::All, first, readable, usize::MAX, false)
        {
            Ok(s) => s.entries,
            Err(e) => {
                bad.push(format!(
                    "n{}: the feed cannot be read at quiescence: {e}",
                    m.id
                ));
                continue;
            }
        };
        let mine: BTreeMap<Lsn, String> = all.iter().map(|e| (e.lsn, fingerprint(e))).collect();
        let lost = seen
            .range(first..)
            .filter(|(l, (fp, _))| mine.get(l) != Some(fp))
            .map(|(l, (fp, on))| (l, fp, on, mine.get(l)))
            .collect::<Vec<_>>();
        if let Some((l, fp, on, got)) = lost.first() {
            bad.push(match got {
                None => format!(
                    "feed entry {l}-0 read on n{on} is lost on n{} ({} such; its log holds {first} to {readable})",
                    m.id,
                    lost.len()
                ),
                Some(g) => {
                    let (then, now) = apart(fp, g);
                    format!(
                        "feed entry {l}-0 differs: n{on} showed {then}, n{} has {now} ({} such)",
                        m.id,
                        lost.len()
                    )
                }
            });
        }
        match &base {
            None => base = Some((m.id, mine)),
            Some((b, theirs)) => {
                let odd = mine
                    .iter()
                    .find(|(l, fp)| theirs.get(l).is_some_and(|t| t != *fp));
                if let Some((l, _)) = odd {
                    bad.push(format!(
                        "feed entry {l}-0 differs between n{b} and n{}",
                        m.id
                    ));
                }
            }
        }
    }
    for b in bad {
        c.fail(b);
    }
    let n = seen.len();
    c.env.history.note(format!("feed: {n} entries read"));
}
