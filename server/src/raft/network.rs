//! The network between the members of a group: openraft's three RPCs over TCP, one
//! request and one reply per frame, `[u32 length][bincode body]`.
//!
//! Each node listens on its Raft address (`--raft-listen`) and keeps one connection per
//! peer it calls, opened on first use and dropped on any error (the next heartbeat opens
//! it again). A frame larger than [`MAX_FRAME`] ends the connection: a peer's bytes are
//! bounded like a client's. With `--tls-replication` every peer connection is TLS, both
//! ends presenting the member's certificate, each checked against the CA.
//!
//! A peer that cannot be connected to (down, or its port closed) is backed off, per peer:
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

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

// tokio's clock (std's in a server; the simulation's paused one in `sim/`): the lease
// dates appends by it.
use tokio::time::Instant;

use bincode::Options;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::EntryPayload;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::takeover::Io;
use crate::tls::Tls;

/// A peer connection, TCP or TLS (openraft shares a peer's client between threads).
trait PeerIo: Io + Sync {}
impl<T: Io + Sync> PeerIo for T {}

use super::identity::Identity;
use super::lease::Lease;
use super::{NodeId, NodeInfo, Raft, TypeConfig};

/// Largest frame a peer may send (an append of `max_payload_entries` batches).
pub const MAX_FRAME: usize = 256 << 20;

/// What a frame's body buffer starts with before its bytes arrive: a peer that announces
/// a large frame and sends little costs what it sent, not what it announced.
const FRAME_PREALLOC: usize = 64 << 10;

/// A request, as a peer sends it.
#[derive(Debug, Serialize, Deserialize)]
pub enum Rpc {
    /// openraft's log replication and heartbeat, from the leader.
    Append(AppendEntriesRequest<TypeConfig>),
    /// A candidate asking for this member's vote.
    Vote(VoteRequest<NodeId>),
    /// A chunk of a snapshot, sent to a member too far behind for the log.
    Snapshot(InstallSnapshotRequest<TypeConfig>),
    /// Stand for election now (`SENTINEL FAILOVER` on the leader).
    Elect,
    /// Who are you: node id, incarnation, group, whether it holds any Raft state
    /// (the bootstrap and `RAFT.ADD`/`RAFT.READMIT` ask before they name a member).
    Hello,
    /// Form the group: the bootstrapping member hands every member the group id and the
    /// first membership (each member's incarnation as it answered [`Rpc::Hello`]).
    Init {
        /// The new group's id.
        group: u64,
        /// The first membership, every member a voter.
        members: BTreeMap<NodeId, NodeInfo>,
    },
    /// How far this member's log goes: the followers of a leader gone silent stand in
    /// that order, the furthest first, so that the first to stand is not refused for a
    /// shorter log (asked only then; a member that does not know this request is asked
    /// nothing more and taken by its id).
    Progress,
}

/// A request with who sends it to whom (see the module's description).
#[derive(Debug, Serialize, Deserialize)]
pub struct Envelope<R> {
    /// The sender's group id; 0 when it has none yet (only `Hello` then).
    pub group: u64,
    /// The sender's node id.
    pub from: NodeId,
    /// The sender's incarnation.
    pub from_incarnation: u64,
    /// The incarnation the sender believes the receiver has (0: unknown, `Hello`).
    pub to_incarnation: u64,
    /// The request itself.
    pub rpc: R,
}

/// A reply with the incarnation of the storage that answered.
#[derive(Debug, Serialize, Deserialize)]
pub struct ReplyEnvelope {
    /// The responder's incarnation.
    pub incarnation: u64,
    /// The reply itself.
    pub reply: RpcReply,
}

/// The answer to [`Rpc::Hello`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HelloReply {
    /// The responder's node id.
    pub node: NodeId,
    /// Its incarnation.
    pub incarnation: u64,
    /// Its group id, 0 when none yet.
    pub group: u64,
    /// No Raft state at all: no membership, no log entry.
    pub pristine: bool,
}

