//! The network between the members of a group, as openraft calls it: openraft's three
//! RPCs (and the member's own requests) sent as the typed messages of
//! [`message`](super::message) over a [`Transport`] (TCP in a server,
//! [`tcp`](super::tcp); memory in the simulation).
//!
//! A peer that cannot be connected to (down, or its port closed) is backed off, per peer
//! and per member ([`PeerTable`]):
//! after each failed connection no new one is tried for a pause doubling from
//! [`BACKOFF_FIRST`] to [`BACKOFF_MAX`], jittered, and openraft's calls in that pause are
//! answered at once with `Unreachable`, which makes openraft's replication to that peer
//! wait out the same pause ([`RaftNetwork::backoff`]) instead of retrying at every
//! heartbeat and every write. A failure on an open connection (a peer killed mid-call)
//! is a plain network error, retried at once: only connecting is backed off, so a
//! failover among live members never waits for it, and a peer back up is reached within
//! [`BACKOFF_MAX`].
//!
//! Every request travels in an [`Envelope`] naming the group, the sender and its
//! incarnation, and the incarnation the sender believes the receiver has; every reply
//! names the responder's incarnation. A member refuses a vote or an append from another
//! group or from a storage the group did not admit under that node id, and a caller
//! never counts a reply from a storage other than the one the membership names
//! ([`identity`](super::identity)): a member started on an empty or foreign disk gets
//! no say, even if its own checks were bypassed.

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;
use std::time::Duration;

// tokio's clock (std's in a server; the simulation's paused one in `sim/`): the lease
// dates appends by it.
use tokio::time::Instant;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};

pub use super::message::{
    decode_reply, decode_request, encode, read_frame, Envelope, HelloReply, ReplyEnvelope, Rpc,
    RpcReply, LOG, MAX_FRAME,
};
pub use super::peers::{backoff_delay, BACKOFF_FIRST, BACKOFF_MAX};

use super::append_hold::AppendHold;
use super::identity::Identity;
use super::lease::Lease;
use super::peers::PeerTable;
use super::transport::{CallError, Link, Transport};
use super::{NodeId, NodeInfo, TypeConfig};

/// Creates a [`Peer`] per member openraft talks to, over the member's [`Transport`].
#[derive(Clone)]
pub struct Network {
    /// What carries the requests (TCP in a server).
    pub transport: Arc<dyn Transport>,
    /// This member's view of its peers' links (back-off, counts), shared by all its clients.
    pub peers: Arc<PeerTable>,
    /// This member's identity, put on every request.
    pub ident: Arc<Identity>,
    /// The followers' acknowledgements of this member's appends ([`Lease`]).
    pub lease: Arc<Lease>,
    /// A leader no majority acknowledged for this long stops sending appends.
    pub mute_after: Duration,
    /// A handover's hold on this member's appends ([`AppendHold`]).
    pub hold: Arc<AppendHold>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &NodeInfo) -> Peer {
        Peer {
            target,
            link: self.transport.link(target, node, self.peers.clone()),
            peers: self.peers.clone(),
            ident: self.ident.clone(),
            expect: node.incarnation,
            lease: self.lease.clone(),
            mute_after: self.mute_after,
            hold: self.hold.clone(),
        }
    }
}

/// One link to a peer member (one connection over TCP).
pub struct Peer {
    target: NodeId,
    link: Box<dyn Link>,
    peers: Arc<PeerTable>,
    ident: Arc<Identity>,
    /// The incarnation the membership names for `target` (0: not known yet).
    expect: u64,
    lease: Arc<Lease>,
    mute_after: Duration,
    hold: Arc<AppendHold>,
}

fn net_err<E: std::error::Error + 'static>(e: &E) -> NetworkError {
    NetworkError::new(e)
}

impl Peer {
    /// One request and its reply, in the envelope naming both sides' storages.
    /// `gated`: a call of openraft's, answered at once while the peer is backed off
    /// (the bootstrap's and the operator's calls always try).
    async fn call(&mut self, rpc: Rpc, ttl: Duration, gated: bool) -> Result<RpcReply, CallError> {
        let req = Envelope {
            group: self.ident.group().unwrap_or(0),
            from: self.ident.node,
            from_incarnation: self.ident.incarnation,
            to_incarnation: self.expect,
            rpc,
        };
        let reply = self.link.call(req, ttl, gated).await?;
        let checked = self.checked(reply);
        self.peers.note_answer(self.target, checked.is_ok());
        let addr = self.link.addr();
        self.peers
            .note_reachable(self.target, addr, checked.as_ref().map(|_| ()));
        // A reply that does not count (another storage, a refusal) will not count on the
        // next call either: openraft waits out the back-off rather than asking again at
        // once, which would spin a core for as long as the member waits for re-admission.
        checked.map_err(CallError::Unreachable)
    }

