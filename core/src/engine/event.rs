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

use super::types::{
    Millis, ReleaseReason, ReservationState, ReservationView, SaleExport, SaleParams, SaleState,
};

/// One state change. Field order and meaning are part of the WAL format: change them
/// only together with the record version in `wal::record`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// `SALE.CREATE`: a new sale with `params.total` units spread over `params.shards`.
    SaleCreated {
        /// The sale's sku.
        sku: String,
        /// The sale's parameters, defaults filled in.
        params: SaleParams,
        /// When it happened, by the engine's clock.
        at_ms: Millis,
    },
    /// `SALE.ADJUST`: per-shard deltas of available units (their sum is the change of
    /// `total`). Logged per shard so replay does not depend on the distribution rule.
    SaleAdjusted {
        /// The sale's sku.
        sku: String,
        /// The change of each shard's available units, by shard index.
        shard_deltas: Vec<i64>,
    },
    /// `SALE.PAUSE` / `SALE.RESUME` / fencing.
    SaleStateSet {
        /// The sale's sku.
        sku: String,
        /// The state the sale enters.
        state: SaleState,
    },
    /// `RESERVE`: `qty` units taken from `shard`.
    Reserved {
        /// The reservation's token (`{sku}` followed by its 26 base32 characters).
        token: String,
        /// The sale's sku.
        sku: String,
        /// The buyer.
        user: String,
        /// The buyer's request id: a retry with the same id replays the hold.
        request_id: String,
        /// Units held.
        qty: u32,
        /// The shard the units came from and go back to.
        shard: u16,
        /// The hold's deadline.
        expires_at_ms: Millis,
        /// When the hold was taken.
        created_at_ms: Millis,
    },
    /// `RELEASE` (or auto-release on expiry): the units went back to their shard.
    /// Buyer, request and quantity are repeated from the reservation so that the feed
    /// entry stands on its own; replay needs only the token.
    Released {
        /// The reservation's token (`{sku}` followed by its 26 base32 characters).
        token: String,
        /// When it happened, by the engine's clock.
        at_ms: Millis,
        /// The buyer.
        user: String,
        /// The buyer's request id: a retry with the same id replays the hold.
        request_id: String,
        /// Units held.
        qty: u32,
        /// Why the units went back to stock.
        reason: ReleaseReason,
    },
    /// `COMMIT`: the units are sold for good.
    Committed {
        /// The reservation's token (`{sku}` followed by its 26 base32 characters).
        token: String,
        /// When it happened, by the engine's clock.
        at_ms: Millis,
        /// The buyer.
        user: String,
        /// The buyer's request id: a retry with the same id replays the hold.
        request_id: String,
        /// Units held.
        qty: u32,
    },
    /// `EXTEND`: new deadline.
    Extended {
        /// The reservation's token (`{sku}` followed by its 26 base32 characters).
        token: String,
        /// The hold's deadline.
        expires_at_ms: Millis,
        /// The buyer.
        user: String,
        /// The buyer's request id: a retry with the same id replays the hold.
        request_id: String,
        /// Units held.
        qty: u32,
    },
    /// Retention: a finished reservation is forgotten (its units are already accounted
    /// for in the sale's counters).
    Purged {
        /// The reservation's token (`{sku}` followed by its 26 base32 characters).
        token: String,
    },
    /// Rebuild of a fenced sale from the ledger: the sale's counters are set outright.
    /// Pending reservations restored by the rebuild follow as `Reserved` events.
    SaleRebuilt {
        /// The sale's sku.
        sku: String,
        /// Units for sale in total, as the ledger counts them.
        total: u64,
        /// Units sold, as the ledger counts them.
        committed: u64,
        /// Each shard's available units after the rebuild.
        shard_available: Vec<i64>,
    },
    /// The first record of a history (`Engine::begin_history`): its random id.
    HistoryBegun {
        /// The history's random id.
        id: String,
    },
    /// A sale handed over from another group (`Engine::import_sale`): its whole state.
    SaleImported {
        /// What the source group exported.
        export: Box<SaleExport>,
    },
    /// A sale handed over to another group (`Engine::drop_sale`): it is gone from here.
    SaleDropped {
        /// The sale's sku.
        sku: String,
    },
    /// A record another module writes into the same log (the order feed's consumer
    /// groups): `kind` is one of the WAL's opaque kinds, `body` its encoding. The engine
    /// gives it no meaning and skips it on replay, so it depends on nothing that logs
    /// such records.
    Opaque {
        /// One of the log's opaque kinds (`wal::record::OPAQUE_KINDS`).
        kind: u8,
        /// The record's bytes, decoded by the module that logged it.
        body: Vec<u8>,
    },
}

