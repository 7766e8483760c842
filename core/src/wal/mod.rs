//! The write-ahead log: every engine [`Event`] is appended here before the change it
//! describes is acknowledged to a client, and replayed from here after a restart.
//!
//! Layout of `<data-dir>/wal/`:
//! - `wal-<first lsn, 20 digits>.log`: segments, see [`segment`]; records in [`record`];
//! - `snapshot-<lsn, 20 digits>.snap`: the full state after the record at `lsn`, see
//!   [`snapshot`];
//! - `LOCK`: held (flock) by the process that has the log open.
//!
//! A consistent copy of a running log is written by [`Wal::backup_into`] ([`backup`]).
//!
//! Lifecycle, as the server uses it:
//! 1. [`Wal::open`] recovers: newest valid snapshot + the records after it
//!    ([`Recovery`]), a torn tail is cut off, corruption elsewhere stops the start.
//! 2. The engine calls [`EventSink::record`] with its locks held; it returns the [`Lsn`].
//! 3. A connection awaits [`Wal::wait_durable`] on the last LSN of its batch, then replies.
//! 4. Periodically, with the engine's world stopped, [`Wal::roll`]; then, off the hot path,
//!    [`Wal::write_snapshot`], which also deletes what the snapshot makes redundant.
//! 5. On shutdown, [`Wal::flush_and_close`].
//!
//! This module knows nothing of the engine's rules: events and snapshots are data.

pub mod backup;
pub mod bit_repair;
pub mod codec;
mod fields;
pub mod handover;
pub mod reader;
pub mod record;
mod recovery;
pub mod segment;
pub mod snapshot;
mod writer;

#[cfg(test)]
mod tests;

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use thiserror::Error;

pub use crate::engine::event::{Event, EventRef, EventSink, Lsn};
pub use crate::engine::types::Snapshot;
pub use backup::{BackupError, BackupWritten};
pub use codec::DecodeError;
pub use record::RecordError;
pub use snapshot::SnapshotWritten;
pub use writer::Wal;

/// Default segment size before rolling to a new file.
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;
/// Default bound of encoded records waiting for the writer; past it `record` blocks.
pub const DEFAULT_MAX_BUFFER_BYTES: usize = 64 << 20;

/// When a record counts as acknowledged (`--fsync`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FsyncPolicy {
    /// After `write` and `fdatasync`: survives power loss.
    Always,
    /// After `write`; `fdatasync` at least once a second: survives a process crash, may
    /// lose about a second on power loss.
    #[default]
    EverySec,
    /// After `write`; the OS decides when it reaches the disk.
    No,
}

impl FsyncPolicy {
    /// The word `--appendfsync` takes and INFO shows.
    pub fn as_str(self) -> &'static str {
        match self {
            FsyncPolicy::Always => "always",
            FsyncPolicy::EverySec => "everysec",
            FsyncPolicy::No => "no",
        }
    }
}

impl fmt::Display for FsyncPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("invalid fsync policy '{0}' (expected always, everysec or no)")]
/// A word that names no [`FsyncPolicy`].
pub struct ParseFsyncPolicyError(pub String);

impl FromStr for FsyncPolicy {
    type Err = ParseFsyncPolicyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "always" => Ok(FsyncPolicy::Always),
            "everysec" => Ok(FsyncPolicy::EverySec),
            "no" => Ok(FsyncPolicy::No),
            _ => Err(ParseFsyncPolicyError(s.to_owned())),
        }
    }
}