/// The answer to an [`Rpc`].
#[derive(Debug, Serialize, Deserialize)]
pub enum RpcReply {
    /// The follower's answer to an append.
    Append(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    /// The vote granted or refused.
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    /// The snapshot chunk's acknowledgement.
    Snapshot(Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>),
    /// Whether the election was started.
    Elect(bool),
    /// Who this member is.
    Hello(HelloReply),
    /// Whether the member took the group's id and first membership.
    Init(Result<(), String>),
    /// The request was refused before reaching Raft, and why (another group, a storage
    /// the group did not admit, a member that may not vote).
    Refused(String),
    /// The index of the last entry in this member's log (`None`: an empty log).
    Progress(Option<u64>),
}

/// Creates a [`Peer`] per member openraft talks to. `routes` overrides where a peer is
/// reached (`--raft-route ID=ADDR`: a proxy, a NAT), by node id.
#[derive(Clone)]
pub struct Network {
    /// Peer address overrides by node id: where to connect instead of the member's advertised
    /// `raft_addr`.
    pub routes: Arc<HashMap<NodeId, String>>,
    /// `--tls-replication`: peers are called over TLS.
    pub tls: Option<Arc<Tls>>,
    /// This member's identity, put on every request.
    pub ident: Arc<Identity>,
    /// The followers' acknowledgements of this member's appends ([`Lease`]).
    pub lease: Arc<Lease>,
    /// A leader no majority acknowledged for this long stops sending appends.
    pub mute_after: Duration,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &NodeInfo) -> Peer {
        let addr = self
            .routes
            .get(&target)
            .cloned()
            .unwrap_or_else(|| node.raft_addr.clone());
        Peer {
            target,
            addr,
            tls: self.tls.clone(),
            conn: None,
            ident: self.ident.clone(),
            expect: node.incarnation,
            lease: self.lease.clone(),
            mute_after: self.mute_after,
        }
    }
}

/// One connection to a peer member, opened on first use and reopened after an error.
pub struct Peer {
    target: NodeId,
    addr: String,
    tls: Option<Arc<Tls>>,
    conn: Option<Box<dyn PeerIo>>,
    ident: Arc<Identity>,
    /// The incarnation the membership names for `target` (0: not known yet).
    expect: u64,
    lease: Arc<Lease>,
    mute_after: Duration,
}

/// Opens a connection to a peer: TCP, and TLS on it with `--tls-replication` (the
/// peer's name is the host of its address, an IP or a DNS name its certificate lists).
async fn connect(addr: &str, tls: Option<&Tls>) -> io::Result<Box<dyn PeerIo>> {
    let s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let Some((_, connector)) = tls.and_then(|t| t.peers()) else {
        return Ok(Box::new(s));
    };
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let name = crate::tls::peer::server_name(host)
        .map_err(|e| io::Error::other(format!("peer address {addr}: {e}")))?;
    Ok(Box::new(connector.connect(name, s).await?))
}

async fn write_frame<S: AsyncWrite + Unpin + ?Sized>(s: &mut S, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len())
        .ok()
        .filter(|l| (*l as usize) <= MAX_FRAME)
        .ok_or_else(|| io::Error::other(format!("frame of {} bytes over the limit", body.len())))?;
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(body);
    s.write_all(&out).await?;
    // TLS holds encrypted bytes back until flushed; TCP's flush does nothing.
    s.flush().await
}

/// Reads one frame's body. A length over [`MAX_FRAME`] is an error before any of the body
/// is read: the caller ends the connection.
pub async fn read_frame<R: AsyncRead + Unpin>(s: &mut R) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::other(format!(
            "peer sent a frame of {len} bytes, over the limit"
        )));
    }
    let mut body = Vec::with_capacity(len.min(FRAME_PREALLOC));
    s.take(len as u64).read_to_end(&mut body).await?;
    if body.len() < len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("frame of {len} bytes ended after {}", body.len()),
        ));
    }
    Ok(body)
}

/// The frame bodies' encoding: bincode's fixed-width integers (what `bincode::serialize`
/// writes), bounded by the frame limit, and nothing after the message (trailing bytes are
/// a peer speaking another format, not something to ignore).
fn wire() -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_limit(MAX_FRAME as u64)
        .reject_trailing_bytes()
}

/// A message as a frame body.
pub fn encode<T: Serialize>(msg: &T) -> io::Result<Vec<u8>> {
    wire().serialize(msg).map_err(io::Error::other)
}

