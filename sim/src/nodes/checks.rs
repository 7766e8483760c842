//! What the scenario checks, all through the `Replication` trait (what the command
//! layer asks of a member): who takes writes (`write_refusal`), who each member names
//! to Sentinel-aware clients (`SENTINEL get-master-addr-by-name`) and who says it leads
//! (`role`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stockgate_server::engine::ReservationState;
use stockgate_server::raft::log_store::LogStore;
use stockgate_server::raft::NodeId;
use stockgate_server::session::{HostPort, Replication, RoleView, SentinelAnswer, SentinelQuery};
use tokio::time::{sleep, Instant};

use super::boot::{Node, GROUP};
use super::{Run, GIVE_UP_SLACK, STEP, TIMING};
use crate::scenario::log_matching::differing_entries;
use crate::wire::client_addr;

/// The member's answer to `SENTINEL get-master-addr-by-name <group>`.
pub(super) fn named(n: &Node) -> Option<HostPort> {
    match Replication::sentinel(&*n.node, SentinelQuery::MasterAddr(GROUP.as_bytes())) {
        Ok(SentinelAnswer::MasterAddr(a)) => a,
        _ => None,
    }
}

/// Member `id`'s client address as discovery hands it out.
pub(super) fn addr_of(id: NodeId) -> HostPort {
    let a = client_addr(id);
    let (h, p) = a.rsplit_once(':').unwrap_or((a.as_str(), "0"));
    (h.to_owned(), p.parse().unwrap_or(0))
}

/// Whether the member's write gate lets a write through now. A stopped member takes
/// nothing: no command it is sent is read until it continues.
pub(super) fn takes_writes(n: &Node) -> bool {
    !n.gate.is_stopped()
        && Replication::write_refusal(&*n.node).is_none()
        && !n.deposed.load(Ordering::Acquire)
}

/// Whether the member presents itself as the master: it takes writes, or its
/// discovery answer names itself.
pub(super) fn claims_master(n: &Node) -> bool {
    takes_writes(n) || named(n) == Some(addr_of(n.id))
}

/// The one member that takes writes, if every member but `excluded` names it, it says
/// it leads, and it is not `other_than`.
fn agreed(r: &Run, excluded: Option<NodeId>, other_than: Option<NodeId>) -> Option<NodeId> {
    let live = r.live.lock();
    // A stopped member answers nobody: it is not asked.
    let members: Vec<&Node> = live
        .values()
        .filter(|n| Some(n.id) != excluded && !n.gate.is_stopped())
        .collect();
    let writers: Vec<&Node> = members
        .iter()
        .copied()
        .filter(|n| takes_writes(n))
        .collect();
    let [w] = writers[..] else {
        return None;
    };
    if Some(w.id) == other_than {
        return None;
    }
    let want = Some(addr_of(w.id));
    let all_name = members.iter().all(|n| named(n) == want);
    let leads = matches!(Replication::role(&*w.node), RoleView::Leader { .. });
    (all_name && leads).then_some(w.id)
}

/// What each member says now, for a failure's message.
pub(super) fn views(r: &Run) -> String {
    let live = r.live.lock();
    let each = live.values().map(|n| {
        let refusal = Replication::write_refusal(&*n.node).map_or("takes writes", |s| {
            s.split_whitespace().next().unwrap_or("refuses")
        });
        let stopped = if n.gate.is_stopped() {
            " (stopped)"
        } else {
            ""
        };
        let m = n.node.raft.metrics().borrow().clone();
        let ms = m.membership_config.membership();
        format!(
            "n{}{stopped}: {refusal}, names {:?}, voters {:?}, learners {:?}, last log {:?}",
            n.id,
            named(n),
            ms.voter_ids().collect::<Vec<_>>(),
            ms.learner_ids().collect::<Vec<_>>(),
            m.last_log_index
        )
    });
    each.collect::<Vec<_>>().join("; ")
}