    /// A reply counts only from the storage the membership names: a member that lost
    /// its state answers with another incarnation, and its acknowledgement of an append
    /// must not make an entry committed, nor its vote elect anyone.
    fn checked(&self, r: ReplyEnvelope) -> io::Result<RpcReply> {
        if self.expect != 0 && r.incarnation != self.expect {
            return Err(io::Error::other(format!(
                "node {} answered from storage incarnation {:016x}, the group admitted {:016x}: it lost its state and is not counted until re-admitted (RAFT.READMIT {})",
                self.target, r.incarnation, self.expect, self.target
            )));
        }
        match r.reply {
            RpcReply::Refused(why) => Err(io::Error::other(format!("refused: {why}"))),
            reply => Ok(reply),
        }
    }
}

impl Peer {
    /// The reply of one RPC as openraft wants it: the peer's own error as a remote
    /// error, no connection as unreachable (openraft then backs off), anything else (a
    /// failed exchange, a reply of the wrong kind) as a network error.
    #[allow(clippy::result_large_err)] // openraft's own error type, as its trait returns it
    fn answer<T, E: std::error::Error>(
        &self,
        r: Result<RpcReply, CallError>,
        pick: impl FnOnce(RpcReply) -> Option<Result<T, E>>,
    ) -> Result<T, RPCError<NodeId, NodeInfo, E>> {
        match r.map(pick) {
            Ok(Some(r)) => r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e))),
            Ok(None) => Err(RPCError::Network(net_err(&io::Error::other(
                "mismatched reply",
            )))),
            Err(CallError::Unreachable(e)) => Err(RPCError::Unreachable(Unreachable::new(&e))),
            Err(CallError::Failed(e)) => Err(RPCError::Network(net_err(&e))),
        }
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, NodeInfo, RaftError<NodeId>>> {
        let term = rpc.vote.leader_id.term;
        let sent = Instant::now();
        let Some(_on_its_way) = self.hold.admit(self.target, term) else {
            return Err(held_back());
        };
        if !self
            .lease
            .may_send(self.target, term, sent, self.mute_after)
        {
            return Err(RPCError::Unreachable(Unreachable::new(&io::Error::other(
                "no majority answered this leader: appends held back until a newer term",
            ))));
        }
        self.lease.sending(term, sent);
        let r = self.call(Rpc::Append(rpc), option.hard_ttl(), true).await;
        let r = self.answer(r, |r| match r {
            RpcReply::Append(a) => Some(a),
            _ => None,
        });
        if matches!(&r, Ok(a) if !matches!(a, AppendEntriesResponse::HigherVote(_))) {
            self.lease.accepted(self.target, term, sent);
        }
        r
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, NodeInfo, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let Some(_on_its_way) = self.hold.admit(self.target, rpc.vote.leader_id.term) else {
            return Err(held_back());
        };
        let r = self.call(Rpc::Snapshot(rpc), option.hard_ttl(), true).await;
        self.answer(r, |r| match r {
            RpcReply::Snapshot(a) => Some(a),
            _ => None,
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, NodeInfo, RaftError<NodeId>>> {
        let r = self.call(Rpc::Vote(rpc), option.hard_ttl(), true).await;
        self.answer(r, |r| match r {
            RpcReply::Vote(a) => Some(a),
            _ => None,
        })
    }

    /// openraft's pause after an `Unreachable`: until this peer's back-off ends, so that
    /// its replication to the peer waits as long as a new connection would.
    fn backoff(&self) -> Backoff {
        let (target, peers) = (self.target, self.peers.clone());
        Backoff::new(std::iter::repeat_with(move || {
            peers
                .backoff_left(target)
                .map_or(BACKOFF_FIRST, |d| d.max(BACKOFF_FIRST))
        }))
    }
}

/// An append (or snapshot) a handover holds back: unreachable to openraft, which
/// tries again after its back-off.
fn held_back<E: std::error::Error>() -> RPCError<NodeId, NodeInfo, E> {
    RPCError::Unreachable(Unreachable::new(&io::Error::other(
        "held back: this leader is handing over (SENTINEL FAILOVER) and lets the leases of the members other than its target run out",
    )))
}

/// Asks `target` to stand for election at once (a switchover).
pub async fn ask_to_elect(mut net: Network, target: NodeId, node: &NodeInfo) -> io::Result<()> {
    let mut peer = net.new_client(target, node).await;
    match peer.call(Rpc::Elect, Duration::from_secs(2), false).await? {
        RpcReply::Elect(true) => Ok(()),
        RpcReply::Elect(false) => Err(io::Error::other("it cannot stand for election now")),
        _ => Err(io::Error::other("mismatched reply")),
    }
}

/// Asks the member at `node` who it is, whatever incarnation it has.
pub async fn hello(net: Network, target: NodeId, node: &NodeInfo) -> io::Result<HelloReply> {
    let mut peer = hello_client(net, target, node).await;
    say_hello(&mut peer, target, Duration::from_secs(2)).await
}

/// A client for [`say_hello`]: asks whoever answers, whatever its incarnation.
pub async fn hello_client(mut net: Network, target: NodeId, node: &NodeInfo) -> Peer {
    let unknown = NodeInfo {
        incarnation: 0,
        ..node.clone()
    };
    net.new_client(target, &unknown).await
}

/// `Hello` on `peer`'s connection (kept for the next call when it answers).
pub async fn say_hello(peer: &mut Peer, target: NodeId, ttl: Duration) -> io::Result<HelloReply> {
    let node = peer.link.addr().to_owned();
    match peer.call(Rpc::Hello, ttl, false).await? {
        RpcReply::Hello(h) if h.node == target => Ok(h),
        RpcReply::Hello(h) => Err(io::Error::other(format!(
            "{node} is node {}, not node {target}",
            h.node
        ))),
        _ => Err(io::Error::other("mismatched reply")),
    }
}

/// The index of the last entry in `target`'s log (see [`Rpc::Progress`]).
pub async fn ask_progress(peer: &mut Peer, ttl: Duration) -> io::Result<Option<u64>> {
    match peer.call(Rpc::Progress, ttl, false).await? {
        RpcReply::Progress(last) => Ok(last),
        _ => Err(io::Error::other("mismatched reply")),
    }
}

/// The id of the last entry in `target`'s log (see [`Rpc::LastLog`]).
pub async fn ask_last_log(
    peer: &mut Peer,
    ttl: Duration,
) -> io::Result<Option<openraft::LogId<NodeId>>> {
    match peer.call(Rpc::LastLog, ttl, false).await? {
        RpcReply::LastLog(last) => Ok(last),
        _ => Err(io::Error::other("mismatched reply")),
    }
}

/// The term `target` leads in, if it leads (see [`Rpc::Leads`]).
pub async fn ask_leads(peer: &mut Peer, ttl: Duration) -> io::Result<Option<u64>> {
    match peer.call(Rpc::Leads, ttl, false).await? {
        RpcReply::Leads(term) => Ok(term),
        _ => Err(io::Error::other("mismatched reply")),
    }
}

/// Hands `target` the new group's id and first membership (the bootstrap).
pub async fn init(
    mut net: Network,
    target: NodeId,
    group: u64,
    members: &BTreeMap<NodeId, NodeInfo>,
) -> io::Result<()> {
    let node = members
        .get(&target)
        .ok_or_else(|| io::Error::other(format!("node {target} is not in the membership")))?;
    let mut peer = net.new_client(target, node).await;
    let rpc = Rpc::Init {
        group,
        members: members.clone(),
    };
    match peer.call(rpc, Duration::from_secs(5), false).await? {
        RpcReply::Init(r) => r.map_err(|why| io::Error::other(format!("refused: {why}"))),
        _ => Err(io::Error::other("mismatched reply")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_bound() {
        assert_eq!(backoff_delay(0, 1.0), BACKOFF_FIRST);
        assert_eq!(backoff_delay(1, 1.0), BACKOFF_FIRST);
        assert_eq!(backoff_delay(2, 1.0), BACKOFF_FIRST * 2);
        assert_eq!(backoff_delay(3, 1.0), BACKOFF_FIRST * 4);
        assert_eq!(backoff_delay(8, 1.0), BACKOFF_MAX);
        assert_eq!(backoff_delay(u32::MAX, 1.0), BACKOFF_MAX);
        // Jitter shortens a pause by half at most, never lengthens it.
        assert_eq!(backoff_delay(1, 0.5), BACKOFF_FIRST / 2);
        assert_eq!(backoff_delay(1, 0.0), BACKOFF_FIRST / 2);
        assert_eq!(backoff_delay(1, 7.0), BACKOFF_FIRST);
        assert_eq!(backoff_delay(1, f64::NAN), BACKOFF_FIRST);
    }
}
