//! stockgate's operator tools: what the `stockgate-ops` binary (the sweeper daemon and the
//! operator subcommands; `stockgate-sweeper` is its old name), `stockgate-materializer`
//! and `stockgate-history-check` are made of.
//!
//! - [`split`]: a sale split over the cluster's groups, and its rebalancing.
//! - [`slot_move`]: hash slots moved from one group to another while sales run.
//! - [`checker`]: the Jepsen-style checker of a recorded history.
//! - [`metrics`]: the sweeper's and the materializer's Prometheus endpoint.
pub mod checker;
pub mod metrics;
pub mod slot_move;
pub mod split;

// The client's and the ledger crate's modules under this crate's root, so the tools name
// them as they did when they were one crate (`crate::client::StockgateClient`).
use stockgate_client::{client, gate, sentinel, tls, types};
use stockgate_ledger::{adjust, ledger, materialize, sweeper};
