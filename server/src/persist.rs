//! Glue between the engine and the WAL: recovery at start-up, waiting for
//! acknowledgements, snapshots (on demand and periodic). The engine and the WAL know
//! nothing of each other; this is the only place that holds both.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::engine::{Clock, Engine, EngineConfig, Keyring, Lsn, NullSink, ReservationKey};
use crate::session::{Durability, NotDurable};
use crate::wal::{BackupError, BackupWritten, Event, Recovery, Wal, WalError, WalOptions};

/// The WAL as the engine's durability: acknowledgements wait on it, snapshots are taken through it,
/// and modules that keep state in the log (consumer groups) hook into its snapshots and replays.
pub struct WalDurability {
    /// The write-ahead log itself.
    pub wal: Arc<Wal>,
    snapshot_lsn: AtomicU64,
    snapshots: AtomicU64,
    last_snapshot_ms: AtomicU64,
    save_lock: parking_lot::Mutex<()>,
    checkpoints: parking_lot::Mutex<Vec<CheckpointHook>>,
    replays: parking_lot::Mutex<Vec<ReplayHook>>,
    /// Held by a replica while it logs and applies a batch from its primary, and by a
    /// snapshot: on a replica the records are not logged under the engine's locks (they
    /// are applied after), so this keeps a snapshot from cutting between the two.
    apply_gate: parking_lot::Mutex<()>,
}

/// Logs the state of a module that keeps its state in the log outside the engine (the
/// order feed's consumer groups) and returns the last LSN it logged (0: nothing). Run by
/// every snapshot after its roll and before it deletes the segments it covers, so the
/// state survives the records that described it.
/// It gets the snapshot's LSN (`upto`).
pub type CheckpointHook = Box<dyn Fn(Lsn) -> Result<Lsn, WalError> + Send + Sync>;

/// Applies one opaque record (LSN, kind, body) that a replica took from its primary,
/// for the module that logs such records (at start-up it gets them from recovery).
pub type ReplayHook = Box<dyn Fn(Lsn, u8, &[u8]) + Send + Sync>;

impl WalDurability {
    /// Wraps an opened WAL whose newest snapshot covers up to `snapshot_lsn`.
    pub fn new(wal: Arc<Wal>, snapshot_lsn: Lsn) -> Self {
        WalDurability {
            wal,
            snapshot_lsn: AtomicU64::new(snapshot_lsn),
            snapshots: AtomicU64::new(0),
            last_snapshot_ms: AtomicU64::new(0),
            save_lock: parking_lot::Mutex::new(()),
            checkpoints: parking_lot::Mutex::new(Vec::new()),
            replays: parking_lot::Mutex::new(Vec::new()),
            apply_gate: parking_lot::Mutex::new(()),
        }
    }

    /// Adds a hook every snapshot runs to log a module's state before it deletes the segments
    /// covering it (see [`CheckpointHook`]).
    pub fn add_checkpoint_hook(&self, hook: CheckpointHook) {
        self.checkpoints.lock().push(hook);
    }

    /// Adds a hook that receives the opaque records a replica applies (see [`ReplayHook`]).
    pub fn add_replay_hook(&self, hook: ReplayHook) {
        self.replays.lock().push(hook);
    }

    /// A record a replica logged and applied to the engine: an opaque one goes on to the
    /// module that owns it.
    pub fn replayed(&self, lsn: Lsn, ev: &Event) {
        if let Event::Opaque { kind, body } = ev {
            for h in self.replays.lock().iter() {
                h(lsn, *kind, body);
            }
        }
    }

    /// Records written since the last snapshot: what a restart would replay.
    pub fn records_since_snapshot(&self) -> u64 {
        self.wal
            .last_lsn()
            .saturating_sub(self.snapshot_lsn.load(Ordering::Relaxed))
    }

    /// A snapshot written by another module (a Raft member's, built from the log) now
    /// covers the log up to `lsn`: counted as this one's own would be.
    pub fn snapshot_written(&self, lsn: Lsn, millis: u64) {
        self.snapshot_lsn.fetch_max(lsn, Ordering::Relaxed);
        self.snapshots.fetch_add(1, Ordering::Relaxed);
        self.last_snapshot_ms.store(millis, Ordering::Relaxed);
    }

