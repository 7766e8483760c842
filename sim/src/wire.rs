//! The in-memory [`Transport`] the simulated `RaftNode`s talk over (`nodes`): each
//! request encoded as the server's frames carry it (`network::encode`, read back with
//! `network::decode_request`, so a request the server would refuse to decode is refused
//! here too), handed to the target's [`Responder`] (the server's receiving side: the
//! identity checks, then openraft), each leg (request, reply) delayed by a draw from the
//! seed, directed links cut one way or both, a member that is down refusing.
//!
//! Connections follow the TCP link's rules (`MemLink`), with the member's own
//! `PeerTable`: so openraft gets `Unreachable` and waits out its back-off, in a
//! `select!` without `biased` (tokio draws its branch order from a generator it seeds at
//! random; its two branches are rarely ready at once, and the digests stay equal from
//! one process to another: docs/simulation.md). What it leaves out: TLS, the bytes on a
//! socket.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::Rng;
use stockgate_server::raft::network::{self, Envelope, ReplyEnvelope, Rpc};
use stockgate_server::raft::peers::PeerTable;
use stockgate_server::raft::respond::Responder;
use stockgate_server::raft::runtime::under_gate;
use stockgate_server::raft::transport::{CallError, CallFuture, Link, ServeFuture, Transport};
use stockgate_server::raft::{NodeId, NodeInfo};

use crate::gate::Gate;

/// How long a call whose member went down after the request left takes to fail (a
/// reset connection fails at once; the pause keeps openraft's immediate retry of a
/// network error from spinning without simulated time passing).
const RESET_AFTER: Duration = Duration::from_millis(50);

/// The members listening now, the cut links and the generator of the delays.
pub struct Wire(Mutex<State>);

struct State {
    listening: BTreeMap<NodeId, Arc<Responder>>,
    /// Each member's task gate: its answers to requests run under it.
    gates: BTreeMap<NodeId, Arc<Gate>>,
    /// Directed links that carry nothing: (from, to).
    cut: BTreeSet<(NodeId, NodeId)>,
    rng: StdRng,
    max_delay_ms: u64,
    sent: u64,
    lost: u64,
    /// While set: the per-mille chance that a leg is lost and that a request is
    /// delivered a second time (`set_lossy`).
    lossy: Option<(u32, u32)>,
    duplicated: u64,
}

impl Wire {
    /// No member listening yet, no cut link; each leg delayed up to `max_delay_ms`.
    pub fn new(rng: StdRng, max_delay_ms: u64) -> Arc<Wire> {
        Arc::new(Wire(Mutex::new(State {
            listening: BTreeMap::new(),
            gates: BTreeMap::new(),
            cut: BTreeSet::new(),
            rng,
            max_delay_ms,
            sent: 0,
            lost: 0,
            lossy: None,
            duplicated: 0,
        })))
    }

    /// Cuts every link between `id` and the others, both ways.
    pub fn isolate(&self, id: NodeId, all: &BTreeSet<NodeId>) {
        let mut s = self.0.lock();
        for &o in all.iter().filter(|o| **o != id) {
            s.cut.insert((id, o));
            s.cut.insert((o, id));
        }
    }

    /// Cuts the link `from` → `to` only.
    pub fn cut(&self, from: NodeId, to: NodeId) {
        self.0.lock().cut.insert((from, to));
    }

    /// Every link carries again.
    pub fn heal(&self) {
        self.0.lock().cut.clear();
    }

    /// Heals the link `from` → `to` only.
    pub fn uncut(&self, from: NodeId, to: NodeId) {
        self.0.lock().cut.remove(&(from, to));
    }

    /// Whether the link `from` → `to` is cut.
    pub fn is_cut(&self, from: NodeId, to: NodeId) -> bool {
        self.0.lock().cut.contains(&(from, to))
    }

    /// From now on each leg is lost with `loss` per mille and each delivered request
    /// delivered again with `dup` per mille (`None`: neither). Draws are made only while
    /// set, so a run that never sets it draws what it drew before.
    pub fn set_lossy(&self, lossy: Option<(u32, u32)>) {
        self.0.lock().lossy = lossy;
    }

    /// Requests delivered twice so far.
    pub fn duplicated(&self) -> u64 {
        self.0.lock().duplicated
    }

