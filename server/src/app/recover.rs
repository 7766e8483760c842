//! The engine rebuilt from the data dir: the keys it was written with, the snapshot and
//! the log replayed, and for a Raft member the speculation its records go through
//! instead of the WAL.

use std::path::PathBuf;
use std::sync::Arc;

use super::config::Config;
use crate::engine::{Engine, EngineConfig, Keyring, ReservationKey, SystemClock};
use crate::keyfiles;
use crate::persist::{recover_engine_with, RecoveryReport, WalDurability};
use crate::raft::speculation::Speculation;
use crate::wal::WalError;

/// The admission keyring and the reservation key, created in the data dir on first start.
pub(super) struct Keys {
    admission: Keyring,
    /// The file the admission keys were read from (`SECRET.RELOAD` reads it again).
    pub(super) secret_path: PathBuf,
    reservation: ReservationKey,
    reservation_path: PathBuf,
}

/// The keys of `--secret-file` and `--reservation-key-file` (or the data dir's), each
/// created where that is allowed, each named on stderr.
pub(super) fn load_keys(c: &Config) -> Result<Keys, String> {
    let (admission, secret_path, created) =
        keyfiles::load_or_create_secret(&c.data_dir, c.keys.secret_file.as_deref())
            .map_err(|e| e.to_string())?;
    if created {
        eprintln!(
            "stockgate: created admission secret {}",
            secret_path.display()
        );
    } else {
        eprintln!("stockgate: admission secret {}", secret_path.display());
    }
    let (reservation, reservation_path, reservation_created) =
        keyfiles::load_or_create_reservation_key(
            &c.data_dir,
            c.keys.reservation_key_file.as_deref(),
            c.keys.create_keys,
        )
        .map_err(|e| e.to_string())?;
    if reservation_created {
        eprintln!(
            "stockgate: created reservation key {} (fingerprint {})",
            reservation_path.display(),
            reservation.fingerprint()
        );
    }
    Ok(Keys {
        admission,
        secret_path,
        reservation,
        reservation_path,
    })
}

/// The engine rebuilt from the data dir, its log, and (a Raft member) the speculation
/// its records go through instead of the WAL.
pub(super) struct Recovered {
    /// The engine, as the snapshot and the log left it.
    pub(super) engine: Arc<Engine>,
    /// This node's own WAL.
    pub(super) durability: Arc<WalDurability>,
    /// What recovery read: the snapshot's LSN, the opaque records after it.
    pub(super) report: RecoveryReport,
    /// A Raft member's: where its engine's records go, to be batched by the leader.
    pub(super) speculation: Option<Arc<Speculation>>,
}

/// Replays the data dir into a new engine; refuses a log it cannot read and data written
/// with another reservation key.
pub(super) fn recover(
    c: &Config,
    cfg: EngineConfig,
    keys: Keys,
    raft_member: bool,
) -> Result<Recovered, String> {
    let mut speculation: Option<Arc<Speculation>> = None;
    let (engine, durability, report) = recover_engine_with(
        &c.data_dir,
        c.wal_options(),
        cfg,
        Arc::new(SystemClock::new()),
        keys.admission,
        keys.reservation,
        |wal| {
            if !raft_member {
                return wal.clone();
            }
            // A member's engine writes into the leader's batches, not the WAL.
            let s = Arc::new(Speculation::new(rand::random::<u64>(), wal.last_lsn()));
            speculation = Some(s.clone());
            s
        },
    )
    .map_err(refusal)?;
    engine.check_reservation_key(1000).map_err(|token| {
        format!(
            "reservation {token} in {} was not made with reservation key {} (fingerprint {}); start with the key that wrote this data dir. Refusing to start",
            c.data_dir.display(),
            keys.reservation_path.display(),
            engine.key_fingerprint()
        )
    })?;
    if let Some(t) = &report.truncated {
        tracing::warn!("WAL recovery: {t}");
    }
    tracing::info!(
        "recovered {} sales, {} reservations (snapshot lsn {}, {} records replayed) in {} ms",
        engine.list_sales().len(),
        engine.reservation_count(),
        report.snapshot_lsn,
        report.events_replayed,
        report.millis
    );
    Ok(Recovered {
        engine,
        durability,
        report,
        speculation,
    })
}

/// Why the server will not start on its data dir, and what to do about it. `--repair`
/// is the cure for a damaged log only: offered for anything else (a lock another process
/// holds, a permission) it would lead an operator to cut a healthy log.
fn refusal(e: WalError) -> String {
    match e {
        WalError::Corrupt { .. } => format!("{e}\nstockgate: refusing to start; `--repair` cuts the log at the first bad record (what follows is lost; the ledger can rebuild)"),
        other => format!("{other}\nstockgate: refusing to start"),
    }
}
