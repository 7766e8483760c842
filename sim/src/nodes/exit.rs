//! The process exit of a member whose disk failed it, in the simulation: the server's
//! own `storage_fault::watch` runs on every member (on the paused clock, under the
//! member's gate) and decides when to exit and with what; the exit it calls ends here
//! what a process exit ends: nothing the member syncs from then on counts, and the
//! scenario's step that armed the error (or the supervisor, for an exit no step asked
//! for) ends the member's tasks and starts it again, as its supervisor (systemd)
//! would. Several members share this process, so `std::process::exit` is not an
//! option.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use stockgate_server::raft::runtime::under_gate;
use stockgate_server::raft::storage_fault::{self, Exit, Fault, Watched};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::disk::Hook;
use crate::gate::Gate;
use crate::history::History;

/// One member process's exit, once its watcher called for it.
#[derive(Default)]
pub struct Exited {
    fault: OnceLock<Fault>,
    seen: Notify,
}

impl Exited {
    /// The fault the process exited on, if it did.
    pub fn fault(&self) -> Option<&Fault> {
        self.fault.get()
    }

    /// Waits up to `within` for the process to exit: the fault, or `None`.
    pub async fn wait(&self, within: Duration) -> Option<Fault> {
        let until = tokio::time::Instant::now() + within;
        loop {
            if let Some(f) = self.fault.get() {
                return Some(f.clone());
            }
            if tokio::time::timeout_at(until, self.seen.notified())
                .await
                .is_err()
            {
                return self.fault.get().cloned();
            }
        }
    }
}

/// What a member process's exit touches: its disk hook, its gate (the watcher runs
/// under it), the run's history, and the run's root (left out of the fault's paths, which
/// differ from run to run).
pub struct Process {
    /// The member.
    pub id: u64,
    /// Its view of its disk.
    pub hook: Arc<Hook>,
    /// Its task gate.
    pub gate: Arc<Gate>,
    /// The run's history.
    pub history: History,
    /// The run's root directory.
    pub root: PathBuf,
}

/// Starts the server's watcher on member process `p`: the task, and what it records
/// when it calls for the exit.
pub fn watch(w: Watched, p: Process) -> (JoinHandle<()>, Arc<Exited>) {
    let Process {
        id,
        hook,
        gate,
        history,
        root,
    } = p;
    let exited = Arc::new(Exited::default());
    let seam: Exit = Box::new({
        let exited = exited.clone();
        move |f: &Fault| {
            // What the process wrote stays in the page cache; what it would sync now is
            // never synced (it is gone).
            hook.die();
            hook.end();
            let what = f.to_string().replace(&format!("{}/", root.display()), "");
            history.note(format!("n{id} exits with status {}: {what}", f.code));
            let _ = exited.fault.set(f.clone());
            exited.seen.notify_one();
        }
    });
    let task = tokio::spawn(under_gate(gate, storage_fault::watch(w, seam)));
    (task, exited)
}
