//! Values exchanged with the server, independent of transport (TCP or embedded engine).

/// Outcome of `RESERVE`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReserveOutcome {
    /// New reservation: `qty` units taken.
    Reserved {
        /// The reservation's token.
        token: String,
        /// When the hold lapses unless committed, in ms since the Unix epoch.
        expires_at_ms: i64,
        /// The shard of the sale the units came from.
        shard: u16,
    },
    /// This `(sku, user, request-id)` was seen before; nothing taken.
    Replay {
        /// The reservation's token.
        token: String,
        /// When the hold lapses unless committed, in ms since the Unix epoch.
        expires_at_ms: i64,
        /// The shard of the sale the units came from.
        shard: u16,
    },
    /// Too few units left for the request.
    SoldOut,
    /// The per-user limit refused the request.
    Limit {
        /// The user's reservations still `RESERVED` in this sale, to resume or cancel one.
        live_tokens: Vec<String>,
        /// The sale's limit, in units per user.
        limit: u32,
        /// Units the user holds in this sale (`RESERVED` or `COMMITTED`).
        held: u64,
    },
}

impl ReserveOutcome {
    /// The reservation token, for outcomes that have one.
    pub fn token(&self) -> Option<&str> {
        match self {
            ReserveOutcome::Reserved { token, .. } | ReserveOutcome::Replay { token, .. } => {
                Some(token)
            }
            _ => None,
        }
    }
}

/// Successful `COMMIT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitOk {
    /// The reservation was RESERVED and is now sold.
    Committed,
    /// The reservation was already committed; nothing changed (a retried commit).
    AlreadyCommitted,
}

/// One entry of `EXPIRED`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpiredReservation {
    /// The reservation's token.
    pub token: String,
    /// The sale's key.
    pub sku: String,
    /// The buyer's id.
    pub user: String,
    /// Units held.
    pub qty: u32,
    /// The shard of the sale the units came from.
    pub shard: u16,
    /// When the hold lapses unless committed, in ms since the Unix epoch.
    pub expires_at_ms: i64,
}

/// Where a reservation is in its life: held, sold, or given back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReservationState {
    /// Held: its units are taken from stock until it is committed, released or lapses.
    Reserved,
    /// Sold: its units are gone for good.
    Committed,
    /// Given back: its units returned to stock.
    Released,
}

impl ReservationState {
    /// The state as the protocol spells it (`RESERVED`, `COMMITTED`, `RELEASED`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reserved => "RESERVED",
            Self::Committed => "COMMITTED",
            Self::Released => "RELEASED",
        }
    }

    /// Parses the protocol's spelling; `None` for any other word.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "RESERVED" => Some(Self::Reserved),
            "COMMITTED" => Some(Self::Committed),
            "RELEASED" => Some(Self::Released),
            _ => None,
        }
    }
}

/// Reply of `RESERVATION`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReservationInfo {
    /// The reservation's token.
    pub token: String,
    /// The sale's key.
    pub sku: String,
    /// The buyer's id.
    pub user: String,
    /// The caller's id for the reservation attempt; a retry with the same id gets the same
    /// reservation.
    pub request_id: String,
    /// Units held.
    pub qty: u32,
    /// The shard of the sale the units came from.
    pub shard: u16,
    /// Where the reservation is in its life.
    pub state: ReservationState,
    /// When the hold lapses unless committed, in ms since the Unix epoch.
    pub expires_at_ms: i64,
    /// When the reservation was made, in ms since the Unix epoch.
    pub created_at_ms: i64,
}

/// Reply of `SALE.INFO`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SaleInfo {
    /// Units the sale has in all.
    pub total: i64,
    /// Units free to reserve, summed over the shards.
    pub available: i64,
    /// Units held by RESERVED reservations.
    pub reserved: i64,
    /// Units sold.
    pub committed: i64,
    /// How many shards the sale's stock is split into.
    pub shards: i64,
    /// How long a new hold lasts before it lapses, in ms.
    pub ttl_ms: i64,
    /// Most units one user may hold in the sale (0: no limit).
    pub limit: i64,
    /// `OPEN`, `PAUSED` or `FENCED`.
    pub state: String,
    /// Fingerprint of the reservation key the server derives tokens with; a rebuild checks it
    /// against the ledger's.
    pub key_fingerprint: String,
    /// Units free to reserve in each shard, by shard index.
    pub shard_available: Vec<i64>,
}

