//! Two faults of one kind at once (`Kinds::doubled`): the other drawn steps fault one
//! member or one link at a time, and the overlapping ones (`overlap`) two of different
//! kinds. One of four, drawn:
//!
//! - two members' storage errors armed together (each the next write or sync of one of
//!   its logs, as `storage_faults` arms it), each member exiting on its own, both
//!   started again on healed disks;
//! - two members stopped (`SIGSTOP`), the second 0 to 500 ms after the first, each for
//!   0.3 to 3 s, continued in turn;
//! - two links cut by two different cuts (different pairs, each one way or both), the
//!   second 0.1 to 0.6 s after the first, each healed at its own time;
//! - a storage error, then the disk still failing when the supervisor starts the member
//!   again: the new process's next write or sync of one of its logs fails too, and it
//!   exits again before the disk is healed and it starts a third time.
//!
//! With three members two faults leave no majority, so nothing is asked of the group
//! while both last but the monitor's rules (at most one member takes writes), and the
//! stopped members' lease rule as they continue; with a majority still up and linked
//! (five members, or a storage error that hit nothing), the others agree within a
//! crash's bound. Once everything is put right, all agree within a healing's bound and
//! every member that went down catches up.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use stockgate_server::raft::NodeId;
use tokio::time::{sleep, sleep_until, Instant};

use super::checks;
use super::members::{pick, restart};
use super::overlap::storage_error;
use super::pause::continued_at_once;
use super::storage_faults::caught_up;
use super::{Run, FAILOVER_WITHIN, HEAL_WITHIN};

/// One of the four, drawn.
pub(super) async fn step(r: &Arc<Run>, rng: &mut StdRng) -> bool {
    match rng.gen_range(0..4) {
        0 => two_storage_errors(r, rng).await,
        1 => two_stops(r, rng).await,
        2 => two_links(r, rng).await,
        _ => storage_error_again(r, rng).await,
    }
}

/// Two different members: one drawn as `pick` draws (the one taking writes half the
/// time), the other any other.
fn two_members(r: &Run, rng: &mut StdRng) -> (NodeId, NodeId) {
    let a = pick(r, rng);
    let others: Vec<NodeId> = r.env.ids.iter().copied().filter(|i| *i != a).collect();
    (a, others[rng.gen_range(0..others.len())])
}

/// Whether more than half the members run, continued.
fn majority_up(r: &Run) -> bool {
    let up = r
        .live
        .lock()
        .values()
        .filter(|n| !n.gate.is_stopped())
        .count();
    up > r.env.ids.len() / 2
}

/// Both members' storage errors armed at once; each that hits ends its member (the
/// server's exit), and each starts again on a healed disk.
async fn two_storage_errors(r: &Arc<Run>, rng: &mut StdRng) -> bool {
    let (a, b) = two_members(r, rng);
    // Each error's draws from a generator of its own: the two wait side by side.
    let mut ra = StdRng::seed_from_u64(rng.gen());
    let mut rb = StdRng::seed_from_u64(rng.gen());
    r.note(format!("n{a} and n{b}: storage errors armed together"));
    let (da, db) = tokio::join!(storage_error(r, &mut ra, a), storage_error(r, &mut rb, b));
    let down: Vec<NodeId> = [da, db].into_iter().flatten().collect();
    back_up(r, rng, &down, "both storage errors").await
        && all_back(r, &down, "both storage errors put right").await
}

/// The members in `down` (gone on their faults) start again in turn, 0.1 to 1.5 s
/// apart; while a majority is up the others agree within a crash's bound first.
async fn back_up(r: &Run, rng: &mut StdRng, down: &[NodeId], what: &str) -> bool {
    if !down.is_empty() && majority_up(r) {
        let while_down = format!("{what}: {down:?} down");
        if checks::agreement(r, &while_down, FAILOVER_WITHIN, None, None)
            .await
            .is_none()
        {
            return false;
        }
    }
    for &id in down {
        sleep(Duration::from_millis(rng.gen_range(100..1_500))).await;
        r.note(format!("n{id} disk healed"));
        if !restart(r, id).await {
            return false;
        }
    }
    true
}

