//! The scenario's second phase: after the fixed steps, 4 to 7 fault steps drawn from
//! the seed, each checked as the fixed ones are (one member takes writes and every member
//! that can hear it names it, within bounds; at most one writer at any instant, by the
//! monitor; an isolated leader stops claiming master). Each step puts right what it did
//! before the next (restarts its member, heals its links), so the checks know what to
//! expect; the kinds:
//!
//! - a member's process dies (`RaftNode::stop`), by a `kill -9` (its files as they are)
//!   or with the machine's power (each log file cut back to what was synced, or by the
//!   seed part of the rest, torn: `Disk::power_cut`), and starts again from its data dir
//!   after 0.1 to 1.5 s;
//! - one link cut one way or both, between any two members, for 0.3 to 1.5 s;
//! - one link flapping: cut and healed 3 to 8 times, 20 to 400 ms each;
//! - a member (the leader, half the time) cut off from all others, both ways or from
//!   sending only, as the fixed steps cut the leader off;
//! - lossy links for 1 to 2.5 s: every leg lost with a drawn chance (1 to 20 %), every
//!   delivered request delivered again with another (up to 40 %), the copy up to ten
//!   maximum delays later.
//!
//! - a voter taken out of the group and added back (`membership`).
//!
//! While a link is cut or the links are lossy, one time in three a member drawn also
//! dies (with the power half the time) and starts again before the step heals.
//!
//! And three kinds of their own files: a member stopped and continued (`pause`), a
//! storage error on a member's Raft log or WAL (`storage_faults`), a member that lost
//! its disk and is re-admitted (`amnesia`). Drawn only when on (`Kinds`), after those:
//! a restart on a flipped bit or a damaged record (`disk_faults`), three overlapping
//! faults (`overlap`), two faults of one kind at once (`doubled`), a storage error or a
//! crash in the middle of a membership change (`change_faults`) and a slow-disk leader's
//! power loss with a fast restart (`slow_leader`).
//!
//! After every step, no two members hold different entries under one log id
//! (`checks::logs_match`).

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use stockgate_server::raft::NodeId;
use stockgate_server::session::{Replication, RoleView};
use tokio::time::{sleep, Instant};

use super::checks::{self, addr_of, named, takes_writes, views};
use super::crash::down;
use super::members::{agree_then_pause, pick, restart};
use super::{Run, FAILOVER_WITHIN, HEAL_WITHIN, STEP};

/// How long a step waits for every member to be up before it starts (a deposed member
/// re-executing meanwhile).
const UP_WITHIN: Duration = Duration::from_secs(5);

/// The drawn steps; `false` when one failed (the run then ends).
pub(super) async fn random_phase(r: &Arc<Run>, rng: &mut StdRng) -> bool {
    // The member the fixed steps killed comes back first.
    let killed: Vec<NodeId> = r.killed.lock().iter().copied().collect();
    for id in killed {
        sleep(Duration::from_millis(rng.gen_range(200..1_500))).await;
        if !restart(r, id).await {
            return false;
        }
        let what = format!("n{id} back after its kill");
        if checks::agreement(r, &what, HEAL_WITHIN, None, None)
            .await
            .is_none()
        {
            return false;
        }
    }
    let steps = rng.gen_range(4..=7);
    r.note(format!("{steps} drawn fault steps"));
    for _ in 0..steps {
        sleep(Duration::from_millis(rng.gen_range(100..600))).await;
        if !all_up(r).await {
            return false;
        }
        let ok = match rng.gen_range(0..16 + r.kinds.extra()) {
            0 | 1 => crash(r, rng, true).await,
            2 => crash(r, rng, false).await,
            3 | 4 => link(r, rng).await,
            5 | 6 => flap(r, rng).await,
            7 | 8 => isolate(r, rng).await,
            9 => lossy(r, rng).await,
            10 => super::membership::out_and_back(r, rng).await,
            11 | 12 => super::pause::stop(r, rng).await,
            13 | 14 => super::storage_faults::fail_disk(r, rng).await,
            15 => super::amnesia::lose_disk(r, rng).await,
            k => newer(r, rng, k - 16).await,
        };
        if !ok || !checks::logs_match(r, "after a drawn step") {
            return false;
        }
    }
    true
}

