//! stockgate client: the typed RESP client, its connection to the primary of a
//! Sentinel-managed group, and the gate the reservation lifecycle runs against (over TCP
//! or the engine embedded in-process). The ledgers and the flows built on them are in
//! `stockgate-ledger`; the operator tools in `stockgate-tools`.
//!
//! - [`client`]: typed async client for docs/protocol.md.
//! - [`sentinel`]: the client's connection to the primary of a Sentinel-managed group.
//! - [`error`], [`conn_config`]: the error type and the connection settings both
//!   transports share.
//! - [`gate`]: what the lifecycle needs from the server, over TCP or the embedded engine.
//! - [`types`]: the replies, typed.
//! - [`live`]: a sale's live counts and a buyer's place, pushed over RESP pub/sub.
//! - [`token`]: admission tokens, minted as the server checks them.
//! - [`tls`]: the tools' TLS flags and the TLS connection to a server (the `tls` feature).
pub mod client;
pub mod conn_config;
pub mod error;
pub mod gate;
pub mod live;
pub mod sentinel;
pub mod tls;
pub mod token;
pub mod types;
mod value;

pub use client::{ClientConfig, ClientError, StockgateClient};
pub use gate::{EngineGate, ReservationGate};
pub use live::LiveWatch;
pub use sentinel::{SentinelConfig, ServerTarget};
pub use tls::{TlsArgs, TlsConfig, TlsError};
pub use token::mint_admission_token;
pub use types::SaleRecord;
