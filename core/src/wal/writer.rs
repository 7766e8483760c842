//! Group commit.
//!
//! `record` runs on engine threads with engine locks held, so it only encodes the event
//! (outside any WAL lock, into a thread-local scratch buffer), then, under one short mutex,
//! copies the bytes into the shared pending buffer and takes the next LSN. Because both
//! happen under the same mutex, buffer order is LSN order.
//!
//! One writer thread swaps the pending buffer for an empty one, writes the whole batch
//! with as few `write` calls as segment boundaries allow, syncs according to the
//! [`FsyncPolicy`], and only then publishes the batch's last LSN as durable. Everything
//! that arrived while it was writing or syncing becomes the next batch: the more load,
//! the bigger the batches, the fewer syncs per record.
//!
//! Failure is sticky: after any I/O error nothing more is written or acknowledged, and
//! every wait for an LSN that was not yet durable returns [`WalError::Failed`].

use std::cell::RefCell;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

use super::record::{encode_record, HEADER_LEN};
use super::segment::{self, ActiveSegment, Catalog, DiskHook};
use super::snapshot::{self, SnapshotWritten};
use super::{
    EventRef, EventSink, FsyncPolicy, Lsn, Recovery, Snapshot, WalError, WalOptions, WalStats,
};

const EVERYSEC: Duration = Duration::from_secs(1);

/// Records handed over by `record` and not yet taken by the writer.
struct Pending {
    buf: Vec<u8>,
    /// LSN of the first record in `buf` (the next LSN when `buf` is empty).
    buf_first: Lsn,
    buf_records: u64,
    /// LSN the next `record` gets.
    next: Lsn,
    /// LSNs that must start a new segment (requested by `roll`), ascending.
    rolls: Vec<Lsn>,
    /// Set once the writer has failed or close began: `record` still hands out LSNs (it
    /// cannot refuse) but drops the bytes; waits on those LSNs fail.
    stopped: bool,
    closing: bool,
}

/// What waiters watch, besides the `durable` atomic.
#[derive(Default)]
struct Progress {
    /// Highest `roll point - 1` whose segment switch the writer has carried out.
    rolled: Lsn,
    failure: Option<Arc<str>>,
    closed: bool,
}

struct Shared {
    dir: PathBuf,
    opts: WalOptions,
    /// The simulation's disk model ([`Wal::open_inline_on`]); `None` in a server.
    hook: Option<Arc<dyn DiskHook>>,
    state: Mutex<Pending>,
    has_work: Condvar,
    has_space: Condvar,
    durable: AtomicU64,
    /// The last LSN handed out (`Pending::next - 1`), readable without the state lock.
    assigned: AtomicU64,
    /// Segments holding this LSN or later are kept by snapshots (see [`Wal::retain_from`]).
    retain_from: AtomicU64,
    /// Highest roll point requested, so `write_snapshot` knows whether to wait for one.
    roll_requested: AtomicU64,
    progress: Mutex<Progress>,
    progress_cv: Condvar,
    /// Wakes the async waiters ([`Wal::wait_durable`], `reader`'s `wait_durable_past`).
    #[cfg(feature = "tokio")]
    notify: tokio::sync::Notify,
    catalog: Mutex<Catalog>,
    batches: AtomicU64,
    syncs: AtomicU64,
    bytes_written: AtomicU64,
}

impl Shared {
    /// The state of a log whose next record gets LSN `next`: nothing pending, everything
    /// before `next` durable (recovery read it from disk) and its rolls done.
    fn new(
        dir: PathBuf,
        opts: WalOptions,
        next: Lsn,
        catalog: Catalog,
        hook: Option<Arc<dyn DiskHook>>,
    ) -> Self {
        Shared {
            dir,
            opts,
            hook,
            state: Mutex::new(Pending {
                buf: Vec::new(),
                buf_first: next,
                buf_records: 0,
                next,
                rolls: Vec::new(),
                stopped: false,
                closing: false,
            }),
            has_work: Condvar::new(),
            has_space: Condvar::new(),
            durable: AtomicU64::new(next - 1),
            assigned: AtomicU64::new(next - 1),
            retain_from: AtomicU64::new(Lsn::MAX),
            roll_requested: AtomicU64::new(0),
            progress: Mutex::new(Progress {
                rolled: next - 1,
                ..Progress::default()
            }),
            progress_cv: Condvar::new(),
            #[cfg(feature = "tokio")]
            notify: tokio::sync::Notify::new(),
            catalog: Mutex::new(catalog),
            batches: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
        }
    }

