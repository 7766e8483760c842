//! What members say to each other: openraft's three RPCs and the member's own requests
//! as typed requests and replies, each in an envelope naming both sides' storages, the
//! frames they travel in over TCP (`[u32 length][bincode body]`), and their encoding.
//! Both ends of a link use it: openraft's side ([`network`](super::network)), the
//! answering side ([`respond`](super::respond)) and the transports.
//!
//! A frame larger than [`MAX_FRAME`] ends the connection: a peer's bytes are bounded
//! like a client's. A body that is not a well-formed message is an error, never a panic.

use std::collections::BTreeMap;
use std::io;

use bincode::Options;
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{EntryPayload, LogId};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{NodeId, NodeInfo, TypeConfig};

/// The log target of everything about the links to peers, whichever module writes it
/// (`tcp`, `peers`, `respond`): operators turn it up by this name
/// (`--log-level info,stockgate_server::raft::network=debug`, docs/replication.md).
pub const LOG: &str = "stockgate_server::raft::network";

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
    /// Whether this member leads now, and in which term: a follower that hears no
    /// append from the leader it last followed, but is told it still leads, does not
    /// stand (a member that does not know this request is taken as not leading).
    Leads,
    /// The id of the last entry in this member's log, as a vote compares logs: a member
    /// about to stand asks the voters in reach, and holds back while those that would
    /// grant it their vote are no majority (a member that does not know this request is
    /// taken as one that would).
    LastLog,
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
    /// The term this member leads in (`None`: it does not lead).
    Leads(Option<u64>),
    /// The id of the last entry in this member's log (`None`: an empty log).
    LastLog(Option<LogId<NodeId>>),
}

/// Writes a frame [`encode_frame`] built.
pub(super) async fn write_frame<S: AsyncWrite + Unpin + ?Sized>(
    s: &mut S,
    frame: &[u8],
) -> io::Result<()> {
    s.write_all(frame).await?;
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

/// A message as a whole frame, `[u32 length][body]`, serialised in place: an append's
/// records are copied once, into the frame, not into a body first and then behind its
/// length. A message over [`MAX_FRAME`] is an error.
pub(super) fn encode_frame<T: Serialize>(msg: &T) -> io::Result<Vec<u8>> {
    let size = wire().serialized_size(msg).map_err(io::Error::other)?;
    let len = u32::try_from(size)
        .ok()
        .filter(|l| (*l as usize) <= MAX_FRAME)
        .ok_or_else(|| io::Error::other(format!("frame of {size} bytes over the limit")))?;
    let mut out = Vec::with_capacity(4 + len as usize);
    out.extend_from_slice(&len.to_le_bytes());
    wire()
        .serialize_into(&mut out, msg)
        .map_err(io::Error::other)?;
    Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_frame_serialised_in_place_reads_back_as_the_message() {
        let msg: Vec<u64> = (0..10_000).collect();
        let frame = encode_frame(&msg).expect("a frame");
        let body = encode(&msg).expect("a body");
        assert_eq!(frame[..4], (body.len() as u32).to_le_bytes());
        assert_eq!(frame[4..], body[..]);
        let mut out = Vec::new();
        write_frame(&mut out, &frame).await.expect("write");
        let back = read_frame(&mut &out[..]).await.expect("read");
        assert_eq!(back, body);
    }

    #[test]
    fn a_message_over_the_frame_limit_is_refused() {
        // Zeroed pages are not touched: no 256 MiB written to make the point.
        let msg = bytes::Bytes::from(vec![0u8; MAX_FRAME + 1]);
        assert!(encode_frame(&msg).is_err());
        let fits = bytes::Bytes::from(vec![0u8; 1 << 20]);
        assert!(encode_frame(&fits).is_ok());
    }
}
