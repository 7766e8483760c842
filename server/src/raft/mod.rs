//! A replicated group: the engine's log replicated with Raft (the `openraft` library).
//!
//! What is the library's and what is ours:
//! - elections, terms, log matching, commit by majority, membership changes: openraft;
//! - the Raft log on disk ([`log_store`]), the network between peers ([`network`], over
//!   a [`transport`]: [`tcp`] in a server), the
//!   state machine ([`state_machine`]: the engine and its WAL), and how the leader's
//!   engine feeds the log ([`speculation`]): ours.
//!
//! The rules (docs/replication.md has the why):
//! - **A Raft entry is a batch of WAL records**, written by the leader's engine under its
//!   locks exactly as a single node writes its WAL, LSNs included. Every node applies the
//!   same batches in the same order, so every node's WAL holds the same records under the
//!   same LSNs (feed positions mean the same everywhere).
//! - **The leader runs ahead, nobody else sees it.** The leader's engine applies a command
//!   at once (the fast path) and its records go to Raft; the reply waits until the batch
//!   holding them is committed (a majority has it durable) and applied. Only applied
//!   batches reach a node's WAL, so the feed, recovery and followers see committed state
//!   only.
//! - **A leader that loses its term with records not yet committed restarts itself**
//!   (re-executes the binary) and recovers from its WAL and Raft log like after a
//!   `kill -9`: its uncommitted engine state is thrown away before it serves anything,
//!   and no waiting reply is sent (the connections close with the old process image).
//! - Only a leader whose own term's first entry is applied, and that holds its lease (a
//!   majority acknowledged it within the shortest election timeout: `authority`), takes
//!   writes; followers answer writes `-READONLY` and serve stock and feed reads from
//!   committed state, possibly behind the leader. A leader without its lease refuses
//!   stock reads too and names no leader in discovery (docs/replication.md).

pub mod append_hold;
pub mod authority;
pub mod handover;
pub mod identity;
pub mod lease;
mod log_file;
mod log_held;
mod log_record;
pub mod log_store;
pub mod message;
pub mod network;
pub mod node;
pub mod peers;
pub mod prepare_env;
pub mod respond;
pub mod runtime;
pub mod snapshot;
pub mod speculation;
pub mod state_machine;
pub mod storage_fault;
pub mod tcp;
pub mod transport;

use std::fmt;
use std::io::Cursor;

use serde::{Deserialize, Serialize};

pub use node::{RaftNode, RaftNodeConfig};

/// A member's id in the group (`--raft-id`), unique and never reused.
pub type NodeId = u64;

/// What the group knows of a member: where peers reach its Raft port, where clients
/// reach it (the address the Sentinel discovery commands hand out), and which storage
/// it runs on (its incarnation, [`identity`]): part of the replicated membership, so
/// every member refuses the same impostor.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Where peers reach this member's Raft port (`host:port`).
    pub raft_addr: String,
    /// Where clients reach this member (`host:port`), as Sentinel discovery reports it.
    pub client_addr: String,
    /// The incarnation of the member's storage the group admitted; 0 only in
    /// `--raft-peers` before the bootstrap asked the member for it.
    pub incarnation: u64,
}

impl fmt::Display for NodeInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}#{:016x}",
            self.client_addr, self.raft_addr, self.incarnation
        )
    }
}

/// One Raft entry's payload: WAL records `first_lsn ..= first_lsn + count - 1`, encoded
/// as the WAL encodes them (CRC per record), written by the leader's engine.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// The incarnation (process start) of the leader that wrote it: its own engine
    /// already holds these records, every other engine applies them.
    pub origin: u64,
    /// The LSN of the batch's first record.
    pub first_lsn: u64,
    /// How many records the batch holds.
    pub count: u32,
    /// The records, encoded back to back as the WAL writes them. Serialized as bytes
    /// (one copy) rather than as a sequence of `u8`s (a call per byte); bincode writes
    /// both the same way, so logs and peers of either kind read each other. Shared, not
    /// owned: openraft clones an entry for every follower it sends it to and the log
    /// keeps one, and a clone of `Bytes` is a count, not a copy of the records.
    pub records: bytes::Bytes,
}