    fn publish(&self, durable: Option<Lsn>, rolled: Option<Lsn>, closed: bool) {
        if let Some(d) = durable {
            self.durable.fetch_max(d, Ordering::Release);
        }
        {
            // Taking the lock orders this publication with a waiter that checked the
            // atomic just before sleeping: it is either already asleep (and woken below)
            // or will see the new value.
            let mut p = self.progress.lock();
            if let Some(r) = rolled {
                p.rolled = p.rolled.max(r);
            }
            p.closed |= closed;
        }
        self.progress_cv.notify_all();
        #[cfg(feature = "tokio")]
        self.notify.notify_waiters();
    }

    fn fail(&self, reason: String) {
        tracing::error!(dir = %self.dir.display(), "WAL failed: {reason}");
        {
            let mut state = self.state.lock();
            state.stopped = true;
            state.buf = Vec::new();
            state.buf_records = 0;
        }
        self.has_space.notify_all();
        {
            let mut p = self.progress.lock();
            if p.failure.is_none() {
                p.failure = Some(reason.into());
            }
        }
        self.progress_cv.notify_all();
        #[cfg(feature = "tokio")]
        self.notify.notify_waiters();
    }

    /// `Some(result)` once waiting for `lsn` is over.
    fn settled(&self, lsn: Lsn, p: &Progress) -> Option<Result<(), WalError>> {
        if lsn <= self.durable.load(Ordering::Acquire) {
            return Some(Ok(()));
        }
        if let Some(reason) = &p.failure {
            return Some(Err(WalError::Failed {
                durable: self.durable.load(Ordering::Acquire),
                reason: reason.clone(),
            }));
        }
        if p.closed {
            return Some(Err(WalError::Closed));
        }
        None
    }

    fn check_assigned(&self, lsn: Lsn) -> Result<(), WalError> {
        // `assigned` is `next - 1`, published under the state lock: the same answer as
        // taking that lock, without taking it once more per batch on the reply path.
        let last = self.assigned.load(Ordering::Acquire);
        if lsn > last {
            return Err(WalError::NotAssigned { lsn, last });
        }
        Ok(())
    }
}

