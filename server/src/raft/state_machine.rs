//! The state machine of a group member: the engine and its WAL.
//!
//! Applying a committed batch writes its records to this node's WAL under the LSNs the
//! leader gave them (the WAL must continue exactly there: a gap or an overlap means the
//! histories differ, and the node stops rather than guess). A batch this process wrote
//! as leader is already in its engine; any other batch is applied to the engine too,
//! through the recovery path (`Engine::apply`), and its consumer-group records go to the
//! feed. Records the WAL already holds (a batch cut short by a crash, applied again after
//! the restart) are skipped.
//!
//! Where the state machine stands survives a restart without a record of its own: the
//! WAL's last LSN names the last batch applied (see `LogStore::applied_for`).
//!
//! Snapshots are built from this member's disk by `super::snapshot`; one received from
//! the leader is staged there and adopted by a restart (the recovery path, as after a
//! `kill -9`), so the engine is never swapped under running sessions.

use std::io::{self, Cursor};
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, RaftSnapshotBuilder, SnapshotMeta, StorageIOError, StoredMembership};

use super::log_store::{LogStore, SnapMeta};
use super::snapshot::Snapshots;
use super::speculation::Speculation;
use super::{Batch, Entry, LogId, NodeId, NodeInfo, StorageError, TypeConfig};
use crate::engine::Engine;
use crate::engine::HoldRecord;
use crate::persist::WalDurability;
use crate::wal::record::{decode_payload, decode_reserved, frame};
use crate::wal::Event;

/// openraft's state machine for a group member: applies committed entries to the engine and the
/// WAL, tracks the last applied log id and membership, and builds and installs snapshots.
pub struct StateMachine {
    engine: Arc<Engine>,
    dur: Arc<WalDurability>,
    spec: Arc<Speculation>,
    applied: Option<LogId>,
    membership: StoredMembership<NodeId, NodeInfo>,
    snapshots: Arc<Snapshots>,
    store: LogStore,
    data_dir: std::path::PathBuf,
}

impl StateMachine {
    /// Wraps the member's engine and WAL. The pairs are what recovery found: the last applied log
    /// id with its membership, and the log store with the data directory snapshots are installed
    /// into.
    pub fn new(
        engine: Arc<Engine>,
        dur: Arc<WalDurability>,
        spec: Arc<Speculation>,
        (applied, membership): (Option<LogId>, StoredMembership<NodeId, NodeInfo>),
        snapshots: Arc<Snapshots>,
        (store, data_dir): (LogStore, std::path::PathBuf),
    ) -> StateMachine {
        // What recovery applied from the log at the start needs no records in memory.
        if let Some(a) = applied {
            store.release_applied(a.index);
        }
        StateMachine {
            engine,
            dur,
            spec,
            applied,
            membership,
            snapshots,
            store,
            data_dir,
        }
    }

    fn apply_batch(&self, b: &Batch) -> Result<(), String> {
        let own = b.origin == self.spec.origin();
        // Another leader's records: only into an engine with nothing of its own in
        // flight (else this node is deposed and restarts instead).
        if !own && self.spec.follow_to(b.last_lsn()).is_err() {
            return Err("deposed".into());
        }
        let wal = &self.dur.wal;
        let _gate = self.dur.apply_gate();
        let (mut at, mut lsn) = (0usize, b.first_lsn);
        while at < b.records.len() {
            let bad = |e: &dyn std::fmt::Display| {
                format!("record at LSN {lsn} of a committed batch: {e}")
            };
            let (payload, used) = frame(&b.records[at..]).map_err(|e| bad(&e))?;
            let have = wal.last_lsn();
            if lsn > have {
                if lsn != have + 1 {
                    return Err(format!(
                        "the group's batch has LSN {lsn}, this WAL continues at {}",
                        have + 1
                    ));
                }
                // The leader's own records are in its engine already: they are only
                // logged, as encoded, never decoded again.
                let decoded = if own {
                    None
                } else {
                    Some(Decoded::of(payload).map_err(|e| bad(&e))?)
                };
                let got = wal.record_framed(&b.records[at..at + used]);
                if got != lsn {
                    return Err(format!("local WAL gave LSN {got} to the group's {lsn}"));
                }
                match decoded {
                    Some(Decoded::Hold(h)) => self.engine.apply_hold(&h),
                    Some(Decoded::Event(ev)) => {
                        self.engine.apply(&ev);
                        self.dur.replayed(lsn, &ev);
                    }
                    None => {}
                }
            } else if own {
                return Err(format!("this leader's own LSN {lsn} is already in its WAL"));
            }
            at += used;
            lsn += 1;
        }
        if lsn != b.first_lsn + u64::from(b.count) {
            return Err(format!(
                "batch announced {} records, holds {}",
                b.count,
                lsn - b.first_lsn
            ));
        }
        if own {
            self.spec.committed_own(b.last_lsn());
        }
        Ok(())
    }
}

