//! State changes of the engine, as they are logged and replayed.
//!
//! Every mutation of the engine is described by exactly one [`Event`]. The engine hands
//! each event to an [`EventSink`] *while it still holds the lock that decided the
//! transition*, so the log order of one reservation's events always matches the order in
//! which they happened (a RELEASE can never precede its RESERVE in the log). Events of
//! different reservations commute: they touch different records and counter deltas add.
//!
//! Replaying the same events into an empty engine (see `Engine::apply`) reproduces the
//! state exactly; the WAL stores nothing else.

use super::types::{Millis, SaleParams, SaleState};

/// One state change. Field order and meaning are part of the WAL format: change them
/// only together with the record version in `wal::record`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// `SALE.CREATE`: a new sale with `params.total` units spread over `params.shards`.
    SaleCreated {
        sku: String,
        params: SaleParams,
        at_ms: Millis,
    },
    /// `SALE.ADJUST`: per-shard deltas of available units (their sum is the change of
    /// `total`). Logged per shard so replay does not depend on the distribution rule.
    SaleAdjusted { sku: String, shard_deltas: Vec<i64> },
    /// `SALE.PAUSE` / `SALE.RESUME` / fencing.
    SaleStateSet { sku: String, state: SaleState },
    /// `RESERVE`: `qty` units taken from `shard`.
    Reserved {
        token: String,
        sku: String,
        user: String,
        request_id: String,
        qty: u32,
        shard: u16,
        expires_at_ms: Millis,
        created_at_ms: Millis,
    },
    /// `RELEASE` (or auto-release on expiry): the units went back to their shard.
    Released { token: String, at_ms: Millis },
    /// `COMMIT`: the units are sold for good.
    Committed { token: String, at_ms: Millis },
    /// `EXTEND`: new deadline.
    Extended {
        token: String,
        expires_at_ms: Millis,
    },
    /// Retention: a finished reservation is forgotten (its units are already accounted
    /// for in the sale's counters).
    Purged { token: String },
    /// Rebuild of a fenced sale from the ledger: the sale's counters are set outright.
    /// Pending reservations restored by the rebuild follow as `Reserved` events.
    SaleRebuilt {
        sku: String,
        total: u64,
        committed: u64,
        shard_available: Vec<i64>,
    },
}

/// Log sequence number: position of an event in the log. 0 means "not logged".
pub type Lsn = u64;

/// Where the engine sends its events. Called with engine locks held: it must be cheap and
/// must never call back into the engine. The returned [`Lsn`] is what a caller waits on
/// (through the WAL) before it may acknowledge the change to a client.
pub trait EventSink: Send + Sync {
    fn record(&self, event: &Event) -> Lsn;
}

/// A sink that drops everything: an engine without durability (tests, embedded use
/// where the ledger is the only record).
#[derive(Debug, Default)]
pub struct NullSink;

impl EventSink for NullSink {
    fn record(&self, _event: &Event) -> Lsn {
        0
    }
}