/// A request frame's body. A peer can send any bytes: what is not a well-formed request
/// is an error (the connection ends), never a panic.
pub fn decode_request(body: &[u8]) -> io::Result<Envelope<Rpc>> {
    let env: Envelope<Rpc> = wire().deserialize(body).map_err(io::Error::other)?;
    let batches_ok = match &env.rpc {
        Rpc::Append(r) => r.entries.iter().all(|e| match &e.payload {
            EntryPayload::Normal(b) => b.well_formed(),
            _ => true,
        }),
        _ => true,
    };
    if !batches_ok {
        return Err(io::Error::other(
            "append with a batch of no records or past the last LSN",
        ));
    }
    Ok(env)
}

/// A reply frame's body, read back from a peer this node called.
pub fn decode_reply(body: &[u8]) -> io::Result<ReplyEnvelope> {
    wire().deserialize(body).map_err(io::Error::other)
}

fn net_err<E: std::error::Error + 'static>(e: &E) -> NetworkError {
    NetworkError::new(e)
}

/// The first pause after a failed connection to a peer.
pub const BACKOFF_FIRST: Duration = Duration::from_millis(10);
/// The longest pause: how late, at most, a peer back up is called again.
pub const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The pause after `failures` failed connections in a row: [`BACKOFF_FIRST`] doubling,
/// at most [`BACKOFF_MAX`], scaled by `jitter` (taken in 0.5..=1) so that the members
/// calling a peer that comes back do not all call at the same instant.
pub fn backoff_delay(failures: u32, jitter: f64) -> Duration {
    let doubled = BACKOFF_FIRST.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
    let jitter = if jitter.is_nan() {
        1.0
    } else {
        jitter.clamp(0.5, 1.0)
    };
    doubled.min(BACKOFF_MAX).mul_f64(jitter)
}

/// Why a call to a peer failed.
#[derive(Debug)]
enum CallError {
    /// No connection could be opened, or the peer is in its back-off pause: openraft's
    /// `Unreachable`, which makes it wait before calling again.
    Unreachable(io::Error),
    /// The exchange on a connection failed, or the reply is not one to count.
    Failed(io::Error),
}

impl From<CallError> for io::Error {
    fn from(e: CallError) -> io::Error {
        match e {
            CallError::Unreachable(e) | CallError::Failed(e) => e,
        }
    }
}

impl From<io::Error> for CallError {
    fn from(e: io::Error) -> CallError {
        CallError::Failed(e)
    }
}

impl Peer {
    /// One request and its reply. The connection is taken out of `self` for the call and
    /// put back only after a whole reply was read: a call that fails, times out or is
    /// dropped half way (openraft drops replication futures it no longer needs) takes the
    /// connection with it, so no later call can read the reply meant for this one.
    /// `gated`: a call of openraft's, answered at once while the peer is backed off
    /// (the bootstrap's and the operator's calls always try).
    async fn call(&mut self, rpc: &Rpc, ttl: Duration, gated: bool) -> Result<RpcReply, CallError> {
        let body = encode(&Envelope {
            group: self.ident.group().unwrap_or(0),
            from: self.ident.node,
            from_incarnation: self.ident.incarnation,
            to_incarnation: self.expect,
            rpc,
        })?;
        let start = Instant::now();
        let s = match self.conn.take() {
            Some(s) => s,
            None => self.open(ttl, gated).await?,
        };
        let left = ttl.saturating_sub(start.elapsed());
        let r = tokio::time::timeout(left, exchange(s, body))
            .await
            .unwrap_or_else(|_| {
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "raft rpc timed out",
                ))
            });
        let (s, reply) = match r {
            Ok(ok) => ok,
            Err(e) => {
                note_reachable(self.target, &self.addr, Err(&e));
                return Err(CallError::Failed(e));
            }
        };
        self.conn = Some(s);
        let checked = self.checked(reply);
        note_answer(self.target, checked.is_ok());
        note_reachable(self.target, &self.addr, checked.as_ref().map(|_| ()));
        // A reply that does not count (another storage, a refusal) will not count on the
        // next call either: openraft waits out the back-off rather than asking again at
        // once, which would spin a core for as long as the member waits for re-admission.
        checked.map_err(CallError::Unreachable)
    }

    /// A new connection to the peer, unless it is backed off (`gated`); a failure starts
    /// or lengthens its back-off.
    async fn open(&self, ttl: Duration, gated: bool) -> Result<Box<dyn PeerIo>, CallError> {
        if gated {
            if let Some(left) = backoff_left(self.target) {
                return Err(CallError::Unreachable(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!(
                        "node {} not called for another {left:?}: its last connection failed",
                        self.target
                    ),
                )));
            }
        }
        tracing::debug!("raft: connecting to peer {} at {}", self.target, self.addr);
        let r = tokio::time::timeout(ttl, connect(&self.addr, self.tls.as_deref()))
            .await
            .unwrap_or_else(|_| {
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "raft connection timed out",
                ))
            });
        note_connect(self.target, r.is_ok());
        r.map_err(|e| {
            note_reachable(self.target, &self.addr, Err(&e));
            CallError::Unreachable(e)
        })
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

