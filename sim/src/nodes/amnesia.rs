//! A member loses its disk: its process killed, its data dir removed, and the member
//! started again on an empty one, as docs/replication.md ("A member lost its disk") tells
//! an operator to: its usual command line with `--rejoin-empty` (it never forms a group),
//! new storage with a new incarnation (drawn from the seed), then `RAFT.READMIT <id>` on
//! the leader, as a command line on an admin connection (`cmd::dispatch`, its deferred
//! reply awaited under the leader's gate; with `Kinds::readmit_command` off, through
//! `Replication::raft_change`, as the command layer calls it), retried on whoever leads
//! until it succeeds: out of the membership, back as a learner under the new storage,
//! caught up, a voter again. A member whose start refused a damaged log comes back the
//! same way ([`rejoin`], from `disk_faults`), and so does one that lost its Raft log
//! alone ([`readmitted`], from `lost_log`).
//!
//! One time in three, before the re-admission, the member taking writes is cut off for
//! a while, so that the others stand for election and ask the member that lost its
//! disk for its vote ([`leader_lost`]).
//!
//! Checked: the others elect and name a leader while it is down; until the group
//! re-admits it, the member that lost its votes casts none (its Raft vote is never a
//! vote granted to a candidate, sampled every few milliseconds) and stands for nothing
//! (it never leads nor takes writes); once re-admitted, all agree and it catches up. The
//! end's checks find every acknowledged outcome on it too.

use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use openraft::Vote;
use rand::rngs::StdRng;
use rand::Rng;
use stockgate_server::cmd::Deferred;
use stockgate_server::protocol::Reply;
use stockgate_server::raft::runtime::under_gate;
use stockgate_server::raft::{NodeId, RaftNode};
use stockgate_server::session::{RaftChange, RaftChangeFuture, RaftError, Replication};
use tokio::time::{sleep, timeout, Instant};

use super::checks;
use super::members::{pick, writer};
use super::membership::{dispatch_admin, words};
use super::storage_faults::caught_up;
use super::{boot, Run, HEAL_WITHIN, STEP};
use crate::disk::Disk;
use crate::gate::Gate;

/// What `Replication::raft_change` answers.
type Change = Result<RaftChangeFuture, RaftError>;

/// The re-admission is retried until this has passed since the member started again.
const READMIT_WITHIN: Duration = Duration::from_secs(30);
/// One `RAFT.READMIT` is given up after this (its leader lost meanwhile).
const CHANGE_WITHIN: Duration = Duration::from_secs(10);

/// A member drawn loses its disk and comes back empty; the group re-admits it.
pub(super) async fn lose_disk(r: &Arc<Run>, rng: &mut StdRng) -> bool {
    let id = pick(r, rng);
    let Some(n) = r.live.lock().remove(&id) else {
        return true;
    };
    n.kill().await;
    wiped(r, rng, id, "loses its disk: killed, data dir wiped").await
}

/// Member `id`, down, has its data dir wiped by the operator (its start refused a
/// damaged log) and comes back empty; the group re-admits it.
pub(super) async fn rejoin(r: &Arc<Run>, rng: &mut StdRng, id: NodeId) -> bool {
    wiped(r, rng, id, "data dir wiped by the operator").await
}

/// Member `id` (down) on an empty data dir, then started with `--rejoin-empty` and
/// re-admitted; `how` says why in the history.
async fn wiped(r: &Arc<Run>, rng: &mut StdRng, id: NodeId, how: &str) -> bool {
    let dir = r.env.dir(id);
    if let Err(e) = std::fs::remove_dir_all(&dir) {
        r.fail(format!("the harness cannot remove {}: {e}", dir.display()));
        return false;
    }
    r.env.disks.lock().insert(id, Disk::new(id, dir));
    r.note(format!("n{id} {how}"));
    let what = format!("n{id} down (disk lost)");
    if !super::members::agree_then_pause(r, rng, &what).await {
        return false;
    }
    let incarnation = rng.gen::<u64>().max(1);
    match boot::start_empty(&r.env, id, incarnation).await {
        Ok(n) => {
            r.note(format!(
                "n{id} starts on an empty data dir (--rejoin-empty, storage {incarnation:016x})"
            ));
            r.live.lock().insert(id, n);
        }
        Err(e) => {
            r.fail(format!("n{id} refuses to start on an empty data dir: {e}"));
            return false;
        }
    }
    readmitted(r, rng, id, incarnation).await
}

