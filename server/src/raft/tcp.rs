//! The server's [`Transport`]: each request and its reply one frame each over TCP
//! (`[u32 length][bincode body]`, [`network`](super::network)), TLS on it with
//! `--tls-replication` (both ends presenting the member's certificate, each checked
//! against the CA).
//!
//! A link keeps one connection, opened on first use and dropped on any error (the next
//! call opens it again). Only connecting is backed off (the member's [`PeerTable`]): a
//! failure on an open connection (a peer killed mid-call) is a plain network error,
//! retried at once, so a failover among live members never waits for the back-off.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::Duration;

// tokio's clock: the call's time-to-live is counted by it.
use tokio::time::Instant;

use tokio::net::{TcpListener, TcpStream};

use super::message::{decode_reply, decode_request, encode_frame, read_frame, write_frame};
use super::message::{Envelope, ReplyEnvelope, Rpc, LOG};
use super::peers::PeerTable;
use super::respond::Responder;
use super::transport::{CallError, CallFuture, Link, ServeFuture, Transport};
use super::{NodeId, NodeInfo};
use crate::takeover::Io;
use crate::tls::Tls;

/// A peer connection, TCP or TLS (openraft shares a peer's client between threads).
trait PeerIo: Io + Sync {}
impl<T: Io + Sync> PeerIo for T {}

/// Peers over TCP (TLS with `--tls-replication`), listening on `--raft-listen`.
pub struct TcpTransport {
    /// Where this member listens for its peers (`--raft-listen`).
    pub listen: String,
    /// `--raft-route ID=ADDR`: where to connect instead of a member's advertised
    /// `raft_addr` (a proxy, a NAT), by node id.
    pub routes: HashMap<NodeId, String>,
    /// `--tls-replication`: peers are called and answered over TLS.
    pub tls: Option<Arc<Tls>>,
}

impl Transport for TcpTransport {
    fn link(&self, target: NodeId, node: &NodeInfo, peers: Arc<PeerTable>) -> Box<dyn Link> {
        let addr = self
            .routes
            .get(&target)
            .cloned()
            .unwrap_or_else(|| node.raft_addr.clone());
        Box::new(TcpLink {
            target,
            addr,
            tls: self.tls.clone(),
            conn: None,
            peers,
        })
    }

    fn serve(&self, responder: Arc<Responder>) -> ServeFuture<'_> {
        Box::pin(async move {
            let listener = TcpListener::bind(&self.listen)
                .await
                .map_err(|e| format!("bind --raft-listen {}: {e}", self.listen))?;
            Ok(tokio::spawn(serve(listener, responder, self.tls.clone())))
        })
    }

    fn client_port_answers(&self, addr: &str) -> bool {
        port_answers(addr)
    }
}

/// One connection to a peer member, opened on first use and reopened after an error.
struct TcpLink {
    target: NodeId,
    addr: String,
    tls: Option<Arc<Tls>>,
    conn: Option<Box<dyn PeerIo>>,
    peers: Arc<PeerTable>,
}

impl Link for TcpLink {
    fn addr(&self) -> &str {
        &self.addr
    }

    /// The connection is taken out of the link for the call and put back only after a
    /// whole reply was read: a call that fails, times out or is dropped half way
    /// (openraft drops replication futures it no longer needs) takes the connection with
    /// it, so no later call can read the reply meant for this one.
    fn call(&mut self, req: Envelope<Rpc>, ttl: Duration, gated: bool) -> CallFuture<'_> {
        Box::pin(async move {
            let frame = encode_frame(&req)?;
            let start = Instant::now();
            let s = match self.conn.take() {
                Some(s) => s,
                None => self.open(ttl, gated).await?,
            };
            let left = ttl.saturating_sub(start.elapsed());
            let r = tokio::time::timeout(left, exchange(s, frame))
                .await
                .unwrap_or_else(|_| {
                    Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "raft rpc timed out",
                    ))
                });
            match r {
                Ok((s, reply)) => {
                    self.conn = Some(s);
                    Ok(reply)
                }
                Err(e) => {
                    self.peers.note_reachable(self.target, &self.addr, Err(&e));
                    Err(CallError::Failed(e))
                }
            }
        })
    }
}

impl TcpLink {
    /// A new connection to the peer, unless it is backed off (`gated`); a failure starts
    /// or lengthens its back-off.
    async fn open(&self, ttl: Duration, gated: bool) -> Result<Box<dyn PeerIo>, CallError> {
        if gated {
            if let Some(left) = self.peers.backoff_left(self.target) {
                return Err(CallError::Unreachable(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!(
                        "node {} not called for another {left:?}: its last connection failed",
                        self.target
                    ),
                )));
            }
        }
        tracing::debug!(target: LOG, "raft: connecting to peer {} at {}", self.target, self.addr);
        let r = tokio::time::timeout(ttl, connect(&self.addr, self.tls.as_deref()))
            .await
            .unwrap_or_else(|_| {
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "raft connection timed out",
                ))
            });
        self.peers.note_connect(self.target, r.is_ok());
        r.map_err(|e| {
            self.peers.note_reachable(self.target, &self.addr, Err(&e));
            CallError::Unreachable(e)
        })
    }
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

/// Sends one request on `s` and reads its reply; hands the connection back with it.
async fn exchange(
    mut s: Box<dyn PeerIo>,
    frame: Vec<u8>,
) -> io::Result<(Box<dyn PeerIo>, ReplyEnvelope)> {
    write_frame(&mut s, &frame).await?;
    let reply = read_frame(&mut s).await?;
    let reply = decode_reply(&reply)?;
    Ok((s, reply))
}

/// Serves the peers' RPCs: a task per connection, each frame answered by `responder`.
async fn serve(listener: TcpListener, responder: Arc<Responder>, tls: Option<Arc<Tls>>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(target: LOG, "raft: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let responder = responder.clone();
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
                            return tracing::warn!(target: LOG, "raft: peer TLS handshake failed: {e}")
                        }
                        Err(_) => {
                            return tracing::warn!(target: LOG, "raft: peer TLS handshake timed out")
                        }
                    }
                }
            };
            if let Err(e) = serve_peer(s, &responder).await {
                tracing::debug!(target: LOG, "raft: peer connection ended: {e}");
            }
        });
    }
}

async fn serve_peer(mut s: Box<dyn PeerIo>, responder: &Responder) -> io::Result<()> {
    loop {
        let body = read_frame(&mut s).await?;
        let env = decode_request(&body)?;
        let reply = responder.answer(env).await.map_err(io::Error::other)?;
        write_frame(&mut s, &encode_frame(&reply)?).await?;
    }
}

/// Whether `addr` accepts a TCP connection within 100 ms (a refused port answers at
/// once; only an unreachable host takes the whole timeout).
fn port_answers(addr: &str) -> bool {
    use std::net::ToSocketAddrs as _;
    let Some(sa) = addr.to_socket_addrs().ok().and_then(|mut a| a.next()) else {
        return false;
    };
    std::net::TcpStream::connect_timeout(&sa, Duration::from_millis(100)).is_ok()
}

/// What a server's member listens on and calls its peers with, from its flags.
pub fn transport(
    listen: &str,
    routes: &HashMap<NodeId, String>,
    tls: Option<Arc<Tls>>,
) -> Arc<dyn Transport> {
    Arc::new(TcpTransport {
        listen: listen.to_owned(),
        routes: routes.clone(),
        tls,
    })
}
