//! Consumer groups over the feed's streams (`XGROUP`, `XREADGROUP`, `XACK`, `XPENDING`,
//! `XCLAIM`, `XAUTOCLAIM`), with their state in the write-ahead log.
//!
//! Every change of a group is a [`GroupRecord`], logged as an opaque WAL record (kinds
//! `wal::record::K_GROUP_*`; the engine skips them on replay). A change is applied to the
//! in-memory state by [`Group::apply`] and logged *under the group's lock*, so the log
//! order of one group's records is the order of its changes, and replaying them through
//! the same `apply` rebuilds the state exactly. The caller waits for the returned LSN to
//! be durable before it answers, like every other write.
//!
//! Snapshots delete the segments they cover, and with them old group records: before a
//! snapshot may delete anything, [`Groups::checkpoint`] logs each group's whole state as
//! one [`GroupRecord::Checkpoint`] after the snapshot's position, so recovery (the
//! snapshot, then the records after it) always meets a checkpoint of every group that
//! existed before the snapshot.
//!
//! Bounds (a client cannot grow them without limit): [`GroupLimits`]. The largest record,
//! a checkpoint at every bound, stays under the WAL's 1 MiB payload limit.

mod record;
mod registry;
mod state;

pub use record::GroupRecord;
pub use registry::{now_ms, GroupRef, GroupSummary, Groups};
pub use state::{Consumer, Group, Nack};

/// Limits of consumer groups, documented in docs/feed.md.
#[derive(Clone, Copy, Debug)]
pub struct GroupLimits {
    /// Groups over all streams.
    pub max_groups: usize,
    /// Consumers per group.
    pub max_consumers: usize,
    /// Pending (delivered, unacknowledged) entries per group. A `>` read delivers at
    /// most what is left; a full group is refused until entries are acknowledged.
    pub max_pending: usize,
    /// Bytes of a group or consumer name.
    pub max_name: usize,
}

impl Default for GroupLimits {
    fn default() -> Self {
        // A checkpoint at these bounds: 10,000 x ~40 B of pending entries plus
        // 1,000 x ~230 B of consumers, well under the 1 MiB record limit.
        GroupLimits {
            max_groups: 1000,
            max_consumers: 1000,
            max_pending: 10_000,
            max_name: 200,
        }
    }
}