impl SaleInfo {
    /// Whether the sale is fenced: its counts are unproven and it refuses changes until rebuilt.
    pub fn is_fenced(&self) -> bool {
        self.state == "FENCED"
    }
}

/// `ROOM.OPEN`'s settings (docs/protocol.md, section 4a); `None` leaves the server's
/// default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoomOptions {
    /// `OPENS-AT`: ms since the Unix epoch; joins before it are pre-queued and drawn in a
    /// random order when it passes (default 0: open).
    pub opens_at_ms: Option<u64>,
    /// `RATE`: admissions per second at most, 1–1,000,000 (default 100).
    pub rate: Option<u32>,
    /// `OVERADMIT`: admitted-but-not-reserved buyers per unit available, per mille,
    /// 100–10,000 (default 1000).
    pub overadmit_permille: Option<u32>,
    /// `ADMIT-TTL`: how long an admission lasts, 1–3,600,000 ms (default 120,000).
    pub admit_ttl_ms: Option<u64>,
    /// `WINDOW`: 0–3,600,000 ms (default 10,000).
    pub window_ms: Option<u64>,
    /// `MAX`: buyers waiting at most, 1–50,000,000 (default 1,000,000).
    pub max_waiting: Option<u32>,
}

/// Reply of `ROOM.JOIN`: the user's place (the same ticket again while the user holds one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoomTicket {
    /// The ticket `ROOM.STATUS` takes.
    pub ticket: String,
    /// 1-based while waiting; 0 when admitted already or before the sale opens
    /// (`ROOM.STATUS` says which).
    pub position: u64,
    /// The estimated wait in ms, from the recent admission rate.
    pub eta_ms: u64,
}

/// Reply of `ROOM.STATUS`: where the user's place is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoomStatus {
    /// In line.
    Waiting {
        /// 1-based place in line.
        position: u64,
        /// The estimated wait in ms.
        eta_ms: u64,
    },
    /// The buyer's turn: `RESERVE` with `admission` before `until_ms`.
    Admitted {
        /// The admission token `RESERVE` verifies, minted for (sku, user, `until_ms`).
        admission: String,
        /// When the admission lapses, in ms since the Unix epoch.
        until_ms: i64,
    },
    /// Pre-queued: the line is drawn in a random order when the sale opens.
    BeforeOpen {
        /// When the sale opens, in ms since the Unix epoch.
        opens_at_ms: i64,
    },
    /// The admission was used by a `RESERVE`.
    Reserved,
    /// The sale has nothing available and nothing held.
    SoldOut,
    /// Admitted, not reserved within `ADMIT-TTL`: join again for a place at the back.
    Expired,
    /// The place was given up (`ROOM.LEAVE`).
    Left,
}

impl RoomStatus {
    /// The admission token, for an admitted place.
    pub fn admission(&self) -> Option<&str> {
        match self {
            RoomStatus::Admitted { admission, .. } => Some(admission),
            _ => None,
        }
    }
}

/// Reply of `ROOM.INFO`: the room's settings, then its counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoomInfo {
    /// `OPENS-AT`, ms since the Unix epoch (0: open).
    pub opens_at_ms: u64,
    /// `RATE`: admissions per second at most.
    pub rate: u32,
    /// `OVERADMIT`, per mille.
    pub overadmit_permille: u32,
    /// `ADMIT-TTL`, ms.
    pub admit_ttl_ms: u64,
    /// `WINDOW`, ms.
    pub window_ms: u64,
    /// `MAX`: buyers waiting at most.
    pub max_waiting: u32,
    /// Buyers in line or pre-queued.
    pub waiting: u64,
    /// Buyers admitted and not reserved yet.
    pub admitted: u64,
    /// Whether the line is drawn (the sale opened and the room moved since).
    pub open: bool,
    /// Whether waiting buyers are told `SOLDOUT` (and joins refused).
    pub sold_out: bool,
}

