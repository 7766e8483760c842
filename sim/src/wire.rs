//! The in-memory [`Transport`] the simulated `RaftNode`s talk over (`nodes`): each
//! request encoded as the server's frames carry it (`network::encode`, read back with
//! `network::decode_request`, so a request the server would refuse to decode is refused
//! here too), handed to the target's [`Responder`] (the server's receiving side: the
//! identity checks, then openraft), each leg (request, reply) delayed by a draw from the
//! seed, directed links cut one way or both, a member that is down refusing.
//!
//! What it leaves out of the TCP transport: connections and their back-off (a refused
//! call is a network error after a short pause, never openraft's `Unreachable`, whose
//! wait `select!`s without `biased` on a generator tokio seeds at random; the same
//! choice as the hand-built members' network, `net.rs`), TLS.

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
use stockgate_server::raft::transport::{CallError, CallFuture, Link, ServeFuture, Transport};
use stockgate_server::raft::{NodeId, NodeInfo};

/// How long a call to a member that is down takes to fail (a refused connection
/// answers at once; the pause keeps openraft's retries from spinning without simulated
/// time passing).
const REFUSED_AFTER: Duration = Duration::from_millis(50);

/// The members listening now, the cut links and the generator of the delays.
pub struct Wire(Mutex<State>);

struct State {
    listening: BTreeMap<NodeId, Arc<Responder>>,
    /// Directed links that carry nothing: (from, to).
    cut: BTreeSet<(NodeId, NodeId)>,
    rng: StdRng,
    max_delay_ms: u64,
    sent: u64,
    lost: u64,
}

impl Wire {
    /// No member listening yet, no cut link; each leg delayed up to `max_delay_ms`.
    pub fn new(rng: StdRng, max_delay_ms: u64) -> Arc<Wire> {
        Arc::new(Wire(Mutex::new(State {
            listening: BTreeMap::new(),
            cut: BTreeSet::new(),
            rng,
            max_delay_ms,
            sent: 0,
            lost: 0,
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
        if s.cut.contains(&(from, to)) {
            s.lost += 1;
            return None;
        }
        Some(Duration::from_millis(delay))
    }

    fn listener(&self, id: NodeId) -> Option<Arc<Responder>> {
        self.0.lock().listening.get(&id).cloned()
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
    fn link(&self, target: NodeId, node: &NodeInfo, _peers: Arc<PeerTable>) -> Box<dyn Link> {
        Box::new(MemLink {
            wire: self.0.clone(),
            target,
            addr: node.raft_addr.clone(),
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

struct MemLink {
    wire: Arc<Wire>,
    target: NodeId,
    addr: String,
}

impl Link for MemLink {
    fn addr(&self) -> &str {
        &self.addr
    }

    /// The request leg, the target's answer, the reply leg, all within `ttl`; a cut leg
    /// is silence (the call times out, as over a dead link).
    fn call(&mut self, req: Envelope<Rpc>, ttl: Duration, _gated: bool) -> CallFuture<'_> {
        Box::pin(async move {
            let (from, to) = (req.from, self.target);
            let body = network::encode(&req)?;
            let wire = self.wire.clone();
            let exchange = async move {
                let there = match wire.leg(from, to) {
                    Some(d) => d,
                    None => std::future::pending().await,
                };
                tokio::time::sleep(there).await;
                let Some(responder) = wire.listener(to) else {
                    tokio::time::sleep(REFUSED_AFTER).await;
                    return Err(CallError::Failed(io::Error::new(
                        io::ErrorKind::ConnectionRefused,
                        format!("node {to} is down"),
                    )));
                };
                let env = network::decode_request(&body)?;
                let reply = responder.answer(env).await.map_err(io::Error::other)?;
                let back = network::encode(&reply)?;
                let delay = match wire.leg(to, from) {
                    Some(d) => d,
                    None => std::future::pending().await,
                };
                tokio::time::sleep(delay).await;
                Ok::<ReplyEnvelope, CallError>(network::decode_reply(&back)?)
            };
            tokio::time::timeout(ttl, exchange)
                .await
                .unwrap_or_else(|_| {
                    Err(CallError::Failed(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "raft rpc timed out",
                    )))
                })
        })
    }
}
