//! The network between the members of a group: openraft's three RPCs over TCP, one
//! request and one reply per frame, `[u32 length][bincode body]`.
//!
//! Each node listens on its Raft address (`--raft-listen`) and keeps one connection per
//! peer it calls, opened on first use and dropped on any error (the next heartbeat opens
//! it again). A frame larger than [`MAX_FRAME`] ends the connection: a peer's bytes are
//! bounded like a client's. Failures are reported as network errors rather than
//! "unreachable": openraft backs off half a second from an unreachable peer, which would
//! add that to every failover. With `--tls-replication` every peer connection is TLS,
//! both ends presenting the member's certificate, each checked against the CA.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bincode::Options;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
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
}

/// Creates a [`Peer`] per member openraft talks to. `routes` overrides where a peer is
/// reached (`--raft-route ID=ADDR`: a proxy, a NAT), by node id.
#[derive(Clone, Default)]
pub struct Network {
    /// Peer address overrides by node id: where to connect instead of the member's advertised
    /// `raft_addr`.
    pub routes: Arc<HashMap<NodeId, String>>,
    /// `--tls-replication`: peers are called over TLS.
    pub tls: Option<Arc<Tls>>,
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
        }
    }
}

/// One connection to a peer member, opened on first use and reopened after an error.
pub struct Peer {
    target: NodeId,
    addr: String,
    tls: Option<Arc<Tls>>,
    conn: Option<Box<dyn PeerIo>>,
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
pub fn decode_request(body: &[u8]) -> io::Result<Rpc> {
    let rpc: Rpc = wire().deserialize(body).map_err(io::Error::other)?;
    let batches_ok = match &rpc {
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
    Ok(rpc)
}

/// A reply frame's body, read back from a peer this node called.
pub fn decode_reply(body: &[u8]) -> io::Result<RpcReply> {
    wire().deserialize(body).map_err(io::Error::other)
}

fn net_err<E: std::error::Error + 'static>(e: &E) -> NetworkError {
    NetworkError::new(e)
}

impl Peer {
    /// One request and its reply. The connection is taken out of `self` for the call and
    /// put back only after a whole reply was read: a call that fails, times out or is
    /// dropped half way (openraft drops replication futures it no longer needs) takes the
    /// connection with it, so no later call can read the reply meant for this one.
    async fn call(&mut self, rpc: &Rpc, ttl: Duration) -> io::Result<RpcReply> {
        let body = encode(rpc)?;
        let held = self.conn.take();
        let addr = self.addr.clone();
        let tls = self.tls.clone();
        let r = tokio::time::timeout(ttl, async move {
            let mut s = match held {
                Some(s) => s,
                None => connect(&addr, tls.as_deref()).await?,
            };
            write_frame(&mut s, &body).await?;
            let reply = read_frame(&mut s).await?;
            let reply = decode_reply(&reply)?;
            Ok((s, reply))
        })
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
                return Err(e);
            }
        };
        note_reachable(self.target, &self.addr, Ok(()));
        self.conn = Some(s);
        Ok(reply)
    }
}

/// Whether each peer answered its last call, and whether it ever did (absent: not
/// called yet). One process runs one member, so one map serves every client openraft
/// makes to a peer.
static REACHABLE: parking_lot::Mutex<Option<HashMap<NodeId, (bool, bool)>>> =
    parking_lot::Mutex::new(None);

/// Logs a peer's reachability when it changes, never per call: openraft retries a peer
/// many times a second, and a peer not up yet (members start one after another) or down
/// for a while is a state for the operator to see once, not an error per heartbeat.
fn note_reachable(target: NodeId, addr: &str, outcome: Result<(), &io::Error>) {
    let now = outcome.is_ok();
    let before = {
        let mut map = REACHABLE.lock();
        let map = map.get_or_insert_with(HashMap::new);
        let ever = map.get(&target).is_some_and(|(_, ever)| *ever);
        map.insert(target, (now, ever || now))
    };
    match (before, outcome) {
        (Some((was, _)), _) if was == now => {}
        (None | Some((_, false)), Ok(())) => {
            tracing::info!("raft: peer {target} at {addr} reachable")
        }
        (Some(_), Ok(())) => tracing::info!("raft: peer {target} at {addr} reachable again"),
        (None, Err(e)) => tracing::info!("raft: peer {target} at {addr} not reachable yet: {e}"),
        (Some(_), Err(e)) => tracing::warn!("raft: peer {target} at {addr} unreachable: {e}"),
    }
}

