//! The fault kinds of `Settings::pause_and_membership`: a member stopped and continued
//! (SIGSTOP, SIGCONT), and membership changes through the leader's handle while the
//! other faults go on.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use stockgate_server::raft::{NodeId, Raft};
use tokio::time::{sleep, Instant};

use super::{admitted, names, read_after_resume, readmit, readmit_on, voters, Cluster};

/// A membership change (its two joint-consensus steps, or the re-admission's three)
/// not done within this is given up: its leader was lost or cut off.
const CHANGE_WITHIN: Duration = Duration::from_secs(10);

/// One member stopped (often the one taking writes) for a drawn while: 200 ms to 5 s,
/// one time in eight 5 to 12 s (the election timeout is 400 to 800 ms). It sends
/// nothing and answers nothing meanwhile; what is sent to it, and what it tried to
/// send, is held and goes on when it continues (`Net::pause`). openraft's ticks stop
/// with it (no election timeout, no heartbeat); its core still handles what its own
/// tasks hand it. One member at a time.
pub(super) fn pause(c: &Arc<Cluster>, rng: &mut StdRng) {
    let leader = rng.gen_bool(0.6);
    let pick = rng.gen_range(1..=c.ids.len() as u64);
    let ms = if rng.gen_range(0..8) == 0 {
        rng.gen_range(5000..12_000)
    } else {
        rng.gen_range(200..5000)
    };
    let writer = c.writer().map(|w| w.0);
    let id = match writer {
        Some(w) if leader => w,
        _ => pick,
    };
    if c.ids.iter().any(|&i| c.env.net.is_paused(i)) {
        return;
    }
    let Some(raft) = c.live.lock().get(&id).map(|m| m.raft.clone()) else {
        return;
    };
    let Some(n) = c.env.net.pause(id) else {
        return;
    };
    raft.runtime_config().tick(false);
    let role = if writer == Some(id) {
        ", taking writes"
    } else {
        ""
    };
    c.env
        .history
        .note(format!("n{id} stopped (SIGSTOP) for {ms} ms{role}"));
    let c = c.clone();
    tokio::spawn(async move {
        sleep(Duration::from_millis(ms)).await;
        resume(&c, id, n, &raft);
    });
}

/// Pause `n` of member `id` ends, unless the process died meanwhile (then nothing is
/// left to continue) or healing ended it first.
pub(super) fn resume(c: &Cluster, id: NodeId, n: u64, raft: &Raft) {
    if !c.env.net.resume(id, n) {
        return;
    }
    raft.runtime_config().tick(true);
    read_after_resume(c, id);
}

/// Healing continues every stopped member.
pub(super) fn resume_all(c: &Cluster) {
    for &id in &c.ids {
        let (n, raft) = {
            let live = c.live.lock();
            let Some(m) = live.get(&id) else {
                continue;
            };
            (c.env.net.pause_of(id), m.raft.clone())
        };
        if let Some(n) = n {
            resume(c, id, n, &raft);
        }
    }
}

/// Through the handle of the member taking writes, as an operator's command: a voter
/// taken out of the group (`change_membership` to the voters without it, not kept as a
/// learner), or, when one is out, that one added back as `RAFT.READMIT` adds a member
/// (learner, caught up, voter). One change in flight, none during a re-admission. The
/// change may fail or hang (its leader lost): the outcome is written down, and the next
/// try starts from the membership as the leader then sees it.
pub(super) fn reconfigure(c: &Arc<Cluster>, rng: &mut StdRng) {
    let pick = rng.gen_range(1..=c.ids.len() as u64);
    let h = &c.env.history;
    if c.changing.load(Ordering::Acquire) || c.readmitting.load(Ordering::Acquire) {
        h.note("membership change: another in flight");
        return;
    }
    let Some((leader, raft)) = c.leader_raft() else {
        h.note("membership change: nobody takes writes");
        return;
    };
    let out = *c.removed.lock();
    let id = out.unwrap_or(pick);
    if out.is_none() {
        let left = voters(&raft).iter().filter(|&&v| v != id).count();
        // Fewer than two voters left would be no group to speak of.
        if left < 2 || !voters(&raft).contains(&id) {
            h.note(format!(
                "membership change: n{id} stays (voters {left} without it)"
            ));
            return;
        }
        *c.removed.lock() = Some(id);
    }
    c.changing.store(true, Ordering::Release);
    h.note(format!(
        "membership change on n{leader}: n{id} {}",
        if out.is_none() { "out" } else { "back in" }
    ));
    let c = c.clone();
    tokio::spawn(async move {
        let r = tokio::time::timeout(CHANGE_WITHIN, change(&c, &raft, id, out.is_none())).await;
        let r = r.unwrap_or_else(|_| Err("timed out".into()));
        if r.is_ok() && out.is_some() {
            *c.removed.lock() = None;
        }
        let what = if out.is_none() { "out" } else { "back in" };
        c.env.history.note(format!(
            "membership change on n{leader}: n{id} {what}: {r:?}"
        ));
        c.changing.store(false, Ordering::Release);
    });
}

/// One change through `raft`: `id` out of the voters, or back in.
async fn change(c: &Cluster, raft: &Raft, id: NodeId, out: bool) -> Result<(), String> {
    if out {
        let mut rest = voters(raft);
        rest.remove(&id);
        return raft
            .change_membership(rest, false)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string());
    }
    let incarnation = c.incarnations.lock()[&id];
    if admitted(raft, id, incarnation) {
        return Ok(());
    }
    readmit_on(c, raft, id, names(raft, id, incarnation)).await
}

/// After healing, before the final checks: the change in flight ends (or gives up) and
/// a member a change took out is re-admitted (`readmit`, retried until it holds), so
/// that every member applies the whole log again.
pub(super) async fn rejoin(c: &Arc<Cluster>) {
    let until = Instant::now() + CHANGE_WITHIN + Duration::from_secs(1);
    while c.changing.load(Ordering::Acquire) && Instant::now() < until {
        sleep(Duration::from_millis(50)).await;
        c.restart_deposed().await;
    }
    let Some(id) = c.removed.lock().take() else {
        return;
    };
    // A re-admission after a lost disk runs first: one change at a time.
    let until = Instant::now() + super::QUIESCE_WITHIN;
    while c.readmitting.load(Ordering::Acquire) && Instant::now() < until {
        sleep(Duration::from_millis(50)).await;
        c.restart_deposed().await;
    }
    c.env
        .history
        .note(format!("n{id} joins again after healing"));
    c.readmitting.store(true, Ordering::Release);
    tokio::spawn(readmit(c.clone(), id));
}
