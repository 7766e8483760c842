//! A drawn step of the second phase: a voter taken out of the group and added back, as
//! an operator does it, with `RAFT.REMOVE id` and then `RAFT.ADD id client-addr
//! raft-addr` sent to the member taking writes through the command layer
//! (`cmd::dispatch`, the reply being the deferred one a connection waits for).
//!
//! The voter drawn is the leader one time in three. While it is out the others (a
//! majority of the smaller group) elect and name a leader, the member taken out never
//! takes writes once its removal is decided, and the command client goes on; when it
//! is back, every member names the one leader again and, at the end, holds every
//! acknowledged outcome. A change the group refuses or does not decide in time (the
//! leader changing under it) is noted and sent again to whoever takes writes then: the
//! step ends only with every member a voter again. Adding the member back must leave
//! the leadership where it was: a member taken out that raised its term meanwhile
//! would depose the leader as soon as it is sent the log again.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use stockgate_server::cmd::{dispatch, Ctx, Deferred};
use stockgate_server::protocol::Reply;
use stockgate_server::raft::{NodeId, RaftNode};
use stockgate_server::session::{ConnState, MemberRole, Replication};
use stockgate_server::users::Role;
use tokio::time::{sleep, timeout, Instant};

use super::checks::{self, takes_writes, views};
use super::members::writer;
use super::{Run, FAILOVER_WITHIN, HEAL_WITHIN, STEP};
use crate::wire::{client_addr, raft_addr};

/// How long one change may take before the step asks again: a learner catching up
/// from the log, then joint consensus, with room for a leader change.
const CHANGE_WITHIN: Duration = Duration::from_secs(10);
/// Attempts of one change before the step fails.
const ATTEMPTS: u32 = 8;
/// After the removal is decided, the member taken out may still take writes for this
/// long: a leader that removed itself steps down once the change commits, as soon as it
/// learns that it did.
const STEP_DOWN_WITHIN: Duration = Duration::from_millis(500);

/// Takes a voter drawn out and back; `false` when a check failed.
pub(super) async fn out_and_back(r: &Arc<Run>, rng: &mut StdRng) -> bool {
    let ids = &r.env.ids;
    let id = match writer(r) {
        Some(w) if rng.gen_range(0..3) == 0 => w,
        _ => ids[rng.gen_range(0..ids.len())],
    };
    let remove = remove_argv(id);
    if change(r, &format!("RAFT.REMOVE {id}"), &remove, |v| {
        !v.contains(&id)
    })
    .await
    .is_none()
    {
        return false;
    }
    let decided = Instant::now();
    let out = Duration::from_millis(rng.gen_range(500..2_500));
    let what = format!("n{id} out of the group");
    if checks::agreement(r, &what, FAILOVER_WITHIN, Some(id), None)
        .await
        .is_none()
        || !stays_out(r, id, decided, out).await
    {
        return false;
    }
    let add = add_argv(id);
    let before = leader_process(r);
    let Some(tries) = change(r, &format!("RAFT.ADD {id}"), &add, |v| v.contains(&id)).await else {
        return false;
    };
    let what = format!("n{id} back in the group");
    if checks::agreement(r, &what, HEAL_WITHIN, None, None)
        .await
        .is_none()
    {
        return false;
    }
    let after = leader_process(r);
    let kept = matches!((&before, &after), (Some(a), Some(b)) if Arc::ptr_eq(&a.1, &b.1));
    if tries > 1 || !kept {
        r.fail(format!(
            "RAFT.ADD {id} took {tries} attempts and the leadership went from {:?} to {:?} (a new process or member) with no fault",
            before.map(|n| n.0),
            after.map(|n| n.0)
        ));
        return false;
    }
    true
}

/// `RAFT.REMOVE id`, as an operator sends it.
pub(super) fn remove_argv(id: NodeId) -> Vec<Vec<u8>> {
    vec![b"RAFT.REMOVE".to_vec(), id.to_string().into_bytes()]
}

/// `RAFT.ADD id client-addr raft-addr`, as an operator sends it.
pub(super) fn add_argv(id: NodeId) -> Vec<Vec<u8>> {
    vec![
        b"RAFT.ADD".to_vec(),
        id.to_string().into_bytes(),
        client_addr(id).into_bytes(),
        raft_addr(id).into_bytes(),
    ]
}

/// The process of the member taking writes now.
fn leader_process(r: &Run) -> Option<(NodeId, Arc<RaftNode>)> {
    let w = writer(r)?;
    r.live.lock().get(&w).map(|n| (w, n.node.clone()))
}

