//! A storage error or a crash in the middle of a membership change
//! (`Kinds::change_faults`): a voter taken out and added back as the membership step
//! does it (`RAFT.REMOVE id`, then `RAFT.ADD id …`, through the command layer), but
//! one of the two changes is faulted between its request and its commit. A change is
//! two entries (the joint membership, then the new one), each committed by a majority
//! of the memberships in force; the fault lands while they are in flight:
//!
//! - a storage error armed on a member drawn (the one taking writes half the time, the
//!   voter the change is about a quarter, any member otherwise) just before the request:
//!   its next write or sync of one of its logs fails, often the change's own entry;
//! - or a crash (a power loss half the time) of such a member 0 to 30 ms after it.
//!
//! The change's reply is awaited (at most [`REPLY_WITHIN`]) and noted, whatever it is;
//! the member that went down starts again 0.1 to 1.5 s later; then the change is sent
//! again to whoever takes writes until that member's membership shows it (the
//! membership step's `change`, its attempts and bound): a change cut short must be
//! finished, or found done, by the next leader. Checked besides: the member taken out
//! takes no writes while out (from 500 ms after its removal was decided), all agree
//! within a healing's bound at the end, and the member that went down catches up.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use stockgate_server::raft::NodeId;
use tokio::time::{sleep, timeout, Instant};

use super::checks;
use super::crash::down;
use super::members::{restart, writer};
use super::membership::{change, dispatch_admin, stays_out, words};
use super::overlap::storage_error;
use super::storage_faults::caught_up;
use super::{Run, HEAL_WITHIN};

/// How long the faulted change's reply is awaited before the step goes on.
const REPLY_WITHIN: Duration = Duration::from_secs(3);

/// A voter drawn taken out and added back, one of the two changes faulted.
pub(super) async fn step(r: &Arc<Run>, rng: &mut StdRng) -> bool {
    let ids = r.env.ids.clone();
    let id = match writer(r) {
        Some(w) if rng.gen_range(0..3) == 0 => w,
        _ => ids[rng.gen_range(0..ids.len())],
    };
    let on_add = rng.gen_bool(0.5);
    let out = Duration::from_millis(rng.gen_range(500..2_500));
    let remove = super::membership::remove_argv(id);
    let add = super::membership::add_argv(id);
    let (rm, ad) = (format!("RAFT.REMOVE {id}"), format!("RAFT.ADD {id}"));
    let mut went_down = None;
    if !on_add {
        went_down = faulted(r, rng, id, &remove, &rm).await;
    }
    if change(r, &rm, &remove, |v| !v.contains(&id))
        .await
        .is_none()
        || !stays_out(r, id, Instant::now(), out).await
    {
        return false;
    }
    if on_add {
        went_down = faulted(r, rng, id, &add, &ad).await;
    }
    if change(r, &ad, &add, |v| v.contains(&id)).await.is_none() {
        return false;
    }
    let what = format!("n{id} back in the group after a faulted change");
    let Some(leader) = checks::agreement(r, &what, HEAL_WITHIN, None, None).await else {
        return false;
    };
    match went_down {
        Some(d) => caught_up(r, d, leader).await,
        None => true,
    }
}

/// Sends `argv` (`what`) to the member taking writes and faults a member drawn while
/// the change is in flight; the member that went down (if any) is started again. Which
/// member went down.
async fn faulted(
    r: &Run,
    rng: &mut StdRng,
    id: NodeId,
    argv: &[Vec<u8>],
    what: &str,
) -> Option<NodeId> {
    let leader = writer(r)?;
    let victim = match rng.gen_range(0..4) {
        0 | 1 => leader,
        2 => id,
        _ => r.env.ids[rng.gen_range(0..r.env.ids.len())],
    };
    let storage = rng.gen_bool(0.5);
    let (after, power) = (rng.gen_range(0..30), rng.gen_bool(0.5));
    // The fault's own draws, from a generator of its own: it runs beside the request.
    let mut frng = StdRng::seed_from_u64(rng.gen());
    let fault = async {
        if storage {
            // Armed at its first poll, before the request is sent.
            storage_error(r, &mut frng, victim).await
        } else {
            sleep(Duration::from_millis(after)).await;
            down(r, &mut frng, power, Some(victim)).await.map(|d| d.0)
        }
    };
    let kind = if storage { "storage error" } else { "crash" };
    r.note(format!(
        "{what} on n{leader}, a {kind} of n{victim} in flight"
    ));
    let (went_down, reply) = tokio::join!(fault, request(r, leader, argv));
    r.note(format!("{what} on n{leader} (faulted): {reply}"));
    if let Some(d) = went_down {
        sleep(Duration::from_millis(rng.gen_range(100..1_500))).await;
        if !restart(r, d).await {
            return None;
        }
    }
    went_down
}

/// One change on an admin connection to `leader`, its reply awaited (at most
/// [`REPLY_WITHIN`]), in words.
async fn request(r: &Run, leader: NodeId, argv: &[Vec<u8>]) -> String {
    match dispatch_admin(r, leader, argv) {
        None => format!("n{leader} is down"),
        Some(Ok(reply)) => words(&reply),
        Some(Err(w)) => match timeout(REPLY_WITHIN, w).await {
            Ok(reply) => words(&reply),
            Err(_) => format!("no reply within {REPLY_WITHIN:?}"),
        },
    }
}