    /// See the field `apply_gate`.
    pub fn apply_gate(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.apply_gate.lock()
    }

    /// Writes a snapshot of the engine and lets the WAL delete what it covers.
    pub fn snapshot(&self, engine: &Engine) -> Result<Lsn, WalError> {
        self.snapshot_file(engine).map(|(lsn, _)| lsn)
    }

    /// [`Self::snapshot`], also saying which file holds it (a full sync sends it).
    pub fn snapshot_file(&self, engine: &Engine) -> Result<(Lsn, std::path::PathBuf), WalError> {
        let _one_at_a_time = self.save_lock.lock();
        let t = Instant::now();
        let (snap, upto, logged) = {
            let _applying = self.apply_gate.lock();
            let (snap, upto) = engine.snapshot_with(|| self.wal.roll());
            // The checkpoints land after `upto`, so recovery from this snapshot replays
            // them; they must be durable before the snapshot deletes the records they
            // replace. Under the gate: a node turning replica cannot apply its primary's
            // records between the role check (in the hook) and the checkpoint's LSN.
            let mut logged = 0;
            for h in self.checkpoints.lock().iter() {
                logged = logged.max(h(upto)?);
            }
            (snap, upto, logged)
        };
        if logged > 0 {
            self.wal.wait_durable_blocking(logged)?;
        }
        let written = self.wal.write_snapshot(&snap, upto)?;
        self.snapshot_lsn.store(upto, Ordering::Relaxed);
        self.snapshots.fetch_add(1, Ordering::Relaxed);
        self.last_snapshot_ms
            .store(t.elapsed().as_millis() as u64, Ordering::Relaxed);
        tracing::info!(
            "snapshot at lsn {upto}: {} sales, {} reservations, {} ms",
            snap.sales.len(),
            snap.reservations.len(),
            t.elapsed().as_millis()
        );
        Ok((upto, written.path))
    }
}

impl Durability for WalDurability {
    fn wait(&self, lsn: Lsn) -> Pin<Box<dyn Future<Output = Result<(), NotDurable>> + Send + '_>> {
        Box::pin(async move {
            self.wal
                .wait_durable(lsn)
                .await
                .map_err(|e| NotDurable::Log(e.to_string()))
        })
    }

    fn save(&self, engine: &Engine) -> Result<(), String> {
        self.snapshot(engine).map(|_| ()).map_err(|e| e.to_string())
    }

    fn failure(&self) -> Option<String> {
        self.wal.failure().map(|e| e.to_string())
    }

    fn backup(&self, target: &Path) -> Result<BackupWritten, BackupError> {
        // No snapshot may delete a segment while it is copied.
        let _one_at_a_time = self.save_lock.lock();
        let data_dir = self.wal.dir().parent().unwrap_or(self.wal.dir());
        let t = Instant::now();
        let written = self
            .wal
            .backup_into(target, &[data_dir.join(crate::keyfiles::FINGERPRINT_FILE)])?;
        tracing::info!(
            "backup at lsn {} into {}: snapshot at lsn {}, {} segments, {} bytes, {} ms",
            written.lsn,
            written.dir.display(),
            written.snapshot_lsn,
            written.segments,
            written.bytes,
            t.elapsed().as_millis()
        );
        Ok(written)
    }

    fn info(&self) -> String {
        format!(
            "aof_enabled:1\r\naof_fsync:{}\r\nwal_last_lsn:{}\r\nwal_durable_lsn:{}\r\nwal_snapshot_lsn:{}\r\nwal_records_since_snapshot:{}\r\nsnapshots_written:{}\r\nlast_snapshot_ms:{}\r\n",
            self.wal.options().fsync,
            self.wal.last_lsn(),
            self.wal.durable_lsn(),
            self.snapshot_lsn.load(Ordering::Relaxed),
            self.records_since_snapshot(),
            self.snapshots.load(Ordering::Relaxed),
            self.last_snapshot_ms.load(Ordering::Relaxed),
        )
    }
}