    /// Whether this request, just delivered, is delivered again, and after how long: up
    /// to ten maximum delays, so often after later requests on the same link (a stale
    /// replay).
    fn duplicate(&self) -> Option<Duration> {
        let mut s = self.0.lock();
        let (_, dup) = s.lossy?;
        if s.rng.gen_range(0..1_000) >= dup {
            return None;
        }
        s.duplicated += 1;
        let most = s.max_delay_ms * 10;
        Some(Duration::from_millis(s.rng.gen_range(0..=most)))
    }

    /// Legs sent and lost so far.
    pub fn counts(&self) -> (u64, u64) {
        let s = self.0.lock();
        (s.sent, s.lost)
    }

    /// The fate of one leg `from` → `to`: its delay, or `None` when the link is cut. One
    /// draw per leg, cut or not, so a cut changes no later draw.
    fn leg(&self, from: NodeId, to: NodeId) -> Option<Duration> {
        let mut s = self.0.lock();
        s.sent += 1;
        let most = s.max_delay_ms;
        let delay = s.rng.gen_range(0..=most);
        let dropped = match s.lossy {
            Some((loss, _)) => s.rng.gen_range(0..1_000) < loss,
            None => false,
        };
        if dropped || s.cut.contains(&(from, to)) {
            s.lost += 1;
            return None;
        }
        Some(Duration::from_millis(delay))
    }

    fn listener(&self, id: NodeId) -> Option<Arc<Responder>> {
        self.0.lock().listening.get(&id).cloned()
    }

    /// Member `id`'s answers run under `gate` from now on.
    pub fn set_gate(&self, id: NodeId, gate: Arc<Gate>) {
        self.0.lock().gates.insert(id, gate);
    }

    fn gate(&self, id: NodeId) -> Option<Arc<Gate>> {
        self.0.lock().gates.get(&id).cloned()
    }
}

/// One member's transport on the shared [`Wire`].
pub struct MemTransport(pub Arc<Wire>);

/// Takes a member off the wire when its listener's task ends (aborted at its crash).
struct Listening(Arc<Wire>, NodeId);

impl Drop for Listening {
    fn drop(&mut self) {
        self.0 .0.lock().listening.remove(&self.1);
    }
}

impl Transport for MemTransport {
    fn link(&self, target: NodeId, node: &NodeInfo, peers: Arc<PeerTable>) -> Box<dyn Link> {
        Box::new(MemLink {
            wire: self.0.clone(),
            target,
            addr: node.raft_addr.clone(),
            peers,
            connected: false,
        })
    }

    fn serve(&self, responder: Arc<Responder>) -> ServeFuture<'_> {
        let wire = self.0.clone();
        Box::pin(async move {
            let id = responder.node();
            wire.0.lock().listening.insert(id, responder);
            let guard = Listening(wire, id);
            Ok(tokio::spawn(async move {
                let _guard = guard;
                std::future::pending::<()>().await
            }))
        })
    }

    /// Nobody connects to a simulated client port: a member that listens answers.
    fn client_port_answers(&self, addr: &str) -> bool {
        let s = self.0 .0.lock();
        s.listening
            .keys()
            .any(|id| addr == client_addr(*id).as_str())
    }
}

/// Member `id`'s client address.
pub fn client_addr(id: NodeId) -> String {
    format!("10.0.0.{id}:6379")
}

/// Member `id`'s Raft address.
pub fn raft_addr(id: NodeId) -> String {
    format!("n{id}:7000")
}

/// A link to one peer: "connected" once a call found the peer listening, until a call
/// on it fails, as the TCP link keeps its connection. Connecting is what is backed off
/// (the member's `PeerTable`, the server's rule): a peer down refuses at once, one
/// behind a cut link is silent until the call's time-to-live; either is openraft's
/// `Unreachable`, and a gated call to a peer in its back-off pause is refused without
/// trying.
struct MemLink {
    wire: Arc<Wire>,
    target: NodeId,
    addr: String,
    peers: Arc<PeerTable>,
    connected: bool,
}

impl Link for MemLink {
    fn addr(&self) -> &str {
        &self.addr
    }

