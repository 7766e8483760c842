//! The receiving side of a member's Raft traffic, whatever carried it: one request
//! ([`Envelope`]`<`[`Rpc`]`>`) answered for this member. The TCP listener
//! ([`tcp`](super::tcp)) calls [`Responder::answer`] for every frame it reads; the
//! simulation calls it directly. A request first passes the identity checks
//! ([`admit`]: the group, the storage each side runs on, who may vote), then reaches
//! openraft or the member's own requests (`Hello`, the bootstrap's `Init`, ...).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

// tokio's clock (std's in a server; the simulation's paused one in `sim/`): a follower
// dates the appends it takes by it.
use tokio::time::Instant;

use openraft::raft::AppendEntriesResponse;
use parking_lot::Mutex;

use super::identity::Identity;
use super::message::{Envelope, HelloReply, ReplyEnvelope, Rpc, RpcReply, LOG};
use super::speculation::Speculation;
use super::{NodeId, NodeInfo, Raft};

/// The leader whose append this member last took, and when: a follower names a leader
/// to clients only while it hears from it. Shared by the member's [`Responder`] (which
/// takes the appends) and its `RaftNode` (which names the leader).
#[derive(Default)]
pub struct LastAppend(Mutex<Option<(NodeId, Instant)>>);

impl LastAppend {
    fn note(&self, from: NodeId) {
        *self.0.lock() = Some((from, Instant::now()));
    }

    /// How long ago this member last took an append from `leader` (`None`: never).
    pub fn heard_from(&self, leader: NodeId) -> Option<Duration> {
        let (from, at) = (*self.0.lock())?;
        (from == leader).then(|| at.elapsed())
    }
}

/// A request from this member to itself: a peer address or `--raft-route` leads back
/// here. The connection that carried it ends.
#[derive(Debug, thiserror::Error)]
#[error("request from this member itself")]
pub struct OwnRequest;

/// Answers the peers' requests for one member.
pub struct Responder {
    raft: Raft,
    /// While set, vote and election requests are refused (a member the group has not
    /// admitted as a voter under this storage's incarnation must not vote: it may have
    /// voted in these terms before it lost its state).
    no_votes: Arc<AtomicBool>,
    ident: Arc<Identity>,
    heard: Arc<LastAppend>,
    /// Where this member's writes open and close: it says it leads (`Rpc::Leads`) only
    /// while they are open.
    spec: Arc<Speculation>,
    /// The refusals logged already, by sender, its storage and the storage it meant.
    refused: Mutex<HashSet<(NodeId, u64, u64)>>,
}

impl Responder {
    /// The receiving side of member `ident` over `raft`.
    pub fn new(
        raft: Raft,
        no_votes: Arc<AtomicBool>,
        ident: Arc<Identity>,
        heard: Arc<LastAppend>,
        spec: Arc<Speculation>,
    ) -> Responder {
        Responder {
            raft,
            no_votes,
            ident,
            heard,
            spec,
            refused: Mutex::new(HashSet::new()),
        }
    }

    /// The member this answers for.
    pub fn node(&self) -> NodeId {
        self.ident.node
    }

    /// Answers one request: refused (with why) unless [`admit`] lets it through, else
    /// handled. `Err` for a request from this member itself: openraft must never see its
    /// own requests as a peer's (a leader receiving its own append-entries stops its
    /// core).
    pub async fn answer(&self, env: Envelope<Rpc>) -> Result<ReplyEnvelope, OwnRequest> {
        let ident = &self.ident;
        if env.from == ident.node && !matches!(env.rpc, Rpc::Hello) {
            tracing::error!(
                target: LOG,
                "raft: a request from this member itself reached its Raft port: a peer address or --raft-route points back here; dropped"
            );
            return Err(OwnRequest);
        }
        let reply = match admit(&env, &self.raft, ident, &self.no_votes) {
            Err(why) => {
                self.note_refused(&env, &why);
                RpcReply::Refused(why)
            }
            Ok(()) => self.handle(env.rpc).await,
        };
        Ok(ReplyEnvelope {
            incarnation: ident.incarnation,
            reply,
        })
    }