/// The write-ahead log. Create with [`Wal::open`]; share as `Arc<Wal>` (it is the engine's
/// [`EventSink`]).
pub struct Wal {
    shared: Arc<Shared>,
    /// The writer's state, shared by the writer thread and (under `everysec` and `no`)
    /// by waiters that write the pending batch themselves.
    inline: Arc<Mutex<Writer>>,
    /// False for [`Wal::open_inline`]: no writer thread, `record` writes itself.
    threaded: bool,
    writer: Mutex<Option<JoinHandle<()>>>,
    lock_file: Mutex<Option<File>>,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("dir", &self.shared.dir)
            .field("durable", &self.durable_lsn())
            .finish_non_exhaustive()
    }
}

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Wal {
    /// Opens (creating if needed) the log in `<data_dir>/wal/`, recovers what it holds and
    /// starts the writer thread. The caller loads `Recovery::snapshot`, applies
    /// `Recovery::events` in order, and only then serves.
    pub fn open(
        data_dir: impl AsRef<Path>,
        opts: WalOptions,
    ) -> Result<(Arc<Wal>, Recovery), WalError> {
        Wal::open_with(data_dir.as_ref(), opts, true, None)
    }

    /// [`Wal::open`] without the writer thread: every `record` writes (and, under
    /// `always`, syncs) on the caller's thread before it returns. For the deterministic
    /// simulation, where what is on disk at a crash must follow from the run's history
    /// alone, never from when an OS thread got scheduled; a server never uses it (the
    /// write would run under the engine's locks, on the event loop).
    pub fn open_inline(
        data_dir: impl AsRef<Path>,
        opts: WalOptions,
    ) -> Result<(Arc<Wal>, Recovery), WalError> {
        Wal::open_with(data_dir.as_ref(), opts, false, None)
    }

    /// [`Wal::open_inline`] on the simulation's model of the disk: every segment write
    /// and sync goes through `hook`, which may fail it and which stands in for the
    /// `fdatasync` (see [`DiskHook`]).
    pub fn open_inline_on(
        data_dir: impl AsRef<Path>,
        opts: WalOptions,
        hook: Arc<dyn DiskHook>,
    ) -> Result<(Arc<Wal>, Recovery), WalError> {
        Wal::open_with(data_dir.as_ref(), opts, false, Some(hook))
    }

    fn open_with(
        data_dir: &Path,
        opts: WalOptions,
        threaded: bool,
        hook: Option<Arc<dyn DiskHook>>,
    ) -> Result<(Arc<Wal>, Recovery), WalError> {
        let dir = create_wal_dir(data_dir)?;
        let lock_file = lock_dir(&dir)?;
        let resume = super::recovery::recover(&dir, &opts)?;
        let next = resume.recovery.last_lsn + 1;
        let active = match resume.active {
            Some((path, first, size)) => Some(ActiveSegment::reopen(
                path,
                (first, next, size),
                hook.clone(),
            )?),
            None => None,
        };
        let shared = Arc::new(Shared::new(dir.clone(), opts, next, resume.catalog, hook));
        let inline = Arc::new(Mutex::new(Writer::new(shared.clone(), active, next)));
        let handle = if threaded {
            Some(spawn_writer(&dir, shared.clone(), inline.clone())?)
        } else {
            None
        };
        let wal = Arc::new(Wal {
            inline,
            shared,
            threaded,
            writer: Mutex::new(handle),
            lock_file: Mutex::new(Some(lock_file)),
        });
        Ok((wal, resume.recovery))
    }

    /// Appends `event` to the log and returns its LSN; cheap enough to call with engine
    /// locks held. Blocks only when more than `max_buffer_bytes` are waiting for the disk.
    /// After a failure or close the event is dropped and waiting on its LSN fails.
    pub fn record<'a>(&self, event: impl Into<EventRef<'a>>) -> Lsn {
        let event: EventRef<'a> = event.into();
        SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            scratch.clear();
            let (lsn, queued) = match encode_record(event, &mut scratch) {
                Ok(()) => self.push(Ok(&scratch)),
                Err(e) => self.push(Err(e)),
            };
            if scratch.capacity() > 1 << 16 {
                *scratch = Vec::new();
            }
            drop(scratch);
            self.write_if_inline(queued);
            lsn
        })
    }

    /// [`Wal::record`] for a record already framed as `encode_record` frames it, whose
    /// frame the caller checked (`record::frame`): a Raft member logs the records of a
    /// committed batch as the leader encoded them, without decoding and encoding each
    /// again.
    pub fn record_framed(&self, record: &[u8]) -> Lsn {
        debug_assert_eq!(
            super::record::frame(record).map(|(_, used)| used).ok(),
            Some(record.len())
        );
        let (lsn, queued) = self.push(Ok(record));
        self.write_if_inline(queued);
        lsn
    }

    /// Without a writer thread a queued record is written (and synced under `always`)
    /// here.
    fn write_if_inline(&self, queued: bool) {
        if queued && !self.threaded {
            self.write_now(false);
        }
    }

    /// Gives the next LSN to `record` (one framed record) and queues it for the writer;
    /// an unloggable record stops the log. Returns the LSN and whether it was queued.
    fn push(&self, record: Result<&[u8], super::RecordError>) -> (Lsn, bool) {
        let sh = &*self.shared;
        let mut state = sh.state.lock();
        while !state.stopped && !state.closing && state.buf.len() >= sh.opts.max_buffer_bytes {
            sh.has_space.wait(&mut state);
        }
        let lsn = state.next;
        state.next += 1;
        // Published under the state lock, so it never runs ahead of `next`; read
        // without it by every reply (see `EventSink::last_lsn`).
        sh.assigned.store(lsn, Ordering::Release);
        let bytes = match record {
            Ok(b) => b,
            Err(e) => {
                // Unloggable means unacknowledgeable; stopping is the only safe answer.
                drop(state);
                sh.fail(format!("cannot log event at LSN {lsn}: {e}"));
                return (lsn, false);
            }
        };
        if state.stopped || state.closing {
            return (lsn, false);
        }
        // Under `everysec` and `no` the waiters write batches themselves and the
        // thread polls: no futex wake per batch on the hot path.
        let wake = state.buf.is_empty() && sh.opts.fsync == FsyncPolicy::Always;
        state.buf.extend_from_slice(bytes);
        state.buf_records += 1;
        drop(state);
        if wake {
            sh.has_work.notify_one();
        }
        (lsn, true)
    }

    /// Without a writer thread ([`Wal::open_inline`]): one round of the writer, here;
    /// with `closing` the final one.
    fn write_now(&self, closing: bool) {
        let mut w = self.inline.lock();
        if w.done {
            return;
        }
        match w.round() {
            Ok(finished) => w.done = finished || closing,
            Err(e) => {
                w.done = true;
                self.shared.fail(e.to_string());
            }
        }
    }

    /// Snapshots keep every segment holding `lsn` or later (replicas still reading them:
    /// the replication backlog); `Lsn::MAX` lifts the hold.
    pub fn retain_from(&self, lsn: Lsn) {
        self.shared.retain_from.store(lsn, Ordering::Release);
    }

    /// The last LSN handed out (0 if none).
    pub fn last_lsn(&self) -> Lsn {
        self.shared.assigned.load(Ordering::Acquire)
    }

    /// The highest LSN acknowledged under the fsync policy.
    pub fn durable_lsn(&self) -> Lsn {
        self.shared.durable.load(Ordering::Acquire)
    }

    /// Counters for INFO and benchmarks.
    pub fn stats(&self) -> WalStats {
        let sh = &*self.shared;
        WalStats {
            last_lsn: self.last_lsn(),
            durable_lsn: self.durable_lsn(),
            batches: sh.batches.load(Ordering::Relaxed),
            syncs: sh.syncs.load(Ordering::Relaxed),
            bytes_written: sh.bytes_written.load(Ordering::Relaxed),
            segments: sh.catalog.lock().len(),
        }
    }

    /// The segments on disk as (first LSN, last LSN or `None` for the active one), for
    /// `reader`.
    pub(super) fn catalog_snapshot(&self) -> Vec<(Lsn, Option<Lsn>)> {
        let cat = self.shared.catalog.lock();
        cat.iter().map(|(f, l)| (*f, *l)).collect()
    }

    /// Notified whenever a durable LSN is published, or on failure or close (`reader`).
    #[cfg(feature = "tokio")]
    pub(super) fn durable_notify(&self) -> &tokio::sync::Notify {
        &self.shared.notify
    }

    #[cfg(feature = "tokio")]
    pub(super) fn is_closed(&self) -> bool {
        self.shared.progress.lock().closed
    }

    /// `<data-dir>/wal`.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// What it was opened with.
    pub fn options(&self) -> &WalOptions {
        &self.shared.opts
    }

    /// Whether a writer thread writes it (false for [`Wal::open_inline`]: the caller's
    /// thread does, and [`Wal::flush_and_close`] waits for nothing).
    pub fn has_writer_thread(&self) -> bool {
        self.threaded
    }

    /// Why the log stopped accepting writes, if it did.
    pub fn failure(&self) -> Option<WalError> {
        let p = self.shared.progress.lock();
        p.failure.as_ref().map(|reason| WalError::Failed {
            durable: self.durable_lsn(),
            reason: reason.clone(),
        })
    }

    /// Resolves once the record at `lsn` is acknowledged under the fsync policy (at once
    /// for 0). Fails if the writer failed or the log closed before that.
    #[cfg(feature = "tokio")]
    pub async fn wait_durable(&self, lsn: Lsn) -> Result<(), WalError> {
        if lsn <= self.durable_lsn() {
            return Ok(());
        }
        self.shared.check_assigned(lsn)?;
        if self.shared.opts.fsync != FsyncPolicy::Always {
            // Group commit across connections: let every other connection task that is
            // ready in this turn of the scheduler append its records first, so one
            // `write` covers them all (as Redis writes its AOF once per event-loop
            // iteration) instead of one `write` per connection per request.
            tokio::task::yield_now().await;
            if lsn <= self.durable_lsn() {
                return Ok(());
            }
        }
        loop {
            let notified = self.shared.notify.notified();
            tokio::pin!(notified);
            // Registered before checking, so a publication between the check and the
            // await still wakes us.
            notified.as_mut().enable();
            if let Some(r) = self.shared.settled(lsn, &self.shared.progress.lock()) {
                return r;
            }
            // Whoever was writing may have taken its batch before our record arrived:
            // after every wake-up, write what is pending if nobody else is.
            if self.flush_inline(lsn) {
                continue;
            }
            // Bounded, as the blocking variant's wait is: the writer lock may have been
            // the writer thread's for a moment on its way into the periodic sync, which
            // publishes nothing until it ends, so an unbounded wait here would last the
            // whole fdatasync for a record that only needed a `write`.
            let _ = tokio::time::timeout(POLL, notified).await;
        }
    }

    /// Blocking variant of [`Wal::wait_durable`], for threads outside the async runtime.
    pub fn wait_durable_blocking(&self, lsn: Lsn) -> Result<(), WalError> {
        if lsn <= self.durable_lsn() {
            return Ok(());
        }
        self.shared.check_assigned(lsn)?;
        loop {
            // The progress lock is never held across `flush_inline` (it publishes).
            if self.flush_inline(lsn) {
                continue;
            }
            let mut p = self.shared.progress.lock();
            if let Some(r) = self.shared.settled(lsn, &p) {
                return r;
            }
            self.shared.progress_cv.wait_for(&mut p, POLL);
        }
    }

    /// Under `everysec` and `no` an acknowledgement needs only a `write`: the waiter does
    /// it itself when nobody else is writing (leader-style group commit), which saves two
    /// thread hand-offs per batch. Under `always` the fdatasync stays on the writer thread
    /// so no async worker ever blocks on the disk.
    /// Returns true if it wrote (or failed): the caller re-checks its LSN.
    fn flush_inline(&self, lsn: Lsn) -> bool {
        // Under the test-only write delay the writer thread does every write, so the
        // delay holds records in flight without stalling an event loop (a waiter writing
        // inline would sleep on the loop's thread, and every connection of that loop with it).
        if self.shared.opts.fsync == FsyncPolicy::Always
            || self.shared.opts.fault_write_delay_ms > 0
        {
            return false;
        }
        let Some(mut w) = self.inline.try_lock() else {
            return false;
        };
        if lsn <= self.durable_lsn() || w.done {
            return false;
        }
        if let Err(e) = w.round() {
            w.done = true;
            self.shared.fail(e.to_string());
        }
        true
    }

    /// Writes what is recorded and fdatasyncs it (the active segment and any segment
    /// closed unsynced), whatever the fsync policy; returns the last LSN now on disk.
    /// A Raft member's WAL is a copy of its Raft log and syncs only on its timer, so a
    /// snapshot that lets the Raft log drop entries syncs the WAL first. Blocking.
    pub fn sync_blocking(&self) -> Result<Lsn, WalError> {
        let mut w = self.inline.lock();
        if w.done {
            return Err(WalError::Closed);
        }
        let res = (|| {
            if w.round()? {
                w.done = true;
                return Err(WalError::Closed);
            }
            w.unsynced = true;
            w.sync()?;
            Ok(w.written)
        })();
        if let Err(e) = &res {
            if !matches!(e, WalError::Closed) {
                w.done = true;
                self.shared.fail(e.to_string());
            }
        }
        res
    }

    /// Makes the next record start a new segment and returns the last LSN before it.
    /// Call it while the engine's world is stopped: the state at that moment is exactly
    /// the records up to the returned LSN, which is what the snapshot then covers.
    pub fn roll(&self) -> Lsn {
        let sh = &*self.shared;
        let mut state = sh.state.lock();
        let point = state.next;
        if state.rolls.last() != Some(&point) {
            state.rolls.push(point);
        }
        drop(state);
        sh.roll_requested.fetch_max(point, Ordering::AcqRel);
        sh.has_work.notify_one();
        if !self.threaded {
            self.write_now(false);
        }
        point - 1
    }

    /// Writes `snap` (the state after the record at `upto`, usually from [`Wal::roll`])
    /// atomically, then deletes the segments and older snapshots it makes redundant.
    /// Blocking file I/O: call it from a blocking thread, not from the async runtime.
    pub fn write_snapshot(&self, snap: &Snapshot, upto: Lsn) -> Result<SnapshotWritten, WalError> {
        let sh = &*self.shared;
        sh.check_assigned(upto)?;
        let (path, bytes) = snapshot::write_atomic(&sh.dir, snap, upto)?;
        // Segments are only deleted once the writer has closed them; if a roll for this
        // snapshot is under way, wait for it so the deletion below can include its segment.
        let must_roll = sh.roll_requested.load(Ordering::Acquire) > upto;
        {
            let mut p = sh.progress.lock();
            loop {
                let durable = sh.durable.load(Ordering::Acquire);
                if durable >= upto && (!must_roll || p.rolled >= upto) {
                    break;
                }
                if let Some(reason) = &p.failure {
                    return Err(WalError::Failed {
                        durable,
                        reason: reason.clone(),
                    });
                }
                if p.closed {
                    return Err(WalError::Closed);
                }
                sh.progress_cv.wait(&mut p);
            }
        }
        let mut removed = Vec::new();
        {
            let mut cat = sh.catalog.lock();
            let doomed: Vec<(Lsn, PathBuf)> = cat
                .iter()
                .filter(|(_, last)| {
                    let keep = sh.retain_from.load(Ordering::Acquire);
                    matches!(last, Some(l) if *l <= upto && *l < keep)
                })
                .map(|(first, _)| (*first, sh.dir.join(segment::segment_file_name(*first))))
                .collect();
            let doomed = segment::past_feed_retention(doomed, |d| &d.1, &sh.opts.feed_retention);
            for (first, p) in doomed {
                segment::remove_if_exists(&p)?;
                cat.remove(&first);
                removed.push(p);
            }
        }
        for (lsn, p) in segment::list_dir(&sh.dir)?.snapshots {
            if lsn < upto {
                segment::remove_if_exists(&p)?;
                removed.push(p);
            }
        }
        if !removed.is_empty() {
            segment::sync_dir(&sh.dir)?;
        }
        Ok(SnapshotWritten {
            path,
            lsn: upto,
            bytes,
            removed,
        })
    }

    /// Writes and fsyncs everything recorded so far, stops the writer and releases the
    /// directory lock. Returns the last durable LSN. Later records are dropped and waits
    /// on them fail with [`WalError::Closed`]. Idempotent.
    pub fn flush_and_close(&self) -> Result<Lsn, WalError> {
        {
            let mut state = self.shared.state.lock();
            state.closing = true;
        }
        self.shared.has_work.notify_one();
        self.shared.has_space.notify_all();
        if let Some(h) = self.writer.lock().take() {
            if h.join().is_err() {
                self.shared.fail("WAL writer thread panicked".to_owned());
            }
        }
        if !self.threaded {
            self.write_now(true);
        }
        self.lock_file.lock().take();
        match self.failure() {
            Some(e) => Err(e),
            None => Ok(self.durable_lsn()),
        }
    }
}