/// A borrowed [`Event`]: what the engine hands to its sink on the hot path, so logging a
/// RESERVE copies no strings (the WAL encodes straight from the engine's own data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventRef<'a> {
    /// [`Event::SaleCreated`], borrowed.
    SaleCreated {
        /// The sale's sku.
        sku: &'a str,
        /// The sale's parameters, defaults filled in.
        params: &'a SaleParams,
        /// When it happened, by the engine's clock.
        at_ms: Millis,
    },
    /// [`Event::SaleAdjusted`], borrowed.
    SaleAdjusted {
        /// The sale's sku.
        sku: &'a str,
        /// The change of each shard's available units, by shard index.
        shard_deltas: &'a [i64],
    },
    /// [`Event::SaleStateSet`], borrowed.
    SaleStateSet {
        /// The sale's sku.
        sku: &'a str,
        /// The state the sale enters.
        state: SaleState,
    },
    /// [`Event::Reserved`], borrowed.
    Reserved {
        /// The reservation's token (`{sku}` followed by its 26 base32 characters).
        token: &'a str,
        /// The sale's sku.
        sku: &'a str,
        /// The buyer.
        user: &'a str,
        /// The buyer's request id: a retry with the same id replays the hold.
        request_id: &'a str,
        /// Units held.
        qty: u32,
        /// The shard the units came from and go back to.
        shard: u16,
        /// The hold's deadline.
        expires_at_ms: Millis,
        /// When the hold was taken.
        created_at_ms: Millis,
    },
    /// [`Event::Released`], borrowed.
    Released {
        /// The reservation's token (`{sku}` followed by its 26 base32 characters).
        token: &'a str,
        /// When it happened, by the engine's clock.
        at_ms: Millis,
        /// The buyer.
        user: &'a str,
        /// The buyer's request id: a retry with the same id replays the hold.
        request_id: &'a str,
        /// Units held.
        qty: u32,
        /// Why the units went back to stock.
        reason: ReleaseReason,
    },
    /// [`Event::Committed`], borrowed.
    Committed {
        /// The reservation's token (`{sku}` followed by its 26 base32 characters).
        token: &'a str,
        /// When it happened, by the engine's clock.
        at_ms: Millis,
        /// The buyer.
        user: &'a str,
        /// The buyer's request id: a retry with the same id replays the hold.
        request_id: &'a str,
        /// Units held.
        qty: u32,
    },
    /// [`Event::Extended`], borrowed.
    Extended {
        /// The reservation's token (`{sku}` followed by its 26 base32 characters).
        token: &'a str,
        /// The hold's deadline.
        expires_at_ms: Millis,
        /// The buyer.
        user: &'a str,
        /// The buyer's request id: a retry with the same id replays the hold.
        request_id: &'a str,
        /// Units held.
        qty: u32,
    },
    /// [`Event::Purged`], borrowed.
    Purged {
        /// The reservation's token (`{sku}` followed by its 26 base32 characters).
        token: &'a str,
    },
    /// [`Event::SaleRebuilt`], borrowed.
    SaleRebuilt {
        /// The sale's sku.
        sku: &'a str,
        /// Units for sale in total, as the ledger counts them.
        total: u64,
        /// Units sold, as the ledger counts them.
        committed: u64,
        /// Each shard's available units after the rebuild.
        shard_available: &'a [i64],
    },
    /// [`Event::HistoryBegun`], borrowed.
    HistoryBegun {
        /// The history's random id.
        id: &'a str,
    },
    /// [`Event::SaleImported`], borrowed.
    SaleImported {
        /// What the source group exported.
        export: &'a SaleExport,
    },
    /// [`Event::SaleDropped`], borrowed.
    SaleDropped {
        /// The sale's sku.
        sku: &'a str,
    },
    /// [`Event::Opaque`], borrowed.
    Opaque {
        /// One of the log's opaque kinds (`wal::record::OPAQUE_KINDS`).
        kind: u8,
        /// The record's bytes, decoded by the module that logged it.
        body: &'a [u8],
    },
}

