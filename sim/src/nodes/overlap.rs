//! Faults that overlap (`Kinds::overlaps`): the drawn steps of `faults` put right what
//! they did before the next, and crash a member at most alongside a link fault; these
//! three kinds let one fault begin while another lasts.
//!
//! - a storage error (the next write or sync of a log of a member drawn, as
//!   `storage_faults` arms it) or a crash (a power loss half the time) while a link is
//!   cut, a member is cut off, or a member is stopped; the member that went down starts
//!   again before the first fault is put right;
//! - a voter taken out and added back (`RAFT.REMOVE`, `RAFT.ADD` through the command
//!   layer, as `membership` sends them) while a link is cut, the links are lossy or a
//!   member is stopped;
//! - a stopped member crashed (`SIGKILL` of a stopped process), then started again.
//!
//! With two faults at once a majority may be out of reach (three members: a link cut
//! both ways and a third member down), so nothing is asked of the group while both
//! last but the monitor's rules (at most one member takes writes; a member cut off
//! stops claiming master); once everything is put right, all agree within the bound a
//! healing has, a member that went down catches up, and the end's checks find every
//! acknowledged outcome on every member. Around the voter out and back, the member taken
//! out takes no writes once its removal is decided, and each change is decided within
//! the membership step's attempts (a fault may make it take more than one, and move the
//! leadership).

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use stockgate_server::raft::NodeId;
use tokio::time::{sleep, sleep_until, Instant};

use super::checks;
use super::crash::down;
use super::members::{pick, restart, writer};
use super::membership::{change, stays_out};
use super::storage_faults::{caught_up, ended, hit, Ended};
use super::{Run, HEAL_WITHIN};
use crate::disk::{Armed, Log, Op};
use crate::gate::Gate;

/// The first fault, which lasts while the second happens, at least until a time drawn
/// (0.3 to 3 s after it began).
enum First {
    /// Links faulty: one cut (one way or both), a member cut off from all others both
    /// ways, or every leg lost with a chance and requests delivered twice.
    Links(Instant),
    /// A member stopped.
    Stop(NodeId, Arc<Gate>, Instant),
}

impl First {
    /// The member the first fault leaves unable to act on its own, if any.
    fn stopped(&self) -> Option<NodeId> {
        match self {
            First::Stop(id, ..) => Some(*id),
            _ => None,
        }
    }

    /// Puts it right at its time (at once if that has passed): heals the links, or lets
    /// the stopped member continue.
    async fn end(self, r: &Run) {
        match self {
            First::Stop(id, gate, until) => {
                sleep_until(until).await;
                gate.resume();
                r.note(format!("n{id} continues (SIGCONT)"));
            }
            First::Links(until) => {
                sleep_until(until).await;
                r.env.wire.set_lossy(None);
                r.env.wire.heal();
                *r.isolated.lock() = None;
                r.note("links healed".into());
            }
        }
    }
}

/// Begins a first fault drawn among a link cut, a member cut off both ways and a stop
/// (and lossy links with `lossy`).
fn begin(r: &Run, rng: &mut StdRng, lossy: bool) -> First {
    let ids = &r.env.ids;
    let until = Instant::now() + Duration::from_millis(rng.gen_range(300..3_000));
    match rng.gen_range(0..if lossy { 4 } else { 3 }) {
        0 => {
            let ai = rng.gen_range(0..ids.len());
            let (a, b) = (ids[ai], ids[(ai + rng.gen_range(1..ids.len())) % ids.len()]);
            let both = rng.gen_bool(0.5);
            r.env.wire.cut(a, b);
            if both {
                r.env.wire.cut(b, a);
            }
            let arrow = if both { "<->" } else { "->" };
            r.note(format!("link n{a} {arrow} n{b} cut"));
            First::Links(until)
        }
        1 => {
            let id = pick(r, rng);
            r.env.wire.isolate(id, &r.ids());
            *r.isolated.lock() = Some((id, Instant::now()));
            r.cut_at.lock().insert(id, Instant::now());
            r.note(format!("n{id} cut off both ways"));
            First::Links(until)
        }
        2 => {
            let id = pick(r, rng);
            let gate = r.env.gate(id);
            gate.stop();
            let ms = (until - Instant::now()).as_millis();
            r.note(format!("n{id} stopped (SIGSTOP) for {ms} ms"));
            First::Stop(id, gate, until)
        }
        _ => {
            let (loss, dup) = (rng.gen_range(10..=200), rng.gen_range(0..=400));
            r.env.wire.set_lossy(Some((loss, dup)));
            r.note(format!(
                "lossy links: {loss} legs in 1000 lost, {dup} requests in 1000 twice"
            ));
            First::Links(until)
        }
    }
}