/// Member `id`, started with `--rejoin-empty` on new storage of `incarnation`: one time
/// in three the leader is lost first ([`leader_lost`]); then the group re-admits it, all
/// agree, and it catches up.
pub(super) async fn readmitted(
    r: &Arc<Run>,
    rng: &mut StdRng,
    id: NodeId,
    incarnation: u64,
) -> bool {
    if rng.gen_range(0..3) == 0 && !leader_lost(r, rng, id, incarnation).await {
        return false;
    }
    if !readmit(r, id, incarnation).await {
        return false;
    }
    let what = format!("n{id} re-admitted");
    let Some(leader) = checks::agreement(r, &what, HEAL_WITHIN, None, None).await else {
        return false;
    };
    caught_up(r, id, leader).await
}

/// Before the re-admission, the member taking writes is cut off both ways for 1 to 2.5
/// s: the others stand for election, and ask member `id` for its vote too. Its votes
/// were lost with its disk, so it must cast none: with three members the one left
/// cannot win then (no leader until the links heal), with five the other three elect
/// one. After healing, all but `id` agree on a leader.
async fn leader_lost(r: &Arc<Run>, rng: &mut StdRng, id: NodeId, incarnation: u64) -> bool {
    let Some(leader) = writer(r).filter(|l| *l != id) else {
        return true;
    };
    r.env.wire.isolate(leader, &r.ids());
    // The monitor's rule for a member cut off: it stops claiming master.
    *r.isolated.lock() = Some((leader, Instant::now()));
    r.note(format!(
        "n{leader} cut off both ways, n{id} not yet re-admitted"
    ));
    let until = Instant::now() + Duration::from_millis(rng.gen_range(1_000..2_500));
    let mut started = None;
    while Instant::now() < until {
        if let Some(why) = votes_unadmitted(r, id, incarnation, &mut started) {
            r.fail(why);
            return false;
        }
        sleep(STEP).await;
    }
    let who = writer(r).map_or("none".to_owned(), |w| format!("n{w}"));
    r.note(format!(
        "links healed (taking writes at the healing: {who})"
    ));
    r.env.wire.heal();
    *r.isolated.lock() = None;
    let what = format!("healed, n{id} not yet re-admitted");
    checks::agreement(r, &what, HEAL_WITHIN, Some(id), None)
        .await
        .is_some()
}

/// `RAFT.READMIT id` on whoever takes writes, again until one succeeds (or finds it
/// done), then until member `id` knows itself a voter under `incarnation`; meanwhile it
/// must cast no vote ([`votes_unadmitted`]).
async fn readmit(r: &Arc<Run>, id: NodeId, incarnation: u64) -> bool {
    let start = Instant::now();
    let (mut tries, mut done) = (0, false);
    let mut started = None;
    while !admitted(r, id, incarnation) {
        if start.elapsed() >= READMIT_WITHIN {
            r.fail(format!(
                "n{id} not re-admitted within {READMIT_WITHIN:?} ({tries} RAFT.READMIT; {})",
                checks::views(r)
            ));
            return false;
        }
        if let Some(why) = votes_unadmitted(r, id, incarnation, &mut started) {
            r.fail(why);
            return false;
        }
        if done {
            sleep(STEP).await;
            continue;
        }
        let Some((l, gate, change)) = readmit_on_writer(r, id) else {
            sleep(STEP).await;
            continue;
        };
        tries += 1;
        let outcome = match change {
            Sent::Change(change) => changed(r, (id, incarnation), gate, change).await,
            Sent::Line(line) => answered(r, (id, incarnation), gate, line).await,
        };
        done = outcome.is_ok();
        let (Ok(how) | Err(how)) = outcome;
        r.note(format!("RAFT.READMIT {id} on n{l}: {how}"));
        if !done {
            sleep(Duration::from_millis(200)).await;
        }
    }
    let ms = start.elapsed().as_millis();
    r.note(format!(
        "n{id} a voter again under its new storage after {ms} ms ({tries} RAFT.READMIT)"
    ));
    true
}

/// How `RAFT.READMIT` was sent: through `Replication::raft_change`, as the command
/// layer calls it, or as a command line (`Kinds::readmit_command`).
enum Sent {
    Change(Change),
    Line(Result<Reply, Deferred>),
}

/// `RAFT.READMIT id` on the member taking writes (not `id`): its id, its gate and the
/// change, if one takes writes.
fn readmit_on_writer(r: &Run, id: NodeId) -> Option<(NodeId, Arc<Gate>, Sent)> {
    let l = writer(r).filter(|l| *l != id)?;
    if r.kinds.readmit_command {
        let gate = r.live.lock().get(&l)?.gate.clone();
        let argv = [b"RAFT.READMIT".to_vec(), id.to_string().into_bytes()];
        let line = dispatch_admin(r, l, &argv)?;
        return Some((l, gate, Sent::Line(line)));
    }
    let live = r.live.lock();
    let n = live.get(&l)?;
    let change = Replication::raft_change(&*n.node, RaftChange::Readmit(id));
    Some((l, n.gate.clone(), Sent::Change(change)))
}