/// All agree within [`HEAL_WITHIN`], and each member of `down` catches up.
async fn all_back(r: &Run, down: &[NodeId], what: &str) -> bool {
    let Some(leader) = checks::agreement(r, what, HEAL_WITHIN, None, None).await else {
        return false;
    };
    for &id in down {
        if !caught_up(r, id, leader).await {
            return false;
        }
    }
    true
}

/// Two members stopped, the second a while after the first, each continued at its own
/// time (the lease rule checked as each continues).
async fn two_stops(r: &Arc<Run>, rng: &mut StdRng) -> bool {
    let (a, b) = two_members(r, rng);
    let (ma, mb) = (rng.gen_range(300..3_000), rng.gen_range(300..3_000));
    let gap = rng.gen_range(0..500);
    let (ga, gb) = (r.env.gate(a), r.env.gate(b));
    ga.stop();
    let until_a = Instant::now() + Duration::from_millis(ma);
    r.note(format!("n{a} stopped (SIGSTOP) for {ma} ms"));
    sleep(Duration::from_millis(gap)).await;
    gb.stop();
    let until_b = Instant::now() + Duration::from_millis(mb);
    r.note(format!("n{b} stopped (SIGSTOP) for {mb} ms as well"));
    let mut ends = [(until_a, a, ma, ga), (until_b, b, mb, gb)];
    ends.sort_by_key(|e| (e.0, e.1));
    for (until, id, ms, gate) in ends {
        sleep_until(until).await;
        gate.resume();
        continued_at_once(r, id, ms);
    }
    all_back(r, &[], "both stopped members continued").await
}

/// Two different links cut by two cuts, each one way or both, each healed at its time.
async fn two_links(r: &Arc<Run>, rng: &mut StdRng) -> bool {
    let ids = &r.env.ids;
    let mut pairs = Vec::new();
    for (i, &x) in ids.iter().enumerate() {
        for &y in &ids[i + 1..] {
            pairs.push((x, y));
        }
    }
    let first = pairs.swap_remove(rng.gen_range(0..pairs.len()));
    let until_1 = cut(r, rng, first);
    sleep(Duration::from_millis(rng.gen_range(100..600))).await;
    let second = pairs[rng.gen_range(0..pairs.len())];
    let until_2 = cut(r, rng, second);
    let mut ends = [(until_1, first), (until_2, second)];
    ends.sort();
    for (until, (x, y)) in ends {
        sleep_until(until).await;
        r.env.wire.uncut(x, y);
        r.env.wire.uncut(y, x);
        r.note(format!("link n{x} <-> n{y} healed"));
    }
    r.env.wire.heal();
    all_back(r, &[], "both links healed").await
}

/// Cuts the link between `pair`, one way (drawn) or both, for 0.3 to 3 s: when it heals.
fn cut(r: &Run, rng: &mut StdRng, (x, y): (NodeId, NodeId)) -> Instant {
    let until = Instant::now() + Duration::from_millis(rng.gen_range(300..3_000));
    let way = rng.gen_range(0..3);
    if way != 1 {
        r.env.wire.cut(x, y);
    }
    if way != 0 {
        r.env.wire.cut(y, x);
    }
    let arrow = ["->", "<-", "<->"][way];
    let ms = (until - Instant::now()).as_millis();
    r.note(format!("link n{x} {arrow} n{y} cut for {ms} ms"));
    until
}

/// A storage error ends a member; the supervisor starts it again on a disk that still
/// fails (full, say): its next write or sync fails too and it exits again; the disk is
/// then healed and it starts a third time.
async fn storage_error_again(r: &Arc<Run>, rng: &mut StdRng) -> bool {
    let id = pick(r, rng);
    let Some(id) = storage_error(r, rng, id).await else {
        return true;
    };
    if majority_up(r) {
        let what = format!("n{id} down (storage error)");
        if checks::agreement(r, &what, FAILOVER_WITHIN, None, None)
            .await
            .is_none()
        {
            return false;
        }
    }
    sleep(Duration::from_millis(rng.gen_range(100..1_500))).await;
    r.note(format!("n{id} starts again on a disk still failing"));
    if !restart(r, id).await {
        return false;
    }
    let again: Vec<NodeId> = storage_error(r, rng, id).await.into_iter().collect();
    let what = format!("n{id}'s second storage error");
    back_up(r, rng, &again, &what).await && all_back(r, &[id], &format!("{what} put right")).await
}
