//! stockgate client: the typed RESP client, the ledgers (Postgres and embedded sled), the
//! checkout flow, the sweeper and the rebuild of a fenced sale.
//!
//! - [`adjust`]: change a sale's allocation, ledger first, idempotent under retry.
//! - [`client`]: typed async client for docs/protocol.md.
//! - [`sentinel`]: the client's connection to the primary of a Sentinel-managed group.
//! - [`error`], [`conn_config`]: the error type and the connection settings both
//!   transports share.
//! - [`gate`]: what the lifecycle needs from the server, over TCP or the embedded engine.
//! - [`ledger`]: the judge — Postgres and sled backends of one interface.
//! - [`checkout`]: reserve → materialize → pay (ledger first) / cancel.
//! - [`sweeper`]: expired reservations reconciled ledger-first, any number at once.
//! - [`rebuild`]: fail closed and rebuild a fenced sale from the ledger.
//! - [`materialize`]: the order feed written into the ledger exactly once.
//! - [`metrics`]: the sweeper's Prometheus endpoint.
//! - [`slot_move`]: hash slots moved from one group to another while sales run.
//! - [`tls`]: the tools' TLS flags and the TLS connection to a server.
pub mod adjust;
pub mod checker;
pub mod checkout;
pub mod client;
pub mod conn_config;
pub mod error;
pub mod gate;
pub mod group;
pub mod identity;
pub mod ledger;
pub mod materialize;
pub mod metrics;
pub mod rebuild;
pub mod sentinel;
pub mod slot_move;
pub mod split;
pub mod sweeper;
pub mod tls;
pub mod token;
pub mod types;
mod value;

pub use checkout::{Checkout, CheckoutError, Hold, PayOutcome};
pub use client::{ClientConfig, ClientError, StockgateClient};
pub use gate::{EngineGate, ReservationGate};
pub use ledger::embedded::SledLedger;
pub use ledger::postgres::PgLedger;
pub use ledger::{Ledger, LedgerError, OrderStatus};
pub use sentinel::{SentinelConfig, ServerTarget};
pub use sweeper::{PassReport, Sweeper, SweeperConfig};
pub use tls::{TlsArgs, TlsConfig, TlsError};
pub use token::mint_admission_token;