impl EventSink for Wal {
    fn record(&self, event: &EventRef<'_>) -> Lsn {
        Wal::record(self, event)
    }

    fn last_lsn(&self) -> Lsn {
        Wal::last_lsn(self)
    }
}

impl Drop for Wal {
    fn drop(&mut self) {
        if let Err(e) = self.flush_and_close() {
            tracing::error!("WAL close on drop: {e}");
        }
    }
}

/// Two processes appending to one log would interleave records: hold an exclusive flock
/// for as long as the log is open. The holder writes its process id into the file, so a
/// second process refused the lock can say which process to stop.
fn lock_dir(dir: &Path) -> Result<File, WalError> {
    use std::io::{Read, Seek, Write};
    use std::os::unix::io::AsRawFd;
    let path = dir.join("LOCK");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(super::io_err("open lock file", &path))?;
    // SAFETY: flock on a file descriptor we own and keep open; no memory is involved.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::WouldBlock {
            let mut text = String::new();
            let pid = f
                .read_to_string(&mut text)
                .ok()
                .and_then(|_| text.trim().parse().ok());
            return Err(WalError::Locked(super::LockHeld {
                dir: dir.to_owned(),
                pid,
            }));
        }
        return Err(super::io_err("lock", &path)(e));
    }
    // The id is a courtesy for that message: the flock alone is the lock, so a failure
    // to write it is no reason to refuse the log.
    let _ = f
        .set_len(0)
        .and_then(|()| f.rewind())
        .and_then(|()| writeln!(f, "{}", std::process::id()));
    Ok(f)
}