impl Event {
    /// The reservation a `Reserved` event creates, as a fresh RESERVED record.
    pub fn reserved_view(&self) -> Option<ReservationView> {
        let Event::Reserved {
            token,
            sku,
            user,
            request_id,
            qty,
            shard,
            expires_at_ms,
            created_at_ms,
        } = self
        else {
            return None;
        };
        Some(ReservationView {
            token: token.clone(),
            sku: sku.clone(),
            user: user.clone(),
            request_id: request_id.clone(),
            qty: *qty,
            shard: *shard,
            state: ReservationState::Reserved,
            expires_at_ms: *expires_at_ms,
            created_at_ms: *created_at_ms,
            finished_at_ms: 0,
        })
    }

    /// The borrowed form, as the engine hands it to its sink.
    pub fn as_ref(&self) -> EventRef<'_> {
        match self {
            Event::SaleCreated { sku, params, at_ms } => EventRef::SaleCreated {
                sku,
                params,
                at_ms: *at_ms,
            },
            Event::SaleAdjusted { sku, shard_deltas } => {
                EventRef::SaleAdjusted { sku, shard_deltas }
            }
            Event::SaleStateSet { sku, state } => EventRef::SaleStateSet { sku, state: *state },
            Event::Reserved {
                token,
                sku,
                user,
                request_id,
                qty,
                shard,
                expires_at_ms,
                created_at_ms,
            } => EventRef::Reserved {
                token,
                sku,
                user,
                request_id,
                qty: *qty,
                shard: *shard,
                expires_at_ms: *expires_at_ms,
                created_at_ms: *created_at_ms,
            },
            Event::Released {
                token,
                at_ms,
                user,
                request_id,
                qty,
                reason,
            } => EventRef::Released {
                token,
                at_ms: *at_ms,
                user,
                request_id,
                qty: *qty,
                reason: *reason,
            },
            Event::Committed {
                token,
                at_ms,
                user,
                request_id,
                qty,
            } => EventRef::Committed {
                token,
                at_ms: *at_ms,
                user,
                request_id,
                qty: *qty,
            },
            Event::Extended {
                token,
                expires_at_ms,
                user,
                request_id,
                qty,
            } => EventRef::Extended {
                token,
                expires_at_ms: *expires_at_ms,
                user,
                request_id,
                qty: *qty,
            },
            Event::Purged { token } => EventRef::Purged { token },
            Event::SaleRebuilt {
                sku,
                total,
                committed,
                shard_available,
            } => EventRef::SaleRebuilt {
                sku,
                total: *total,
                committed: *committed,
                shard_available,
            },
            Event::HistoryBegun { id } => EventRef::HistoryBegun { id },
            Event::SaleImported { export } => EventRef::SaleImported { export },
            Event::SaleDropped { sku } => EventRef::SaleDropped { sku },
            Event::Opaque { kind, body } => EventRef::Opaque { kind: *kind, body },
        }
    }
}

