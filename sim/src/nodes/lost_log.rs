//! A member's data dir loses its Raft log but keeps its identity file (`raft/id`): an
//! operator's slip, a restore that missed a file. Its process is killed and `raft/log`
//! removed; it starts again with its usual command line, which the server's
//! `node::prepare` must refuse: the log held the votes it cast, and a member never
//! continues a history it did not come from. The operator's answer is the one the
//! refusal names (docs/replication.md): `--rejoin-empty`, which sets the WAL aside
//! (`wal.before-rejoin-<ms>`), gives the storage a new incarnation under the group it
//! belonged to, and waits as a non-voter until `RAFT.READMIT` (`amnesia::readmitted`).
//!
//! Checked: the others elect and name a leader while it is down; the first start is
//! refused, and its words name the missing log, `--rejoin-empty` and `RAFT.READMIT
//! <id>`; the second starts, with the old WAL set aside; then what `amnesia` checks of a
//! re-admitted member (no vote cast before the re-admission, caught up), and the end's
//! checks find every acknowledged outcome on it.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::Rng;
use stockgate_server::raft::NodeId;

use super::members::pick;
use super::{amnesia, boot, Run};

/// A member drawn loses its Raft log, keeps its identity; refused, then rejoined.
pub(super) async fn lose_log(r: &Arc<Run>, rng: &mut StdRng) -> bool {
    let id = pick(r, rng);
    let Some(n) = r.live.lock().remove(&id) else {
        return true;
    };
    n.kill().await;
    let log = r.env.dir(id).join("raft").join("log");
    if let Err(e) = std::fs::remove_file(&log) {
        r.fail(format!("the harness cannot remove {}: {e}", log.display()));
        return false;
    }
    r.note(format!(
        "n{id} loses its Raft log (killed, raft/log removed, raft/id kept)"
    ));
    let what = format!("n{id} down (Raft log lost)");
    if !super::members::agree_then_pause(r, rng, &what).await {
        return false;
    }
    if !refused(r, id).await {
        return false;
    }
    let incarnation = rng.gen::<u64>().max(1);
    match boot::start_empty(&r.env, id, incarnation).await {
        Ok(n) => {
            r.live.lock().insert(id, n);
        }
        Err(e) => {
            let e = e.replace(&format!("{}/", r.env.root.display()), "");
            r.fail(format!("n{id} refuses to start with --rejoin-empty: {e}"));
            return false;
        }
    }
    let aside = set_aside(r, id);
    r.note(format!(
        "n{id} starts with --rejoin-empty (storage {incarnation:016x}, old WAL in {aside})"
    ));
    if aside.is_empty() {
        r.fail(format!(
            "n{id} started with --rejoin-empty but set no WAL aside"
        ));
        return false;
    }
    amnesia::readmitted(r, rng, id, incarnation).await
}

/// Member `id`'s start with its usual command line must refuse its data dir, naming the
/// missing log and the operator's answer.
async fn refused(r: &Run, id: NodeId) -> bool {
    let e = match boot::start(&r.env, id, None).await {
        Ok(n) => {
            r.live.lock().insert(id, n);
            r.fail(format!("n{id} started on a data dir without its Raft log"));
            return false;
        }
        Err(e) => e.replace(&format!("{}/", r.env.root.display()), ""),
    };
    r.note(format!("n{id} refuses to start: {e}"));
    let words = [
        format!("n{id}/raft/log is missing"),
        "--rejoin-empty".to_string(),
        format!("RAFT.READMIT {id}"),
    ];
    if let Some(w) = words.iter().find(|w| !e.contains(w.as_str())) {
        r.fail(format!(
            "n{id}'s refusal of a lost Raft log does not say {w:?}: {e}"
        ));
        return false;
    }
    true
}

/// The name of the WAL `--rejoin-empty` set aside in member `id`'s data dir (empty if
/// none).
fn set_aside(r: &Run, id: NodeId) -> String {
    let Ok(entries) = std::fs::read_dir(r.env.dir(id)) else {
        return String::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("wal.before-rejoin-"))
        .collect();
    names.sort();
    names.pop().unwrap_or_default()
}