/// Until `out` has passed since the removal was decided: the member taken out takes
/// no writes (after [`STEP_DOWN_WITHIN`]).
pub(super) async fn stays_out(r: &Run, id: NodeId, decided: Instant, out: Duration) -> bool {
    while decided.elapsed() < out {
        let writes = r.live.lock().get(&id).is_some_and(takes_writes);
        if writes && decided.elapsed() >= STEP_DOWN_WITHIN {
            r.fail(format!(
                "n{id}, out of the group, takes writes {} ms after its removal ({})",
                decided.elapsed().as_millis(),
                views(r)
            ));
            return false;
        }
        sleep(STEP).await;
    }
    true
}

/// Sends `argv` to the member taking writes until the voters it reports satisfy
/// `done`: the attempts it took, or a failure after [`ATTEMPTS`].
pub(super) async fn change(
    r: &Run,
    what: &str,
    argv: &[Vec<u8>],
    done: impl Fn(&[NodeId]) -> bool,
) -> Option<u32> {
    for attempt in 1..=ATTEMPTS {
        // No member takes writes while no majority is up and connected (a fault still
        // lasting beside the change): liveness is owed only once one is, so the wait
        // counts as an attempt and the next one waits again.
        let Some(leader) = wait_writer(r).await else {
            r.note(format!(
                "{what}: no member takes writes (attempt {attempt})"
            ));
            continue;
        };
        let reply = send(r, leader, argv).await;
        r.note(format!("{what} on n{leader}: {reply}"));
        if voters(r, leader).is_some_and(|v| done(&v)) {
            return Some(attempt);
        }
        sleep(Duration::from_millis(200)).await;
    }
    r.fail(format!(
        "{what}: not decided after {ATTEMPTS} attempts ({})",
        views(r)
    ));
    None
}

/// The member taking writes, waiting for one up to [`FAILOVER_WITHIN`].
async fn wait_writer(r: &Run) -> Option<NodeId> {
    let start = Instant::now();
    while start.elapsed() < FAILOVER_WITHIN {
        if let Some(w) = writer(r) {
            return Some(w);
        }
        sleep(STEP).await;
    }
    None
}

/// One command on an admin connection to `id`, its deferred reply awaited (at most
/// [`CHANGE_WITHIN`]): the reply in words.
async fn send(r: &Run, id: NodeId, argv: &[Vec<u8>]) -> String {
    let Some(out) = dispatch_admin(r, id, argv) else {
        return format!("n{id} is down");
    };
    let reply = match out {
        Err(w) => match timeout(CHANGE_WITHIN, w).await {
            Ok(reply) => reply,
            Err(_) => return format!("no reply within {CHANGE_WITHIN:?}"),
        },
        Ok(reply) => reply,
    };
    words(&reply)
}

/// One command line on an admin connection to `id` (`cmd::dispatch`): its reply, or
/// (`Err`) the deferred reply a connection awaits; `None` when `id` is down.
pub(super) fn dispatch_admin(
    r: &Run,
    id: NodeId,
    argv: &[Vec<u8>],
) -> Option<Result<Reply, Deferred>> {
    let (engine, shared) = {
        let live = r.live.lock();
        let n = live.get(&id)?;
        (n.engine.clone(), n.shared.clone())
    };
    let refs: Vec<&[u8]> = argv.iter().map(|w| w.as_slice()).collect();
    let mut conn = ConnState::new(1, Some(Role::Admin), "sim".into(), "sim".into());
    let mut ctx = Ctx {
        engine: &engine,
        conn: &mut conn,
        shared: &shared,
    };
    let out = dispatch(&mut ctx, &refs);
    Some(match out.wait {
        Some(w) => Err(w),
        None => Ok(out.reply),
    })
}

/// A reply in words, as the history notes it.
pub(super) fn words(reply: &Reply) -> String {
    match reply {
        Reply::Simple(s) => (*s).to_owned(),
        Reply::Error(e) => format!("-{e}"),
        other => format!("{other:?}"),
    }
}

/// The voters member `id` reports (`RAFT.MEMBERS`), if it runs.
fn voters(r: &Run, id: NodeId) -> Option<Vec<NodeId>> {
    let live = r.live.lock();
    let rows = Replication::members(&*live.get(&id)?.node)?;
    let voting = rows
        .into_iter()
        .filter(|m| matches!(m.role, MemberRole::Voter | MemberRole::Leader));
    Some(voting.map(|m| m.id).collect())
}