impl<'a> From<&'a Event> for EventRef<'a> {
    fn from(e: &'a Event) -> Self {
        e.as_ref()
    }
}

impl<'a> From<&EventRef<'a>> for EventRef<'a> {
    fn from(e: &EventRef<'a>) -> Self {
        *e
    }
}

impl EventRef<'_> {
    /// The owned form, for a caller that keeps the event past the sink call.
    pub fn to_owned_event(&self) -> Event {
        match *self {
            EventRef::SaleCreated { sku, params, at_ms } => Event::SaleCreated {
                sku: sku.into(),
                params: params.clone(),
                at_ms,
            },
            EventRef::SaleAdjusted { sku, shard_deltas } => Event::SaleAdjusted {
                sku: sku.into(),
                shard_deltas: shard_deltas.to_vec(),
            },
            EventRef::SaleStateSet { sku, state } => Event::SaleStateSet {
                sku: sku.into(),
                state,
            },
            EventRef::Reserved {
                token,
                sku,
                user,
                request_id,
                qty,
                shard,
                expires_at_ms,
                created_at_ms,
            } => Event::Reserved {
                token: token.into(),
                sku: sku.into(),
                user: user.into(),
                request_id: request_id.into(),
                qty,
                shard,
                expires_at_ms,
                created_at_ms,
            },
            EventRef::Released {
                token,
                at_ms,
                user,
                request_id,
                qty,
                reason,
            } => Event::Released {
                token: token.into(),
                at_ms,
                user: user.into(),
                request_id: request_id.into(),
                qty,
                reason,
            },
            EventRef::Committed {
                token,
                at_ms,
                user,
                request_id,
                qty,
            } => Event::Committed {
                token: token.into(),
                at_ms,
                user: user.into(),
                request_id: request_id.into(),
                qty,
            },
            EventRef::Extended {
                token,
                expires_at_ms,
                user,
                request_id,
                qty,
            } => Event::Extended {
                token: token.into(),
                expires_at_ms,
                user: user.into(),
                request_id: request_id.into(),
                qty,
            },
            EventRef::Purged { token } => Event::Purged {
                token: token.into(),
            },
            EventRef::SaleRebuilt {
                sku,
                total,
                committed,
                shard_available,
            } => Event::SaleRebuilt {
                sku: sku.into(),
                total,
                committed,
                shard_available: shard_available.to_vec(),
            },
            EventRef::HistoryBegun { id } => Event::HistoryBegun { id: id.into() },
            EventRef::SaleImported { export } => Event::SaleImported {
                export: Box::new(export.clone()),
            },
            EventRef::SaleDropped { sku } => Event::SaleDropped { sku: sku.into() },
            EventRef::Opaque { kind, body } => Event::Opaque {
                kind,
                body: body.to_vec(),
            },
        }
    }
}

/// Log sequence number: position of an event in the log. 0 means "not logged".
pub type Lsn = u64;

/// Where the engine sends its events. Called with engine locks held: it must be cheap and
/// must never call back into the engine. The returned [`Lsn`] is what a caller waits on
/// (through the WAL) before it may acknowledge the change to a client.
pub trait EventSink: Send + Sync {
    /// Logs `event` and returns its position; 0 if the sink keeps no log.
    fn record(&self, event: &EventRef<'_>) -> Lsn;

    /// The highest LSN handed out so far (0 if none). A reply computed after this call
    /// may report any state those records made, so it waits for this position: the rule
    /// that no reply reports a state a crash could still erase.
    fn last_lsn(&self) -> Lsn;
}

/// A sink that drops everything: an engine without durability (tests, embedded use
/// where the ledger is the only record).
#[derive(Debug, Default)]
pub struct NullSink;

impl EventSink for NullSink {
    fn record(&self, _event: &EventRef<'_>) -> Lsn {
        0
    }

    fn last_lsn(&self) -> Lsn {
        0
    }
}