/// Options of [`Wal::open`]. Build with `WalOptions { fsync, ..WalOptions::default() }`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalOptions {
    /// When a record counts as durable.
    pub fsync: FsyncPolicy,
    /// A segment is closed and a new one started before it would grow past this size
    /// (a single record larger than that still gets written, alone in its segment).
    pub segment_bytes: u64,
    /// On corruption, cut the log at the first bad record instead of refusing to start.
    /// Everything after that point is lost: use it knowingly (the ledger can rebuild).
    pub repair: bool,
    /// Encoded records waiting for the writer beyond which `record` blocks (backpressure).
    pub max_buffer_bytes: usize,
    /// Fault injection for crash tests: sleep this long before writing each batch, so a
    /// test can hold a record "in flight" and kill the process there. 0 in production;
    /// the binary reads it from `STOCKGATE_FAULT_WAL_DELAY_MS`.
    pub fault_write_delay_ms: u64,
    /// Fault injection: sleep this long inside every fdatasync (a slow disk), so a test
    /// can show that under `everysec` no reply waits for the periodic sync. 0 in
    /// production; the binary reads it from `STOCKGATE_FAULT_FSYNC_DELAY_MS`.
    pub fault_sync_delay_ms: u64,
    /// Segments a snapshot makes redundant that are kept anyway, for the order feed
    /// (`--feed-retention`). The default keeps none.
    pub feed_retention: FeedRetention,
}

/// How much of the log covered by a snapshot stays on disk for readers of the feed: the
/// newest redundant segments are kept while they fit in *every* given limit; the others
/// are deleted as usual (at the next snapshot, and at start-up). Both `None`: keep none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FeedRetention {
    /// Total bytes of redundant segments kept.
    pub max_bytes: Option<u64>,
    /// A redundant segment older than this (by modification time) is deleted.
    pub max_age: Option<std::time::Duration>,
}

impl FeedRetention {
    /// Whether no redundant segment is kept.
    pub fn keeps_nothing(&self) -> bool {
        self.max_bytes.is_none() && self.max_age.is_none()
    }
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            fsync: FsyncPolicy::default(),
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            repair: false,
            max_buffer_bytes: DEFAULT_MAX_BUFFER_BYTES,
            fault_write_delay_ms: 0,
            fault_sync_delay_ms: 0,
            feed_retention: FeedRetention::default(),
        }
    }
}

/// Counters of a running log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalStats {
    /// Last LSN handed out.
    pub last_lsn: Lsn,
    /// Last LSN acknowledged under the fsync policy.
    pub durable_lsn: Lsn,
    /// Group commits: batches written since open.
    pub batches: u64,
    /// fdatasync calls since open.
    pub syncs: u64,
    /// Bytes written to segments since open.
    pub bytes_written: u64,
    /// Segment files currently on disk.
    pub segments: usize,
}

/// What [`Wal::open`] found on disk.
///
/// Invariant: `events[i]` is the record at LSN `snapshot_lsn + 1 + i`, and
/// `last_lsn == snapshot_lsn + events.len()`. The next record gets `last_lsn + 1`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// The newest valid snapshot, if any: load it first.
    pub snapshot: Option<Snapshot>,
    /// The LSN the snapshot covers (0 without a snapshot).
    pub snapshot_lsn: Lsn,
    /// The records after the snapshot, in log order: apply them in this order.
    pub events: Vec<Event>,
    /// The last LSN in the recovered state.
    pub last_lsn: Lsn,
    /// Bytes cut off the log: a torn tail (normal after a crash) or, with
    /// [`WalOptions::repair`], everything from the first bad record on.
    pub truncated_tail: Option<Truncation>,
    /// Invalid snapshots set aside by repair (renamed to `*.corrupt`).
    pub discarded_snapshots: Vec<PathBuf>,
}

/// Where and how much of the log was dropped during recovery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Truncation {
    /// The segment cut at `offset` (deleted altogether when `offset` is 0).
    pub file: PathBuf,
    /// Bytes kept of that segment.
    pub offset: u64,
    /// Bytes dropped in total, including the segments listed in `deleted_segments`.
    pub bytes_dropped: u64,
    /// Why the first dropped record was invalid.
    pub reason: String,
    /// False: a torn tail, cut automatically. True: corruption removed because
    /// [`WalOptions::repair`] was set.
    pub repaired: bool,
    /// Later segments deleted by repair.
    pub deleted_segments: Vec<PathBuf>,
}

