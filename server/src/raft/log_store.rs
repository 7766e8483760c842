//! The Raft log on disk: `<data-dir>/raft/log`, one append-only file of records, each
//! `[u32 body length][u32 crc32c of kind+body][u8 kind][body]` (little endian).
//!
//! Kinds: an entry, a truncation (entries from an index on are gone), a purge (entries
//! up to a log id are gone), the vote, the committed log id. Replaying the file in order
//! rebuilds the log; the newest vote and committed id win. A record cut short at the end
//! of the file (a crash mid-write) is dropped; a bad record anywhere else stops the start.
//!
//! Entries are kept in memory too (the log is never longer than what the state machine
//! has not yet snapshotted). Writes go to one thread that writes and `fdatasync`s what
//! has queued up and then completes every waiter at once: a group commit, off the event
//! loop. An append is acknowledged to openraft (`LogFlushed`) only after its sync, so the
//! leader counts its own copy toward the majority only when it is on disk.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{EntryPayload, RaftLogReader, StorageIOError, StoredMembership, Vote};
use parking_lot::Mutex;

use super::{Entry, LogId, NodeId, NodeInfo, StorageError, TypeConfig};

const K_ENTRY: u8 = 1;
const K_TRUNCATE: u8 = 2;
const K_PURGE: u8 = 3;
const K_VOTE: u8 = 4;
const K_COMMITTED: u8 = 5;
const HEADER: usize = 9;
/// A record body larger than this is corruption, not data (an entry is a batch of WAL
/// records bounded by the proposer).
const MAX_BODY: usize = 256 << 20;

#[derive(Default)]
struct Inner {
    entries: BTreeMap<u64, Entry>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId>,
    last_purged: Option<LogId>,
}

enum Done {
    Flushed(LogFlushed<TypeConfig>),
    Sync(mpsc::Sender<io::Result<()>>),
    None,
}

struct Job {
    bytes: Vec<u8>,
    done: Done,
}

/// The Raft log (openraft's `RaftLogStorage`).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<Inner>>,
    tx: mpsc::Sender<Job>,
    path: Arc<PathBuf>,
}

