//! Snapshots of a group member: what lets the Raft log and the WAL be compacted, and a
//! member far behind (or rejoining empty) catch up without the whole history.
//!
//! **Built from disk, not from the live engine.** A leader's engine runs ahead of what is
//! committed (speculation), so its state at any moment is not the state after any
//! committed entry. A snapshot is therefore the member's newest WAL snapshot plus the WAL
//! records after it, replayed into an empty engine and empty consumer groups (the
//! recovery path, off to the side). The WAL holds committed records only, so the result
//! is the state after exactly one entry, the same on every member; the cost is a replay,
//! on a blocking thread, never under the live engine's locks.
//!
//! **Where it stands.** `upto` is an LSN at which an entry's batch ends. It is held back
//! by the consumer groups (`Groups::oldest_needed_in_log`): nothing a group may still
//! read is covered, whichever of a leader's group changes in flight commit, so neither
//! this member's WAL nor a member installing the snapshot loses an entry a consumer
//! needs.
//!
//! **On disk** it is an ordinary WAL snapshot (`wal/snapshot-<lsn>.snap`, the engine) and
//! a state file (`wal/groups-<lsn>.state`, the consumer groups), so a restart recovers
//! from it as a single node does; the raft log records which log id it includes
//! (`SnapMeta`). Written in that order: a crash in between leaves the older snapshot in
//! force and the entries still in the log.
//!
//! **Sent to a peer** as `magic | lsn u64 | len u64 | snapshot file | len u64 | state
//! file | crc32c u32` (little endian). The receiver stages both files in
//! `wal.raft-snapshot/` (with a `complete` marker once synced), records the snapshot in
//! its raft log, and restarts; at start ([`adopt_staged`]) the staged directory replaces
//! `wal/` if the raft log names that snapshot, and is deleted otherwise.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::log_store::{LogStore, SnapMeta};
use super::Raft;
use crate::engine::{Engine, Event, Lsn, NullSink};
use crate::feed::groups::{GroupLimits, Groups};
use crate::persist::WalDurability;
use crate::wal::reader::Visit;
use crate::wal::record::K_SLOT_SET;
use crate::wal::segment::{list_dir, snapshot_file_name, sync_dir};
use crate::wal::snapshot::decode_snapshot;

const MAGIC: [u8; 8] = *b"SGRSNAP1";
/// The staging directory of a received snapshot, beside `wal/`.
pub const STAGING: &str = "wal.raft-snapshot";
const COMPLETE: &str = "complete";

/// Builds and reads this member's snapshots.
pub struct Snapshots {
    dur: Arc<WalDurability>,
    /// The live engine, only as a template for the empty one a build replays into.
    engine: Arc<Engine>,
    store: LogStore,
    /// What the layers above decide for a snapshot.
    hooks: SnapshotHooks,
    /// One build at a time.
    building: parking_lot::Mutex<()>,
    /// No blocking threads: [`Self::off_task`] runs on the caller's task (the
    /// deterministic simulation, whose WAL and Raft log are inline too).
    inline: bool,
}

impl Snapshots {
    /// Sets up snapshot building for one member.
    pub fn new(
        dur: Arc<WalDurability>,
        engine: Arc<Engine>,
        store: LogStore,
        hooks: SnapshotHooks,
    ) -> Snapshots {
        Snapshots {
            dur,
            engine,
            store,
            hooks,
            building: parking_lot::Mutex::new(()),
            inline: false,
        }
    }

    /// As [`Self::new`], for a member whose WAL and Raft log are written inline
    /// (`Wal::open_inline`, `LogStore::open_inline`): builds, reads and installs run on
    /// the caller's task instead of a blocking thread, so the simulation's one thread
    /// runs them in an order its seed fixes. Never a server's.
    pub fn new_inline(
        dur: Arc<WalDurability>,
        engine: Arc<Engine>,
        store: LogStore,
        hooks: SnapshotHooks,
    ) -> Snapshots {
        Snapshots {
            inline: true,
            ..Snapshots::new(dur, engine, store, hooks)
        }
    }