fn sm_err(log_id: LogId, why: &str) -> StorageError {
    StorageIOError::apply(log_id, &io::Error::other(why.to_owned())).into()
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Builder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembership<NodeId, NodeInfo>), StorageError> {
        Ok((self.applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<()>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut out = Vec::new();
        for e in entries {
            // openraft applies each committed entry once, in log order.
            assert!(
                self.applied.is_none_or(|a| e.log_id.index > a.index),
                "entry {} applied after {:?}",
                e.log_id,
                self.applied
            );
            match &e.payload {
                EntryPayload::Blank => {}
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembership::new(Some(e.log_id), m.clone());
                }
                EntryPayload::Normal(b) => {
                    if let Err(why) = self.apply_batch(b) {
                        if self.spec.is_deposed() {
                            // The node restarts (its hook is running): apply nothing more.
                            std::future::pending::<()>().await;
                        }
                        tracing::error!("raft: cannot apply entry {}: {why}", e.log_id);
                        return Err(sm_err(e.log_id, &why));
                    }
                }
            }
            self.applied = Some(e.log_id);
            out.push(());
        }
        if let Some(a) = self.applied {
            self.store.release_applied(a.index);
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        Builder(self.snapshots.clone(), self.store.clone())
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    /// Stages the leader's snapshot, records it in the raft log (dropping the entries it
    /// includes) and restarts the process on it; never returns on success.
    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, NodeInfo>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let (store, dir, meta) = (self.store.clone(), self.data_dir.clone(), meta.clone());
        let staged = self
            .snapshots
            .off_task(move || -> Result<SnapMeta, String> {
                let lsn = super::snapshot::announced_lsn(&data)?;
                let sm = SnapMeta { meta, lsn };
                super::snapshot::stage(&dir, &sm, &data)?;
                store
                    .adopt_snapshot(sm.clone())
                    .map_err(|e| format!("raft log: {e}"))?;
                Ok(sm)
            })
            .await;
        match staged {
            Ok(sm) => {
                tracing::warn!(
                    "raft: installing the leader's snapshot (entry {:?}, LSN {}): restarting on it",
                    sm.meta.last_log_id,
                    sm.lsn
                );
                self.spec.depose("installing the group's snapshot");
                std::future::pending::<()>().await;
                Ok(())
            }
            Err(why) => {
                tracing::error!("raft: cannot install the leader's snapshot: {why}");
                Err(StorageIOError::write_snapshot(None, &io::Error::other(why)).into())
            }
        }
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let Some(meta) = self.store.snapshot() else {
            return Ok(None);
        };
        let snaps = self.snapshots.clone();
        let m = meta.clone();
        let data = self.snapshots.off_task(move || snaps.read(&m)).await;
        match data {
            Ok(d) => Ok(Some(Snapshot {
                meta: meta.meta,
                snapshot: Box::new(Cursor::new(d)),
            })),
            Err(why) => {
                tracing::error!("raft: cannot read this member's snapshot: {why}");
                Err(StorageIOError::read_snapshot(None, &io::Error::other(why)).into())
            }
        }
    }
}

/// Builds a snapshot on a blocking thread ([`Snapshots::build`]; inline in the
/// simulation, [`Snapshots::off_task`]). openraft keeps only
/// the description of what it built; a peer gets the bytes from `get_current_snapshot`.
pub struct Builder(Arc<Snapshots>, LogStore);

impl RaftSnapshotBuilder<TypeConfig> for Builder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let snaps = self.0.clone();
        let built = self.0.off_task(move || snaps.build()).await;
        let m = built.unwrap_or_else(|why| {
            tracing::error!("raft: cannot build a snapshot (retried later): {why}");
            super::snapshot::unchanged(&self.1)
        });
        Ok(Snapshot {
            meta: m.meta,
            snapshot: Box::new(Cursor::new(Vec::new())),
        })
    }
}

/// Another member's record, decoded for the engine: a RESERVE (most of a sale's records)
/// as a hold whose strings stay in the batch, any other kind as its event.
enum Decoded<'a> {
    Hold(HoldRecord<'a>),
    Event(Event),
}

impl<'a> Decoded<'a> {
    fn of(payload: &'a [u8]) -> Result<Decoded<'a>, crate::wal::codec::DecodeError> {
        match decode_reserved(payload)? {
            Some(h) => Ok(Decoded::Hold(h)),
            None => decode_payload(payload).map(Decoded::Event),
        }
    }
}
