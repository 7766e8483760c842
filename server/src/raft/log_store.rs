//! The Raft log on disk: `<data-dir>/raft/log`, one append-only file of records, each
//! `[u32 body length][u32 crc32c of kind+body][u8 kind][body]` (little endian).
//!
//! Kinds: an entry, a truncation (entries from an index on are gone), a purge (entries
//! up to a log id are gone), the vote, the committed log id, the newest snapshot's
//! description (`SnapMeta`: which log id and which WAL LSN it covers). Replaying the
//! file in order rebuilds the log; the newest vote, committed id and snapshot win. A
//! record cut short at the end of the file (a crash mid-write) is dropped; a bad record
//! anywhere else stops the start.
//!
//! Entries are kept in memory too, but an entry the state machine applied a while ago
//! and the file holds durably keeps only its description there: its records are read
//! back from the file if asked for again (`log_held`). Writes go to one thread that writes and `fdatasync`s what
//! has queued up and then completes every waiter at once: a group commit, off the event
//! loop. An append is acknowledged to openraft (`LogFlushed`) only after its sync, so the
//! leader counts its own copy toward the majority only when it is on disk.
//!
//! A purge rewrites the file: the image of what is left (snapshot, purge point, vote,
//! committed id, entries) goes to `log.tmp`, is synced and renamed over `log`, so the
//! file stays as short as the log. Every change is handed to the writer while the
//! in-memory log is locked, in the order it was made; so an image, built under that
//! lock, holds everything handed over before it, and whatever follows it in the queue
//! lands after it in the new file.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::ops::RangeBounds;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{EntryPayload, RaftLogReader, StorageIOError, StoredMembership, Vote};
use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::log_file::{self, LogFile};
use super::log_held::{Durable, Held};
use super::log_record::{
    encode, encode_ser, ser, HEADER, K_COMMITTED, K_ENTRY, K_PURGE, K_SNAPSHOT, K_TRUNCATE, K_VOTE,
    MAX_BODY,
};
use super::storage_fault::LogFault;
use super::{Entry, LogId, NodeId, NodeInfo, StorageError, TypeConfig};
use crate::wal::bit_repair;
use crate::wal::segment::DiskHook;

/// An entry's index, and where its record starts in bytes written and how long it is.
type Placed = (u64, u64, usize);

#[derive(Default)]
struct Inner {
    /// Every entry not purged; those applied long enough ago without their records
    /// (`held`).
    entries: BTreeMap<u64, Entry>,
    held: Held,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId>,
    last_purged: Option<LogId>,
    snapshot: Option<SnapMeta>,
}

/// The newest snapshot of this member: the Raft side (`meta`: the log id and membership
/// it includes) and the WAL side (`lsn`: the last record it covers).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SnapMeta {
    /// openraft's description of the snapshot: last log id included and membership.
    pub meta: openraft::SnapshotMeta<NodeId, NodeInfo>,
    /// The LSN of the last WAL record the snapshot covers.
    pub lsn: u64,
}

impl Inner {
    /// The whole log as a file: what a rewrite writes, and where each entry lies in it.
    /// Every entry must be whole ([`Held::restore_all`]).
    fn image(&self) -> (Vec<u8>, Vec<Placed>) {
        let mut out = Vec::new();
        let mut places = Vec::with_capacity(self.entries.len());
        if let Some(s) = &self.snapshot {
            encode(K_SNAPSHOT, &ser(s), &mut out);
        }
        if let Some(p) = &self.last_purged {
            encode(K_PURGE, &ser(p), &mut out);
        }
        if let Some(v) = &self.vote {
            encode(K_VOTE, &ser(v), &mut out);
        }
        encode(K_COMMITTED, &ser(&self.committed), &mut out);
        for e in self.entries.values() {
            let at = out.len();
            encode(K_ENTRY, &ser(e), &mut out);
            places.push((e.log_id.index, at as u64, out.len() - at));
        }
        (out, places)
    }

    /// Every entry whole again, then the image of the log: what a rewrite writes.
    fn rewrite_image(&mut self, path: &Path) -> io::Result<(Vec<u8>, Vec<Placed>)> {
        let Inner { entries, held, .. } = self;
        held.restore_all(entries, path)?;
        Ok(self.image())
    }

    fn purge_to(&mut self, upto: LogId) {
        if self.last_purged.is_some_and(|p| p.index >= upto.index) {
            return;
        }
        self.entries = self.entries.split_off(&upto.index.saturating_add(1));
        self.held.purge_to(upto.index);
        self.last_purged = Some(upto);
    }
}

enum Done {
    Flushed(LogFlushed<TypeConfig>),
    /// A caller blocking its thread until the change is on disk.
    Sync(mpsc::Sender<io::Result<()>>),
    /// A task awaiting it.
    Notify(oneshot::Sender<io::Result<()>>),
    None,
}

struct Job {
    /// Records to append, or with `rewrite` the file's whole new content.
    bytes: Vec<u8>,
    rewrite: bool,
    /// The file generation it goes to ([`Held`]).
    gen: u64,
    done: Done,
}

/// Where a change goes to reach the disk.
#[derive(Clone)]
enum Sink {
    /// The writer thread (group commit off the event loop): what a server uses.
    Thread(mpsc::Sender<Job>),
    /// Written and synced by the caller, before `submit` returns: the deterministic
    /// simulation's, where what is on disk at a crash must follow from the run's history,
    /// not from when an OS thread ran ([`LogStore::open_inline`]).
    Inline(Arc<Mutex<InlineFile>>),
    /// Written and synced by a task of the event loop a while after the change, as the
    /// writer thread does in a server: the simulation's, when its disk model
    /// [`lags`](DiskHook::lags), so that entries are readable, and sent to peers, before
    /// they are durable here.
    Lagging(Arc<Mutex<Lagging>>),
}

/// The queue of a [`Sink::Lagging`] log.
struct Lagging {
    inline: InlineFile,
    durable: Arc<Mutex<Durable>>,
    queue: Vec<Job>,
    /// A task is waiting out the lag and then writes the queue.
    scheduled: bool,
    hook: Arc<dyn DiskHook>,
    path: Arc<PathBuf>,
    fault: Arc<LogFault>,
}

impl Lagging {
    /// Writes and syncs what is queued, in order.
    fn flush(&mut self) {
        let jobs = std::mem::take(&mut self.queue);
        let InlineFile { file, failed } = &mut self.inline;
        if *failed {
            fail_jobs(jobs);
        } else {
            *failed = !write_jobs(file, (&self.path, &self.fault), jobs, &self.durable);
        }
    }
}