    /// Runs the blocking `f` on a blocking thread (a server: never under the async
    /// runtime's workers), or at once on the caller's task when inline.
    pub async fn off_task<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, String> + Send + 'static,
    ) -> Result<T, String> {
        if self.inline {
            return f();
        }
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r)
    }

    /// The LSN a snapshot may cover now: the WAL's durable end, held back to just before
    /// the oldest position a consumer group may still read.
    pub fn reachable(&self) -> Lsn {
        let end = self.dur.wal.durable_lsn().min(self.dur.wal.last_lsn());
        match (self.hooks.hold)() {
            Some(oldest) => end.min(oldest.saturating_sub(1)),
            None => end,
        }
    }

    /// Records the snapshot would cover beyond the current one.
    pub fn records_since(&self) -> Lsn {
        let cur = self.store.snapshot().map_or(0, |s| s.lsn);
        self.reachable().saturating_sub(cur)
    }

    /// Builds the state after the last entry that ends at or before [`Self::reachable`],
    /// writes it as this member's WAL snapshot and records it in the raft log. Returns
    /// the current snapshot unchanged when nothing newer can be built. Blocking.
    pub fn build(&self) -> Result<SnapMeta, String> {
        let _one = self.building.lock();
        let current = self.store.snapshot();
        // The WAL syncs only once a second (the Raft log is the durable copy): once the
        // snapshot is recorded the Raft log may drop its entries, so what it covers must
        // be on disk in the WAL first.
        let synced = self.dur.wal.sync_blocking().map_err(|e| e.to_string())?;
        let target = self.reachable().min(synced);
        let Some((log_id, upto, membership)) = self.store.log_id_for(target) else {
            return Ok(current.unwrap_or_else(nothing));
        };
        if let Some(c) = &current {
            if c.lsn >= upto {
                return Ok(c.clone());
            }
        }
        let meta = SnapMeta {
            meta: openraft::SnapshotMeta {
                last_log_id: Some(log_id),
                last_membership: membership,
                snapshot_id: format!("{}-{}-{upto}", log_id.leader_id.term, log_id.index),
            },
            lsn: upto,
        };
        // Recorded first: until the files exist the records they replace are all still
        // in the WAL (only writing the snapshot deletes them), so whoever finds the
        // files missing (a crash in between) can write them again ([`Self::read`]).
        self.store
            .record_snapshot(meta.clone())
            .map_err(|e| format!("raft log: {e}"))?;
        self.write_files(&meta)?;
        Ok(meta)
    }

    /// Writes the snapshot `meta` describes into this member's WAL dir: the consumer
    /// groups' state file, then the engine's snapshot (which deletes what it covers).
    fn write_files(&self, meta: &SnapMeta) -> Result<(), String> {
        let (t, upto) = (Instant::now(), meta.lsn);
        let wal = &self.dur.wal;
        wal.wait_durable_blocking(upto).map_err(|e| e.to_string())?;
        let (engine, groups, slots) = self.replay(upto)?;
        let (snap, ()) = engine.snapshot_with(|| ());
        crate::feed::write_state_file_with(wal.dir(), upto, groups.state_records(), slots)
            .map_err(|e| e.to_string())?;
        wal.write_snapshot(&snap, upto).map_err(|e| e.to_string())?;
        let millis = t.elapsed().as_millis() as u64;
        self.dur.snapshot_written(upto, millis);
        tracing::info!(
            "raft: snapshot at entry {:?} (LSN {upto}): {} sales, {} reservations, {millis} ms",
            meta.meta.last_log_id,
            snap.sales.len(),
            snap.reservations.len()
        );
        Ok(())
    }

    /// The newest WAL snapshot at or before `upto` and the records after it, replayed
    /// into an empty engine and empty groups.
    /// Also gives the slot map's changes (`K_SLOT_SET`) up to `upto`, in log order: the
    /// snapshot's state file carries them on, as it carries the groups.
    fn replay(&self, upto: Lsn) -> Result<(Engine, Groups, SlotRecords), String> {
        let mut slots = SlotRecords::new();
        let wal = &self.dur.wal;
        let engine = self.engine.empty_twin();
        let groups = Groups::new(Arc::new(NullSink), GroupLimits::default(), engine.clock());
        let listing = list_dir(wal.dir()).map_err(|e| e.to_string())?;
        let base = listing
            .snapshots
            .iter()
            .filter(|(l, _)| *l <= upto)
            .max_by_key(|(l, _)| *l);
        let mut from = 1;
        if let Some((lsn, path)) = base {
            let bytes = std::fs::read(path).map_err(|e| format!("read {}: {e}", path.display()))?;
            let (got, snap) = decode_snapshot(&bytes)
                .map_err(|e| format!("{}: {} at byte {}", path.display(), e.reason, e.offset))?;
            if got != *lsn {
                return Err(format!("{} holds LSN {got}", path.display()));
            }
            engine.load_snapshot(&snap);
            let state = wal.dir().join(crate::feed::state_file_name(*lsn));
            if let Ok(b) = std::fs::read(&state) {
                let recs = decode_state(&b).map_err(|e| format!("{}: {e}", state.display()))?;
                groups.recover(recs.iter().map(|(k, b)| (0, *k, b.as_slice())));
                slots.extend(recs.into_iter().filter(|(k, _)| *k == K_SLOT_SET));
            }
            from = lsn + 1;
        }
        let mut failed = None;
        wal.read_records(from, upto, None, &mut |lsn, ev| {
            engine.apply(&ev);
            if let Event::Opaque { kind, body } = &ev {
                if *kind == K_SLOT_SET {
                    slots.push((*kind, body.clone()));
                }
                let (n, bad) = groups.recover(std::iter::once((lsn, *kind, body.as_slice())));
                if bad > 0 && failed.is_none() {
                    failed = Some(format!("consumer-group record at LSN {lsn} ({n} applied)"));
                }
            }
            Visit::More
        })
        .map_err(|e| format!("reading the WAL up to LSN {upto}: {e}"))?;
        if let Some(f) = failed {
            tracing::warn!("raft: snapshot replay skipped an undecodable {f}");
        }
        Ok((engine, groups, (self.hooks.compact_slots)(slots)))
    }

    /// The bytes of the snapshot `meta` for a peer, read from this member's WAL dir.
    pub fn read(&self, meta: &SnapMeta) -> Result<Vec<u8>, String> {
        let _one = self.building.lock();
        let dir = self.dur.wal.dir();
        let snap_path = dir.join(snapshot_file_name(meta.lsn));
        if !snap_path.exists() {
            self.write_files(meta)?;
        }
        let snap =
            std::fs::read(&snap_path).map_err(|e| format!("read {}: {e}", snap_path.display()))?;
        let state =
            std::fs::read(dir.join(crate::feed::state_file_name(meta.lsn))).unwrap_or_default();
        Ok(encode_data(meta.lsn, &snap, &state))
    }
}