/// A storage error or a crash of a member drawn (not one stopped) while a first fault
/// lasts; it starts again before that fault is put right.
pub(super) async fn down_during(r: &Arc<Run>, rng: &mut StdRng) -> bool {
    let first = begin(r, rng, false);
    sleep(Duration::from_millis(rng.gen_range(100..600))).await;
    let storage = rng.gen_bool(0.5);
    let mut id = pick(r, rng);
    if first.stopped() == Some(id) {
        id = r.env.ids.iter().copied().find(|i| *i != id).unwrap_or(id);
    }
    let went_down = if storage {
        storage_error(r, rng, id).await
    } else {
        let power = rng.gen_bool(0.5);
        down(r, rng, power, Some(id)).await.map(|d| d.0)
    };
    if let Some(id) = went_down {
        sleep(Duration::from_millis(rng.gen_range(100..1_500))).await;
        if !restart(r, id).await {
            first.end(r).await;
            return false;
        }
    }
    first.end(r).await;
    healed(r, went_down, "both faults put right").await
}

/// Arms a storage error on member `id` (as `storage_faults` does) and, when it hits,
/// waits for the member to exit as the server's watcher exits it: the member, or `None`
/// when it hit nothing or did not exit (a failure then, `storage_faults::ended`).
pub(super) async fn storage_error(r: &Run, rng: &mut StdRng, id: NodeId) -> Option<NodeId> {
    let (log, op) = [
        (Log::Raft, Op::Write),
        (Log::Raft, Op::Sync),
        (Log::Wal, Op::Write),
        (Log::Wal, Op::Sync),
    ][rng.gen_range(0..4)];
    let errno = if rng.gen_bool(0.5) { 28 } else { 5 };
    let failed = hit(r, id, Armed { log, op, errno }).await?;
    if !matches!(ended(r, id).await, Ended::Exited) {
        return None;
    }
    let disk = r.env.disks.lock().get(&id).cloned();
    if let Some(disk) = disk {
        disk.power_cut(rng, Some(&failed), &r.env.history);
    }
    Some(id)
}

/// A voter drawn taken out and added back while a first fault lasts; the fault is put
/// right at its time, whether the changes are done by then or not.
pub(super) async fn membership_during(r: &Arc<Run>, rng: &mut StdRng) -> bool {
    let first = begin(r, rng, true);
    let ids = &r.env.ids;
    let id = match writer(r) {
        Some(w) if rng.gen_range(0..3) == 0 => w,
        _ => ids[rng.gen_range(0..ids.len())],
    };
    let out = Duration::from_millis(rng.gen_range(500..2_500));
    // The first fault is put right at its time, whether the changes are done or not.
    let (ok, ()) = tokio::join!(out_and_back(r, id, out), first.end(r));
    ok && healed(
        r,
        None,
        &format!("n{id} back in the group, faults put right"),
    )
    .await
}

/// `RAFT.REMOVE id`, then after `out` `RAFT.ADD id`, each sent again to whoever takes
/// writes until decided; the member taken out takes no writes meanwhile.
async fn out_and_back(r: &Run, id: NodeId, out: Duration) -> bool {
    let remove = super::membership::remove_argv(id);
    let removed = change(r, &format!("RAFT.REMOVE {id}"), &remove, |v| {
        !v.contains(&id)
    })
    .await;
    if removed.is_none() || !stays_out(r, id, Instant::now(), out).await {
        return false;
    }
    let add = super::membership::add_argv(id);
    change(r, &format!("RAFT.ADD {id}"), &add, |v| v.contains(&id))
        .await
        .is_some()
}

/// A member drawn stopped, then killed while stopped (with the power half the time),
/// then started again.
pub(super) async fn stopped_crash(r: &Arc<Run>, rng: &mut StdRng) -> bool {
    let id = pick(r, rng);
    let ms = rng.gen_range(300..3_000);
    let power = rng.gen_bool(0.5);
    let gate = r.env.gate(id);
    gate.stop();
    r.note(format!("n{id} stopped (SIGSTOP) for {ms} ms, then killed"));
    sleep(Duration::from_millis(ms)).await;
    let Some(n) = r.live.lock().remove(&id) else {
        gate.resume();
        return true;
    };
    let how = if power { "power loss" } else { "kill -9" };
    r.note(format!("n{id} crashes while stopped ({how})"));
    // A stopped process dies without running again: nothing it still does counts
    // (its syncs, its Raft log's queue), and its tasks are aborted before they run. The
    // gate opens so that openraft's own tasks can end (its shutdown waits for them);
    // what they do meanwhile is what a process does in the instant before a kill.
    n.hook.die();
    n.hook.end();
    gate.resume();
    n.kill().await;
    if power {
        let disk = r.env.disks.lock().get(&id).cloned();
        if let Some(disk) = disk {
            disk.power_cut(rng, None, &r.env.history);
        }
    }
    let what = format!("n{id} down (killed while stopped)");
    if !super::members::agree_then_pause(r, rng, &what).await {
        return false;
    }
    restart(r, id).await && healed(r, Some(id), &format!("n{id} back after its kill")).await
}

/// Everything put right: all agree within [`HEAL_WITHIN`], and the member that went
/// down (if any) catches up.
async fn healed(r: &Run, went_down: Option<NodeId>, what: &str) -> bool {
    let Some(leader) = checks::agreement(r, what, HEAL_WITHIN, None, None).await else {
        return false;
    };
    match went_down {
        Some(id) => caught_up(r, id, leader).await,
        None => true,
    }
}
