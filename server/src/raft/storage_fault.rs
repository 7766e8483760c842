//! What a member does when its disk fails it (no space left, an I/O error, a failed
//! `fsync`): it exits with [`EXIT_STORAGE`], for its supervisor to start it again.
//!
//! After such an error nothing the member holds in memory can be promised durable, and
//! openraft stops its core on a storage error while the process would go on: a member
//! still answering clients, possibly still naming itself the leader, that never comes
//! back by itself. Exiting ends that at once: clients and peers find its ports closed
//! and turn to the others (the remaining majority keeps serving); no reply still waiting
//! is acknowledged (a reply waits for the group's commit, which this process no longer
//! learns); and the next start recovers from what is on disk, as after a crash (a record
//! cut short at the end of the Raft log or of the WAL is dropped, and the group sends
//! the member whatever it lacks).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use openraft::error::Fatal;
use openraft::RaftMetrics;

use super::{NodeId, NodeInfo, Raft};
use crate::persist::WalDurability;
use crate::wal::Wal;

/// The exit status after a storage error (`EX_TEMPFAIL`: start again once the disk is
/// fixed). A supervisor restarts on it (`Restart=on-failure`).
pub const EXIT_STORAGE: i32 = 75;

/// The exit status when openraft's core stopped for another reason than storage (a
/// panic inside it): a member without a working core must not go on serving either.
pub const EXIT_RAFT_STOPPED: i32 = 70;

/// How often the WAL's state is looked at: its writer thread reports a failure by
/// state, not by an event this task could wait on.
const POLL: Duration = Duration::from_millis(20);

/// How long the exit waits for the WAL to write what it buffers: a failing disk may
/// hang a write, and nothing durable depends on it (the Raft log holds every entry).
const FLUSH_WAIT: Duration = Duration::from_millis(500);

/// A storage failure: what failed, on which path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The exit status it calls for.
    pub code: i32,
    /// The file or directory concerned.
    pub path: PathBuf,
    /// What the system or openraft reported.
    pub error: String,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = if self.code == EXIT_STORAGE {
            "storage error"
        } else {
            "raft core stopped"
        };
        write!(f, "{what} on {}: {}", self.path.display(), self.error)
    }
}

/// A Raft log's first write failure, kept by whoever writes it (its writer thread in a
/// server) for [`watch`] to find: one record per log, so one per member process.
#[derive(Default)]
pub struct LogFault {
    fault: OnceLock<Fault>,
    seen: tokio::sync::Notify,
}

impl LogFault {
    /// Records that writing or syncing the Raft log at `path` failed (the first failure
    /// only), and wakes [`watch`].
    pub fn note(&self, path: &Path, e: &std::io::Error) {
        let _ = self.fault.set(Fault {
            code: EXIT_STORAGE,
            path: path.to_path_buf(),
            error: e.to_string(),
        });
        self.seen.notify_one();
    }

    /// The failure recorded, if any.
    pub fn get(&self) -> Option<&Fault> {
        self.fault.get()
    }
}

/// How the process ends on a fault, once [`watch`] has logged it and written what the
/// WAL buffers: a server's exits ([`process_exit`]); the simulation's ends its member as
/// a crash does, several members sharing one process there.
pub type Exit = Box<dyn FnOnce(&Fault) + Send>;

/// A server's [`Exit`]: the process ends with [`Fault::code`].
pub fn process_exit() -> Exit {
    Box::new(|f: &Fault| std::process::exit(f.code))
}

/// The failure to exit on, if any: the Raft log's, the WAL's, or openraft's core
/// stopped (`running_state`; a normal shutdown, `Fatal::Stopped`, is none).
pub fn fault(
    m: &RaftMetrics<NodeId, NodeInfo>,
    log: &LogFault,
    wal: &Wal,
    data_dir: &Path,
) -> Option<Fault> {
    if let Some(f) = log.get() {
        return Some(f.clone());
    }
    if let Some(e) = wal.failure() {
        return Some(Fault {
            code: EXIT_STORAGE,
            path: wal.dir().to_path_buf(),
            error: e.to_string(),
        });
    }
    core_fault(&m.running_state, data_dir)
}