/// What one `RAFT.READMIT` through `Replication::raft_change` came to, awaited under the
/// leader's gate while member `id` is watched: `Ok` when done.
async fn changed(
    r: &Run,
    (id, incarnation): (NodeId, u64),
    gate: Arc<Gate>,
    change: Change,
) -> Result<String, String> {
    let f = match change {
        Err(e) => return Err(format!("refused: {e}")),
        Ok(f) => f,
    };
    match timeout(
        CHANGE_WITHIN,
        watched(r, id, incarnation, under_gate(gate, f)),
    )
    .await
    {
        Ok(Ok(())) => Ok("done".to_owned()),
        Ok(Err(RaftError::SameIncarnation { .. })) => Ok("done already".to_owned()),
        Ok(Err(e)) => Err(format!("failed: {e}")),
        Err(_) => Err(format!("not done within {CHANGE_WITHIN:?}")),
    }
}

/// What one `RAFT.READMIT` command line came to: its reply (awaited, when deferred, as
/// the leader's connection awaits it, while member `id` is watched); `Ok` on `+OK`, or
/// on the refusal that says the member already runs on the storage the group admitted.
async fn answered(
    r: &Run,
    (id, incarnation): (NodeId, u64),
    gate: Arc<Gate>,
    line: Result<Reply, Deferred>,
) -> Result<String, String> {
    let reply = match line {
        Ok(reply) => reply,
        Err(w) => match timeout(
            CHANGE_WITHIN,
            watched(r, id, incarnation, under_gate(gate, w)),
        )
        .await
        {
            Ok(reply) => reply,
            Err(_) => return Err(format!("no reply within {CHANGE_WITHIN:?}")),
        },
    };
    let text = words(&reply);
    match reply {
        Reply::Simple("OK") => Ok(text),
        Reply::Error(e) if e.contains("still runs on the storage the group admitted") => {
            Ok(format!("done already ({text})"))
        }
        _ => Err(text),
    }
}

/// `f`, while checking every few milliseconds that member `id` casts no vote before it
/// is re-admitted (a failure if it does; the change goes on).
async fn watched<F, T>(r: &Run, id: NodeId, incarnation: u64, f: F) -> T
where
    F: std::future::Future<Output = T>,
{
    tokio::pin!(f);
    let mut failed = false;
    let mut started = None;
    loop {
        tokio::select! {
            biased;
            out = &mut f => return out,
            _ = sleep(STEP) => {
                if failed || admitted(r, id, incarnation) {
                    continue;
                }
                if let Some(why) = votes_unadmitted(r, id, incarnation, &mut started) {
                    failed = true;
                    r.fail(why);
                }
            }
        }
    }
}

/// Whether member `id`'s running process knows itself a voter under `incarnation`.
fn admitted(r: &Run, id: NodeId, incarnation: u64) -> bool {
    let live = r.live.lock();
    let Some(n) = live.get(&id) else {
        return false;
    };
    let m = n.node.raft.metrics().borrow().clone();
    let ms = m.membership_config.membership();
    let voter = ms.voter_ids().any(|v| v == id);
    voter
        && ms
            .get_node(&id)
            .is_some_and(|i| i.incarnation == incarnation)
}

/// What member `id`, not yet re-admitted under its new storage, did that only a voter
/// may: a vote granted to a candidate (an uncommitted vote of a term, other than the one
/// its process started with), a term it leads, writes taken. `None` when it did none.
/// `started` keeps the process last looked at and the vote it started with: a restart
/// loads the vote uncommitted, the leader's own among them (taken with its appends or
/// its snapshot before a restart that adopts the snapshot), and that is no vote granted.
fn votes_unadmitted(
    r: &Run,
    id: NodeId,
    incarnation: u64,
    started: &mut Option<(Arc<RaftNode>, Vote<NodeId>)>,
) -> Option<String> {
    let live = r.live.lock();
    let n = live.get(&id)?;
    let m = n.node.raft.metrics().borrow().clone();
    let vote = m.vote;
    if !started
        .as_ref()
        .is_some_and(|(p, _)| Arc::ptr_eq(p, &n.node))
    {
        *started = Some((n.node.clone(), vote));
    }
    let loaded = started.as_ref().is_some_and(|(_, v)| *v == vote);
    let granted = !vote.is_committed() && vote.leader_id().term > 0 && !loaded;
    let leads = m.state == ServerState::Leader || m.state == ServerState::Candidate;
    let writes = checks::takes_writes(n);
    (granted || leads || writes).then(|| {
        format!(
            "n{id}, on new storage {incarnation:016x} and not re-admitted, voted or stood: vote {vote}, {:?}, takes writes {writes}",
            m.state
        )
    })
}