/// Waits (at most `within`) until one member takes writes (not `other_than`) and every
/// live member but `excluded` names it; `None` (a failure) if that never happens.
pub(super) async fn agreement(
    r: &Run,
    what: &str,
    within: Duration,
    excluded: Option<NodeId>,
    other_than: Option<NodeId>,
) -> Option<NodeId> {
    let start = Instant::now();
    loop {
        if let Some(l) = agreed(r, excluded, other_than) {
            let ms = start.elapsed().as_millis();
            r.note(format!(
                "{what}: n{l} takes writes and every member names it, after {ms} ms"
            ));
            return Some(l);
        }
        if start.elapsed() >= within {
            r.fail(format!(
                "{what}: no member named by all within {within:?} ({})",
                views(r)
            ));
            return None;
        }
        sleep(STEP).await;
    }
}

/// The deadline by which a member cut off at `at` must have stopped claiming master.
fn give_up_by(at: Instant) -> Instant {
    at + Duration::from_millis(TIMING.1) + GIVE_UP_SLACK
}

/// Waits until the isolated `leader` stops claiming master; a failure if it still does
/// at [`give_up_by`].
pub(super) async fn gives_up(r: &Run, leader: NodeId, at: Instant) {
    loop {
        let claims = r.live.lock().get(&leader).map(claims_master);
        match claims {
            None => return,
            Some(false) => {
                let ms = at.elapsed().as_millis();
                return r.note(format!(
                    "n{leader} stops claiming master {ms} ms after the cut"
                ));
            }
            Some(true) if Instant::now() >= give_up_by(at) => {
                return r.fail(format!(
                    "n{leader}, cut off, still claims master {} ms after the cut ({})",
                    at.elapsed().as_millis(),
                    views(r)
                ));
            }
            Some(true) => sleep(STEP).await,
        }
    }
}

/// Every few milliseconds until `done`: at most one member takes writes, and a member
/// cut off claims master no longer than [`give_up_by`] allows. Each rule fails once.
pub(super) async fn monitor(r: Arc<Run>, done: Arc<AtomicBool>) {
    let (mut two, mut isolated) = (false, false);
    while !done.load(Ordering::Acquire) {
        let writers: Vec<NodeId> = {
            let live = r.live.lock();
            live.values()
                .filter(|n| takes_writes(n))
                .map(|n| n.id)
                .collect()
        };
        if writers.len() > 1 && !two {
            two = true;
            r.fail(format!("members {writers:?} take writes at once"));
        }
        let cut = *r.isolated.lock();
        if let Some((id, at)) = cut.filter(|(_, at)| Instant::now() > give_up_by(*at)) {
            let claims = r.live.lock().get(&id).is_some_and(claims_master);
            if claims && !isolated {
                isolated = true;
                let ms = at.elapsed().as_millis();
                r.fail(format!(
                    "n{id}, cut off, claims master again {ms} ms after the cut"
                ));
            }
        }
        sleep(STEP).await;
    }
}

/// Every acknowledged hold is held on every live member.
pub(super) async fn acked_holds(r: &Run) {
    let acked = r.acked.lock().clone();
    let live = r.live.lock();
    for n in live.values() {
        let missing: Vec<&String> = acked
            .iter()
            .filter(|t| {
                !matches!(n.engine.reservation(t), Some((v, _)) if v.state == ReservationState::Reserved)
            })
            .collect();
        if let Some(first) = missing.first() {
            r.fail(format!(
                "n{}: {} of {} acknowledged holds missing, {first} first",
                n.id,
                missing.len(),
                acked.len()
            ));
        }
    }
    r.note(format!(
        "{} acknowledged holds checked on {:?}",
        acked.len(),
        live.keys().collect::<Vec<_>>()
    ));
}

/// Raft's Log Matching across the live members' Raft logs, as openraft reads them
/// (`scenario::log_matching`): two entries under one log id must hold the same batch.
/// A follower compares log ids only, so a leader that wrote an index of its term twice
/// would leave members applying different batches there. `false` (each pair a
/// failure) when two differ.
pub(super) fn logs_match(r: &Run, when: &str) -> bool {
    let stores: Vec<(NodeId, LogStore)> = {
        let live = r.live.lock();
        live.values().map(|n| (n.id, n.store.clone())).collect()
    };
    let bad = differing_entries(stores.iter().map(|(id, s)| (*id, s)));
    for b in &bad {
        r.fail(format!("{when}: {b}"));
    }
    bad.is_empty()
}