/// The `k`th of the kinds drawn only when on (`Kinds`), in order: a flipped bit, a
/// damaged record, the three overlapping faults, a lost Raft log, two faults of one kind
/// at once (two draws), a fault during a membership change and a slow leader's power loss.
async fn newer(r: &Arc<Run>, rng: &mut StdRng, k: u32) -> bool {
    let kinds = r.kinds;
    let on = [
        kinds.bit_flips,
        kinds.damage,
        kinds.overlaps,
        kinds.overlaps,
        kinds.overlaps,
        kinds.lost_log,
        kinds.doubled,
        kinds.doubled,
        kinds.change_faults,
        kinds.slow_leader,
    ];
    let Some(kind) = on
        .iter()
        .enumerate()
        .filter(|(_, on)| **on)
        .map(|(i, _)| i)
        .nth(k as usize)
    else {
        return true;
    };
    match kind {
        0 => super::disk_faults::flip(r, rng).await,
        1 => super::disk_faults::damage(r, rng).await,
        2 => super::overlap::down_during(r, rng).await,
        3 => super::overlap::membership_during(r, rng).await,
        4 => super::overlap::stopped_crash(r, rng).await,
        5 => super::lost_log::lose_log(r, rng).await,
        6 | 7 => super::doubled::step(r, rng).await,
        8 => super::change_faults::step(r, rng).await,
        _ => super::slow_leader::power_loss(r, rng).await,
    }
}

/// Waits until every member runs; a failure if one is still down after [`UP_WITHIN`].
async fn all_up(r: &Run) -> bool {
    let start = Instant::now();
    while r.live.lock().len() < r.env.ids.len() {
        if start.elapsed() >= UP_WITHIN {
            r.fail(format!(
                "a member is still down after {UP_WITHIN:?}: {}",
                views(r)
            ));
            return false;
        }
        sleep(STEP).await;
    }
    true
}

/// Two different members drawn.
fn pick_two(r: &Run, rng: &mut StdRng) -> (NodeId, NodeId) {
    let ids = &r.env.ids;
    let a = rng.gen_range(0..ids.len());
    let b = (a + rng.gen_range(1..ids.len())) % ids.len();
    (ids[a], ids[b])
}

/// A member's process dies, with the power (`power`) or by a `kill -9`; the others
/// agree on a leader meanwhile; it starts again after a drawn while, and all agree.
async fn crash(r: &Arc<Run>, rng: &mut StdRng, power: bool) -> bool {
    let Some((id, how)) = down(r, rng, power, None).await else {
        return true;
    };
    let what = format!("n{id} down ({how})");
    if !agree_then_pause(r, rng, &what).await {
        return false;
    }
    if !restart(r, id).await {
        return false;
    }
    let what = format!("n{id} back after a {how}");
    checks::agreement(r, &what, HEAL_WITHIN, None, None)
        .await
        .is_some()
}

/// One time in three, while another fault lasts: a member drawn dies (with the power
/// half the time) and starts again after a drawn while. Nothing is checked meanwhile
/// but the monitor's rules: with a link cut as well, no majority may be left.
async fn crash_too(r: &Run, rng: &mut StdRng) -> bool {
    if rng.gen_range(0..3) != 0 {
        return true;
    }
    let power = rng.gen_bool(0.5);
    let Some((id, _)) = down(r, rng, power, None).await else {
        return true;
    };
    sleep(Duration::from_millis(rng.gen_range(100..1_500))).await;
    restart(r, id).await
}

/// One link cut, one way or both, between two members drawn: one member takes writes
/// and every member it can reach names it; then the link heals and all agree.
async fn link(r: &Arc<Run>, rng: &mut StdRng) -> bool {
    let (a, b) = pick_two(r, rng);
    let way = rng.gen_range(0..3);
    if way != 1 {
        r.env.wire.cut(a, b);
    }
    if way != 0 {
        r.env.wire.cut(b, a);
    }
    let arrow = ["->", "<-", "<->"][way];
    r.note(format!("link n{a} {arrow} n{b} cut"));
    let what = format!("link n{a} {arrow} n{b} cut");
    if heard(r, &what, FAILOVER_WITHIN).await.is_none() {
        return false;
    }
    sleep(Duration::from_millis(rng.gen_range(300..1_500))).await;
    // Again once the cut has had its effect (an election it prompted, say).
    let what = format!("link n{a} {arrow} n{b} still cut");
    if heard(r, &what, FAILOVER_WITHIN).await.is_none() || !crash_too(r, rng).await {
        return false;
    }
    heal(r, "links healed").await
}