/// A buyer's place as the buyer's live channel (`place:<ticket>`) tells it: what
/// `ROOM.STATUS` would answer, without the admission token, or [`PlaceStatus::Gone`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlaceStatus {
    /// In line.
    Waiting {
        /// 1-based place in line.
        position: u64,
        /// The estimated wait in ms.
        eta_ms: u64,
    },
    /// The buyer's turn until `until_ms`; the admission token comes from
    /// `StockgateClient::status` ([`RoomStatus::Admitted`]).
    Admitted {
        /// When the admission lapses, in ms since the Unix epoch.
        until_ms: i64,
    },
    /// Pre-queued: the line is drawn in a random order when the sale opens.
    BeforeOpen {
        /// When the sale opens, in ms since the Unix epoch.
        opens_at_ms: i64,
    },
    /// The admission was used by a `RESERVE`.
    Reserved,
    /// The sale has nothing available and nothing held.
    SoldOut,
    /// Admitted, not reserved within `ADMIT-TTL`: join again for a place at the back.
    Expired,
    /// The place was given up (`ROOM.LEAVE`).
    Left,
    /// The room (or the place) is gone: the sale was dropped or moved away.
    Gone,
}

/// One message of a sale's live channel (`sale:<sku>:live`) or of a buyer's
/// (`place:<ticket>`), docs/protocol.md section 4a, "Live counts over RESP".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveCounts {
    /// The sale's key.
    pub sku: String,
    /// Units free to reserve (`SALE.INFO`'s `available`).
    pub available: i64,
    /// Units in live holds (`SALE.INFO`'s `reserved`).
    pub held: i64,
    /// Units sold (`SALE.INFO`'s `committed`).
    pub sold: i64,
    /// Buyers in line or pre-queued (`ROOM.INFO`'s; 0 without a room).
    pub waiting: u64,
    /// Buyers admitted and not reserved yet (`ROOM.INFO`'s; 0 without a room).
    pub admitted: u64,
    /// Whether the sale has a waiting room.
    pub room: bool,
    /// `SALE.INFO`'s state (`OPEN`, `PAUSED`, `FENCED`, `MOVING`), or `GONE` once the sale
    /// is dropped or moved away.
    pub state: String,
    /// The buyer's place, on a buyer's channel only.
    pub you: Option<PlaceStatus>,
}

impl LiveCounts {
    /// Whether the sale was dropped or moved away: no more counts come for it here.
    pub fn is_gone(&self) -> bool {
        self.state == "GONE"
    }
}

/// Milliseconds since the Unix epoch by the system clock.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A sale as the ledger knows it: what a rebuild starts from.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SaleRecord {
    /// The sale's key.
    pub sku: String,
    /// Units the sale was created with. Never changes (a repeated registration is compared
    /// against it).
    pub initial_allocation: u64,
    /// The current allocation: `initial_allocation` plus every adjustment recorded with
    /// `Ledger::record_adjustment` (in `stockgate-ledger`) and not refused. The one truth a rebuild uses.
    pub allocation: u64,
    /// Shards the sale is created with on a rebuild (`None`: the server's default).
    pub shards: Option<u16>,
    /// Hold lifetime in ms a rebuilt sale gets (`None`: the server's default).
    pub ttl_ms: Option<u64>,
    /// Per-user limit in units a rebuilt sale gets (`None`: the server's default).
    pub per_user_limit: Option<u32>,
    /// Fingerprint of the server's reservation key (`SALE.INFO` key_fingerprint). A rebuild
    /// into a server with another key is refused.
    pub key_fingerprint: Option<String>,
}

impl SaleRecord {
    /// A sale of `initial_allocation` units with the server's defaults and no key fingerprint yet.
    pub fn new(sku: &str, initial_allocation: u64) -> Self {
        SaleRecord {
            sku: sku.to_string(),
            initial_allocation,
            allocation: initial_allocation,
            shards: None,
            ttl_ms: None,
            per_user_limit: None,
            key_fingerprint: None,
        }
    }
}
