//! What the server reports of itself, rendered from the metrics store (`crate::metrics`)
//! and the server's own state (`crate::session`): `INFO`, the Prometheus text, the status
//! page and its JSON, and `stockgate top`, the terminal view of them. Above the store and
//! the session, below the commands (`INFO` is one).

pub mod health;
pub mod http;
pub mod info;
pub mod live;
pub mod prom;
pub mod prom_label;
pub mod prom_raft;
pub mod replication;
#[cfg(feature = "tui")]
pub mod top;
pub mod view;

/// A follower this many entries behind its leader is shown as lagging (red in `top`, on
/// the status page).
pub const LAGGING_FOLLOWER_ENTRIES: u64 = 1000;

#[cfg(test)]
mod tests;
