//! A member stopped and continued, as `SIGSTOP` and `SIGCONT` stop and continue its
//! process: its task gate (`gate`) is closed for a drawn while, so none of its tasks is
//! polled, openraft's included (no heartbeat, no election timeout, no append handled),
//! and no request a peer sends it is answered (each waits in the member's "socket" and
//! is handled when it continues, whether or not its caller still waits). Its timers
//! fall due meanwhile; what waits on them runs when it continues. Its files and its
//! place on the wire stay as they are: a peer connects to it (the kernel accepts) and
//! times out waiting for the answer.
//!
//! Checked: with a stop longer than a failover takes, the others elect and name a
//! leader meanwhile (within the bound a crash has); right as it continues, before any
//! of its tasks has run, a member stopped for longer than its lease does not claim
//! master (its lease is counted on the clock, not by its tasks); after it continues all
//! agree again; the monitor's rule holds throughout (at most one member takes writes),
//! and the end's checks find every acknowledged outcome on every member (an old leader
//! answering a waiting write as committed would show there).

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use stockgate_server::raft::NodeId;
use tokio::time::{sleep, sleep_until, Instant};

use super::checks::{self, claims_master, takes_writes};
use super::members::pick;
use super::{Run, FAILOVER_WITHIN, GIVE_UP_SLACK, HEAL_WITHIN, STEP, TIMING};

/// One member stopped for 0.3 to 3 s, one time in three 4 to 6 s (long enough for the
/// others to elect a leader within [`FAILOVER_WITHIN`]); then it continues.
pub(super) async fn stop(r: &Arc<Run>, rng: &mut StdRng) -> bool {
    let id = pick(r, rng);
    let long = rng.gen_range(0..3) == 0;
    let ms = if long {
        rng.gen_range(4_000..6_000)
    } else {
        rng.gen_range(300..3_000)
    };
    let writer = r.live.lock().get(&id).is_some_and(takes_writes);
    let gate = r.env.gate(id);
    gate.stop();
    let until = Instant::now() + Duration::from_millis(ms);
    let role = if writer { ", taking writes" } else { "" };
    r.note(format!("n{id} stopped (SIGSTOP) for {ms} ms{role}"));
    if long {
        let what = format!("n{id} stopped");
        if checks::agreement(r, &what, FAILOVER_WITHIN, Some(id), None)
            .await
            .is_none()
        {
            gate.resume();
            return false;
        }
    }
    sleep_until(until).await;
    gate.resume();
    continued_at_once(r, id, ms);
    let what = format!("n{id} continued");
    checks::agreement(r, &what, HEAL_WITHIN, None, None)
        .await
        .is_some()
}

/// Right as member `id` continues, before any of its tasks runs: a member stopped for
/// longer than its lease (the shortest election timeout, plus the checks' slack) must
/// not present itself as the master, since a newer leader may have been elected.
pub(super) fn continued_at_once(r: &Run, id: NodeId, ms: u64) {
    let claims = r.live.lock().get(&id).is_some_and(claims_master);
    let lease = Duration::from_millis(TIMING.1) + GIVE_UP_SLACK;
    let how = if claims {
        "claims master"
    } else {
        "does not claim master"
    };
    r.note(format!("n{id} continues (SIGCONT): {how}"));
    if claims && Duration::from_millis(ms) > lease {
        r.fail(format!(
            "n{id}, stopped for {ms} ms, claims master as it continues ({})",
            checks::views(r)
        ));
    }
}

/// Waits while member `id` is stopped, at most `within`: `false` if it still is then (a
/// client's command to it is not read meanwhile, and its reply times out).
pub(super) async fn continued(r: &Run, id: NodeId, within: Duration) -> bool {
    let gate = r.env.gate(id);
    let start = Instant::now();
    while gate.is_stopped() {
        if start.elapsed() >= within {
            return false;
        }
        sleep(STEP).await;
    }
    true
}
