//! A single node's assembly: its WAL is the record of everything, so it begins its own
//! history, snapshots on its own, and has each snapshot re-log what it deletes (the
//! consumer groups, the slot map's changes). A Raft member does none of this: its
//! records are its leader's.

use std::sync::Arc;
use std::time::Duration;

use super::recover::Recovered;
use crate::cluster::Cluster;
use crate::engine::Engine;
use crate::feed::Feed;
use crate::persist::WalDurability;
use crate::session::Durability;

/// A single node's snapshots delete the records that described the consumer groups and
/// the slot map's changes: each snapshot logs a checkpoint of them first.
pub(super) fn checkpoint_hooks(r: &Recovered, feed: &Arc<Feed>, cluster: Option<&Arc<Cluster>>) {
    let hook_feed = feed.clone();
    r.durability
        .add_checkpoint_hook(Box::new(move |_upto| Ok(hook_feed.checkpoint_groups())));
    if let Some(c) = cluster {
        let (cluster, feed) = (c.clone(), feed.clone());
        r.durability.add_checkpoint_hook(Box::new(move |_upto| {
            let mut last = 0;
            for change in cluster.checkpoint() {
                let (kind, body) = change.encode();
                last = feed.groups.log_opaque(kind, &body);
            }
            Ok(last)
        }));
    }
}

/// Begins the history on the node's first start, durably before any tool can read the
/// id.
pub(super) async fn begin_history(r: &Recovered) -> Result<(), String> {
    if r.engine.history().is_some() {
        return Ok(());
    }
    let lsn = r.engine.begin_history(&crate::engine::new_history_id());
    Durability::wait(r.durability.as_ref(), lsn)
        .await
        .map_err(|e| format!("writing the history id: {e}"))
}

/// Snapshots once enough log has accumulated, so restarts replay a bounded tail and old
/// segments can be deleted.
pub(super) fn spawn_snapshotter(
    engine: Arc<Engine>,
    d: Arc<WalDurability>,
    every: u64,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut iv = tokio::time::interval(Duration::from_secs(1));
        loop {
            iv.tick().await;
            if d.records_since_snapshot() >= every.max(1) {
                let (e, d2) = (engine.clone(), d.clone());
                let r = tokio::task::spawn_blocking(move || d2.snapshot(&e)).await;
                if let Ok(Err(err)) = r {
                    tracing::error!("snapshot failed: {err}");
                }
            }
        }
    })
}