impl fmt::Display for Truncation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} bytes of {} from offset {} ({}){}",
            if self.repaired {
                "repair dropped"
            } else {
                "cut torn tail:"
            },
            self.bytes_dropped,
            self.file.display(),
            self.offset,
            self.reason,
            if self.deleted_segments.is_empty() {
                String::new()
            } else {
                format!(", deleted {} later segment(s)", self.deleted_segments.len())
            }
        )
    }
}

#[derive(Debug, Error)]
/// Why the log could not open, write or read.
pub enum WalError {
    #[error("{op} {}: {source}", path.display())]
    /// A file-system call failed.
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory it was done to.
        path: PathBuf,
        #[source]
        /// What the system said.
        source: io::Error,
    },
    /// Damage that is not a torn tail: the server must not start on it (see
    /// [`WalOptions::repair`]).
    #[error("corrupt WAL: {} at offset {offset}: {reason}", file.display())]
    Corrupt {
        /// The damaged file.
        file: PathBuf,
        /// Where the damage starts.
        offset: u64,
        /// What is wrong there.
        reason: String,
    },
    #[error("{0}")]
    /// Another process has the directory open (its `LOCK` is held).
    Locked(LockHeld),
    /// The writer hit an error: nothing after `durable` will ever be acknowledged.
    #[error("WAL failed (records after LSN {durable} are not durable): {reason}")]
    Failed {
        /// The last LSN acknowledged before the failure.
        durable: Lsn,
        /// The writer's error.
        reason: Arc<str>,
    },
    #[error("WAL is closed")]
    /// The log was closed: it acknowledges nothing more.
    Closed,
    #[error("LSN {lsn} was never assigned (last assigned {last})")]
    /// A wait for a position the log never handed out (a caller's bug, not a disk's).
    NotAssigned {
        /// The position waited for.
        lsn: Lsn,
        /// The last one handed out.
        last: Lsn,
    },
}

/// Who holds a log directory's `LOCK`: the directory, and the holder's process id as it
/// wrote it into the file (`None` when the file holds no readable id, as one written by an
/// older version). A lock is never a damaged log: the cure is to stop the holder, not to
/// repair anything, and the message says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockHeld {
    /// The locked directory.
    pub dir: PathBuf,
    /// The process holding it.
    pub pid: Option<u32>,
}

impl std::fmt::Display for LockHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dir = self.dir.display();
        match self.pid {
            Some(pid) => write!(
                f,
                "WAL directory {dir} is locked by another process (pid {pid}); stop that process (or use another data dir) before starting this one"
            ),
            None => write!(
                f,
                "WAL directory {dir} is locked by another process; stop the process that has this data dir open (or use another data dir) before starting this one"
            ),
        }
    }
}

/// Maps an I/O error of `op` on `path` to [`WalError::Io`].
pub fn io_err(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> WalError {
    let path = path.into();
    move |source| WalError::Io { op, path, source }
}

#[cfg(test)]
pub(crate) mod testutil {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A directory removed on drop (keeps the crate free of a tempfile dependency).
    pub(crate) struct TempDir(PathBuf);

    impl TempDir {
        pub(crate) fn new(tag: &str) -> TempDir {
            static N: AtomicU64 = AtomicU64::new(0);
            let p = std::env::temp_dir().join(format!(
                "stockgate-wal-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
        pub(crate) fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[cfg(test)]
mod policy_tests {
    use super::*;

    #[test]
    fn wal_fsync_policy_parses() {
        assert_eq!("always".parse::<FsyncPolicy>(), Ok(FsyncPolicy::Always));
        assert_eq!("EverySec".parse::<FsyncPolicy>(), Ok(FsyncPolicy::EverySec));
        assert_eq!("no".parse::<FsyncPolicy>(), Ok(FsyncPolicy::No));
        assert!("sometimes".parse::<FsyncPolicy>().is_err());
        assert_eq!(FsyncPolicy::default(), FsyncPolicy::EverySec);
        for p in [FsyncPolicy::Always, FsyncPolicy::EverySec, FsyncPolicy::No] {
            assert_eq!(p.to_string().parse::<FsyncPolicy>(), Ok(p));
        }
    }
}