/// The task that writes a [`Sink::Lagging`] log's queue once the disk model's lag
/// passed; changes made meanwhile go in the same write and sync.
async fn lag_then_flush(f: Arc<Mutex<Lagging>>) {
    let lag = f.lock().hook.sync_lag();
    tokio::time::sleep(lag).await;
    let mut g = f.lock();
    g.scheduled = false;
    g.flush();
}

struct InlineFile {
    /// The file, with the simulation's model of the disk ([`LogStore::open_inline_on`]).
    file: LogFile,
    /// A write or sync failed: every later job fails, as the writer thread's do.
    failed: bool,
}

/// The Raft log (openraft's `RaftLogStorage`).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<Inner>>,
    sink: Sink,
    path: Arc<PathBuf>,
    /// What the writer made durable (it sets it, `release_applied` reads it).
    durable: Arc<Mutex<Durable>>,
    /// The newest commit index not yet written: it goes to disk ahead of the next
    /// change (or not at all; see `save_committed`).
    unwritten_commit: Arc<Mutex<Option<Vec<u8>>>>,
    /// Its first write failure, for `storage_fault::watch`.
    fault: Arc<LogFault>,
}

/// Reads entries for replication while the store appends (openraft's `LogReader`).
#[derive(Clone)]
pub struct LogReader {
    inner: Arc<Mutex<Inner>>,
    path: Arc<PathBuf>,
}

/// Why the Raft log file could not be opened at start-up.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Reading or writing the file failed.
    #[error("raft log {path}: {source}")]
    Io {
        /// The log file.
        path: String,
        /// What the system reported.
        source: io::Error,
    },
    /// A record before the end of the file fails its check: damage, not a torn final
    /// write, so the node refuses to start rather than drop acknowledged entries.
    #[error("raft log {path} is corrupt at byte {offset}: {why} (not at the end of the file, so not a torn write); refusing to start")]
    Corrupt {
        /// The log file.
        path: String,
        /// Byte offset of the bad record in the file.
        offset: u64,
        /// What is wrong with it.
        why: String,
    },
}

impl LogStore {
    /// Opens (or creates) `<dir>/log` and starts its writer thread.
    pub fn open(dir: &Path) -> Result<LogStore, OpenError> {
        LogStore::open_with(dir, true, None)
    }

    /// [`LogStore::open`] without the writer thread: each change is written and synced
    /// on the caller's thread (the event loop) before it is acknowledged. For the
    /// deterministic simulation only.
    pub fn open_inline(dir: &Path) -> Result<LogStore, OpenError> {
        LogStore::open_with(dir, false, None)
    }

    /// [`LogStore::open_inline`] on the simulation's model of the disk: every write and
    /// sync of the log goes through `hook`, which may fail it and which stands in for the
    /// `fdatasync` (see [`DiskHook`]).
    pub fn open_inline_on(dir: &Path, hook: Arc<dyn DiskHook>) -> Result<LogStore, OpenError> {
        LogStore::open_with(dir, false, Some(hook))
    }