/// Reads entries for replication while the store appends (openraft's `LogReader`).
#[derive(Clone)]
pub struct LogReader {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("raft log {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("raft log {path} is corrupt at byte {offset}: {why} (not at the end of the file, so not a torn write); refusing to start")]
    Corrupt {
        path: String,
        offset: u64,
        why: String,
    },
}

fn encode(kind: u8, body: &[u8], out: &mut Vec<u8>) {
    let mut crc = crc32c::crc32c(&[kind]);
    crc = crc32c::crc32c_append(crc, body);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.push(kind);
    out.extend_from_slice(body);
}

fn ser<T: serde::Serialize>(v: &T) -> Vec<u8> {
    // Serialising these in-memory types into a Vec cannot fail (no maps with non-string
    // keys, no I/O); an empty body would fail the decoder loudly at the next start.
    bincode::serialize(v).unwrap_or_default()
}

impl LogStore {
    /// Opens (or creates) `<dir>/log` and starts its writer thread.
    pub fn open(dir: &Path) -> Result<LogStore, OpenError> {
        let path = dir.join("log");
        let io_err = |source| OpenError::Io {
            path: path.display().to_string(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io_err)?;
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(io_err)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io_err)?;
        let (inner, good) = replay(&bytes).map_err(|(offset, why)| OpenError::Corrupt {
            path: path.display().to_string(),
            offset,
            why,
        })?;
        if (good as usize) < bytes.len() {
            tracing::warn!(
                "raft log {}: dropped a torn record at the end ({} bytes)",
                path.display(),
                bytes.len() - good as usize
            );
            file.set_len(good).map_err(io_err)?;
            file.seek(SeekFrom::End(0)).map_err(io_err)?;
            file.sync_data().map_err(io_err)?;
        }
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("stockgate-raftlog".into())
            .spawn(move || writer(file, rx))
            .map_err(io_err)?;
        Ok(LogStore {
            inner: Arc::new(Mutex::new(inner)),
            tx,
            path: Arc::new(path),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True when the log has neither entries nor a vote: a node that never took part.
    pub fn is_pristine(&self) -> bool {
        let g = self.inner.lock();
        g.entries.is_empty() && g.vote.is_none() && g.last_purged.is_none()
    }

    pub fn last_index(&self) -> u64 {
        self.inner
            .lock()
            .entries
            .keys()
            .next_back()
            .copied()
            .unwrap_or(0)
    }

    pub fn entry_count(&self) -> usize {
        self.inner.lock().entries.len()
    }

    /// The log position the state machine reached, given the last LSN its WAL holds:
    /// the last entry whose batch ends at or before `wal_last` (a batch cut short in the
    /// WAL is applied again, its first records skipped), and the membership in force
    /// there. `Err` when the WAL holds records this log never had: the data dir does
    /// not come from this log's history.
    pub fn applied_for(
        &self,
        wal_last: u64,
    ) -> Result<(Option<LogId>, StoredMembership<NodeId, NodeInfo>), String> {
        let g = self.inner.lock();
        let mut applied: Option<LogId> = None;
        let mut covered = 0u64;
        for e in g.entries.values() {
            if let EntryPayload::Normal(b) = &e.payload {
                covered = covered.max(b.last_lsn());
                if b.last_lsn() <= wal_last {
                    applied = Some(e.log_id);
                }
            }
        }
        if covered < wal_last {
            return Err(format!(
                "the WAL holds records up to LSN {wal_last}, the raft log only up to LSN {covered}: this data dir's WAL is not the raft log's history (a lost or foreign raft/log)"
            ));
        }
        // The membership in force at `applied`; later entries are applied again.
        let membership = applied
            .and_then(|a| {
                g.entries
                    .range(..=a.index)
                    .rev()
                    .find_map(|(_, e)| match &e.payload {
                        EntryPayload::Membership(m) => {
                            Some(StoredMembership::new(Some(e.log_id), m.clone()))
                        }
                        _ => None,
                    })
            })
            .unwrap_or_default();
        Ok((applied, membership))
    }

    // openraft's trait methods return its own (large) error type: boxing here would only
    // move the allocation.
    #[allow(clippy::result_large_err)]
    fn submit(&self, bytes: Vec<u8>, done: Done) -> Result<(), StorageError> {
        self.tx.send(Job { bytes, done }).map_err(|_| {
            StorageIOError::write_logs(&io::Error::other("raft log writer stopped")).into()
        })
    }

    /// Queues a record and waits (off the event loop) until it is on disk.
    async fn write_synced(
        &self,
        kind: u8,
        body: &[u8],
        what: fn(&io::Error) -> StorageError,
    ) -> Result<(), StorageError> {
        let mut bytes = Vec::with_capacity(HEADER + body.len());
        encode(kind, body, &mut bytes);
        let (tx, rx) = mpsc::channel();
        self.submit(bytes, Done::Sync(tx))?;
        let r = tokio::task::spawn_blocking(move || rx.recv())
            .await
            .map_err(|e| what(&io::Error::other(e.to_string())))?;
        match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(what(&e)),
            Err(_) => Err(what(&io::Error::other("raft log writer stopped"))),
        }
    }
}

fn replay(bytes: &[u8]) -> Result<(Inner, u64), (u64, String)> {
    let mut inner = Inner::default();
    let mut at = 0usize;
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.len() < HEADER {
            break; // torn header at the end
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        let kind = rest[8];
        if len > MAX_BODY {
            return Err((at as u64, format!("record length {len} over the limit")));
        }
        if rest.len() < HEADER + len {
            break; // torn body at the end
        }
        let body = &rest[HEADER..HEADER + len];
        let end = at + HEADER + len;
        let ok = crc32c::crc32c_append(crc32c::crc32c(&[kind]), body) == crc;
        if !ok {
            if end == bytes.len() {
                break; // the last record, half written
            }
            return Err((at as u64, "checksum mismatch".into()));
        }
        let bad = |e: bincode::Error| (at as u64, format!("record kind {kind}: {e}"));
        match kind {
            K_ENTRY => {
                let e: Entry = bincode::deserialize(body).map_err(bad)?;
                inner.entries.insert(e.log_id.index, e);
            }
            K_TRUNCATE => {
                let from: u64 = bincode::deserialize(body).map_err(bad)?;
                inner.entries.split_off(&from);
            }
            K_PURGE => {
                let upto: LogId = bincode::deserialize(body).map_err(bad)?;
                inner.entries = inner.entries.split_off(&(upto.index + 1));
                inner.last_purged = Some(upto);
            }
            K_VOTE => inner.vote = Some(bincode::deserialize(body).map_err(bad)?),
            K_COMMITTED => inner.committed = bincode::deserialize(body).map_err(bad)?,
            k => return Err((at as u64, format!("unknown record kind {k}"))),
        }
        at = end;
    }
    Ok((inner, at as u64))
}

/// The writer thread: takes every queued job, writes them in order, syncs once, then
/// completes them. Exits when every store handle is gone.
fn writer(mut file: File, rx: mpsc::Receiver<Job>) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        while let Ok(j) = rx.try_recv() {
            jobs.push(j);
        }
        let mut r = Ok(());
        for j in &jobs {
            if let Err(e) = file.write_all(&j.bytes) {
                r = Err(e);
                break;
            }
        }
        if r.is_ok() {
            r = file.sync_data();
        }
        if let Err(e) = &r {
            tracing::error!("raft log write failed: {e}");
        }
        for j in jobs {
            let res = match &r {
                Ok(()) => Ok(()),
                Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
            };
            match j.done {
                Done::Flushed(cb) => cb.log_io_completed(res),
                Done::Sync(tx) => {
                    let _ = tx.send(res);
                }
                Done::None => {}
            }
        }
        if r.is_err() {
            // A log that cannot be written cannot promise anything: stop taking writes.
            for j in rx.iter() {
                let e = io::Error::other("raft log failed earlier");
                match j.done {
                    Done::Flushed(cb) => cb.log_io_completed(Err(e)),
                    Done::Sync(tx) => {
                        let _ = tx.send(Err(e));
                    }
                    Done::None => {}
                }
            }
            return;
        }
    }
}

fn range_entries<RB: RangeBounds<u64>>(inner: &Mutex<Inner>, range: RB) -> Vec<Entry> {
    inner
        .lock()
        .entries
        .range(range)
        .map(|(_, e)| e.clone())
        .collect()
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + std::fmt::Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        Ok(range_entries(&self.inner, range))
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + std::fmt::Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        Ok(range_entries(&self.inner, range))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let g = self.inner.lock();
        let last = g
            .entries
            .values()
            .next_back()
            .map(|e| e.log_id)
            .or(g.last_purged);
        Ok(LogState {
            last_purged_log_id: g.last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        LogReader {
            inner: self.inner.clone(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.write_synced(K_VOTE, &ser(vote), |e| StorageIOError::write_vote(e).into())
            .await?;
        self.inner.lock().vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        Ok(self.inner.lock().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        let mut bytes = Vec::new();
        encode(K_COMMITTED, &ser(&committed), &mut bytes);
        self.submit(bytes, Done::None)?;
        self.inner.lock().committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.inner.lock().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut bytes = Vec::new();
        {
            let mut g = self.inner.lock();
            for e in entries {
                encode(K_ENTRY, &ser(&e), &mut bytes);
                g.entries.insert(e.log_id.index, e);
            }
        }
        // Readable at once (openraft reads what it appended), acknowledged when synced.
        self.submit(bytes, Done::Flushed(callback))
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.write_synced(K_TRUNCATE, &ser(&log_id.index), |e| {
            StorageIOError::write_logs(e).into()
        })
        .await?;
        self.inner.lock().entries.split_off(&log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut bytes = Vec::new();
        encode(K_PURGE, &ser(&log_id), &mut bytes);
        self.submit(bytes, Done::None)?;
        let mut g = self.inner.lock();
        g.entries = g.entries.split_off(&(log_id.index + 1));
        g.last_purged = Some(log_id);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::Batch;
    use openraft::{CommittedLeaderId, EntryPayload};

    fn entry(term: u64, index: u64, first_lsn: u64) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Normal(Batch {
                origin: 7,
                first_lsn,
                count: 2,
                records: vec![1, 2, 3],
            }),
        }
    }

    fn write_raw(dir: &Path, recs: &[(u8, Vec<u8>)]) {
        let mut bytes = Vec::new();
        for (k, b) in recs {
            encode(*k, b, &mut bytes);
        }
        std::fs::create_dir_all(dir).expect("dir");
        std::fs::write(dir.join("log"), bytes).expect("write");
    }

    #[test]
    fn raft_log_replays_entries_truncation_and_vote_and_cuts_a_torn_tail() {
        let dir = std::env::temp_dir().join(format!("sg-raftlog-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let vote = Vote::new(3, 2);
        write_raw(
            &dir,
            &[
                (K_ENTRY, ser(&entry(1, 1, 1))),
                (K_ENTRY, ser(&entry(1, 2, 3))),
                (K_ENTRY, ser(&entry(1, 3, 5))),
                (K_TRUNCATE, ser(&3u64)),
                (K_VOTE, ser(&vote)),
            ],
        );
        // Half a record at the end: a crash mid-write.
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.join("log"))
            .expect("open");
        f.write_all(&[9, 0, 0, 0, 1]).expect("torn");
        drop(f);
        let s = LogStore::open(&dir).expect("open store");
        assert_eq!(s.last_index(), 2);
        assert_eq!(s.inner.lock().vote, Some(vote));
        let (applied, _) = s.applied_for(4).expect("covered");
        assert_eq!(applied.map(|l| l.index), Some(2));
        let (applied, _) = s.applied_for(3).expect("mid-batch");
        assert_eq!(applied.map(|l| l.index), Some(1));
        let e = s.applied_for(9).expect_err("WAL beyond the log");
        assert!(e.contains("LSN 9"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn raft_log_refuses_corruption_before_the_end() {
        let dir = std::env::temp_dir().join(format!("sg-raftlog-bad-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        write_raw(
            &dir,
            &[
                (K_ENTRY, ser(&entry(1, 1, 1))),
                (K_ENTRY, ser(&entry(1, 2, 3))),
            ],
        );
        let mut bytes = std::fs::read(dir.join("log")).expect("read");
        bytes[HEADER + 2] ^= 0xff;
        std::fs::write(dir.join("log"), bytes).expect("write");
        match LogStore::open(&dir) {
            Err(OpenError::Corrupt { offset, .. }) => assert_eq!(offset, 0),
            Err(e) => panic!("unexpected {e}"),
            Ok(_) => panic!("a corrupt log opened"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