/// One link, one way or both, cut and healed in turn, then healed for good.
async fn flap(r: &Arc<Run>, rng: &mut StdRng) -> bool {
    let (a, b) = pick_two(r, rng);
    let both = rng.gen_bool(0.5);
    let times = rng.gen_range(3..=8);
    let arrow = if both { "<->" } else { "->" };
    r.note(format!("link n{a} {arrow} n{b} flaps {times} times"));
    for _ in 0..times {
        r.env.wire.cut(a, b);
        if both {
            r.env.wire.cut(b, a);
        }
        sleep(Duration::from_millis(rng.gen_range(20..400))).await;
        r.env.wire.uncut(a, b);
        r.env.wire.uncut(b, a);
        sleep(Duration::from_millis(rng.gen_range(20..400))).await;
    }
    heal(r, "flapping over").await
}

/// A member drawn (the leader half the time) cut off from all the others, both ways or
/// from sending only: the fixed steps' cut, on any member.
async fn isolate(r: &Arc<Run>, rng: &mut StdRng) -> bool {
    let id = pick(r, rng);
    let both = rng.gen_bool(0.5);
    super::cut_off(r, rng, id, both).await.is_some()
}

/// Every leg lost with a drawn chance and every request delivered again with another,
/// for a drawn while; then the links are clean again and all agree.
async fn lossy(r: &Arc<Run>, rng: &mut StdRng) -> bool {
    let loss = rng.gen_range(10..=200);
    let dup = rng.gen_range(0..=400);
    let ms = rng.gen_range(1_000..2_500);
    r.note(format!(
        "lossy links for {ms} ms: {loss} legs in 1000 lost, {dup} requests in 1000 twice"
    ));
    r.env.wire.set_lossy(Some((loss, dup)));
    sleep(Duration::from_millis(ms / 2)).await;
    if !crash_too(r, rng).await {
        return false;
    }
    sleep(Duration::from_millis(ms / 2)).await;
    r.env.wire.set_lossy(None);
    let twice = r.env.wire.duplicated();
    r.note(format!("{twice} requests delivered twice so far"));
    heal(r, "links clean").await
}

/// Heals every link; every member names the one that takes writes.
async fn heal(r: &Run, what: &str) -> bool {
    r.env.wire.heal();
    r.note(what.to_owned());
    checks::agreement(r, what, HEAL_WITHIN, None, None)
        .await
        .is_some()
}

/// The one member that takes writes, if it says it leads, every live member linked to
/// it both ways names it, and one that hears it but cannot answer names it or nobody. A
/// member that hears the
/// leader but whose answers are lost may stand for election again and again in terms
/// the leader never hears of, naming nobody meanwhile (docs/simulation.md); a member
/// that cannot hear it may not know it.
fn agreed_by_hearers(r: &Run) -> Option<NodeId> {
    let live = r.live.lock();
    let writers: Vec<NodeId> = live
        .values()
        .filter(|n| takes_writes(n))
        .map(|n| n.id)
        .collect();
    let [w] = writers[..] else {
        return None;
    };
    let leads = live
        .get(&w)
        .is_some_and(|n| matches!(Replication::role(&*n.node), RoleView::Leader { .. }));
    let want = Some(addr_of(w));
    let wire = &r.env.wire;
    let all_name = live.values().filter(|n| !n.gate.is_stopped()).all(|n| {
        let (hears, answers) = (!wire.is_cut(w, n.id), !wire.is_cut(n.id, w));
        let names = named(n);
        !hears || names == want || (!answers && names.is_none())
    });
    (leads && all_name).then_some(w)
}

/// Waits (at most `within`) for [`agreed_by_hearers`]; `None` (a failure) if it never
/// holds.
async fn heard(r: &Run, what: &str, within: Duration) -> Option<NodeId> {
    let start = Instant::now();
    loop {
        if let Some(l) = agreed_by_hearers(r) {
            let ms = start.elapsed().as_millis();
            r.note(format!(
                "{what}: n{l} takes writes and every member linked to it names it, after {ms} ms"
            ));
            return Some(l);
        }
        if start.elapsed() >= within {
            r.fail(format!(
                "{what}: no member named by those linked to it within {within:?} ({})",
                views(r)
            ));
            return None;
        }
        sleep(STEP).await;
    }
}

/// The end of the run: every link healed and clean, every member up, and all naming
/// the one that takes writes.
pub(super) async fn all_healed(r: &Run) -> bool {
    r.env.wire.set_lossy(None);
    all_up(r).await && heal(r, "all healed, all up").await
}
