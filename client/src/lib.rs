//! stockgate client: the typed RESP client, the ledgers (Postgres and embedded sled), the
//! checkout flow, the sweeper and the rebuild of a fenced sale.
//!
//! - [`client`]: typed async client for PROTOCOL.md.
//! - [`gate`]: what the lifecycle needs from the server, over TCP or the embedded engine.
//! - [`ledger`]: the judge — Postgres and sled backends of one interface.
//! - [`checkout`]: reserve → materialize → pay (ledger first) / cancel.
//! - [`sweeper`]: expired reservations reconciled ledger-first, any number at once.
//! - [`rebuild`]: fail closed and rebuild a fenced sale from the ledger.
//! - [`metrics`]: the sweeper's Prometheus endpoint.
//! - [`pgtemp`], [`testkit`]: throwaway Postgres and server processes for tests/benches.
pub mod checkout;
pub mod client;
pub mod gate;
pub mod ledger;
pub mod metrics;
pub mod pgtemp;
pub mod rebuild;
pub mod sweeper;
pub mod testkit;
pub mod token;
pub mod types;

pub use checkout::{Checkout, CheckoutError, Hold, PayOutcome};
pub use client::{ClientError, StockgateClient};
pub use gate::{EngineGate, ReservationGate};
pub use ledger::embedded::SledLedger;
pub use ledger::postgres::PgLedger;
pub use ledger::{Ledger, LedgerError, OrderStatus};
pub use sweeper::{PassReport, Sweeper, SweeperConfig};
pub use token::mint_admission_token;