    fn open_with(
        dir: &Path,
        threaded: bool,
        hook: Option<Arc<dyn DiskHook>>,
    ) -> Result<LogStore, OpenError> {
        let path = dir.join("log");
        let io_err = |source| OpenError::Io {
            path: path.display().to_string(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io_err)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io_err)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io_err)?;
        let (mut inner, good) = replay_repairing(&mut bytes, &file, &path)?;
        let mut len = bytes.len() as u64;
        if !log_file::blank_from(&bytes, good as usize) {
            tracing::warn!(
                "raft log {}: dropped a torn record at the end ({} bytes)",
                path.display(),
                bytes.len() - good as usize
            );
            file.set_len(good).map_err(io_err)?;
            file.sync_data().map_err(io_err)?;
            len = good;
        }
        let lagging = hook.clone().filter(|h| h.lags());
        let file = LogFile::new(file, good, len, hook);
        inner.held.opened(good);
        let durable = Arc::new(Mutex::new(Durable { gen: 0, end: good }));
        // A restart never resumes a leadership (standard Raft; openraft would restore the
        // leader state of a committed vote naming this node): the previous process may
        // have replicated entries it had not yet synced itself, and leading the same term
        // again would put different entries of that term at those indexes. The vote
        // stays cast (no second vote in its term); only an election in a new term makes
        // this node lead again.
        if let Some(v) = inner.vote.as_mut() {
            v.committed = false;
        }
        let fault = Arc::new(LogFault::default());
        let sink = if threaded {
            let (tx, rx) = mpsc::channel();
            std::thread::Builder::new()
                .name("stockgate-raftlog".into())
                .spawn({
                    let path = path.clone();
                    let durable = durable.clone();
                    let fault = fault.clone();
                    move || writer(file, (&path, &fault), rx, &durable)
                })
                .map_err(io_err)?;
            Sink::Thread(tx)
        } else {
            let inline = InlineFile {
                file,
                failed: false,
            };
            match lagging {
                Some(hook) => Sink::Lagging(Arc::new(Mutex::new(Lagging {
                    inline,
                    durable: durable.clone(),
                    queue: Vec::new(),
                    scheduled: false,
                    hook,
                    path: Arc::new(path.clone()),
                    fault: fault.clone(),
                }))),
                None => Sink::Inline(Arc::new(Mutex::new(inline))),
            }
        };
        Ok(LogStore {
            inner: Arc::new(Mutex::new(inner)),
            sink,
            path: Arc::new(path),
            durable,
            unwritten_commit: Arc::default(),
            fault,
        })
    }

    /// Its write failures' record, which `storage_fault::watch` looks at.
    pub fn fault_record(&self) -> Arc<LogFault> {
        self.fault.clone()
    }

    /// Written on the caller's task rather than by a writer thread
    /// ([`LogStore::open_inline`]): the simulation's, whose member then builds and
    /// installs snapshots on its tasks too.
    pub fn is_inline(&self) -> bool {
        !matches!(self.sink, Sink::Thread(_))
    }

    /// The log file's path, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True when the log has neither entries nor a vote: a node that never took part.
    pub fn is_pristine(&self) -> bool {
        let g = self.inner.lock();
        g.entries.is_empty() && g.vote.is_none() && g.last_purged.is_none()
    }

    /// The index of the last entry held (0 when none), for `INFO` and the metrics.
    pub fn last_index(&self) -> u64 {
        self.inner
            .lock()
            .entries
            .keys()
            .next_back()
            .copied()
            .unwrap_or(0)
    }

    /// The entries held from `from` on, written or not (what openraft reads and sends),
    /// for a consistency check across members.
    pub fn entries_from(&self, from: u64) -> io::Result<Vec<Entry>> {
        let g = self.inner.lock();
        let mut file = None;
        g.entries
            .range(from..)
            .map(|(_, e)| g.held.whole(e, &self.path, &mut file))
            .collect()
    }

    /// How many entries hold their records in memory (the rest are read back from the
    /// file when asked for).
    pub fn entries_in_memory(&self) -> usize {
        let g = self.inner.lock();
        g.entries
            .keys()
            .filter(|i| !g.held.is_released(**i))
            .count()
    }

    /// How many entries the log holds (not yet purged behind a snapshot).
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
        // The snapshot is where the WAL starts when the entries before it are purged.
        let (mut applied, mut covered) = match &g.snapshot {
            Some(s) if s.lsn > wal_last => {
                return Err(format!(
                    "the WAL ends at LSN {wal_last}, but this member's snapshot covers up to LSN {} and the raft log no longer has the entries before it: the WAL lost records (restore the data dir, or rejoin the member empty: RAFT.REMOVE, --rejoin-empty, RAFT.ADD)",
                    s.lsn
                ));
            }
            Some(s) => (s.meta.last_log_id, s.lsn),
            None => (None, 0),
        };
        for e in g.entries.values() {
            if let EntryPayload::Normal(b) = &e.payload {
                covered = covered.max(b.last_lsn());
                if b.last_lsn() <= wal_last && Some(e.log_id) > applied {
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
            .or_else(|| g.snapshot.as_ref().map(|s| s.meta.last_membership.clone()))
            .unwrap_or_default();
        Ok((applied, membership))
    }

    /// The last entry whose batch ends at or before `lsn`: its log id, the LSN its batch
    /// ends at (where a snapshot including it stands in the WAL), and the membership in
    /// force there. None when the log holds no such entry past its snapshot.
    pub fn log_id_for(&self, lsn: u64) -> Option<(LogId, u64, StoredMembership<NodeId, NodeInfo>)> {
        let (applied, m) = self.applied_for(lsn).ok()?;
        let applied = applied?;
        let g = self.inner.lock();
        let end = match g.entries.get(&applied.index).map(|e| &e.payload) {
            Some(EntryPayload::Normal(b)) => b.last_lsn(),
            _ => g.snapshot.as_ref()?.lsn,
        };
        Some((applied, end, m))
    }

    // openraft's trait methods return its own (large) error type: boxing here would only
    // move the allocation.
    #[allow(clippy::result_large_err)]
    /// Queues `bytes` for the writer, under the lock of the in-memory log `g` (so in
    /// the order of the changes), and returns where in the file they land.
    fn submit(
        &self,
        g: &mut Inner,
        bytes: Vec<u8>,
        rewrite: bool,
        done: Done,
    ) -> Result<u64, StorageError> {
        // A rewrite's image holds the commit index already.
        let commit = self.unwritten_commit.lock().take().filter(|_| !rewrite);
        let (bytes, ahead) = match commit {
            Some(mut c) => {
                let ahead = c.len() as u64;
                c.extend_from_slice(&bytes);
                (c, ahead)
            }
            None => (bytes, 0),
        };
        Ok(self.queue_job(g, bytes, rewrite, done)? + ahead)
    }

    /// Queues `bytes` as they are (an append's may start with the commit index written
    /// ahead): where they start in the file.
    #[allow(clippy::result_large_err)]
    fn queue_job(
        &self,
        g: &mut Inner,
        bytes: Vec<u8>,
        rewrite: bool,
        done: Done,
    ) -> Result<u64, StorageError> {
        let at = g.held.queue(bytes.len(), rewrite);
        let job = Job {
            bytes,
            rewrite,
            gen: g.held.gen(),
            done,
        };
        self.send(job)?;
        Ok(at)
    }

    /// Hands `job` to the sink.
    #[allow(clippy::result_large_err)]
    fn send(&self, job: Job) -> Result<(), StorageError> {
        match &self.sink {
            Sink::Thread(tx) => tx.send(job).map_err(|_| {
                StorageIOError::write_logs(&io::Error::other("raft log writer stopped")).into()
            }),
            Sink::Inline(f) => {
                let mut f = f.lock();
                if f.failed {
                    fail_jobs(vec![job]);
                } else {
                    let InlineFile { file, failed } = &mut *f;
                    *failed =
                        !write_jobs(file, (&self.path, &self.fault), vec![job], &self.durable);
                }
                Ok(())
            }
            Sink::Lagging(f) => {
                // A caller blocking its thread cannot wait for a task of its event loop:
                // what is queued goes now, with its change after it.
                let blocking = matches!(job.done, Done::Sync(_));
                let mut g = f.lock();
                g.queue.push(job);
                if blocking {
                    g.flush();
                } else if !g.scheduled {
                    g.scheduled = true;
                    tokio::spawn(super::runtime::gated(lag_then_flush(f.clone())));
                }
                Ok(())
            }
        }
    }

    /// Changes the in-memory log with `change` and queues the record `kind`/`body` (or,
    /// with `kind` None, a rewrite to the image after the change), both under the lock;
    /// `done` completes once it is on disk.
    #[allow(clippy::result_large_err)]
    fn change(
        &self,
        record: Option<(u8, &[u8])>,
        change: impl FnOnce(&mut Inner),
        done: Done,
    ) -> Result<(), StorageError> {
        let mut g = self.inner.lock();
        change(&mut g);
        match record {
            Some((kind, body)) => {
                let mut bytes = Vec::with_capacity(HEADER + body.len());
                encode(kind, body, &mut bytes);
                self.submit(&mut g, bytes, false, done).map(|_| ())
            }
            None => self.submit_rewrite(&mut g, done),
        }
    }

    /// Queues a rewrite of the file to the image of `g`, every entry read back whole
    /// first.
    #[allow(clippy::result_large_err)]
    fn submit_rewrite(&self, g: &mut Inner, done: Done) -> Result<(), StorageError> {
        let (bytes, places) = match g.rewrite_image(&self.path) {
            Ok(image) => image,
            Err(e) => {
                complete(done, Err(io::Error::new(e.kind(), e.to_string())));
                return Err(StorageIOError::read_logs(&e).into());
            }
        };
        self.submit(g, bytes, true, done)?;
        for (index, at, len) in places {
            g.held.placed(index, at, len);
        }
        Ok(())
    }

    /// Lets go of the records of entries the state machine applied up to `applied`
    /// (all but the last few; see `log_held`): they are read back from the file if
    /// asked for again.
    pub fn release_applied(&self, applied: u64) {
        let d = *self.durable.lock();
        let mut g = self.inner.lock();
        let Inner { entries, held, .. } = &mut *g;
        held.release(entries, applied, d);
    }

    /// [`Self::change`], then blocks the calling thread until it is on disk.
    fn change_blocking(
        &self,
        record: Option<(u8, &[u8])>,
        change: impl FnOnce(&mut Inner),
    ) -> io::Result<()> {
        let (tx, rx) = mpsc::channel();
        self.change(record, change, Done::Sync(tx))
            .map_err(|e| io::Error::other(e.to_string()))?;
        rx.recv()
            .map_err(|_| io::Error::other("raft log writer stopped"))?
    }

    /// [`Self::change`], then waits (without holding the event loop) until it is on disk.
    async fn change_synced(
        &self,
        record: Option<(u8, &[u8])>,
        change: impl FnOnce(&mut Inner),
        what: fn(&io::Error) -> StorageError,
    ) -> Result<(), StorageError> {
        let (tx, rx) = oneshot::channel();
        self.change(record, change, Done::Notify(tx))?;
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(what(&e)),
            Err(_) => Err(what(&io::Error::other("raft log writer stopped"))),
        }
    }

    /// The newest snapshot's description, if this member has one.
    pub fn snapshot(&self) -> Option<SnapMeta> {
        self.inner.lock().snapshot.clone()
    }

    /// Records a snapshot this member built (entries stay: openraft purges them when it
    /// is done with them). Blocking: waits for the sync.
    pub fn record_snapshot(&self, snap: SnapMeta) -> io::Result<()> {
        let body = ser(&snap);
        self.change_blocking(Some((K_SNAPSHOT, &body)), |g| g.snapshot = Some(snap))
    }

    /// Records a snapshot received from the leader and drops every entry it includes
    /// (rewriting the file), before the member restarts on it. Blocking.
    pub fn adopt_snapshot(&self, snap: SnapMeta) -> io::Result<()> {
        let upto = snap.meta.last_log_id;
        self.change_blocking(None, |g| {
            if let Some(l) = upto {
                g.purge_to(l);
                if g.committed < Some(l) {
                    g.committed = Some(l);
                }
            }
            g.snapshot = Some(snap);
        })
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
            if torn_at(bytes, at) {
                break; // a length half written over the zeros ahead of the log, or garbled
            }
            return Err((at as u64, format!("record length {len} over the limit")));
        }
        if rest.len() < HEADER + len {
            // A body cut short by the end of the file is a torn last write; a damaged
            // length reaching past the end with whole records after it is not, and
            // cutting there would drop them (acknowledged entries, the vote).
            if torn_at(bytes, at) {
                break;
            }
            return Err((
                at as u64,
                format!("record length {len} runs past the end of the file"),
            ));
        }
        let body = &rest[HEADER..HEADER + len];
        let end = at + HEADER + len;
        let ok = len > 0 && crc32c::crc32c_append(crc32c::crc32c(&[kind]), body) == crc;
        if !ok {
            // The end of the log: the zeros written ahead of it, or its last record half
            // written (zeros, or what a power loss left, after it).
            if torn_at(bytes, at) {
                break;
            }
            return Err((at as u64, "checksum mismatch".into()));
        }
        let bad = |e: bincode::Error| (at as u64, format!("record kind {kind}: {e}"));
        match kind {
            K_ENTRY => {
                let e: Entry = bincode::deserialize(body).map_err(bad)?;
                inner.held.placed(e.log_id.index, at as u64, HEADER + len);
                inner.entries.insert(e.log_id.index, e);
            }
            K_TRUNCATE => {
                let from: u64 = bincode::deserialize(body).map_err(bad)?;
                inner.entries.split_off(&from);
                inner.held.cut_from(from);
            }
            K_PURGE => {
                let upto: LogId = bincode::deserialize(body).map_err(bad)?;
                inner.entries = inner.entries.split_off(&upto.index.saturating_add(1));
                inner.held.purge_to(upto.index);
                inner.last_purged = Some(upto);
            }
            K_VOTE => inner.vote = Some(bincode::deserialize(body).map_err(bad)?),
            K_COMMITTED => inner.committed = bincode::deserialize(body).map_err(bad)?,
            K_SNAPSHOT => inner.snapshot = Some(bincode::deserialize(body).map_err(bad)?),
            k => return Err((at as u64, format!("unknown record kind {k}"))),
        }
        at = end;
    }
    Ok((inner, at as u64))
}

