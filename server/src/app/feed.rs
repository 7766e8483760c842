//! The order feed over the WAL, its consumer groups rebuilt from the log, and the hold
//! they put on a Raft member's snapshots. Public so that the deterministic simulation
//! (`sim/`) builds a member's feed and its snapshots' hold as a server does.

use std::sync::Arc;

use super::recover::Recovered;
use crate::engine::Lsn;
use crate::feed::{Feed, FeedLimits};
use crate::persist::{RecoveryReport, WalDurability};
use crate::raft::speculation::Speculation;

/// The order feed over the WAL `r` recovered (see [`open_on`]).
pub(super) fn open(r: &Recovered) -> Arc<Feed> {
    open_on(&r.durability, r.speculation.as_ref(), &r.report)
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
) -> Arc<Feed> {
    let wal = durability.wal.clone();
    let feed = Arc::new(match speculation {
        Some(spec) => Feed::with_group_sink(wal, spec.clone(), FeedLimits::default()),
        None => Feed::new(wal, FeedLimits::default()),
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
/// position a consumer group of `feed` may still read (`Groups::oldest_needed`); no
/// bound without a feed.
pub fn snapshot_hold(feed: Option<Arc<Feed>>) -> Box<dyn Fn() -> Option<Lsn> + Send + Sync> {
    Box::new(move || feed.as_ref().and_then(|f| f.groups.oldest_needed()))
}
