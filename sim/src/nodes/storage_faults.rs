//! A member's disk fails it: the next write or `fdatasync` of its Raft log, or the next
//! write of its WAL, fails with `ENOSPC` or `EIO` (`disk::Hook::arm`, the first
//! scenario's injection; the log and the WAL are written inline through the hook here
//! too).
//!
//! What the server does then (docs/replication.md, "A disk that fails";
//! `raft::storage_fault`): the member exits with status 75 rather than go on with what it
//! may not have made durable, and its supervisor starts it again. Here the server's own
//! `storage_fault::watch` runs on every member and calls for the exit (`exit`); the step
//! then ends the process's tasks as a kill ends them. The file that failed keeps only
//! what was synced, or by the seed part of the rest (after a failed `fsync` the kernel
//! may have dropped the pages it could not write: the first scenario's model). The disk
//! is healed before the member starts again.
//!
//! Checked: the member exits within [`EXIT_WITHIN`] of the error; the others elect and
//! name a leader while it is down (within a crash's bound); it starts again from what
//! its disk kept, all agree again, and it catches up:
//! it applies at least what the group had committed when it started, within
//! [`HEAL_WITHIN`]. Nothing acknowledged may be lost: the end's checks.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use stockgate_server::raft::NodeId;
use tokio::time::{sleep, Instant};

use super::checks::{self, takes_writes};
use super::members::{pick, restart};
use super::{Run, HEAL_WITHIN, STEP};
use crate::disk::{Armed, Log, Op};

/// An armed error that hits nothing within this is taken back (a member that writes
/// nothing: a follower with no client writing).
const ARMED_FOR: Duration = Duration::from_secs(2);

/// A member whose disk failed it exits within this: the watcher's poll (20 ms) and its
/// wait for the WAL's flush (at most 500 ms), with room.
const EXIT_WITHIN: Duration = Duration::from_secs(1);

/// How a member whose disk failed it ended.
pub(super) enum Ended {
    /// It exited, as the server's watcher exits it, and its process is gone.
    Exited,
    /// Another step or the supervisor ended it first.
    Gone,
    /// It still runs [`EXIT_WITHIN`] after the error: a failure.
    Stays,
}

/// The next write or sync of one log of a member drawn fails; the member exits on it,
/// the others go on, and it starts again on a healed disk and catches up.
pub(super) async fn fail_disk(r: &Arc<Run>, rng: &mut StdRng) -> bool {
    let id = pick(r, rng);
    // The WAL syncs once a second only with `Kinds::lagging_io` (a server's writer
    // thread's timer; inline it syncs only as it closes or rolls a segment): a failed WAL
    // fsync is drawn only then.
    let kinds = if r.kinds.lagging_io { 4 } else { 3 };
    let (log, op) = [
        (Log::Raft, Op::Write),
        (Log::Raft, Op::Sync),
        (Log::Wal, Op::Write),
        (Log::Wal, Op::Sync),
    ][rng.gen_range(0..kinds)];
    let errno = if rng.gen_bool(0.5) { 28 } else { 5 };
    let a = Armed { log, op, errno };
    let Some(failed) = hit(r, id, a).await else {
        return true;
    };
    match ended(r, id).await {
        Ended::Exited => {}
        Ended::Gone => return true,
        Ended::Stays => return false,
    }
    let disk = r.env.disks.lock().get(&id).cloned();
    if let Some(disk) = disk {
        disk.power_cut(rng, Some(&failed), &r.env.history);
    }
    let what = format!("n{id} down (storage error)");
    if !super::members::agree_then_pause(r, rng, &what).await {
        return false;
    }
    r.note(format!("n{id} disk healed"));
    if !restart(r, id).await {
        return false;
    }
    let what = format!("n{id} back after a storage error");
    let Some(leader) = checks::agreement(r, &what, HEAL_WITHIN, None, None).await else {
        return false;
    };
    caught_up(r, id, leader).await
}

/// Arms `a` on member `id`'s disk and waits for it to hit: the file it failed, or
/// `None` when it hit nothing within [`ARMED_FOR`] (then taken back).
pub(super) async fn hit(r: &Run, id: NodeId, a: Armed) -> Option<PathBuf> {
    let (hook, writer) = {
        let live = r.live.lock();
        let n = live.get(&id)?;
        (n.hook.clone(), takes_writes(n))
    };
    hook.arm(a);
    let role = if writer { ", taking writes" } else { "" };
    r.note(format!(
        "n{id} disk: the next {:?} of its {:?} log fails with errno {}{role}",
        a.op, a.log, a.errno
    ));
    let start = Instant::now();
    loop {
        if let Some(p) = hook.failed() {
            return Some(p);
        }
        if start.elapsed() >= ARMED_FOR {
            hook.disarm();
            r.note(format!("n{id} disk: nothing hit the armed error"));
            return None;
        }
        sleep(STEP).await;
    }
}

/// Waits for member `id`, whose disk failed it, to exit (its watcher's call), then ends
/// its process's tasks.
pub(super) async fn ended(r: &Run, id: NodeId) -> Ended {
    let Some(exited) = r.live.lock().get(&id).map(|n| n.exited.clone()) else {
        return Ended::Gone;
    };
    if exited.wait(EXIT_WITHIN).await.is_none() {
        r.fail(format!(
            "n{id} still runs {EXIT_WITHIN:?} after its disk failed it: a member whose disk failed exits (status 75) for its supervisor to restart it"
        ));
        return Ended::Stays;
    }
    let n = {
        let mut live = r.live.lock();
        match live.get(&id) {
            Some(n) if Arc::ptr_eq(&n.exited, &exited) => live.remove(&id),
            _ => None,
        }
    };
    let Some(n) = n else {
        return Ended::Gone;
    };
    n.kill().await;
    Ended::Exited
}

/// Member `id` applies, within [`HEAL_WITHIN`], at least what `leader` had committed
/// when the group agreed again.
pub(super) async fn caught_up(r: &Run, id: NodeId, leader: NodeId) -> bool {
    let Some(want) = r.live.lock().get(&leader).map(|n| n.spec.committed_lsn()) else {
        return true;
    };
    let start = Instant::now();
    loop {
        let has = r.live.lock().get(&id).map(|n| n.engine.last_lsn());
        match has {
            // Down again (deposed, re-executing): the end's checks see it catch up.
            None => return true,
            Some(lsn) if lsn >= want => {
                let ms = start.elapsed().as_millis();
                r.note(format!("n{id} caught up to LSN {want} after {ms} ms"));
                return true;
            }
            Some(lsn) if start.elapsed() >= HEAL_WITHIN => {
                r.fail(format!(
                    "n{id} applied LSN {lsn}, not {want} (committed by n{leader}), within {HEAL_WITHIN:?} of its restart"
                ));
                return false;
            }
            Some(_) => sleep(STEP).await,
        }
    }
}