/// Asks openraft for a snapshot whenever `every` (`--snapshot-records`) records could be
/// covered beyond the current one (openraft then calls the state machine's builder and
/// purges the log it includes). Ends when the member's Raft has shut down.
pub async fn trigger_loop(raft: Raft, snapshots: Arc<Snapshots>, every: u64) {
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        if snapshots.records_since() >= every {
            if let Err(e) = raft.trigger().snapshot().await {
                tracing::warn!("raft: snapshot not started: {e}");
                return;
            }
        }
    }
}

/// openraft's `max_in_snapshot_log_to_keep` for a member snapshotting every
/// `snapshot_records` records: entries kept behind a snapshot, so a follower a little
/// behind still gets the log rather than a whole snapshot.
pub fn log_to_keep(snapshot_records: u64) -> u64 {
    snapshot_records.min(1000)
}

/// Opaque records as a state file stores them: kind and body.
pub type SlotRecords = Vec<(u8, Vec<u8>)>;

/// What the layers above the group decide for its snapshots, handed down as functions so
/// this layer imports neither the feed nor the cluster.
pub struct SnapshotHooks {
    /// The oldest LSN a consumer group may still read (`app::feed::snapshot_hold`,
    /// `Groups::oldest_needed_in_log`): a snapshot never covers (and lets the WAL drop) records a group needs.
    pub hold: Box<dyn Fn() -> Option<Lsn> + Send + Sync>,
    /// Folds the slot map's records the state file carries on into the fewest that
    /// give the same table (the cluster's `compact_slot_records`), so the file stays
    /// bounded however many slots moved; the identity outside cluster mode.
    pub compact_slots: Box<dyn Fn(SlotRecords) -> SlotRecords + Send + Sync>,
}