/// `<data_dir>/wal`, created if missing. A new directory's entry is synced: without
/// that the whole log could vanish with it on power loss, acknowledged records included.
fn create_wal_dir(data_dir: &Path) -> Result<PathBuf, WalError> {
    let dir = data_dir.join("wal");
    if !dir.is_dir() {
        std::fs::create_dir_all(&dir).map_err(super::io_err("create directory", &dir))?;
        segment::sync_dir(data_dir)?;
    }
    Ok(dir)
}

/// Starts the writer thread over the state `open` built.
fn spawn_writer(
    dir: &Path,
    shared: Arc<Shared>,
    writer: Arc<Mutex<Writer>>,
) -> Result<JoinHandle<()>, WalError> {
    std::thread::Builder::new()
        .name("stockgate-wal".into())
        .spawn(move || writer_thread(shared, writer))
        .map_err(super::io_err("spawn WAL writer for", dir))
}

/// One batch taken from [`Pending`].
struct Batch {
    first: Lsn,
    records: u64,
    rolls: Vec<Lsn>,
    closing: bool,
}

struct Writer {
    shared: Arc<Shared>,
    seg: Option<ActiveSegment>,
    /// The batch being written; swapped with the pending buffer so both allocations are
    /// reused.
    batch: Vec<u8>,
    last_sync: Instant,
    /// Bytes written since the last fdatasync.
    unsynced: bool,
    written: Lsn,
    /// Working on the last batch before close: everything gets synced, whatever the policy.
    final_flush: bool,
    /// Closed or failed: no more rounds.
    done: bool,
}