impl Batch {
    /// Saturating: a batch read from a peer or the disk may be malformed (see
    /// [`Batch::well_formed`]); its last LSN must still not overflow.
    pub fn last_lsn(&self) -> u64 {
        self.first_lsn
            .saturating_add(u64::from(self.count))
            .saturating_sub(1)
    }

    /// What every batch a leader writes is: at least one record, LSNs from 1, and the
    /// LSN after the last one representable.
    pub fn well_formed(&self) -> bool {
        self.count > 0
            && self.first_lsn > 0
            && self.first_lsn.checked_add(u64::from(self.count)).is_some()
    }
}

impl fmt::Debug for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Batch(lsn {}..={}, {} bytes, origin {:x})",
            self.first_lsn,
            self.last_lsn(),
            self.records.len(),
            self.origin
        )
    }
}

impl fmt::Display for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

openraft::declare_raft_types!(
    /// The types openraft is instantiated with: entries carry [`Batch`]es, nodes are
    /// described by [`NodeInfo`], snapshots are byte buffers.
    pub TypeConfig:
        D = Batch,
        R = (),
        NodeId = NodeId,
        Node = NodeInfo,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = runtime::Runtime,
);

/// The Raft instance of a group member.
pub type Raft = openraft::Raft<TypeConfig>;
/// One entry of the Raft log.
pub type Entry = openraft::Entry<TypeConfig>;
/// A Raft log position: term, leader and index.
pub type LogId = openraft::LogId<NodeId>;
/// openraft's storage error, as the log store and state machine return it.
pub type StorageError = openraft::StorageError<NodeId>;

/// `ID=CLIENT_HOST:PORT/RAFT_HOST:PORT`, as `--raft-peers` takes it.
pub fn parse_peer(s: &str) -> Result<(NodeId, NodeInfo), String> {
    let bad = || {
        format!(
            "raft peer '{s}': expected ID=CLIENT_HOST:PORT/RAFT_HOST:PORT (e.g. 1=127.0.0.1:7379/127.0.0.1:17379)"
        )
    };
    let (id, rest) = s.split_once('=').ok_or_else(bad)?;
    let id: NodeId = id.trim().parse().map_err(|_| bad())?;
    if id == 0 {
        return Err(format!("raft peer '{s}': node ids start at 1"));
    }
    let (client, raft) = rest.split_once('/').ok_or_else(bad)?;
    for a in [client, raft] {
        let port = a.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok());
        if !matches!(port, Some(p) if p > 0) {
            return Err(bad());
        }
    }
    Ok((
        id,
        NodeInfo {
            raft_addr: raft.to_owned(),
            client_addr: client.to_owned(),
            incarnation: 0,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raft_peer_parses_and_refuses_in_words() {
        let (id, n) = parse_peer("2=127.0.0.1:7380/127.0.0.1:17380").expect("valid");
        assert_eq!(id, 2);
        assert_eq!(n.client_addr, "127.0.0.1:7380");
        assert_eq!(n.raft_addr, "127.0.0.1:17380");
        for bad in [
            "",
            "x=1:2/3:4",
            "1=127.0.0.1:7380",
            "1=a:0/b:1",
            "0=a:1/b:2",
        ] {
            let e = parse_peer(bad).expect_err(bad);
            assert!(e.contains("raft peer"), "{e}");
        }
    }

    /// The batch as written before its records were serialized as bytes.
    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct ByElement {
        origin: u64,
        first_lsn: u64,
        count: u32,
        records: Vec<u8>,
    }

    #[test]
    fn raft_batch_bytes_are_the_same_serialized_as_bytes_or_by_element() {
        let b = Batch {
            origin: 7,
            first_lsn: 42,
            count: 3,
            records: (0..=255u8).cycle().take(1000).collect::<Vec<u8>>().into(),
        };
        let old = ByElement {
            origin: 7,
            first_lsn: 42,
            count: 3,
            records: b.records.to_vec(),
        };
        let new_bytes = bincode::serialize(&b).expect("ser");
        assert_eq!(new_bytes, bincode::serialize(&old).expect("ser"));
        let back: Batch = bincode::deserialize(&new_bytes).expect("de");
        assert!(back == b);
        let back: ByElement = bincode::deserialize(&new_bytes).expect("de");
        assert_eq!(back, old);
    }
}
