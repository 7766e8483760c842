//! stockgate's ledgers and the flows that put the ledger first (docs/design.md, "The
//! reservation lifecycle": **the ledger decides first, then the server is told**).
//!
//! - [`ledger`]: the judge — Postgres and sled backends of one interface.
//! - [`checkout`]: reserve → materialize → pay (ledger first) / cancel.
//! - [`sweeper`]: expired reservations reconciled ledger-first, any number at once.
//! - [`rebuild`]: fail closed and rebuild a fenced sale from the ledger.
//! - [`adjust`]: change a sale's allocation, ledger first, idempotent under retry.
//! - [`materialize`]: the order feed written into the ledger exactly once.
//! - [`group`]: a consumer of a consumer group on the order feed.
//! - [`identity`]: which server histories a ledger describes.
//!
//! The server is reached through `stockgate-client` (a [`ReservationGate`]: TCP or the
//! embedded engine).
pub mod adjust;
pub mod checkout;
pub mod group;
pub mod identity;
pub mod ledger;
pub mod materialize;
pub mod rebuild;
pub mod sweeper;

// The client's modules under this crate's root, so the flows name them as they did when
// they were one crate (`crate::client::ClientError`, `crate::gate::ReservationGate`).
use stockgate_client::{client, gate, sentinel, tls, types};

pub use checkout::{Checkout, CheckoutError, Hold, PayOutcome};
pub use ledger::embedded::SledLedger;
pub use ledger::postgres::PgLedger;
pub use ledger::{Ledger, LedgerError, OrderStatus, SaleRecord};
pub use stockgate_client::ReservationGate;
pub use sweeper::{PassReport, Sweeper, SweeperConfig};