/// The description of no snapshot (openraft ignores a build that is not newer).
fn nothing() -> SnapMeta {
    SnapMeta {
        meta: openraft::SnapshotMeta {
            last_log_id: None,
            last_membership: Default::default(),
            snapshot_id: "none".into(),
        },
        lsn: 0,
    }
}

/// What a failed build reports to openraft: the current snapshot (no progress), so a
/// disk error here is logged and retried, and does not stop the member's Raft.
pub fn unchanged(store: &LogStore) -> SnapMeta {
    store.snapshot().unwrap_or_else(nothing)
}

fn decode_state(buf: &[u8]) -> Result<Vec<(u8, Vec<u8>)>, String> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < buf.len() {
        let (ev, used) =
            crate::wal::record::decode_record(&buf[at..]).map_err(|e| e.to_string())?;
        if let Event::Opaque { kind, body } = ev {
            out.push((kind, body));
        }
        at += used;
    }
    Ok(out)
}

fn encode_data(lsn: Lsn, snap: &[u8], state: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(snap.len() + state.len() + 36);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&lsn.to_le_bytes());
    out.extend_from_slice(&(snap.len() as u64).to_le_bytes());
    out.extend_from_slice(snap);
    out.extend_from_slice(&(state.len() as u64).to_le_bytes());
    out.extend_from_slice(state);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The LSN a peer's snapshot bytes say they cover (checked fully by [`stage`]).
pub fn announced_lsn(data: &[u8]) -> Result<Lsn, String> {
    decode_data(data).map(|(lsn, _, _)| lsn)
}

/// (lsn, snapshot file, state file) of a peer's snapshot bytes, checked.
fn decode_data(data: &[u8]) -> Result<(Lsn, &[u8], &[u8]), String> {
    let bad = |why: &str| Err(format!("received snapshot: {why}"));
    if data.len() < 8 + 8 + 8 + 8 + 4 || data[..8] != MAGIC {
        return bad("not a stockgate raft snapshot");
    }
    let (body, crc) = data.split_at(data.len() - 4);
    let want = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    if crc32c::crc32c(body) != want {
        return bad("checksum mismatch");
    }
    let u64_at = |at: usize| -> Option<u64> {
        let b: [u8; 8] = body.get(at..at + 8)?.try_into().ok()?;
        Some(u64::from_le_bytes(b))
    };
    let (Some(lsn), Some(snap_len)) = (u64_at(8), u64_at(16)) else {
        return bad("truncated header");
    };
    let snap_end = 24usize.saturating_add(snap_len as usize);
    let Some(snap) = body.get(24..snap_end) else {
        return bad("truncated snapshot file");
    };
    let Some(state_len) = u64_at(snap_end) else {
        return bad("truncated state length");
    };
    let state_end = (snap_end + 8).saturating_add(state_len as usize);
    if state_end != body.len() {
        return bad("length mismatch");
    }
    Ok((lsn, snap, &body[snap_end + 8..state_end]))
}

