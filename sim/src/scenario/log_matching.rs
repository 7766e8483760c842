//! Raft's Log Matching property, checked on the members' logs as openraft reads them
//! (appended, synced or not): two entries with the same index and the same leader hold
//! the same batch. A follower compares log ids only, never payloads, so an entry a
//! leader lost and then wrote again differently under the same id (a restarted leader
//! continuing its own term) would be kept by a follower that had the first one, and
//! applied there instead of the one the others apply. The states would differ only
//! where that entry's records did; this check sees the difference in the log itself.
//! Shared by both scenarios (the `RaftNode` one gives its members' `LogStore`s too).

use std::collections::BTreeMap;

use stockgate_server::raft::log_store::LogStore;
use stockgate_server::raft::NodeId;

/// The entries of every pair of the members' logs given that share an index and a
/// leader but not a payload, as FAIL lines (at most one per pair: the first such index).
pub(crate) fn differing_entries<'a>(
    stores: impl IntoIterator<Item = (NodeId, &'a LogStore)>,
) -> Vec<String> {
    let mut bad = Vec::new();
    let mut logs: Vec<(NodeId, BTreeMap<u64, _>)> = Vec::new();
    for (id, store) in stores {
        match store.entries_from(0) {
            Ok(entries) => logs.push((
                id,
                entries.into_iter().map(|e| (e.log_id.index, e)).collect(),
            )),
            Err(e) => bad.push(format!("n{id}: its raft log reads back wrong: {e}")),
        }
    }
    for (i, (a, la)) in logs.iter().enumerate() {
        for (b, lb) in &logs[i + 1..] {
            let differs = la.iter().find(|(index, ea)| {
                lb.get(index)
                    .is_some_and(|eb| eb.log_id == ea.log_id && eb.payload != ea.payload)
            });
            if let Some((index, e)) = differs {
                bad.push(format!(
                    "n{a} and n{b} hold different entries under log id {} (index {index})",
                    e.log_id
                ));
            }
        }
    }
    bad
}