/// Opens the WAL in `data_dir`, rebuilds the engine from the newest snapshot and the log
/// after it, then makes the WAL the engine's sink. Expired reservations are found by the
/// rebuilt wheels at once.
pub fn recover_engine(
    data_dir: &Path,
    opts: WalOptions,
    cfg: EngineConfig,
    clock: Arc<dyn Clock>,
    keys: Keyring,
    reservation_key: ReservationKey,
) -> Result<(Arc<Engine>, Arc<WalDurability>, RecoveryReport), WalError> {
    recover_engine_with(data_dir, opts, cfg, clock, keys, reservation_key, |wal| {
        wal.clone()
    })
}

/// [`recover_engine`] with the engine's records going to the sink `make_sink` builds
/// from the recovered WAL (a Raft group member: the leader's batches) instead of the WAL.
pub fn recover_engine_with(
    data_dir: &Path,
    opts: WalOptions,
    cfg: EngineConfig,
    clock: Arc<dyn Clock>,
    keys: Keyring,
    reservation_key: ReservationKey,
    make_sink: impl FnOnce(&Arc<Wal>) -> Arc<dyn crate::engine::EventSink>,
) -> Result<(Arc<Engine>, Arc<WalDurability>, RecoveryReport), WalError> {
    let (wal, rec) = Wal::open(data_dir, opts)?;
    recover_engine_from((wal, rec), cfg, clock, (keys, reservation_key), make_sink)
}

/// [`recover_engine_with`] on a WAL the caller opened: the deterministic simulation
/// opens it without its writer thread (`Wal::open_inline`) and recovers through here,
/// so its members start exactly as a server's do.
pub fn recover_engine_from(
    (wal, rec): (Arc<Wal>, Recovery),
    cfg: EngineConfig,
    clock: Arc<dyn Clock>,
    (keys, reservation_key): (Keyring, ReservationKey),
    make_sink: impl FnOnce(&Arc<Wal>) -> Arc<dyn crate::engine::EventSink>,
) -> Result<(Arc<Engine>, Arc<WalDurability>, RecoveryReport), WalError> {
    let t = Instant::now();
    let Recovery {
        snapshot,
        snapshot_lsn,
        events,
        last_lsn,
        truncated_tail,
        ..
    } = rec;
    let mut engine = Engine::new(cfg, clock, Arc::new(NullSink), keys, reservation_key);
    let reservations_in_snapshot = snapshot.as_ref().map_or(0, |s| s.reservations.len());
    if let Some(s) = &snapshot {
        engine.load_snapshot(s);
    }
    let events_replayed = events.len();
    // Records of other modules (consumer groups) are theirs to rebuild: handed on.
    let mut opaque = Vec::new();
    for (i, ev) in events.into_iter().enumerate() {
        engine.apply(&ev);
        if let Event::Opaque { kind, body } = ev {
            opaque.push((snapshot_lsn + 1 + i as Lsn, kind, body));
        }
    }
    // The decoded snapshot and log are copies of what the table now holds: give their
    // memory back before the server starts serving.
    drop(snapshot);
    let trim = Instant::now();
    crate::metrics::sys::release_free_memory();
    tracing::debug!(
        "recovery: freed memory handed back in {} ms",
        trim.elapsed().as_millis()
    );
    engine.set_sink(make_sink(&wal));
    let report = RecoveryReport {
        snapshot_lsn,
        reservations_in_snapshot,
        events_replayed,
        opaque,
        last_lsn,
        truncated: truncated_tail.map(|t| t.to_string()),
        millis: t.elapsed().as_millis() as u64,
    };
    Ok((
        Arc::new(engine),
        Arc::new(WalDurability::new(wal, snapshot_lsn)),
        report,
    ))
}

/// What start-up recovery found and did, for the log line and `INFO persistence`.
#[derive(Debug, Clone)]
pub struct RecoveryReport {
    /// The LSN the snapshot recovery started from covers (0: no snapshot).
    pub snapshot_lsn: Lsn,
    /// Reservations the snapshot held.
    pub reservations_in_snapshot: usize,
    /// Log records after the snapshot replayed into the engine.
    pub events_replayed: usize,
    /// The opaque records after the snapshot (LSN, kind, body), in log order.
    pub opaque: Vec<(Lsn, u8, Vec<u8>)>,
    /// The last LSN in the log after recovery.
    pub last_lsn: Lsn,
    /// Why the log's tail was cut (a torn or corrupt record), and where; `None` when the log was
    /// whole.
    pub truncated: Option<String>,
    /// How long recovery took, in ms.
    pub millis: u64,
}