/// Marks the log failed if the writer thread ends without a clean close (error or panic),
/// so that no waiter hangs forever.
struct ExitGuard(Arc<Shared>, bool);

impl Drop for ExitGuard {
    fn drop(&mut self) {
        if !self.1 {
            self.0
                .fail("WAL writer thread stopped unexpectedly".to_owned());
        }
    }
}

/// The writer thread: under `always` it sleeps until records arrive; under `everysec`
/// and `no` it wakes every [`POLL`] to write what no waiter wrote (records of an
/// embedded engine nobody waits for, roll requests) and to run the once-a-second sync.
fn writer_thread(shared: Arc<Shared>, writer: Arc<Mutex<Writer>>) {
    let mut guard = ExitGuard(shared.clone(), false);
    let policy = shared.opts.fsync;
    loop {
        wait_for_work(&shared, policy);
        let mut w = writer.lock();
        if w.done {
            guard.1 = true;
            return;
        }
        if everysec_sync_due(&w, policy) {
            if let Err(e) = sync_outside_writer_lock(&shared, w) {
                let mut w = writer.lock();
                w.done = true;
                guard.1 = true;
                shared.fail(e.to_string());
                return;
            }
            continue;
        }
        match w.round() {
            Ok(true) => {
                w.done = true;
                guard.1 = true;
                return;
            }
            Ok(false) => {}
            Err(e) => {
                w.done = true;
                guard.1 = true;
                shared.fail(e.to_string());
                return;
            }
        }
    }
}