    async fn handle(&self, rpc: Rpc) -> RpcReply {
        let (raft, ident) = (&self.raft, &self.ident);
        match rpc {
            Rpc::Append(r) => {
                let from = r.vote.leader_id.node_id;
                let reply = raft.append_entries(r).await;
                if matches!(&reply, Ok(a) if !matches!(a, AppendEntriesResponse::HigherVote(_))) {
                    self.heard.note(from);
                }
                RpcReply::Append(reply)
            }
            Rpc::Vote(r) => RpcReply::Vote(raft.vote(r).await),
            Rpc::Snapshot(r) => RpcReply::Snapshot(raft.install_snapshot(r).await),
            Rpc::Progress => RpcReply::Progress(raft.metrics().borrow().last_log_index),
            Rpc::LastLog => RpcReply::LastLog(raft.data_metrics().borrow().last_log),
            Rpc::Leads => {
                // A leader whose writes are closed (no majority answered it, handing
                // over, catching up) serves nobody: its followers may stand.
                let m = raft.metrics().borrow().clone();
                let leads = m.state == openraft::ServerState::Leader && self.spec.writable();
                RpcReply::Leads(leads.then_some(m.current_term))
            }
            // A member not admitted as a voter may not stand.
            Rpc::Elect => RpcReply::Elect(
                !self.no_votes.load(Ordering::Acquire) && raft.trigger().elect().await.is_ok(),
            ),
            Rpc::Hello => RpcReply::Hello(HelloReply {
                node: ident.node,
                incarnation: ident.incarnation,
                group: ident.group().unwrap_or(0),
                pristine: pristine(raft),
            }),
            Rpc::Init { group, members } => RpcReply::Init(take_init(raft, ident, group, members)),
        }
    }

    /// Logs a refused peer once per sender and reason kind, not per heartbeat.
    fn note_refused(&self, env: &Envelope<Rpc>, why: &str) {
        let key = (env.from, env.from_incarnation, env.to_incarnation);
        if self.refused.lock().insert(key) {
            tracing::warn!(target: LOG, "raft: refused a request from node {}: {why}", env.from);
        }
    }
}

/// No membership and no log entry: nothing a bootstrap could overwrite.
fn pristine(raft: &Raft) -> bool {
    let m = raft.metrics().borrow().clone();
    m.last_log_index.is_none() && m.membership_config.membership().nodes().next().is_none()
}

/// The bootstrap's [`Rpc::Init`] on a member: only a member with no Raft state and no
/// other group takes it, and only when it lists this storage's incarnation.
fn take_init(
    raft: &Raft,
    ident: &Identity,
    group: u64,
    members: BTreeMap<NodeId, NodeInfo>,
) -> Result<(), String> {
    match members.get(&ident.node) {
        Some(n) if n.incarnation == ident.incarnation => {}
        _ => {
            return Err(format!(
                "the bootstrap does not list node {} with this storage's incarnation {:016x}",
                ident.node, ident.incarnation
            ))
        }
    }
    if ident.group().is_some_and(|g| g != group) {
        return Err(format!("node {} belongs to another group", ident.node));
    }
    if !pristine(raft) {
        // The same bootstrap sent again after the group's log reached this member.
        let same = ident.group() == Some(group);
        return if same {
            Ok(())
        } else {
            Err(format!("node {} already holds Raft state", ident.node))
        };
    }
    ident.adopt_group(group).map_err(|e| e.to_string())?;
    // Not `initialize` here: openraft stands for election at once on it, and a member
    // initialized after a leader was elected could then unseat it with a shorter log.
    // Only the bootstrapping member initializes and stands; this one grants it its vote
    // by this membership and learns the real one from its log.
    ident.set_first_members(members);
    Ok(())
}