/// Why openraft's core stopped, as a fault; `None` while it runs or after a shutdown.
fn core_fault(state: &Result<(), Fatal<NodeId>>, data_dir: &Path) -> Option<Fault> {
    let (code, error) = match state {
        Ok(()) | Err(Fatal::Stopped) => return None,
        Err(Fatal::StorageError(e)) => (EXIT_STORAGE, e.to_string()),
        Err(e) => (EXIT_RAFT_STOPPED, e.to_string()),
    };
    Some(Fault {
        code,
        path: data_dir.to_path_buf(),
        error,
    })
}

/// What [`watch`] looks at: the member's Raft core, its Raft log's fault record, its
/// WAL, and its data dir (named when the core stopped).
pub struct Watched {
    /// The member's Raft handle, for its metrics.
    pub raft: Raft,
    /// Its Raft log's fault record (`LogStore::fault_record`).
    pub log: Arc<LogFault>,
    /// Its WAL.
    pub dur: Arc<WalDurability>,
    /// Its data directory.
    pub data_dir: PathBuf,
}

/// Watches for a storage failure (see [`fault`]) and ends the process on the first: one
/// log line naming the error and the path, what the WAL buffers written, then `exit`
/// with it. On tokio's clock (the simulation's paused one there).
pub async fn watch(w: Watched, exit: Exit) {
    let mut rx = w.raft.metrics();
    let mut core_gone = false;
    loop {
        let found = fault(&rx.borrow_and_update(), &w.log, &w.dur.wal, &w.data_dir);
        if let Some(f) = found {
            flush(&f, &w.dur).await;
            return exit(&f);
        }
        tokio::select! {
            r = rx.changed(), if !core_gone => core_gone = r.is_err(),
            _ = w.log.seen.notified() => {}
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

/// Logs the fault and writes what the WAL still buffers (all of it committed by the
/// group: nothing is acknowledged by it) for at most [`FLUSH_WAIT`].
async fn flush(f: &Fault, dur: &WalDurability) {
    tracing::error!(
        "raft: {f}; exiting with status {} for the supervisor to restart this member from its durable state",
        f.code
    );
    if dur.wal.failure().is_some() {
        return;
    }
    let wal = dur.wal.clone();
    if !wal.has_writer_thread() {
        // Written on the caller's thread (the simulation's WAL): nothing to wait for,
        // and no thread to start.
        let _ = wal.flush_and_close();
        return;
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("stockgate-exit-flush".into())
        .spawn(move || {
            let _ = tx.send(wal.flush_and_close());
        });
    if spawned.is_ok() {
        let _ = tokio::time::timeout(FLUSH_WAIT, rx).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_keeps_its_first_fault() {
        let log = LogFault::default();
        assert!(log.get().is_none());
        let path = Path::new("/data/raft/log");
        log.note(path, &std::io::Error::other("No space left on device"));
        log.note(path, &std::io::Error::other("Input/output error"));
        let f = log.get().expect("a fault");
        assert_eq!(f.code, EXIT_STORAGE);
        assert_eq!(f.path, path);
        assert!(f.error.contains("No space left"), "{f}");
    }

    #[test]
    fn only_a_core_stopped_by_an_error_is_a_fault() {
        let dir = Path::new("/data");
        assert_eq!(core_fault(&Ok(()), dir), None);
        assert_eq!(core_fault(&Err(Fatal::Stopped), dir), None);
        let e = std::io::Error::other("No space left on device");
        let storage = openraft::StorageIOError::write_logs(&e).into();
        let f = core_fault(&Err(Fatal::StorageError(storage)), dir).expect("a fault");
        assert_eq!(f.code, EXIT_STORAGE);
        assert!(f.to_string().contains("/data"), "{f}");
        assert!(f.to_string().contains("No space left"), "{f}");
        let f = core_fault(&Err(Fatal::Panicked), dir).expect("a fault");
        assert_eq!(f.code, EXIT_RAFT_STOPPED);
    }
}
