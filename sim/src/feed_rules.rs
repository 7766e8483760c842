//! The order feed's rules as both scenarios check them (docs/replication.md, "The
//! feed"), over what their consumers read and each member's own feed:
//!
//! - every member's feed shows committed entries only, so an entry id names the same
//!   entry on every member: each entry read anywhere is kept by id with its fields, and
//!   a second, different content for an id is a failure;
//! - nothing read is ever lost: at quiescence every entry read is on every member whose
//!   log still reaches back to it, with the same content, and the members' feeds agree
//!   where they overlap;
//! - a snapshot never covers what a registered consumer group may still read: its
//!   pending entries and the entry after its last-delivered id.
//!
//! The functions say what is wrong; each scenario reports it its own way.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::Arc;

use stockgate_server::engine::Lsn;
use stockgate_server::feed::{Entry, Feed, Stream};
use stockgate_server::raft::NodeId;

/// Every entry read: its fields as shown, and the member it was first read on.
#[derive(Default)]
pub(crate) struct Seen {
    by_id: BTreeMap<Lsn, (String, NodeId)>,
    /// A group found trimmed on a member is reported once.
    reported: BTreeSet<(NodeId, &'static str, Lsn)>,
}

/// An entry's content as the checks compare it.
pub(crate) fn fingerprint(e: &Entry) -> String {
    fields_fingerprint(&e.fields)
}

/// The same for fields read from a reply (`[field, value, ...]` as pairs): the text is
/// the one [`fingerprint`] gives the entry they came from.
pub(crate) fn fields_fingerprint<K: Debug>(fields: &[(K, String)]) -> String {
    format!("{fields:?}")
}

/// Where two fingerprints differ: a stretch of each from shortly before the first
/// difference (the fields lead with the entry's type and token, alike in both).
fn apart(a: &str, b: &str) -> (String, String) {
    let at = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
    let from = at.saturating_sub(40);
    let cut = |s: &str| s.chars().skip(from).take(120).collect::<String>();
    (format!("…{}", cut(a)), format!("…{}", cut(b)))
}

impl Seen {
    /// Entries `(lsn, fingerprint)` read on member `on` by `what`: what is wrong with
    /// them (an id that showed another content before).
    pub(crate) fn saw(
        &mut self,
        on: NodeId,
        entries: impl IntoIterator<Item = (Lsn, String)>,
        what: &str,
    ) -> Vec<String> {
        let mut bad = Vec::new();
        for (lsn, fp) in entries {
            match self.by_id.get(&lsn) {
                None => {
                    self.by_id.insert(lsn, (fp, on));
                }
                Some((was, first)) if *was != fp => {
                    let (now, then) = apart(&fp, was);
                    bad.push(format!(
                        "feed entry {lsn}-0 differs: {what} shows {now}, n{first} showed {then}"
                    ))
                }
                Some(_) => {}
            }
        }
        bad
    }

    /// Whether `group` found trimmed at `at` on member `id` is news (reported once).
    pub(crate) fn first_report(&mut self, id: NodeId, group: &'static str, at: Lsn) -> bool {
        self.reported.insert((id, group, at))
    }

    /// How many entries were read.
    pub(crate) fn len(&self) -> usize {
        self.by_id.len()
    }
}

/// What of registered group `name` member `feed`'s log no longer has: its oldest pending
/// entry, or the entry after its last-delivered id (when one follows it), with words.
pub(crate) fn trimmed_position(feed: &Feed, name: &str) -> Option<(Lsn, String)> {
    let (first, readable) = (feed.first_lsn(), feed.readable_lsn());
    let g = feed.groups.get(&Stream::All, name)?;
    let g = g.lock();
    let next = g.next_unread();
    match g.pending.keys().next().copied().filter(|&p| p < first) {
        Some(p) => Some((p, format!("pending entry {p}-0"))),
        None if next < first && g.last < readable => {
            Some((next, format!("next position {next}-0")))
        }
        None => None,
    }
}

/// At quiescence, over every member's feed: every entry `seen` read is on every member
/// whose log reaches back to it, with the content read; the feeds agree where they
/// overlap. What is wrong, at most one line per member.
pub(crate) fn final_failures(seen: &Seen, members: &[(NodeId, Arc<Feed>)]) -> Vec<String> {
    let mut bad = Vec::new();
    let mut base: Option<(NodeId, BTreeMap<Lsn, String>)> = None;
    for (id, feed) in members {
        let (first, readable) = (feed.first_lsn(), feed.readable_lsn());
        let all = match feed.scan(&Stream::All, first, readable, usize::MAX, false) {
            Ok(s) => s.entries,
            Err(e) => {
                bad.push(format!("n{id}: the feed cannot be read at quiescence: {e}"));
                continue;
            }
        };
        let mine: BTreeMap<Lsn, String> = all.iter().map(|e| (e.lsn, fingerprint(e))).collect();
        if let Some(b) = lost_or_changed(seen, (*id, first, readable), &mine) {
            bad.push(b);
        }
        match &base {
            None => base = Some((*id, mine)),
            Some((b, theirs)) => {
                let odd = mine
                    .iter()
                    .find(|(l, fp)| theirs.get(l).is_some_and(|t| t != *fp));
                if let Some((l, _)) = odd {
                    bad.push(format!("feed entry {l}-0 differs between n{b} and n{id}"));
                }
            }
        }
    }
    bad
}

/// The first entry read that member `id` (its log from `first` to `readable`) lost or
/// shows otherwise, with how many such.
fn lost_or_changed(
    seen: &Seen,
    (id, first, readable): (NodeId, Lsn, Lsn),
    mine: &BTreeMap<Lsn, String>,
) -> Option<String> {
    let lost = seen
        .by_id
        .range(first..)
        .filter(|(l, (fp, _))| mine.get(l) != Some(fp))
        .map(|(l, (fp, on))| (l, fp, on, mine.get(l)))
        .collect::<Vec<_>>();
    let (l, fp, on, got) = lost.first()?;
    Some(match got {
        None => format!(
            "feed entry {l}-0 read on n{on} is lost on n{id} ({} such; its log holds {first} to {readable})",
            lost.len()
        ),
        Some(g) => {
            let (then, now) = apart(fp, g);
            format!(
                "feed entry {l}-0 differs: n{on} showed {then}, n{id} has {now} ({} such)",
                lost.len()
            )
        }
    })
}