/// Whether a request may reach Raft: the receiver must be the storage the sender means,
/// of the same group, and a vote or an append must come from the storage the
/// membership names for the sender's node id. `Err` says why not, in words.
fn admit(
    env: &Envelope<Rpc>,
    raft: &Raft,
    ident: &Identity,
    no_votes: &AtomicBool,
) -> Result<(), String> {
    let voting = matches!(env.rpc, Rpc::Vote(_) | Rpc::Elect);
    match &env.rpc {
        Rpc::Hello | Rpc::Init { .. } | Rpc::Progress | Rpc::Leads | Rpc::LastLog => return Ok(()),
        Rpc::Append(r) => same_sender(env.from, r.vote.leader_id().voted_for())?,
        Rpc::Vote(r) => same_sender(env.from, r.vote.leader_id().voted_for())?,
        Rpc::Snapshot(r) => same_sender(env.from, r.vote.leader_id().voted_for())?,
        Rpc::Elect => {}
    }
    if env.to_incarnation != ident.incarnation {
        return Err(format!(
            "node {} runs on storage incarnation {:016x}, node {} knows it as {:016x}: this member lost its state and takes no part until re-admitted (RAFT.READMIT {} on the leader)",
            ident.node, ident.incarnation, env.from, env.to_incarnation, ident.node
        ));
    }
    if env.group == 0 {
        return Err(format!("node {} belongs to no group", env.from));
    }
    match ident.group() {
        Some(g) if g != env.group => {
            return Err(format!(
                "node {} is of group {:016x}, this member of group {g:016x}",
                env.from, env.group
            ))
        }
        Some(_) => {}
        // A member that never voted yet learns its group from the first leader that
        // names its incarnation (RAFT.ADD asked it for it): it cannot vote before.
        None if voting => return Err(format!("node {} is not in a group yet", ident.node)),
        None => ident.adopt_group(env.group).map_err(|e| e.to_string())?,
    }
    let (known, may_vote) = sender_and_vote(raft, ident, env.from, no_votes);
    match known {
        // A member not admitted under its own storage (wiped, then re-admitted and still
        // catching up) holds an older membership than the leader's, which may name the
        // leader under a storage it has since replaced: it learns the incarnations from
        // the log the leader sends, and votes for nobody meanwhile.
        Some(k) if k != env.from_incarnation && (voting || may_vote) => {
            return Err(format!(
                "node {} runs on storage incarnation {:016x}, the group admitted {k:016x}: it lost its state and gets no vote and no say until re-admitted (RAFT.READMIT {})",
                env.from, env.from_incarnation, env.from
            ))
        }
        // A leader this member's log does not list yet may still append (the log that
        // names it is what it sends); a vote goes to known members only.
        None if voting => return Err(format!("node {} is not a member this node knows", env.from)),
        _ => {}
    }
    // A candidate asks only the voters of its own membership, each under the incarnation
    // that membership names (`Peer::expect`, checked above against this storage): its
    // request so says the group admitted this storage as a voter, in an entry its log
    // holds and this member's may not hold yet. A storage that kept its state may grant
    // it (docs/replication.md, "Who votes"); a wiped one is named under its old
    // incarnation until `RAFT.READMIT` makes it a voter under its new one, and was
    // refused above. Standing stays with this member's own log.
    let admitted_by_candidate = matches!(env.rpc, Rpc::Vote(_));
    if voting && !may_vote && !admitted_by_candidate {
        return Err(format!(
            "node {} is not admitted as a voter under its storage's incarnation and does not vote",
            ident.node
        ));
    }
    Ok(())
}

/// The incarnation this member knows for node `from`, and whether it may vote: by its
/// log's membership, or, before its log holds one, by the first membership the bootstrap
/// handed it (`take_init` checked that it lists this storage).
fn sender_and_vote(
    raft: &Raft,
    ident: &Identity,
    from: NodeId,
    no_votes: &AtomicBool,
) -> (Option<u64>, bool) {
    let (known, empty) = {
        let m = raft.metrics();
        let m = m.borrow();
        let ms = m.membership_config.membership();
        let known = ms.get_node(&from).map(|n| n.incarnation);
        let empty = ms.nodes().next().is_none();
        (known, empty)
    };
    if !empty {
        return (known, !no_votes.load(Ordering::Acquire));
    }
    match ident.first_members() {
        Some(first) => (first.get(&from).map(|n| n.incarnation), true),
        None => (None, false),
    }
}

fn same_sender(from: NodeId, named: Option<NodeId>) -> Result<(), String> {
    match named {
        Some(n) if n != from => Err(format!("a request from node {from} speaks for node {n}")),
        _ => Ok(()),
    }
}