    /// Connects if not connected, then the request leg, the target's answer and the
    /// reply leg, all within `ttl`; a cut leg is silence (the call times out, as over a
    /// dead link). A failed call drops the connection.
    fn call(&mut self, req: Envelope<Rpc>, ttl: Duration, gated: bool) -> CallFuture<'_> {
        Box::pin(async move {
            if !self.connected {
                self.connect(req.from, ttl, gated).await?;
            }
            let r = tokio::time::timeout(ttl, exchange(self.wire.clone(), req, self.target))
                .await
                .unwrap_or_else(|_| {
                    Err(CallError::Failed(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "raft rpc timed out",
                    )))
                });
            if let Err(e) = &r {
                self.connected = false;
                let e = io::Error::other(e.to_string());
                self.peers.note_reachable(self.target, &self.addr, Err(&e));
            }
            r
        })
    }
}

impl MemLink {
    /// A new connection from `from`, unless the peer is backed off (`gated`); a failure
    /// starts or lengthens its back-off, as the TCP link's does.
    async fn connect(&mut self, from: NodeId, ttl: Duration, gated: bool) -> Result<(), CallError> {
        let to = self.target;
        if gated {
            if let Some(left) = self.peers.backoff_left(to) {
                return Err(CallError::Unreachable(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!(
                        "node {to} not called for another {left:?}: its last connection failed"
                    ),
                )));
            }
        }
        let e = if self.wire.0.lock().cut.contains(&(from, to)) {
            tokio::time::sleep(ttl).await;
            io::Error::new(io::ErrorKind::TimedOut, "raft connection timed out")
        } else if self.wire.listener(to).is_none() {
            io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("node {to} is down"),
            )
        } else {
            self.peers.note_connect(to, true);
            self.connected = true;
            return Ok(());
        };
        self.peers.note_connect(to, false);
        self.peers.note_reachable(to, &self.addr, Err(&e));
        Err(CallError::Unreachable(e))
    }
}

/// One request and its reply over a connection to `to`: a member gone meanwhile resets
/// it (after a short pause, so that retries take simulated time).
async fn exchange(
    wire: Arc<Wire>,
    req: Envelope<Rpc>,
    to: NodeId,
) -> Result<ReplyEnvelope, CallError> {
    let from = req.from;
    let body = network::encode(&req)?;
    let there = match wire.leg(from, to) {
        Some(d) => d,
        None => std::future::pending().await,
    };
    tokio::time::sleep(there).await;
    let Some(responder) = wire.listener(to) else {
        tokio::time::sleep(RESET_AFTER).await;
        return Err(CallError::Failed(io::Error::new(
            io::ErrorKind::ConnectionReset,
            format!("node {to} is down"),
        )));
    };
    let env = network::decode_request(&body)?;
    let gate = wire.gate(to);
    if let Some(later) = wire.duplicate() {
        replay(responder.clone(), gate.clone(), body.clone(), later);
    }
    let reply = answer(responder, gate, env).await?;
    let back = network::encode(&reply)?;
    let delay = match wire.leg(to, from) {
        Some(d) => d,
        None => std::future::pending().await,
    };
    tokio::time::sleep(delay).await;
    Ok(network::decode_reply(&back)?)
}

/// The target's answer, under its gate. A stopped target answers when it continues:
/// the request waits in its socket meanwhile and is handled then, even if the caller
/// has given up on it (its own task, not the caller's).
async fn answer(
    responder: Arc<Responder>,
    gate: Option<Arc<Gate>>,
    env: Envelope<Rpc>,
) -> Result<ReplyEnvelope, CallError> {
    let Some(gate) = gate else {
        return Ok(responder.answer(env).await.map_err(io::Error::other)?);
    };
    if !gate.is_stopped() {
        let r = under_gate(gate, responder.answer(env)).await;
        return Ok(r.map_err(io::Error::other)?);
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(under_gate(gate, async move {
        let _ = tx.send(responder.answer(env).await);
    }));
    match rx.await {
        Ok(r) => Ok(r.map_err(io::Error::other)?),
        Err(_) => Err(CallError::Failed(io::Error::new(
            io::ErrorKind::ConnectionReset,
            "the member ended before it answered",
        ))),
    }
}

/// The copy of a delivered request arrives `later` at the same member (its storage
/// then, whatever process answers): its answer goes nowhere.
fn replay(responder: Arc<Responder>, gate: Option<Arc<Gate>>, body: Vec<u8>, later: Duration) {
    tokio::spawn(async move {
        tokio::time::sleep(later).await;
        if let Ok(env) = network::decode_request(&body) {
            let _ = answer(responder, gate, env).await;
        }
    });
}
