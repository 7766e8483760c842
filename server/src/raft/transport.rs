//! The seam between a member and the wire its peers are reached over.
//!
//! A member's Raft traffic is typed requests ([`Envelope`]`<`[`Rpc`]`>`) and replies
//! ([`ReplyEnvelope`]); what carries them is a [`Transport`]: the server's is TCP (or
//! TLS) with frames, connection reuse and a back-off per peer ([`tcp`](super::tcp));
//! the deterministic simulation (`sim/`) carries them in memory on its simulated clock,
//! with its own delays and cut links. Everything above the seam (the identity envelope
//! and its checks on both sides, the lease, openraft's network, the discovery answers)
//! is the same code on either.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::message::{Envelope, ReplyEnvelope, Rpc};
use super::peers::PeerTable;
use super::respond::Responder;
use super::{NodeId, NodeInfo};

/// Why a call to a peer failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No connection could be opened, or the peer is in its back-off pause: openraft's
    /// `Unreachable`, which makes it wait before calling again.
    #[error("{0}")]
    Unreachable(io::Error),
    /// The exchange failed, or the reply is not one to count.
    #[error("{0}")]
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

/// One call's outcome, as a link hands it back.
pub type CallFuture<'a> =
    Pin<Box<dyn Future<Output = Result<ReplyEnvelope, CallError>> + Send + 'a>>;

/// The listener's start: the task answering the peers, or why it could not start.
pub type ServeFuture<'a> =
    Pin<Box<dyn Future<Output = Result<JoinHandle<()>, String>> + Send + 'a>>;

/// How a member reaches its peers and is reached by them.
pub trait Transport: Send + Sync {
    /// A link to member `target`, described by `node`. `peers` is the calling member's
    /// table: a link that connects records there what its attempts did (the back-off).
    fn link(&self, target: NodeId, node: &NodeInfo, peers: Arc<PeerTable>) -> Box<dyn Link>;

    /// Starts answering this member's peers: every request that arrives goes to
    /// `responder` ([`Responder::answer`]). The task returned is the member's to stop.
    fn serve(&self, responder: Arc<Responder>) -> ServeFuture<'_>;

    /// Whether a member's client port (`addr`) accepts connections now: a follower
    /// looks before it names the leader to `SENTINEL MASTER`, as a Sentinel pings its
    /// master.
    fn client_port_answers(&self, addr: &str) -> bool;
}

/// One link to a peer, used by one caller at a time (openraft makes one per
/// replication stream and one for votes; the member's own calls make theirs).
pub trait Link: Send + Sync {
    /// Where the link leads, for the logs.
    fn addr(&self) -> &str;

    /// Carries `req` to the peer and brings its reply back, within `ttl`. `gated`: a
    /// call of openraft's, answered at once with [`CallError::Unreachable`] while the
    /// peer is backed off (the bootstrap's and the operator's calls always try).
    fn call(&mut self, req: Envelope<Rpc>, ttl: Duration, gated: bool) -> CallFuture<'_>;
}