/// Sleeps on the state lock until there is something to do: under `always` until records,
/// a roll request or close arrive; under `everysec` and `no` at most [`POLL`]. The lock is
/// released on return, before the writer lock is taken.
fn wait_for_work(shared: &Shared, policy: FsyncPolicy) {
    let mut state = shared.state.lock();
    if policy == FsyncPolicy::Always {
        while state.buf.is_empty() && state.rolls.is_empty() && !state.closing {
            shared.has_work.wait(&mut state);
        }
    } else if state.rolls.is_empty() && !state.closing {
        shared.has_work.wait_for(&mut state, POLL);
    }
}

/// Whether the once-a-second `everysec` fdatasync is due: something written since the last
/// one, and not the final batch (close syncs that itself, in `round`).
fn everysec_sync_due(w: &Writer, policy: FsyncPolicy) -> bool {
    policy == FsyncPolicy::EverySec
        && w.unsynced
        && !w.final_flush
        && w.last_sync.elapsed() >= EVERYSEC
}

/// The periodic `everysec` fdatasync, run without the writer lock: waiters need only the
/// `write` (they take this lock to write their own batch, see `flush_inline`), so holding
/// it through a sync of tens of milliseconds on a slow disk would stall every reply of the
/// server once a second. Takes the lock `w` and releases it before the sync.
fn sync_outside_writer_lock(
    shared: &Shared,
    mut w: MutexGuard<'_, Writer>,
) -> Result<(), WalError> {
    let handle = w.seg.as_ref().map(ActiveSegment::sync_handle).transpose();
    // Counted as synced now: whatever is written from here on sets `unsynced` again and
    // is covered by the next sync (or by `close_segment`'s).
    w.unsynced = false;
    w.last_sync = Instant::now();
    drop(w);
    handle.and_then(|h| match h {
        Some((file, path)) => {
            fault_sync_delay(&shared.opts);
            file.sync_data()
                .map_err(super::io_err("fdatasync segment", &path))
        }
        None => Ok(()),
    })?;
    shared.syncs.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Test-only slow disk (see `WalOptions::fault_sync_delay_ms`).
fn fault_sync_delay(opts: &WalOptions) {
    if opts.fault_sync_delay_ms > 0 {
        std::thread::sleep(Duration::from_millis(opts.fault_sync_delay_ms));
    }
}

/// How often the writer thread looks for work under `everysec` and `no`.
const POLL: Duration = Duration::from_millis(2);

impl Writer {
    /// The writer of a log whose next record gets LSN `next`, appending to `seg` (the
    /// segment recovery reopened, if any).
    fn new(shared: Arc<Shared>, seg: Option<ActiveSegment>, next: Lsn) -> Self {
        // A reopened segment may hold bytes the previous process wrote and never synced
        // (a crash leaves them in the page cache, where recovery read them): counted
        // unsynced, so they are synced with the next batch or, at the latest, when the
        // segment is closed. Else a restart that rolls over at once would leave them
        // unsynced behind a newer segment, and a power loss would cut the log mid-way.
        let unsynced = seg.is_some();
        Writer {
            shared,
            seg,
            batch: Vec::new(),
            last_sync: Instant::now(),
            unsynced,
            written: next - 1,
            final_flush: false,
            done: false,
        }
    }

    /// Takes whatever is pending (never waits), writes it, syncs under `always` (the
    /// periodic `everysec` sync is the writer thread's, outside this lock: see
    /// `writer_thread`), and publishes. Returns true once the final batch before close
    /// is done.
    fn round(&mut self) -> Result<bool, WalError> {
        let policy = self.shared.opts.fsync;
        let b = self.take();
        self.final_flush = b.closing;
        let rolled = self.write_batch(&b)?;
        let wrote = b.records > 0;
        let last = b.first + b.records - u64::from(wrote);
        if wrote {
            self.written = last;
            self.shared.batches.fetch_add(1, Ordering::Relaxed);
        }
        if policy == FsyncPolicy::Always && self.unsynced {
            self.sync()?;
        }
        if b.closing {
            // Forced: the everysec sync clears `unsynced` before its fdatasync (it runs
            // outside this lock) and may still be in flight; close syncs regardless.
            self.unsynced = true;
            self.sync()?;
            self.shared
                .publish(wrote.then_some(self.written), rolled, true);
            return Ok(true);
        }
        if wrote || rolled.is_some() {
            self.shared.publish(wrote.then_some(last), rolled, false);
        }
        if self.batch.capacity() > 8 << 20 && self.batch.len() < 1 << 20 {
            self.batch = Vec::new();
        }
        Ok(false)
    }

    /// Takes what is pending: records, roll requests, close. Never waits.
    fn take(&mut self) -> Batch {
        let sh = &*self.shared;
        let mut state = sh.state.lock();
        self.batch.clear();
        std::mem::swap(&mut state.buf, &mut self.batch);
        let b = Batch {
            first: state.buf_first,
            records: state.buf_records,
            rolls: std::mem::take(&mut state.rolls),
            closing: state.closing,
        };
        state.buf_first = state.next;
        state.buf_records = 0;
        drop(state);
        sh.has_space.notify_all();
        b
    }

    /// Writes the batch, switching segments at roll points and at the size limit.
    /// Returns the highest `roll point - 1` carried out, if any.
    fn write_batch(&mut self, b: &Batch) -> Result<Option<Lsn>, WalError> {
        if self.shared.opts.fault_write_delay_ms > 0 && b.records > 0 {
            std::thread::sleep(std::time::Duration::from_millis(
                self.shared.opts.fault_write_delay_ms,
            ));
        }
        let limit = self.shared.opts.segment_bytes;
        let batch = std::mem::take(&mut self.batch);
        let res = (|| {
            let mut rolls = b.rolls.iter().copied().peekable();
            let mut off = 0usize;
            let mut lsn = b.first;
            let mut run_start = 0usize;
            let mut run_first = b.first;
            while off < batch.len() {
                // The batch was framed by `record` in this process: its lengths are trusted.
                let len = u32::from_le_bytes([
                    batch[off],
                    batch[off + 1],
                    batch[off + 2],
                    batch[off + 3],
                ]) as usize
                    + HEADER_LEN;
                let mut roll_here = false;
                while let Some(p) = rolls.next_if(|&p| p <= lsn) {
                    roll_here |= p == lsn;
                }
                let run = (off - run_start) as u64;
                let (seg_size, seg_records) = match &self.seg {
                    Some(s) => (s.size, s.records()),
                    None => (segment::SEGMENT_HEADER_LEN, 0),
                };
                let has_records = seg_records > 0 || run > 0;
                let full = seg_size + run + len as u64 > limit;
                if has_records && (roll_here || full) {
                    self.append(&batch[run_start..off], run_first, lsn - run_first)?;
                    self.close_segment()?;
                    run_start = off;
                    run_first = lsn;
                }
                off += len;
                lsn += 1;
            }
            self.append(&batch[run_start..off], run_first, lsn - run_first)?;
            debug_assert_eq!(lsn, b.first + b.records);
            // Roll points right after the batch: close now, so `write_snapshot` can delete
            // the finished segment without waiting for the next record.
            if rolls.next().is_some() && self.seg.as_ref().is_some_and(|s| s.records() > 0) {
                self.close_segment()?;
            }
            Ok(b.rolls.last().map(|p| p - 1))
        })();
        self.batch = batch;
        res
    }

    fn append(&mut self, bytes: &[u8], first: Lsn, records: u64) -> Result<(), WalError> {
        if records == 0 {
            return Ok(());
        }
        let seg = match &mut self.seg {
            Some(s) => s,
            None => {
                let s = ActiveSegment::create(&self.shared.dir, first, self.shared.hook.clone())?;
                self.shared.catalog.lock().insert(first, None);
                self.seg.insert(s)
            }
        };
        if seg.next != first {
            return Err(WalError::Corrupt {
                file: seg.path.clone(),
                offset: seg.size,
                reason: format!(
                    "writer out of sequence: segment expects LSN {}, got {first}",
                    seg.next
                ),
            });
        }
        seg.append(bytes, records)?;
        self.unsynced = true;
        self.shared
            .bytes_written
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn close_segment(&mut self) -> Result<(), WalError> {
        let Some(seg) = self.seg.take() else {
            return Ok(());
        };
        // A segment left behind is synced now, under every policy: the everysec timer
        // only syncs the current one, and under `no` a power loss could otherwise leave
        // an older segment short behind a newer one: a hole in the log, not a lost tail
        // (one sync per segment, every --segment-mib).
        if self.unsynced {
            fault_sync_delay(&self.shared.opts);
            seg.sync()?;
            self.shared.syncs.fetch_add(1, Ordering::Relaxed);
        }
        self.shared
            .catalog
            .lock()
            .insert(seg.first, Some(seg.next - 1));
        Ok(())
    }

    fn sync(&mut self) -> Result<(), WalError> {
        if let Some(s) = &self.seg {
            if self.unsynced {
                fault_sync_delay(&self.shared.opts);
                s.sync()?;
                self.shared.syncs.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.unsynced = false;
        self.last_sync = Instant::now();
        Ok(())
    }
}
