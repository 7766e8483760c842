//! stockgate server library: the RESP server around the reservation engine and its
//! write-ahead log.
//!
//! - [`engine`], [`room`], [`wal`]: the engine, the waiting room and the log, from
//!   `stockgate-core`, re-exported so the server's modules and its users name them as
//!   part of the server.
//! - [`protocol`]: RESP framing and reply encoding. No stock logic.
//! - [`cmd`]: one typed command per file, applied to the engine.
//! - [`server`]: accept loop, connections, pipelining, limits.
//! - [`metrics`]: the store commands record into: counters, latency histograms, slow log.
//! - [`report`]: INFO, the Prometheus/JSON endpoint and `stockgate top`, read from
//!   `metrics` and `session`.
//! - [`session`]: server and connection state shared by `server` and `cmd`.
//! - [`takeover`]: a connection handed from the command loop to a subscriber and back.
//! - [`raft`]: a replicated group: the log replicated with Raft (openraft).
//! - [`cluster`]: Redis Cluster routing: hash slots, the slot map, this node's place.
//! - [`pubsub`]: PUBLISH/SUBSCRIBE and the connection registry (for Sentinel).
//! - [`tls`]: TLS on the RESP port: the certificate files, their reload, the flags.
//! - [`app`]: the composition root the binary runs: settings in, a server assembled and
//!   served until a signal. The top layer: nothing here imports it.
pub use stockgate_core::{engine, room, wal};

pub mod app;
pub mod cli;
pub mod cluster;
pub mod cmd;
pub mod config_file;
pub mod feed;
pub mod keyfiles;
pub mod live;
pub mod metrics;
pub mod persist;
pub mod protocol;
pub mod pubsub;
pub mod raft;
pub mod report;
pub mod server;
pub mod session;
pub mod takeover;
pub mod tls;
pub mod users;