/// Flipped bits put right per start at most: more is a failing disk, refused.
const MAX_REPAIRS: usize = 16;

/// [`replay`], first putting right each bad record that one flipped bit is all that is
/// wrong with (in `bytes`, and in `file`, synced, so the next start reads it whole). A
/// bad last record is otherwise taken for a torn write and cut, and it may be an
/// acknowledged entry or a cast vote (see `wal::bit_repair`). A repair is kept only if
/// the record then replays.
fn replay_repairing(bytes: &mut [u8], file: &File, path: &Path) -> Result<(Inner, u64), OpenError> {
    let mut result = replay(bytes);
    for _ in 0..MAX_REPAIRS {
        let at = match &result {
            Ok((_, good)) if log_file::blank_from(bytes, *good as usize) => break,
            Ok((_, good)) => *good,
            Err((offset, _)) => *offset,
        } as usize;
        let Some(r) = bit_repair::single_bit(&bytes[at..], 1, MAX_BODY) else {
            break;
        };
        r.apply(&mut bytes[at..]);
        let next = replay(bytes);
        let past = |(Ok((_, o)) | Err((o, _))): &Result<(Inner, u64), (u64, String)>| *o;
        if past(&next) as usize <= at {
            r.apply(&mut bytes[at..]);
            break;
        }
        let byte = at + r.byte;
        file.write_all_at(&bytes[byte..=byte], byte as u64)
            .and_then(|()| file.sync_data())
            .map_err(|source| OpenError::Io {
                path: path.display().to_string(),
                source,
            })?;
        tracing::warn!(
            "raft log {}: record at byte {at} had bit {} of byte {byte} flipped; put right",
            path.display(),
            r.bit
        );
        result = next;
    }
    result.map_err(|(offset, why)| OpenError::Corrupt {
        path: path.display().to_string(),
        offset,
        why,
    })
}

/// Whether the bad record at `at` is the log's torn end: no valid record starts anywhere
/// after it. A power loss can leave the last write cut short, garbled, or zero-filled
/// (the file's new size reached the disk, its data did not), and records are only ever
/// appended, so nothing acknowledged lies past it; a valid record further on means
/// damage inside the log.
fn torn_at(bytes: &[u8], at: usize) -> bool {
    log_file::blank_from(bytes, at + 1)
        || !(at + 1..bytes.len()).any(|p| valid_record_at(&bytes[p..]))
}

/// Whether a whole record with a non-empty body and a matching checksum starts `rest`.
fn valid_record_at(rest: &[u8]) -> bool {
    let Some(head) = rest.get(..HEADER) else {
        return false;
    };
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    if len == 0 || len > MAX_BODY {
        return false;
    }
    rest.get(HEADER..HEADER + len)
        .is_some_and(|body| crc32c::crc32c_append(crc32c::crc32c(&[head[8]]), body) == crc)
}

