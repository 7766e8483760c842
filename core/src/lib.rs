//! stockgate's core: the reservation engine and its write-ahead log, the two layers every
//! other part stands on. Neither touches the network or a terminal, so the same code runs
//! in the server, embedded in a checkout service, in the fuzzers and in property tests.
//!
//! - [`engine`]: sales, shard counters, reservations, expiry wheel, tokens. No I/O: time
//!   and durability are injected.
//! - [`wal`]: the log the engine's events are appended to before a change is acknowledged:
//!   records, segments, group commit, snapshots, recovery and the reader the order feed
//!   serves. It knows nothing of the engine's rules.
//!
//! - [`slot`]: Redis Cluster's hash slot of a key (CRC16), the same for the server, the
//!   clients and the tools.
//! - [`durable`]: the one wait an embedded engine's caller needs from the log.
//! - [`tls_hint`]: a failed TLS handshake in an operator's words (text matching only).
//! - [`room`]: the waiting room's engine: a sale's queue, its pace and its tickets.
//!
//! With the `tokio` feature, [`wal::Wal::wait_durable`] and [`wal::Wal::wait_durable_past`]
//! let async tasks await an acknowledgement; without it, threads wait with
//! [`wal::Wal::wait_durable_blocking`].
pub mod durable;
pub mod engine;
pub mod room;
pub mod slot;
pub mod tls_hint;
pub mod wal;