impl Peer {
    /// The reply of one RPC as openraft wants it: the peer's own error as a remote
    /// error, anything else (no connection, a reply of the wrong kind) as a network one.
    #[allow(clippy::result_large_err)] // openraft's own error type, as its trait returns it
    fn answer<T, E: std::error::Error>(
        &self,
        r: io::Result<RpcReply>,
        pick: impl FnOnce(RpcReply) -> Option<Result<T, E>>,
    ) -> Result<T, RPCError<NodeId, NodeInfo, E>> {
        match r.map(pick) {
            Ok(Some(r)) => r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e))),
            Ok(None) => Err(RPCError::Network(net_err(&io::Error::other(
                "mismatched reply",
            )))),
            Err(e) => Err(RPCError::Network(net_err(&e))),
        }
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, NodeInfo, RaftError<NodeId>>> {
        let r = self.call(&Rpc::Append(rpc), option.hard_ttl()).await;
        self.answer(r, |r| match r {
            RpcReply::Append(a) => Some(a),
            _ => None,
        })
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, NodeInfo, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let r = self.call(&Rpc::Snapshot(rpc), option.hard_ttl()).await;
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
        let r = self.call(&Rpc::Vote(rpc), option.hard_ttl()).await;
        self.answer(r, |r| match r {
            RpcReply::Vote(a) => Some(a),
            _ => None,
        })
    }
}

/// Asks `target` to stand for election at once (a switchover).
pub async fn ask_to_elect(mut net: Network, target: NodeId, node: &NodeInfo) -> io::Result<()> {
    let mut peer = net.new_client(target, node).await;
    match peer.call(&Rpc::Elect, Duration::from_secs(2)).await? {
        RpcReply::Elect(true) => Ok(()),
        RpcReply::Elect(false) => Err(io::Error::other("it cannot stand for election now")),
        _ => Err(io::Error::other("mismatched reply")),
    }
}

/// Serves the peers' RPCs. `no_votes`: while set, vote requests are not answered (a node
/// rejoining with an empty log must not vote before it has caught up: it may have
/// voted in these terms before it lost its log).
pub async fn serve(
    listener: TcpListener,
    raft: Raft,
    no_votes: Arc<AtomicBool>,
    me: NodeId,
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
        let (raft, no_votes) = (raft.clone(), no_votes.clone());
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
            if let Err(e) = serve_peer(s, raft, no_votes, me).await {
                tracing::debug!("raft: peer connection ended: {e}");
            }
        });
    }
}

async fn serve_peer(
    mut s: Box<dyn PeerIo>,
    raft: Raft,
    no_votes: Arc<AtomicBool>,
    me: NodeId,
) -> io::Result<()> {
    loop {
        let body = read_frame(&mut s).await?;
        let rpc = decode_request(&body)?;
        // A route that leads back here (a misconfigured --raft-route or --raft-peers):
        // openraft must never see its own requests as a peer's (a leader receiving its
        // own append-entries stops its core).
        let from = match &rpc {
            Rpc::Append(r) => r.vote.leader_id().voted_for(),
            Rpc::Vote(r) => r.vote.leader_id().voted_for(),
            Rpc::Snapshot(r) => r.vote.leader_id().voted_for(),
            Rpc::Elect => None,
        };
        if from == Some(me) {
            tracing::error!(
                "raft: a request from this member itself reached its Raft port: a peer address or --raft-route points back here; dropped"
            );
            return Err(io::Error::other("request from this member itself"));
        }
        let reply = match rpc {
            Rpc::Append(r) => RpcReply::Append(raft.append_entries(r).await),
            Rpc::Vote(r) => {
                if no_votes.load(Ordering::Acquire) {
                    return Err(io::Error::other("not voting until caught up"));
                }
                RpcReply::Vote(raft.vote(r).await)
            }
            Rpc::Snapshot(r) => RpcReply::Snapshot(raft.install_snapshot(r).await),
            // A member rejoining empty may not stand before it has caught up.
            Rpc::Elect => RpcReply::Elect(
                !no_votes.load(Ordering::Acquire) && raft.trigger().elect().await.is_ok(),
            ),
        };
        let out = encode(&reply)?;
        write_frame(&mut s, &out).await?;
    }
}