/// Sends one request on `s` and reads its reply; hands the connection back with it.
async fn exchange(
    mut s: Box<dyn PeerIo>,
    body: Vec<u8>,
) -> io::Result<(Box<dyn PeerIo>, ReplyEnvelope)> {
    write_frame(&mut s, &body).await?;
    let reply = read_frame(&mut s).await?;
    let reply = decode_reply(&reply)?;
    Ok((s, reply))
}

/// What this process knows of a peer. One process runs one member, so one map serves
/// every client openraft makes to a peer (one per replication stream, one for votes):
/// they share the peer's back-off.
#[derive(Clone, Copy, Default)]
struct PeerState {
    /// Whether the last call answered; `None`: not called yet.
    up: Option<bool>,
    /// Whether it ever answered.
    ever: bool,
    /// Connections that failed in a row.
    failures: u32,
    /// No new connection before this instant.
    retry_at: Option<Instant>,
    /// Connections tried since the process started.
    attempts: u64,
    /// Replies not counted since the process started (another storage, a refusal).
    refused: u64,
}

static PEERS: parking_lot::Mutex<Option<HashMap<NodeId, PeerState>>> =
    parking_lot::Mutex::new(None);

fn with_peer<T>(target: NodeId, f: impl FnOnce(&mut PeerState) -> T) -> T {
    let mut map = PEERS.lock();
    f(map
        .get_or_insert_with(HashMap::new)
        .entry(target)
        .or_default())
}

