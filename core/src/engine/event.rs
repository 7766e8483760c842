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
//!
//! Each kind of event is declared once, in `event_kinds!`: its variant, its record kind,
//! its name and its fields in WAL order. [`Event`], its borrowed twin [`EventRef`], the
//! conversions between them and [`EventKind`] are generated here from that list, and the
//! record codec (`wal::record`) is generated from the same list, so a kind cannot exist in
//! one of them and not in the others.

use crate::room::{RoomConfig, RoomOp};

use super::types::{
    HoldRecord, Millis, ReleaseReason, ReservationState, SaleExport, SaleParams, SaleState,
};

/// The declaration of every kind of event, handed to the macro `$then`, which generates
/// what it needs from it (the types below; the codec in `wal::record`).
///
/// Each kind is `Variant = record kind, "name" { fields }`:
/// - the record kind is the byte that tells its WAL records apart. Numbers once used stay
///   taken (5, 6 and 7 are older shapes of finishes, 16 a batch of a split import, 64 to
///   127 the opaque kinds: see `wal::record`; 17 and 18 are the waiting room's). A kind
///   without one ([`Event::Opaque`]) carries its record kind as its first field.
/// - the name is the `type` of its order-feed entries (docs/protocol.md, section 7).
/// - the fields are encoded in the order listed, so order and meaning are part of the WAL
///   format: change them only together with the record version in `wal::record`. A field
///   is `name: Owned => Borrowed` when the borrowed event refers to the engine's data
///   instead of copying it, `name: Type` when both forms hold the value itself.
macro_rules! event_kinds {
    ($then:ident) => {
        $then! {
            /// `SALE.CREATE`: a new sale with `params.total` units spread over `params.shards`.
            SaleCreated = 1, "sale.created" {
                /// The sale's sku.
                sku: String => &'a str,
                /// The sale's parameters, defaults filled in.
                params: SaleParams => &'a SaleParams,
                /// When it happened, by the engine's clock.
                at_ms: Millis,
            },
            /// `SALE.ADJUST`: per-shard deltas of available units (their sum is the change of
            /// `total`). Logged per shard so replay does not depend on the distribution rule.
            SaleAdjusted = 2, "sale.adjusted" {
                /// The sale's sku.
                sku: String => &'a str,
                /// The change of each shard's available units, by shard index.
                shard_deltas: Vec<i64> => &'a [i64],
            },
            /// `SALE.PAUSE` / `SALE.RESUME` / fencing.
            SaleStateSet = 3, "sale.state" {
                /// The sale's sku.
                sku: String => &'a str,
                /// The state the sale enters.
                state: SaleState,
            },
            /// `RESERVE`: `qty` units taken from `shard`.
            Reserved = 4, "reserved" {
                /// The reservation's token (`{sku}` followed by its 26 base32 characters).
                token: String => &'a str,
                /// The sale's sku.
                sku: String => &'a str,
                /// The buyer.
                user: String => &'a str,
                /// The buyer's request id: a retry with the same id replays the hold.
                request_id: String => &'a str,
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
            Released = 10, "released" {
                /// The reservation's token (`{sku}` followed by its 26 base32 characters).
                token: String => &'a str,
                /// When it happened, by the engine's clock.
                at_ms: Millis,
                /// The buyer.
                user: String => &'a str,
                /// The buyer's request id: a retry with the same id replays the hold.
                request_id: String => &'a str,
                /// Units held.
                qty: u32,
                /// Why the units went back to stock.
                reason: ReleaseReason,
            },
            /// `COMMIT`: the units are sold for good.
            Committed = 11, "committed" {
                /// The reservation's token (`{sku}` followed by its 26 base32 characters).
                token: String => &'a str,
                /// When it happened, by the engine's clock.
                at_ms: Millis,
                /// The buyer.
                user: String => &'a str,
                /// The buyer's request id: a retry with the same id replays the hold.
                request_id: String => &'a str,
                /// Units held.
                qty: u32,
            },
            /// `EXTEND`: new deadline.
            Extended = 12, "extended" {
                /// The reservation's token (`{sku}` followed by its 26 base32 characters).
                token: String => &'a str,
                /// The hold's deadline.
                expires_at_ms: Millis,
                /// The buyer.
                user: String => &'a str,
                /// The buyer's request id: a retry with the same id replays the hold.
                request_id: String => &'a str,
                /// Units held.
                qty: u32,
            },
            /// Retention: a finished reservation is forgotten (its units are already
            /// accounted for in the sale's counters).
            Purged = 8, "purged" {
                /// The reservation's token (`{sku}` followed by its 26 base32 characters).
                token: String => &'a str,
            },
            /// Rebuild of a fenced sale from the ledger: the sale's counters are set
            /// outright. Pending reservations restored by the rebuild follow as `Reserved`
            /// events.
            SaleRebuilt = 9, "sale.rebuilt" {
                /// The sale's sku.
                sku: String => &'a str,
                /// Units for sale in total, as the ledger counts them.
                total: u64,
                /// Units sold, as the ledger counts them.
                committed: u64,
                /// Each shard's available units after the rebuild.
                shard_available: Vec<i64> => &'a [i64],
            },
            /// The first record of a history (`Engine::begin_history`): its random id.
            HistoryBegun = 13, "history.begun" {
                /// The history's random id.
                id: String => &'a str,
            },
            /// A sale handed over from another group (`Engine::import_sale`): its whole
            /// state. A batch of an import split over several records is logged with a
            /// record kind of its own (see `wal::record`).
            SaleImported = 14, "sale.imported" {
                /// What the source group exported.
                export: Box<SaleExport> => &'a SaleExport,
            },
            /// A sale handed over to another group (`Engine::drop_sale`): it is gone from
            /// here.
            SaleDropped = 15, "sale.dropped" {
                /// The sale's sku.
                sku: String => &'a str,
            },
            /// `ROOM.OPEN`: the sale `sku` gets a waiting room with these settings.
            RoomOpened = 17, "room.opened" {
                /// The sale's sku.
                sku: String => &'a str,
                /// The room's settings, defaults filled in.
                config: RoomConfig => &'a RoomConfig,
                /// When it happened, by the engine's clock.
                at_ms: Millis,
            },
            /// One change of a sale's waiting room (`crate::room::RoomOp`): a join, a
            /// leave, the opening draw, an admission, a use, an expiry, sold out or
            /// restocked. Replay applies the op to the room as it was applied live.
            RoomChanged = 18, "room.changed" {
                /// The sale's sku.
                sku: String => &'a str,
                /// The change.
                op: RoomOp => &'a RoomOp,
            },
            /// A record another module writes into the same log (the order feed's consumer
            /// groups): `kind` is one of the WAL's opaque kinds, `body` its encoding. The
            /// engine gives it no meaning and skips it on replay, so it depends on nothing
            /// that logs such records. Never an entry of the order feed.
            Opaque, "internal" {
                /// One of the log's opaque kinds (`wal::record::OPAQUE_KINDS`): the record's
                /// kind byte.
                kind: u8,
                /// The record's bytes, decoded by the module that logged it.
                body: Vec<u8> => &'a [u8],
            },
        }
    };
}
pub(crate) use event_kinds;

/// The borrowed type of a field: the one declared after `=>`, else the owned type.
macro_rules! borrowed_type {
    ($owned:ty) => {
        $owned
    };
    ($owned:ty, $borrowed:ty) => {
        $borrowed
    };
}

/// A kind's record kind as an `Option`.
macro_rules! record_kind {
    () => {
        None
    };
    ($code:literal) => {
        Some($code)
    };
}

/// Generates [`Event`], [`EventRef`], [`EventKind`] and the conversions from
/// `event_kinds!`.
macro_rules! declare_events {
    ($(
        $(#[$doc:meta])*
        $variant:ident $(= $code:literal)?, $name:literal {
            $(
                $(#[$field_doc:meta])*
                $field:ident: $owned:ty $(=> $borrowed:ty)?
            ),* $(,)?
        }
    ),* $(,)?) => {
        /// One state change. Field order and meaning are part of the WAL format (see
        /// `event_kinds!`).
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum Event {
            $(
                $(#[$doc])*
                $variant {
                    $( $(#[$field_doc])* $field: $owned, )*
                },
            )*
        }

        /// A borrowed [`Event`]: what the engine hands to its sink on the hot path, so
        /// logging a RESERVE copies no strings (the WAL encodes straight from the engine's
        /// own data).
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum EventRef<'a> {
            $(
                $(#[$doc])*
                $variant {
                    $( $(#[$field_doc])* $field: borrowed_type!($owned $(, $borrowed)?), )*
                },
            )*
        }

        /// The kind of an [`Event`], without its fields.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum EventKind {
            $(
                #[doc = concat!("[`Event::", stringify!($variant), "`].")]
                $variant,
            )*
        }

        impl EventKind {
            /// Every kind, in the order of their declaration.
            pub const ALL: &'static [EventKind] = &[$(EventKind::$variant),*];

            /// The kind's name: the `type` of its order-feed entries.
            pub const fn name(self) -> &'static str {
                match self {
                    $(EventKind::$variant => $name,)*
                }
            }

            /// The byte that tells the kind's WAL records apart; `None` for a kind whose
            /// records carry it as their first field ([`Event::Opaque`]).
            pub const fn code(self) -> Option<u8> {
                match self {
                    $(EventKind::$variant => record_kind!($($code)?),)*
                }
            }

            /// The kind whose [`code`](Self::code) is `code`.
            pub const fn from_code(code: u8) -> Option<EventKind> {
                match code {
                    $($($code => Some(EventKind::$variant),)?)*
                    _ => None,
                }
            }
        }

        impl Event {
            /// The event's kind.
            pub const fn kind(&self) -> EventKind {
                match self {
                    $(Event::$variant { .. } => EventKind::$variant,)*
                }
            }

            /// The borrowed form, as the engine hands it to its sink.
            pub fn as_ref(&self) -> EventRef<'_> {
                match self {
                    $(
                        Event::$variant { $($field),* } => EventRef::$variant {
                            $($field: Lend::lend($field),)*
                        },
                    )*
                }
            }
        }

        impl EventRef<'_> {
            /// The event's kind.
            pub const fn kind(&self) -> EventKind {
                match self {
                    $(EventRef::$variant { .. } => EventKind::$variant,)*
                }
            }

            /// The owned form, for a caller that keeps the event past the sink call.
            pub fn to_owned_event(&self) -> Event {
                match *self {
                    $(
                        EventRef::$variant { $($field),* } => Event::$variant {
                            $($field: Own::own($field),)*
                        },
                    )*
                }
            }
        }
    };
}

event_kinds!(declare_events);

/// A field of an owned event, borrowed as the same field of an [`EventRef`] holds it.
trait Lend<'a, B> {
    fn lend(&'a self) -> B;
}

/// A field of an [`EventRef`], copied into the owned form of the field.
trait Own<T> {
    fn own(self) -> T;
}

impl<'a, T: Copy> Lend<'a, T> for T {
    fn lend(&'a self) -> T {
        *self
    }
}

impl<T: Copy> Own<T> for T {
    fn own(self) -> T {
        self
    }
}

impl<'a> Lend<'a, &'a str> for String {
    fn lend(&'a self) -> &'a str {
        self
    }
}

impl Own<String> for &str {
    fn own(self) -> String {
        self.to_owned()
    }
}

impl<'a, T: Copy> Lend<'a, &'a [T]> for Vec<T> {
    fn lend(&'a self) -> &'a [T] {
        self
    }
}

impl<T: Copy> Own<Vec<T>> for &[T] {
    fn own(self) -> Vec<T> {
        self.to_vec()
    }
}

impl<'a> Lend<'a, &'a SaleParams> for SaleParams {
    fn lend(&'a self) -> &'a SaleParams {
        self
    }
}

impl Own<SaleParams> for &SaleParams {
    fn own(self) -> SaleParams {
        self.clone()
    }
}

impl<'a> Lend<'a, &'a SaleExport> for Box<SaleExport> {
    fn lend(&'a self) -> &'a SaleExport {
        self
    }
}

impl Own<Box<SaleExport>> for &SaleExport {
    fn own(self) -> Box<SaleExport> {
        Box::new(self.clone())
    }
}

impl<'a> Lend<'a, &'a RoomConfig> for RoomConfig {
    fn lend(&'a self) -> &'a RoomConfig {
        self
    }
}

impl Own<RoomConfig> for &RoomConfig {
    fn own(self) -> RoomConfig {
        self.clone()
    }
}

impl<'a> Lend<'a, &'a RoomOp> for RoomOp {
    fn lend(&'a self) -> &'a RoomOp {
        self
    }
}

impl Own<RoomOp> for &RoomOp {
    fn own(self) -> RoomOp {
        self.clone()
    }
}

impl Event {
    /// The reservation a `Reserved` event creates, as a fresh RESERVED record.
    pub fn reserved_record(&self) -> Option<HoldRecord<'_>> {
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
        Some(HoldRecord {
            token,
            sku,
            user,
            request_id,
            qty: *qty,
            shard: *shard,
            state: ReservationState::Reserved,
            expires_at_ms: *expires_at_ms,
            created_at_ms: *created_at_ms,
            finished_at_ms: 0,
        })
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