/// Stages a peer's snapshot for `data_dir` (the files, synced, then the `complete`
/// marker), ready for [`adopt_staged`] at the next start. Blocking.
pub fn stage(data_dir: &Path, meta: &SnapMeta, data: &[u8]) -> Result<(), String> {
    let (lsn, snap, state) = decode_data(data)?;
    let (got, _) = decode_snapshot(snap).map_err(|e| format!("received snapshot: {}", e.reason))?;
    if got != lsn || lsn != meta.lsn {
        return Err(format!(
            "received snapshot: covers LSN {got}, announced {lsn} / {}",
            meta.lsn
        ));
    }
    let staging = data_dir.join(STAGING);
    let io = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(|e| io("remove", &staging, e))?;
    }
    std::fs::create_dir_all(&staging).map_err(|e| io("create", &staging, e))?;
    let write = |name: String, bytes: &[u8]| -> Result<(), String> {
        use std::io::Write as _;
        let p = staging.join(name);
        let mut f = std::fs::File::create(&p).map_err(|e| io("create", &p, e))?;
        f.write_all(bytes).map_err(|e| io("write", &p, e))?;
        f.sync_all().map_err(|e| io("sync", &p, e))
    };
    write(snapshot_file_name(lsn), snap)?;
    if !state.is_empty() {
        write(crate::feed::state_file_name(lsn), state)?;
    }
    write(COMPLETE.into(), format!("{lsn}\n").as_bytes())?;
    sync_dir(&staging).map_err(|e| e.to_string())?;
    Ok(())
}

/// At start, before the WAL is opened: a staged snapshot that the raft log names
/// (`recorded`) becomes `wal/` (the old one is deleted); any other staged directory is
/// an interrupted transfer and is deleted. Returns whether one was adopted.
pub fn adopt_staged(data_dir: &Path, recorded: Option<&SnapMeta>) -> Result<bool, String> {
    let staging = data_dir.join(STAGING);
    if !staging.exists() {
        return Ok(false);
    }
    let staged: Option<Lsn> = std::fs::read_to_string(staging.join(COMPLETE))
        .ok()
        .and_then(|s| s.trim().parse().ok());
    let io = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    if staged.is_none() || staged != recorded.map(|m| m.lsn) {
        std::fs::remove_dir_all(&staging).map_err(|e| io("remove", &staging, e))?;
        return Ok(false);
    }
    let wal = data_dir.join("wal");
    let old: PathBuf = data_dir.join("wal.before-snapshot");
    if old.exists() {
        std::fs::remove_dir_all(&old).map_err(|e| io("remove", &old, e))?;
    }
    if wal.exists() {
        std::fs::rename(&wal, &old).map_err(|e| io("move aside", &wal, e))?;
    }
    let _ = std::fs::remove_file(staging.join(COMPLETE));
    std::fs::rename(&staging, &wal).map_err(|e| io("install", &staging, e))?;
    sync_dir(data_dir).map_err(|e| e.to_string())?;
    if old.exists() {
        std::fs::remove_dir_all(&old).map_err(|e| io("remove", &old, e))?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raft_snapshot_data_round_trips_and_refuses_damage() {
        let d = encode_data(42, b"snapshot-bytes", b"state");
        let (lsn, snap, state) = decode_data(&d).expect("decode");
        assert_eq!(
            (lsn, snap, state),
            (42, &b"snapshot-bytes"[..], &b"state"[..])
        );
        let mut bad = d.clone();
        bad[30] ^= 1;
        assert!(decode_data(&bad).is_err());
        assert!(decode_data(&d[..d.len() - 1]).is_err());
        assert!(decode_data(b"short").is_err());
        let e = encode_data(7, b"", b"");
        assert_eq!(decode_data(&e).expect("empty").0, 7);
    }
}