/// How long `target` is still backed off, if it is.
fn backoff_left(target: NodeId) -> Option<Duration> {
    let at = with_peer(target, |p| p.retry_at)?;
    at.checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

/// Counts a connection attempt; a failed one backs the peer off for longer, a good one
/// ends its back-off.
fn note_connect(target: NodeId, ok: bool) {
    with_peer(target, |p| {
        p.attempts += 1;
        if ok {
            p.failures = 0;
            p.retry_at = None;
        } else {
            p.failures = p.failures.saturating_add(1);
            let pause = backoff_delay(p.failures, rand::random::<f64>() * 0.5 + 0.5);
            p.retry_at = Some(Instant::now() + pause);
        }
    })
}

/// Counts a reply: one that counts ends the peer's back-off, one that does not (a member
/// that lost its state, a refusal) backs it off as a failed connection would.
fn note_answer(target: NodeId, counted: bool) {
    with_peer(target, |p| {
        if counted {
            p.failures = 0;
            p.retry_at = None;
        } else {
            p.refused += 1;
            p.failures = p.failures.saturating_add(1);
            let pause = backoff_delay(p.failures, rand::random::<f64>() * 0.5 + 0.5);
            p.retry_at = Some(Instant::now() + pause);
        }
    })
}

/// How many connections this process tried to open to `target`.
pub fn connect_attempts(target: NodeId) -> u64 {
    with_peer(target, |p| p.attempts)
}

/// What `INFO replication` shows of a peer: whether its last call answered (`None`: not
/// called yet), connections tried, replies not counted.
pub fn peer_stats(target: NodeId) -> (Option<bool>, u64, u64) {
    with_peer(target, |p| (p.up, p.attempts, p.refused))
}

/// Logs a peer's reachability when it changes, never per call: openraft retries a peer
/// many times a second, and a peer not up yet (members start one after another) or down
/// for a while is a state for the operator to see once, not an error per heartbeat.
fn note_reachable(target: NodeId, addr: &str, outcome: Result<(), &io::Error>) {
    let now = outcome.is_ok();
    let (before, ever) = with_peer(target, |p| {
        let before = (p.up, p.ever);
        p.up = Some(now);
        p.ever |= now;
        before
    });
    match (before, ever, outcome) {
        (Some(was), _, _) if was == now => {}
        (_, false, Ok(())) => tracing::info!("raft: peer {target} at {addr} reachable"),
        (_, true, Ok(())) => tracing::info!("raft: peer {target} at {addr} reachable again"),
        (None, _, Err(e)) => tracing::info!("raft: peer {target} at {addr} not reachable yet: {e}"),
        (Some(_), _, Err(e)) => tracing::warn!("raft: peer {target} at {addr} unreachable: {e}"),
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
        if !self
            .lease
            .may_send(self.target, term, sent, self.mute_after)
        {
            return Err(RPCError::Unreachable(Unreachable::new(&io::Error::other(
                "no majority answered this leader: appends held back until a newer term",
            ))));
        }
        self.lease.sending(term, sent);
        let r = self.call(&Rpc::Append(rpc), option.hard_ttl(), true).await;
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
        let r = self
            .call(&Rpc::Snapshot(rpc), option.hard_ttl(), true)
            .await;
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
        let r = self.call(&Rpc::Vote(rpc), option.hard_ttl(), true).await;
        self.answer(r, |r| match r {
            RpcReply::Vote(a) => Some(a),
            _ => None,
        })
    }

    /// openraft's pause after an `Unreachable`: until this peer's back-off ends, so that
    /// its replication to the peer waits as long as a new connection would.
    fn backoff(&self) -> Backoff {
        let target = self.target;
        Backoff::new(std::iter::repeat_with(move || {
            backoff_left(target).map_or(BACKOFF_FIRST, |d| d.max(BACKOFF_FIRST))
        }))
    }
}

/// Asks `target` to stand for election at once (a switchover).
pub async fn ask_to_elect(mut net: Network, target: NodeId, node: &NodeInfo) -> io::Result<()> {
    let mut peer = net.new_client(target, node).await;
    match peer
        .call(&Rpc::Elect, Duration::from_secs(2), false)
        .await?
    {
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
    let node = peer.addr.clone();
    match peer.call(&Rpc::Hello, ttl, false).await? {
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
    match peer.call(&Rpc::Progress, ttl, false).await? {
        RpcReply::Progress(last) => Ok(last),
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
    match peer.call(&rpc, Duration::from_secs(5), false).await? {
        RpcReply::Init(r) => r.map_err(|why| io::Error::other(format!("refused: {why}"))),
        _ => Err(io::Error::other("mismatched reply")),
    }
}

/// Serves the peers' RPCs. `no_votes`: while set, vote and election requests are
/// refused (a member the group has not admitted as a voter under this storage's
/// incarnation must not vote: it may have voted in these terms before it lost its state).
pub async fn serve(
    listener: TcpListener,
    raft: Raft,
    no_votes: Arc<AtomicBool>,
    ident: Arc<Identity>,
    tls: Option<Arc<Tls>>,
) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("raft: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (raft, no_votes, ident) = (raft.clone(), no_votes.clone(), ident.clone());
        let acceptor = tls.as_ref().and_then(|t| t.peers()).map(|p| p.0);
        tokio::spawn(async move {
            let _ = stream.set_nodelay(true);
            let s: Box<dyn PeerIo> = match acceptor {
                None => Box::new(stream),
                Some(a) => {
                    let hs = tokio::time::timeout(crate::tls::HANDSHAKE_TIMEOUT, a.accept(stream));
                    match hs.await {
                        Ok(Ok(s)) => Box::new(s),
                        Ok(Err(e)) => {
                            return tracing::warn!("raft: peer TLS handshake failed: {e}")
                        }
                        Err(_) => return tracing::warn!("raft: peer TLS handshake timed out"),
                    }
                }
            };
            if let Err(e) = serve_peer(s, raft, no_votes, ident).await {
                tracing::debug!("raft: peer connection ended: {e}");
            }
        });
    }
}

async fn serve_peer(
    mut s: Box<dyn PeerIo>,
    raft: Raft,
    no_votes: Arc<AtomicBool>,
    ident: Arc<Identity>,
) -> io::Result<()> {
    loop {
        let body = read_frame(&mut s).await?;
        let env = decode_request(&body)?;
        // A route that leads back here (a misconfigured --raft-route or --raft-peers):
        // openraft must never see its own requests as a peer's (a leader receiving its
        // own append-entries stops its core).
        if env.from == ident.node && !matches!(env.rpc, Rpc::Hello) {
            tracing::error!(
                "raft: a request from this member itself reached its Raft port: a peer address or --raft-route points back here; dropped"
            );
            return Err(io::Error::other("request from this member itself"));
        }
        let reply = match admit(&env, &raft, &ident, &no_votes) {
            Err(why) => {
                note_refused(&env, &why);
                RpcReply::Refused(why)
            }
            Ok(()) => handle(env.rpc, &raft, &ident, &no_votes).await,
        };
        let out = encode(&ReplyEnvelope {
            incarnation: ident.incarnation,
            reply,
        })?;
        write_frame(&mut s, &out).await?;
    }
}

async fn handle(rpc: Rpc, raft: &Raft, ident: &Identity, no_votes: &AtomicBool) -> RpcReply {
    match rpc {
        Rpc::Append(r) => {
            let from = r.vote.leader_id.node_id;
            let reply = raft.append_entries(r).await;
            if matches!(&reply, Ok(a) if !matches!(a, AppendEntriesResponse::HigherVote(_))) {
                *LAST_APPEND.lock() = Some((from, Instant::now()));
            }
            RpcReply::Append(reply)
        }
        Rpc::Vote(r) => RpcReply::Vote(raft.vote(r).await),
        Rpc::Snapshot(r) => RpcReply::Snapshot(raft.install_snapshot(r).await),
        // A member not admitted as a voter may not stand.
        Rpc::Progress => RpcReply::Progress(raft.metrics().borrow().last_log_index),
        Rpc::Elect => RpcReply::Elect(
            !no_votes.load(Ordering::Acquire) && raft.trigger().elect().await.is_ok(),
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

/// The leader whose append this member last took, and when (one process runs one
/// member): a follower names a leader to clients only while it hears from it.
static LAST_APPEND: parking_lot::Mutex<Option<(NodeId, Instant)>> = parking_lot::Mutex::new(None);

/// How long ago this member last took an append from `leader` (`None`: never).
pub fn heard_from(leader: NodeId) -> Option<Duration> {
    let (from, at) = (*LAST_APPEND.lock())?;
    (from == leader).then(|| at.elapsed())
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
        Rpc::Hello | Rpc::Init { .. } | Rpc::Progress => return Ok(()),
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
    if voting && !may_vote {
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

/// Logs a refused peer once per sender and reason kind, not per heartbeat.
fn note_refused(env: &Envelope<Rpc>, why: &str) {
    static SEEN: parking_lot::Mutex<Option<std::collections::HashSet<(NodeId, u64, u64)>>> =
        parking_lot::Mutex::new(None);
    let key = (env.from, env.from_incarnation, env.to_incarnation);
    if SEEN.lock().get_or_insert_with(Default::default).insert(key) {
        tracing::warn!("raft: refused a request from node {}: {why}", env.from);
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

    #[test]
    fn a_failed_connection_backs_a_peer_off_and_a_good_one_ends_it() {
        let peer = 9_999_001;
        assert_eq!(backoff_left(peer), None);
        note_connect(peer, false);
        note_connect(peer, false);
        let (failures, until) = with_peer(peer, |p| (p.failures, p.retry_at));
        assert_eq!(failures, 2);
        assert!(until.is_some_and(|u| u <= Instant::now() + BACKOFF_FIRST * 2));
        note_connect(peer, true);
        assert_eq!(backoff_left(peer), None);
        assert_eq!(with_peer(peer, |p| p.failures), 0);
        assert_eq!(connect_attempts(peer), 3);
    }
}