/// The writer thread: takes every queued job, writes them in order, syncs once, then
/// completes them. Exits when every store handle is gone. After a failed write or sync
/// it fails every later job without touching the file: after a failed `fsync` the
/// kernel may have dropped the pages it could not write, so a later sync that succeeds
/// proves nothing.
fn writer(mut file: LogFile, at: At<'_>, rx: mpsc::Receiver<Job>, durable: &Mutex<Durable>) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        while let Ok(j) = rx.try_recv() {
            jobs.push(j);
        }
        if !write_jobs(&mut file, at, jobs, durable) {
            // A log that cannot be written cannot promise anything: stop taking writes.
            fail_jobs(rx.iter());
            return;
        }
    }
}

/// The log file's path and its fault record, where a write failure is noted.
type At<'a> = (&'a Path, &'a LogFault);

/// Writes `jobs` in order, syncs once, then records what is durable and completes them;
/// false if the write or the sync failed (every job then completes with the error).
fn write_jobs(file: &mut LogFile, at: At<'_>, jobs: Vec<Job>, durable: &Mutex<Durable>) -> bool {
    let (path, fault) = at;
    let mut r = Ok(());
    for j in &jobs {
        let done = if j.rewrite {
            file.rewrite(path, &j.bytes)
        } else {
            file.append(path, &j.bytes)
        };
        if let Err(e) = done {
            r = Err(e);
            break;
        }
    }
    // Nothing waits on a commit index alone (openraft never needs it on disk: an older
    // one after a crash only re-applies what the WAL already has), so it reaches the
    // disk with the next sync anyone waits for instead of costing one of its own.
    let waited = jobs
        .iter()
        .any(|j| j.rewrite || !matches!(j.done, Done::None));
    if r.is_ok() && waited {
        r = file.sync(path);
        if let (Ok(()), Some(last)) = (&r, jobs.last()) {
            *durable.lock() = Durable {
                gen: last.gen,
                end: file.end(),
            };
        }
    }
    if let Err(e) = &r {
        // Recorded before any waiter learns of it: the process exits on it
        // (`storage_fault`), naming this file, rather than serve on a log that may
        // have lost what it was handed.
        tracing::debug!("raft log write failed: {e}");
        fault.note(path, e);
    }
    for j in jobs {
        let res = match &r {
            Ok(()) => Ok(()),
            Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
        };
        complete(j.done, res);
    }
    r.is_ok()
}

/// Fails every job of a log that failed earlier, without touching the file: after a
/// failed `fsync` the kernel may have dropped the pages it could not write, so a later
/// sync that succeeds proves nothing.
fn fail_jobs(jobs: impl IntoIterator<Item = Job>) {
    for j in jobs {
        complete(j.done, Err(io::Error::other("raft log failed earlier")));
    }
}

fn complete(done: Done, res: io::Result<()>) {
    match done {
        Done::Flushed(cb) => cb.log_io_completed(res),
        Done::Sync(tx) => {
            let _ = tx.send(res);
        }
        Done::Notify(tx) => {
            let _ = tx.send(res);
        }
        Done::None => {}
    }
}

/// A range of log indexes openraft asked for that is no range: its start lies past its
/// end. openraft computes these from what peers report, so a peer's reply must not be
/// able to turn one into a panic (`BTreeMap::range` panics on it).
#[derive(Debug, thiserror::Error)]
#[error("log range {0} starts after it ends")]
pub struct RangeError(String);

