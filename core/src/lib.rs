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
//! With the `tokio` feature, [`wal::Wal::wait_durable`] and [`wal::Wal::wait_durable_past`]
//! let async tasks await an acknowledgement; without it, threads wait with
//! [`wal::Wal::wait_durable_blocking`].
pub mod engine;
pub mod wal;
