//! The order feed over the WAL, its consumer groups rebuilt from the log.

use std::sync::Arc;

use super::recover::Recovered;
use crate::feed::{Feed, FeedLimits};

/// The order feed over the WAL, its consumer groups rebuilt from the records after the
/// snapshot (and, a Raft member, from its snapshot's state file), kept up to date with
/// the group records a member applies. A single node's checkpoint of the groups is
/// `single::checkpoint_hooks`'.
pub(super) fn open(r: &Recovered) -> Arc<Feed> {
    let wal = r.durability.wal.clone();
    let feed = Arc::new(match &r.speculation {
        Some(spec) => Feed::with_group_sink(wal, spec.clone(), FeedLimits::default()),
        None => Feed::new(wal, FeedLimits::default()),
    });
    let (state, state_bad) = feed.load_state_file(r.report.snapshot_lsn);
    let (applied, bad) = feed.groups.recover(
        r.report
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
    r.durability
        .add_replay_hook(Box::new(move |lsn, kind, body| {
            replay_feed
                .groups
                .recover(std::iter::once((lsn, kind, body)));
        }));
    feed
}