/// The entries in `range`, or [`RangeError`] as openraft's storage error.
#[allow(clippy::result_large_err)] // openraft's own error type, as its trait returns it
fn range_entries<RB: RangeBounds<u64> + std::fmt::Debug>(
    inner: &Mutex<Inner>,
    path: &Path,
    range: RB,
) -> Result<Vec<Entry>, StorageError> {
    use std::ops::Bound::{Excluded, Included, Unbounded};
    // In u128 so that neither `Excluded(u64::MAX)` as a start nor `Included(u64::MAX)`
    // as an end overflows.
    let start = match range.start_bound() {
        Included(s) => u128::from(*s),
        Excluded(s) => u128::from(*s) + 1,
        Unbounded => 0,
    };
    let end = match range.end_bound() {
        Included(e) => u128::from(*e) + 1,
        Excluded(e) => u128::from(*e),
        Unbounded => u128::from(u64::MAX) + 1,
    };
    if start > end {
        let e = RangeError(format!("{range:?}"));
        tracing::error!("raft log: {e}; refused");
        return Err(StorageIOError::read_logs(&e).into());
    }
    // Empty (start == end) or starting past the last possible index: nothing.
    let Ok(lo) = u64::try_from(start) else {
        return Ok(Vec::new());
    };
    if start == end {
        return Ok(Vec::new());
    }
    let g = inner.lock();
    let entries = match u64::try_from(end) {
        Ok(hi) => g.entries.range(lo..hi),
        Err(_) => g.entries.range(lo..),
    };
    let mut file = None;
    entries
        .map(|(_, e)| g.held.whole(e, path, &mut file))
        .collect::<io::Result<Vec<Entry>>>()
        .map_err(|e| {
            tracing::error!("raft log: {e}");
            StorageIOError::read_logs(&e).into()
        })
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + std::fmt::Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        range_entries(&self.inner, &self.path, range)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + std::fmt::Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        range_entries(&self.inner, &self.path, range)
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
            path: self.path.clone(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        let v = *vote;
        // A vote never goes back: that is what keeps one leader per term.
        // Refused rather than asserted: a vote is what a peer's request leads to.
        let old = self.inner.lock().vote;
        if old.is_some_and(|old| v < old) {
            let e = io::Error::other(format!("vote {v} would go back from {old:?}"));
            return Err(StorageIOError::write_vote(&e).into());
        }
        self.change_synced(
            Some((K_VOTE, &ser(vote))),
            |g| g.vote = Some(v),
            |e| StorageIOError::write_vote(e).into(),
        )
        .await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        Ok(self.inner.lock().vote)
    }

    /// Kept to be written ahead of the next change, not on its own: openraft never needs
    /// the commit index on disk (it is learned again from the leader, and an older one
    /// after a crash only re-applies entries the WAL already has, which the state machine
    /// skips), so a write, a sync and a wake of the writer per commit would buy nothing.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        let mut bytes = Vec::new();
        encode(K_COMMITTED, &ser(&committed), &mut bytes);
        let mut g = self.inner.lock();
        g.committed = committed;
        *self.unwritten_commit.lock() = Some(bytes);
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
        let mut places = Vec::new();
        let mut g = self.inner.lock();
        // The commit index written ahead goes first, into the buffer the entries are
        // serialised into: the batch is not copied again to put it in front.
        let mut bytes = self.unwritten_commit.lock().take().unwrap_or_default();
        for e in entries {
            // The log has no holes: each entry follows the last one kept (or the purge).
            let next = g
                .entries
                .last_key_value()
                .map(|(i, _)| i + 1)
                .or(g.last_purged.map(|p| p.index + 1));
            debug_assert!(
                next.is_none_or(|n| n == e.log_id.index),
                "entry {} appended where {next:?} was expected",
                e.log_id
            );
            let at = bytes.len();
            encode_ser(K_ENTRY, &e, &mut bytes);
            places.push((e.log_id.index, at as u64, bytes.len() - at));
            g.entries.insert(e.log_id.index, e);
        }
        // Readable at once (openraft reads what it appended), acknowledged when synced.
        let base = self.queue_job(&mut g, bytes, false, Done::Flushed(callback))?;
        for (index, at, len) in places {
            g.held.placed(index, base + at, len);
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let from = log_id.index;
        // Only an uncommitted suffix is ever cut: a committed entry is on a majority.
        // Refused rather than asserted: where to cut comes from a leader's append.
        let committed = self.inner.lock().committed;
        if committed.is_some_and(|c| from <= c.index) {
            let e = io::Error::other(format!(
                "truncating from {from} would cut committed entries (committed: {committed:?})"
            ));
            return Err(StorageIOError::write_logs(&e).into());
        }
        self.change_synced(
            Some((K_TRUNCATE, &ser(&from))),
            |g| {
                g.entries.split_off(&from);
                g.held.cut_from(from);
            },
            |e| StorageIOError::write_logs(e).into(),
        )
        .await
    }

    /// Drops the entries up to `log_id` and rewrites the file to what is left. Not waited
    /// for: a purge lost to a crash is only done again.
    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut g = self.inner.lock();
        g.purge_to(log_id);
        self.submit_rewrite(&mut g, Done::None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::Batch;
    use openraft::{CommittedLeaderId, EntryPayload};
    use std::io::Write;

    fn entry(term: u64, index: u64, first_lsn: u64) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Normal(Batch {
                origin: 7,
                first_lsn,
                count: 2,
                records: vec![1, 2, 3].into(),
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

    #[tokio::test]
    async fn raft_log_refuses_a_range_that_starts_after_it_ends() {
        use std::ops::Bound::{Excluded, Included, Unbounded};
        let dir = std::env::temp_dir().join(format!("sg-raftlog-range-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        write_raw(
            &dir,
            &(1..=5)
                .map(|i| (K_ENTRY, ser(&entry(1, i, 2 * i - 1))))
                .collect::<Vec<_>>(),
        );
        let mut s = LogStore::open(&dir).expect("open");
        let idx = |v: Vec<Entry>| v.iter().map(|e| e.log_id.index).collect::<Vec<_>>();
        assert_eq!(idx(s.try_get_log_entries(2..4).await.expect("ok")), [2, 3]);
        assert_eq!(idx(s.try_get_log_entries(4..=9).await.expect("ok")), [4, 5]);
        assert!(s.try_get_log_entries(3..3).await.expect("empty").is_empty());
        let both_excluded = (Excluded(3u64), Excluded(3u64));
        assert!(s.try_get_log_entries(both_excluded).await.is_err());
        // What used to panic the Raft core: a start past the end.
        let reversed = (Included(5u64), Excluded(2u64));
        assert!(s.try_get_log_entries(reversed).await.is_err());
        let mut reader = s.get_log_reader().await;
        let reversed = (Included(9u64), Included(3u64));
        assert!(reader.try_get_log_entries(reversed).await.is_err());
        let top = (Excluded(u64::MAX), Unbounded);
        assert!(reader
            .try_get_log_entries(top)
            .await
            .expect("empty")
            .is_empty());
        let all = (Included(0u64), Included(u64::MAX));
        assert_eq!(
            idx(reader.try_get_log_entries(all).await.expect("ok")).len(),
            5
        );
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

    /// Counts the writes and syncs of a store opened on it.
    #[derive(Default)]
    struct Counting {
        writes: std::sync::atomic::AtomicU64,
        syncs: std::sync::atomic::AtomicU64,
    }

    impl DiskHook for Counting {
        fn created(&self, _: &Path) {}
        fn write(&self, _: &Path, _: u64) -> io::Result<()> {
            self.writes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        }
        fn sync(&self, _: &Path, _: u64) -> io::Result<()> {
            self.syncs
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        }
    }

    /// Fails the sync of a rewrite's new image (`log.tmp`), as a failed `fdatasync`.
    struct FailImageSync;

    impl DiskHook for FailImageSync {
        fn created(&self, _: &Path) {}
        fn write(&self, _: &Path, _: u64) -> io::Result<()> {
            Ok(())
        }
        fn sync(&self, path: &Path, _: u64) -> io::Result<()> {
            if path.extension().is_some_and(|e| e == "tmp") {
                return Err(io::Error::from_raw_os_error(28));
            }
            Ok(())
        }
    }

    /// Under the simulation's disk model a rewrite syncs its image before renaming it
    /// over the log, as a server does: a failed sync leaves the old log in place (were
    /// the image renamed first, the model would count a log it never synced).
    #[test]
    fn raft_log_rewrite_whose_image_sync_fails_keeps_the_old_log() {
        let dir = std::env::temp_dir().join(format!("sg-raftlog-imgsync-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let raw: Vec<(u8, Vec<u8>)> = (1..=20)
            .map(|i| (K_ENTRY, ser(&entry(1, i, 2 * i - 1))))
            .collect();
        write_raw(&dir, &raw);
        let s = LogStore::open_inline_on(&dir, Arc::new(FailImageSync)).expect("open");
        let snap = SnapMeta {
            meta: openraft::SnapshotMeta {
                last_log_id: Some(LogId::new(CommittedLeaderId::new(1, 1), 15)),
                last_membership: StoredMembership::default(),
                snapshot_id: "t".into(),
            },
            lsn: 30,
        };
        assert!(s.adopt_snapshot(snap).is_err(), "the image's sync failed");
        drop(s);
        let s = LogStore::open_inline(&dir).expect("reopen");
        assert_eq!(s.snapshot(), None);
        assert_eq!(s.entry_count(), 20);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn raft_log_writes_a_commit_index_ahead_of_the_next_change_not_on_its_own() {
        use std::sync::atomic::Ordering::Relaxed;
        let dir = std::env::temp_dir().join(format!("sg-raftlog-csync-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let hook = Arc::new(Counting::default());
        let mut s = LogStore::open_inline_on(&dir, hook.clone()).expect("open");
        let (written, synced) = (hook.writes.load(Relaxed), hook.syncs.load(Relaxed));
        for index in 1..=3 {
            let committed = Some(LogId::new(CommittedLeaderId::new(1, 1), index));
            s.save_committed(committed).await.expect("committed");
        }
        assert_eq!(hook.writes.load(Relaxed), written, "not written on its own");
        assert_eq!(hook.syncs.load(Relaxed), synced, "not synced on its own");
        assert_eq!(
            s.inner.lock().committed.map(|c| c.index),
            Some(3),
            "known at once"
        );
        s.save_vote(&Vote::new(2, 1)).await.expect("vote");
        assert_eq!(hook.writes.load(Relaxed), written + 1, "one write");
        assert_eq!(hook.syncs.load(Relaxed), synced + 1, "one sync");
        drop(s);
        // Written ahead of the vote, the newest one: both are there after a restart.
        let s = LogStore::open_inline(&dir).expect("reopen");
        assert_eq!(s.inner.lock().committed.map(|c| c.index), Some(3));
        assert_eq!(s.inner.lock().vote, Some(Vote::new(2, 1)));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Waits until the writer thread of a dropped store let go of the file.
    fn reopen(dir: &Path) -> Result<LogStore, OpenError> {
        std::thread::sleep(std::time::Duration::from_millis(50));
        LogStore::open(dir)
    }

    #[tokio::test]
    async fn raft_log_writes_over_zeros_ahead_and_takes_them_for_its_end() {
        let dir = std::env::temp_dir().join(format!("sg-raftlog-ahead-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut s = LogStore::open(&dir).expect("open");
        for term in 1..=3 {
            s.save_vote(&Vote::new(term, 1)).await.expect("vote");
        }
        drop(s);
        let path = dir.join("log");
        let bytes = std::fs::read(&path).expect("read");
        let (inner, end) = replay(&bytes).expect("replays");
        assert_eq!(inner.vote, Some(Vote::new(3, 1)));
        assert!(bytes.len() as u64 >= log_file::GROW, "written ahead");
        assert!(log_file::blank_from(&bytes, end as usize));
        // Reopened: the zeros are the end, the file keeps them, appends go on after the
        // last record.
        let mut s = reopen(&dir).expect("reopen");
        assert_eq!(s.inner.lock().vote.map(|v| v.leader_id().term), Some(3));
        s.save_vote(&Vote::new(4, 2)).await.expect("vote");
        drop(s);
        let again = std::fs::read(&path).expect("read");
        assert_eq!(again.len(), bytes.len(), "no second growth");
        let (inner, end2) = replay(&again).expect("replays");
        assert_eq!(inner.vote, Some(Vote::new(4, 2)));
        assert!(end2 > end);
        // A record half written over the zeros: dropped, the file cut back to the log.
        // (Node 3: the two set bits of the part never written are more than one flipped
        // bit, which would be put right: such a record is whole but for that bit.)
        let mut torn = Vec::new();
        encode(K_VOTE, &ser(&Vote::<NodeId>::new(5, 3)), &mut torn);
        let f = OpenOptions::new().write(true).open(&path).expect("open");
        std::os::unix::fs::FileExt::write_all_at(&f, &torn[..HEADER + 8], end2).expect("torn");
        drop(f);
        let s = reopen(&dir).expect("torn tail dropped");
        assert_eq!(s.inner.lock().vote, Some(Vote::new(4, 2)));
        drop(s);
        assert_eq!(std::fs::metadata(&path).expect("meta").len(), end2);
        // A bad record with records after it is damage, zeros or not.
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[HEADER + 1] ^= 0xff;
        bytes.extend_from_slice(&[0; 64]);
        std::fs::write(&path, bytes).expect("write");
        assert!(matches!(
            reopen(&dir),
            Err(OpenError::Corrupt { offset: 0, .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn raft_log_lets_applied_records_go_and_reads_them_back_whole() {
        use super::super::log_held::KEEP;
        use openraft::storage::RaftLogStorageExt;
        let dir = std::env::temp_dir().join(format!("sg-raftlog-held-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut s = LogStore::open(&dir).expect("open");
        let all: Vec<Entry> = (1..=400).map(|i| entry(1, i, 2 * i - 1)).collect();
        for chunk in all.chunks(7) {
            // Each append goes with a commit index written ahead of it, which moves
            // where its entries land in the file.
            let prev = all[..]
                .iter()
                .find(|e| e.log_id.index + 1 == chunk[0].log_id.index);
            s.save_committed(prev.map(|e| e.log_id))
                .await
                .expect("commit");
            s.blocking_append(chunk.to_vec()).await.expect("append");
        }
        assert_eq!(s.entries_in_memory(), 400);
        // Applied up to 300: all but the last KEEP of those let their records go.
        s.release_applied(300);
        let released = 300 - KEEP as usize;
        assert_eq!(s.entries_in_memory(), 400 - released);
        assert_eq!(s.try_get_log_entries(1..=400).await.expect("read"), all);
        assert_eq!(s.entries_from(0).expect("read"), all);
        // The log's own questions need no records.
        let (applied, _) = s.applied_for(2 * 150).expect("applied");
        assert_eq!(applied.map(|a| a.index), Some(150));
        // A purge rewrites the file: every entry left is whole in it and in memory until
        // the new file is durable, then let go again from there.
        let upto = all[99].log_id;
        s.purge(upto).await.expect("purge");
        s.save_vote(&Vote::new(1, 1))
            .await
            .expect("vote after the rewrite");
        assert_eq!(s.entries_in_memory(), 300);
        s.release_applied(300);
        assert_eq!(s.entries_in_memory(), 300 - (released - 100));
        let rest = s.try_get_log_entries(101..=400).await.expect("read");
        assert_eq!(rest, all[100..]);
        // A start reads them all; then they go again, and come back the same.
        drop(s);
        let mut s = reopen(&dir).expect("reopen");
        s.release_applied(400);
        assert_eq!(s.entries_in_memory(), KEEP as usize);
        assert_eq!(
            s.try_get_log_entries(101..=400).await.expect("read"),
            all[100..]
        );
        // A record damaged on disk after it was let go reads back as an error, never
        // as another entry.
        let path = dir.join("log");
        let mut bytes = std::fs::read(&path).expect("read");
        let mut rec = Vec::new();
        encode(K_ENTRY, &ser(&all[149]), &mut rec);
        let at = bytes
            .windows(rec.len())
            .position(|w| w == rec.as_slice())
            .expect("entry 150 in the file");
        bytes[at + rec.len() - 1] ^= 0x10;
        std::fs::write(&path, &bytes).expect("write");
        assert!(s.try_get_log_entries(150..151).await.is_err());
        assert_eq!(
            s.try_get_log_entries(151..=152).await.expect("read"),
            all[150..152]
        );
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn raft_log_takes_a_garbled_end_for_a_torn_write_but_not_a_garbled_middle() {
        let dir = std::env::temp_dir().join(format!("sg-raftlog-garble-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        write_raw(
            &dir,
            &[
                (K_ENTRY, ser(&entry(1, 1, 1))),
                (K_ENTRY, ser(&entry(1, 2, 3))),
            ],
        );
        let path = dir.join("log");
        let good = std::fs::read(&path).expect("read");
        // What a power loss can leave of a last write: a length over the limit, then
        // bytes that are neither zeros nor a record.
        let mut bytes = good.clone();
        bytes.extend_from_slice(&[0xf0, 0xff, 0xff, 0x7f, 1, 2, 3, 4, 1, 0xaa, 0x55, 0x13]);
        std::fs::write(&path, &bytes).expect("write");
        let s = LogStore::open(&dir).expect("a garbled end is a torn write");
        assert_eq!(s.last_index(), 2);
        drop(s);
        // The last record's checksum garbled, junk after it.
        let mut bytes = good.clone();
        let last = bytes.len() - 3;
        bytes[last] ^= 0x5a;
        bytes.extend_from_slice(&[7; 5]);
        std::fs::write(&path, &bytes).expect("write");
        let s = reopen(&dir).expect("a garbled last record is a torn write");
        assert_eq!(s.last_index(), 1);
        drop(s);
        // The first record garbled with a whole record after it: damage, refused.
        let mut bytes = good;
        bytes[HEADER + 1] ^= 0x5a;
        std::fs::write(&path, &bytes).expect("write");
        assert!(matches!(
            reopen(&dir),
            Err(OpenError::Corrupt { offset: 0, .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Two flipped bits in a record's length, so that it reaches past the end of the
    /// file: a start must not take that for a torn last write while whole records follow.
    #[test]
    fn raft_log_refuses_a_damaged_length_that_reaches_past_the_end() {
        let dir = std::env::temp_dir().join(format!("sg-raftlog-len-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        write_raw(
            &dir,
            &[
                (K_ENTRY, ser(&entry(1, 1, 1))),
                (K_ENTRY, ser(&entry(1, 2, 3))),
                (K_VOTE, ser(&Vote::new(3, 1))),
            ],
        );
        let path = dir.join("log");
        let good = std::fs::read(&path).expect("read");
        // Bits 12 and 20 of a record's length: 1 MiB and 4 KiB more, under the limit.
        let lengthen = |bytes: &mut [u8], at: usize| {
            bytes[at + 1] ^= 1 << 4;
            bytes[at + 2] ^= 1 << 4;
        };
        let mut bytes = good.clone();
        lengthen(&mut bytes, 0);
        std::fs::write(&path, &bytes).expect("write");
        match LogStore::open(&dir) {
            Err(OpenError::Corrupt { offset, why, .. }) => {
                assert_eq!(offset, 0);
                assert!(why.contains("past the end"), "{why}");
            }
            Err(e) => panic!("unexpected {e}"),
            Ok(s) => panic!("opened with {} entries", s.entry_count()),
        }
        // The same damage to the last record (the vote), nothing after it: what a torn
        // last write leaves, cut.
        let vote_len = HEADER + ser(&Vote::new(3, 1)).len();
        let mut bytes = good;
        let last = bytes.len() - vote_len;
        lengthen(&mut bytes, last);
        std::fs::write(&path, &bytes).expect("write");
        let s = reopen(&dir).expect("a last record cut short is a torn write");
        assert_eq!(s.last_index(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// One flipped bit in any record, the last one (the vote here) included, which would
    /// otherwise pass for a torn write and be cut: put right, in the file too.
    #[test]
    fn raft_log_puts_right_one_flipped_bit_in_any_record_the_last_one_too() {
        let dir = std::env::temp_dir().join(format!("sg-raftlog-flip-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let vote = Vote::new(5, 2);
        write_raw(
            &dir,
            &[
                (K_ENTRY, ser(&entry(1, 1, 1))),
                (K_ENTRY, ser(&entry(2, 2, 3))),
                (K_VOTE, ser(&vote)),
            ],
        );
        let path = dir.join("log");
        let good = std::fs::read(&path).expect("read");
        for bit in 0..good.len() * 8 {
            let mut bytes = good.clone();
            bytes[bit / 8] ^= 1 << (bit % 8);
            std::fs::write(&path, &bytes).expect("write");
            let s = LogStore::open_inline(&dir).expect("one flipped bit is put right");
            assert_eq!(s.last_index(), 2, "bit {bit}");
            assert_eq!(
                s.inner.lock().vote.map(|v| v.leader_id),
                Some(vote.leader_id)
            );
            drop(s);
            assert_eq!(std::fs::read(&path).expect("read"), good, "bit {bit}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn raft_log_adopting_a_snapshot_rewrites_the_file_and_survives_a_restart() {
        let dir = std::env::temp_dir().join(format!("sg-raftlog-snap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut raw: Vec<(u8, Vec<u8>)> = (1..=50)
            .map(|i| (K_ENTRY, ser(&entry(1, i, 2 * i - 1))))
            .collect();
        raw.push((K_VOTE, ser(&Vote::<NodeId>::new(1, 1))));
        write_raw(&dir, &raw);
        let before = std::fs::metadata(dir.join("log")).expect("meta").len();
        let s = LogStore::open(&dir).expect("open");
        let at = LogId::new(CommittedLeaderId::new(1, 1), 40);
        let snap = SnapMeta {
            meta: openraft::SnapshotMeta {
                last_log_id: Some(at),
                last_membership: StoredMembership::default(),
                snapshot_id: "t".into(),
            },
            lsn: 80,
        };
        s.adopt_snapshot(snap.clone()).expect("adopt");
        drop(s);
        let after = std::fs::metadata(dir.join("log")).expect("meta").len();
        assert!(after < before / 3, "not rewritten: {before} -> {after}");
        let s = LogStore::open(&dir).expect("reopen");
        assert_eq!(s.snapshot(), Some(snap));
        assert_eq!(s.entry_count(), 10);
        assert_eq!(s.inner.lock().vote, Some(Vote::new(1, 1)));
        assert_eq!(s.inner.lock().last_purged, Some(at));
        // The WAL may end at the snapshot or past it, not before it.
        assert_eq!(s.applied_for(80).expect("at").0, Some(at));
        assert_eq!(
            s.applied_for(84).expect("past").0.map(|l| l.index),
            Some(42)
        );
        let e = s.applied_for(79).expect_err("a WAL behind the snapshot");
        assert!(e.contains("snapshot covers up to LSN 80"), "{e}");
        assert_eq!(
            s.log_id_for(83).map(|(l, end, _)| (l.index, end)),
            Some((41, 82))
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
