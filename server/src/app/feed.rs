//! The order feed over the WAL, its consumer groups rebuilt from the log, and the hold
//! they put on a Raft member's snapshots. Public so that the deterministic simulation
//! (`sim/`) builds a member's feed and its snapshots' hooks as a server does.

use std::sync::Arc;

use super::recover::Recovered;
use crate::engine::{Clock, Lsn};
use crate::feed::{Feed, FeedLimits};
use crate::persist::{RecoveryReport, WalDurability};
use crate::raft::snapshot::SnapshotHooks;
use crate::raft::speculation::Speculation;
use crate::session::Shared;

/// The order feed over the WAL `r` recovered (see [`open_on`]).
pub(super) fn open(r: &Recovered) -> Arc<Feed> {
    open_on(
        &r.durability,
        r.speculation.as_ref(),
        &r.report,
        r.engine.clock(),
    )
}

/// The order feed over `durability`'s WAL, its consumer groups rebuilt from the records
/// after the snapshot (and, a Raft member, from its snapshot's state file), kept up to
/// date with the group records a member applies. A member's group changes go into the
/// leader's batches through `speculation`, a single node's straight to its WAL (whose
/// checkpoint of the groups is `single::checkpoint_hooks`'). Opened before the member
/// applies anything: the replay hook must see every record applied after recovery.
pub fn open_on(
    durability: &Arc<WalDurability>,
    speculation: Option<&Arc<Speculation>>,
    report: &RecoveryReport,
    clock: Arc<dyn Clock>,
) -> Arc<Feed> {
    let wal = durability.wal.clone();
    let limits = FeedLimits::default();
    let feed = Arc::new(match speculation {
        Some(spec) => Feed::with_group_sink(wal, spec.clone(), limits, clock),
        None => Feed::new(wal, limits, clock),
    });
    let (state, state_bad) = feed.load_state_file(report.snapshot_lsn);
    let (applied, bad) = feed.groups.recover(
        report
            .opaque
            .iter()
            .map(|(lsn, kind, body)| (*lsn, *kind, body.as_slice())),
    );
    let (applied, bad) = (applied + state, bad + state_bad);
    if applied + bad > 0 {
        tracing::info!(
            "recovered {} consumer group(s) from {applied} record(s){}",
            feed.groups.count(),
            if bad > 0 {
                format!(", {bad} undecodable record(s) skipped")
            } else {
                String::new()
            }
        );
    }
    let replay_feed = feed.clone();
    durability.add_replay_hook(Box::new(move |lsn, kind, body| {
        replay_feed
            .groups
            .recover(std::iter::once((lsn, kind, body)));
    }));
    feed
}

/// What a Raft member's snapshots may not cover (`SnapshotHooks::hold`): the oldest
/// position a consumer group of `feed` may still read, as its WAL has the groups
/// (`Groups::oldest_needed_in_log`): a leader's group changes are in force before the
/// group commits them, and one that never commits (the leader deposed, or its disk
/// failing) must not have let a snapshot take what the committed groups still read. No
/// bound without a feed.
pub fn snapshot_hold(feed: Option<Arc<Feed>>) -> Box<dyn Fn() -> Option<Lsn> + Send + Sync> {
    Box::new(move || {
        let f = feed.as_ref()?;
        // The WAL of a member holds committed records only: all of it is in the log.
        f.groups.oldest_needed_in_log(f.last_lsn())
    })
}

/// What a Raft member's snapshots ask of the rest of the server: the consumer groups of
/// `shared`'s feed hold them back (nothing they may still read is covered,
/// [`snapshot_hold`]), and the slot map compacts its records.
pub fn snapshot_hooks(shared: &Shared) -> SnapshotHooks {
    let hold = snapshot_hold(shared.feed.get().cloned());
    let cluster = shared.cluster.get().cloned();
    let compact_slots = Box::new(move |recs| match &cluster {
        Some(c) => c.compact_slot_records(recs),
        None => recs,
    });
    SnapshotHooks {
        hold,
        compact_slots,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::EventRef;
    use crate::feed::groups::GroupRecord;
    use crate::feed::Stream;
    use crate::wal::{Wal, WalOptions};

    const STREAM: &str = "stockgate:events";

    fn nothing_recovered() -> RecoveryReport {
        RecoveryReport {
            snapshot_lsn: 0,
            reservations_in_snapshot: 0,
            events_replayed: 0,
            opaque: Vec::new(),
            last_lsn: 0,
            truncated: None,
            millis: 0,
        }
    }

    /// The group commits `recs`: the leader's apply logs its own records in its WAL.
    fn commit(wal: &Wal, recs: &[GroupRecord]) {
        for r in recs {
            let (kind, body) = r.encode();
            wal.record(EventRef::Opaque { kind, body: &body });
        }
    }

    /// A Raft leader's group change is in force at once and in its WAL only once the
    /// group commits it, if ever: a leader deposed first restarts on the groups its WAL
    /// holds. A snapshot taken meanwhile must keep what those still read.
    #[test]
    fn feed_snapshot_hold_keeps_what_an_uncommitted_change_let_go_of() {
        let dir = std::env::temp_dir().join(format!("sg-feed-hold-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (wal, _) = Wal::open_inline(&dir, WalOptions::default()).unwrap();
        let dur = Arc::new(WalDurability::new(wal.clone(), 0));
        let spec = Arc::new(Speculation::new(7, 0));
        spec.open(1, 0);
        let clock = Arc::new(crate::engine::ManualClock::new(1_000));
        let feed = open_on(&dur, Some(&spec), &nothing_recovered(), clock);
        let hold = snapshot_hold(Some(feed.clone()));
        let g = |name: &str| (STREAM.to_owned(), name.to_owned());
        feed.groups.create(&Stream::All, "g".into(), 0).unwrap();
        let delivered = GroupRecord::Delivered {
            stream: g("g").0,
            group: g("g").1,
            consumer: "c".into(),
            at_ms: 1,
            last: 6,
            new: vec![5, 6],
            again: Vec::new(),
        };
        let group = feed.groups.get(&Stream::All, "g").unwrap();
        feed.groups
            .with(&group, |gr| feed.groups.change(gr, delivered.clone()))
            .unwrap();
        let created = GroupRecord::Created {
            stream: g("g").0,
            group: g("g").1,
            last: 0,
        };
        commit(&wal, &[created, delivered]);
        assert_eq!(hold(), Some(5));
        // XACK 5: in force, not committed.
        let acked = GroupRecord::Acked {
            stream: g("g").0,
            group: g("g").1,
            ids: vec![5],
        };
        feed.groups
            .with(&group, |gr| feed.groups.change(gr, acked.clone()))
            .unwrap();
        assert_eq!(feed.groups.oldest_needed(), Some(6));
        assert_eq!(hold(), Some(5), "entry 5 is pending in the WAL's groups");
        commit(&wal, &[acked]);
        assert_eq!(hold(), Some(6));
        let _ = wal.flush_and_close();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
