//! Plain value types shared by the engine, the WAL and the protocol layer.

/// Milliseconds since the Unix epoch (or since an arbitrary origin for a test clock).
pub type Millis = u64;

/// The creation parameters of a sale, with defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SaleParams {
    /// Units for sale.
    pub total: u64,
    /// Shards the units are spread over.
    pub shards: u16,
    /// How long a hold lasts before it expires.
    pub ttl_ms: u64,
    /// Units per user in this sale; 0 = no limit.
    pub limit: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
/// Whether a sale takes reservations.
pub enum SaleState {
    /// Takes reservations.
    Open,
    /// Takes none until resumed (holds already taken may still commit or be released).
    Paused,
    /// State unproven (e.g. the WAL was lost): refuses reservations until rebuilt.
    Fenced,
    /// Frozen while it is handed over to another group: every write is refused (the
    /// caller retries), reads still answer. `paused` is the state it goes back to (or
    /// opens in on the destination): paused, or else open.
    Moving {
        /// Whether the sale was paused when it was frozen.
        paused: bool,
    },
}

impl SaleState {
    /// The word SALE.INFO shows.
    pub fn as_str(self) -> &'static str {
        match self {
            SaleState::Open => "OPEN",
            SaleState::Paused => "PAUSED",
            SaleState::Fenced => "FENCED",
            SaleState::Moving { .. } => "MOVING",
        }
    }
    /// Whether the sale is frozen for a move.
    pub fn is_moving(self) -> bool {
        matches!(self, SaleState::Moving { .. })
    }
    /// The state a frozen sale had before it was frozen; any other state is its own.
    pub fn before_move(self) -> SaleState {
        match self {
            SaleState::Moving { paused: true } => SaleState::Paused,
            SaleState::Moving { paused: false } => SaleState::Open,
            other => other,
        }
    }
    /// The byte the log and snapshots store.
    pub fn to_u8(self) -> u8 {
        match self {
            SaleState::Open => 0,
            SaleState::Paused => 1,
            SaleState::Fenced => 2,
            SaleState::Moving { paused: false } => 3,
            SaleState::Moving { paused: true } => 4,
        }
    }
    /// The state a stored byte names; `None` for a byte no version wrote.
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(SaleState::Open),
            1 => Some(SaleState::Paused),
            2 => Some(SaleState::Fenced),
            3 => Some(SaleState::Moving { paused: false }),
            4 => Some(SaleState::Moving { paused: true }),
            _ => None,
        }
    }
}

/// What a COMMIT's caller vouches for. The server's deadline is the hold's
/// `expires_at_ms`; past it only the ledger knows whether the payment was accepted in time
/// (its expiry guard ran when the payment arrived, the COMMIT may arrive later).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PaymentCheck {
    /// Nothing: a hold past its expiry is refused (`EXPIRED`), so a late payment is never
    /// sold by a caller that skipped the ledger's guard.
    Unverified,
    /// The ledger accepted the payment before the deadline: a late hold still commits.
    LedgerVerified,
}

/// Why a hold's units went back to stock, as the feed reports it: an order service
/// treats a buyer's cancel, an expiry and an operator's release differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseReason {
    /// Logged before reasons were recorded: the log does not say.
    Unknown,
    /// The buyer or the checkout cancelled the hold before its deadline.
    Cancel,
    /// The hold expired: released by the sweeper or by the server's auto-release.
    Expired,
    /// An operator released it.
    Admin,
    /// A rebuild put back an order the ledger holds as cancelled.
    Rebuild,
}

impl ReleaseReason {
    /// Every reason, in the order of their bytes.
    pub const ALL: [ReleaseReason; 5] = [
        ReleaseReason::Unknown,
        ReleaseReason::Cancel,
        ReleaseReason::Expired,
        ReleaseReason::Admin,
        ReleaseReason::Rebuild,
    ];

    /// The word on the wire (`RELEASE token REASON <word>`) and in the feed.
    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseReason::Unknown => "unknown",
            ReleaseReason::Cancel => "cancel",
            ReleaseReason::Expired => "expired",
            ReleaseReason::Admin => "admin",
            ReleaseReason::Rebuild => "rebuild",
        }
    }

    /// The reasons a client may state; `unknown` is only ever read from an old log.
    pub fn parse(word: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .filter(|r| *r != ReleaseReason::Unknown)
            .find(|r| r.as_str().eq_ignore_ascii_case(word))
    }

    /// The byte the log stores.
    pub fn to_u8(self) -> u8 {
        match self {
            ReleaseReason::Unknown => 0,
            ReleaseReason::Cancel => 1,
            ReleaseReason::Expired => 2,
            ReleaseReason::Admin => 3,
            ReleaseReason::Rebuild => 4,
        }
    }

    /// The reason a stored byte names; `None` for a byte no version wrote.
    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.to_u8() == v)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
/// Where a reservation is in its life.
pub enum ReservationState {
    /// Holding units until committed, released or expired.
    Reserved,
    /// Sold.
    Committed,
    /// The units went back to stock.
    Released,
}

impl ReservationState {
    /// The word RESERVATION and the feed show.
    pub fn as_str(self) -> &'static str {
        match self {
            ReservationState::Reserved => "RESERVED",
            ReservationState::Committed => "COMMITTED",
            ReservationState::Released => "RELEASED",
        }
    }
    /// The byte the log and snapshots store.
    pub fn to_u8(self) -> u8 {
        match self {
            ReservationState::Reserved => 0,
            ReservationState::Committed => 1,
            ReservationState::Released => 2,
        }
    }
    /// The state a stored byte names; `None` for a byte no version wrote.
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(ReservationState::Reserved),
            1 => Some(ReservationState::Committed),
            2 => Some(ReservationState::Released),
            _ => None,
        }
    }
}

/// A reservation as seen from outside (RESERVATION, EXPIRED, snapshots).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ReservationView {
    /// Names the hold in COMMIT, RELEASE and EXTEND.
    pub token: String,
    /// The sale's sku.
    pub sku: String,
    /// The buyer.
    pub user: String,
    /// The buyer's request id.
    pub request_id: String,
    /// Units held.
    pub qty: u32,
    /// The shard they came from.
    pub shard: u16,
    /// Where it is in its life.
    pub state: ReservationState,
    /// The hold's deadline.
    pub expires_at_ms: Millis,
    /// When the hold was taken.
    pub created_at_ms: Millis,
    /// When it left `RESERVED` (0 while reserved); drives retention.
    pub finished_at_ms: Millis,
}

/// A hold's fields as a log record or a snapshot carries them, borrowed: what restoring
/// a hold reads. A follower restores every hold the leader makes, so nothing here is
/// copied that the engine does not keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldRecord<'a> {
    /// Names the hold in COMMIT, RELEASE and EXTEND.
    pub token: &'a str,
    /// The sale's sku.
    pub sku: &'a str,
    /// The buyer.
    pub user: &'a str,
    /// The buyer's request id.
    pub request_id: &'a str,
    /// Units held.
    pub qty: u32,
    /// The shard they came from.
    pub shard: u16,
    /// Where it is in its life.
    pub state: ReservationState,
    /// The hold's deadline.
    pub expires_at_ms: Millis,
    /// When the hold was taken.
    pub created_at_ms: Millis,
    /// When it left `RESERVED` (0 while reserved).
    pub finished_at_ms: Millis,
}

impl HoldRecord<'_> {
    /// The record as an owned view.
    pub fn to_view(&self) -> ReservationView {
        ReservationView {
            token: self.token.to_string(),
            sku: self.sku.to_string(),
            user: self.user.to_string(),
            request_id: self.request_id.to_string(),
            qty: self.qty,
            shard: self.shard,
            state: self.state,
            expires_at_ms: self.expires_at_ms,
            created_at_ms: self.created_at_ms,
            finished_at_ms: self.finished_at_ms,
        }
    }
}

impl ReservationView {
    /// The view's fields, borrowed.
    pub fn record(&self) -> HoldRecord<'_> {
        HoldRecord {
            token: &self.token,
            sku: &self.sku,
            user: &self.user,
            request_id: &self.request_id,
            qty: self.qty,
            shard: self.shard,
            state: self.state,
            expires_at_ms: self.expires_at_ms,
            created_at_ms: self.created_at_ms,
            finished_at_ms: self.finished_at_ms,
        }
    }
}

/// A sale's counters as seen from outside (SALE.INFO, snapshots).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SaleView {
    /// The sale's sku.
    pub sku: String,
    /// What it was created with.
    pub params: SaleParams,
    /// Units for sale in total, after adjustments.
    pub total: u64,
    /// Units anyone may still reserve.
    pub available: i64,
    /// Units held by live reservations.
    pub reserved: u64,
    /// Units sold.
    pub committed: u64,
    /// Open, paused or fenced.
    pub state: SaleState,
    /// Each shard's available units, by shard index.
    pub shard_available: Vec<i64>,
}

/// What is left of a finished reservation once retention purged its record: enough for
/// a retry of the same request to REPLAY (never take stock again) and, in a limited
/// sale, for the user's committed units to keep counting. Keyed by a 128-bit hash of
/// the token ([`super::table::tomb_key`]), not the token, to stay small.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TombView {
    /// The sale's sku.
    pub sku: String,
    /// The 128-bit hash of the token that names it.
    pub key: u128,
    /// How it finished.
    pub state: ReservationState,
    /// Units it held.
    pub qty: u32,
    /// The shard they came from.
    pub shard: u16,
    /// Its deadline.
    pub expires_at_ms: Millis,
    /// The buyer, kept only where a limit must still count the units (committed, in a
    /// sale with a per-user limit); empty otherwise.
    pub user: String,
}

/// The full state of an engine, consistent at one log position. Written by snapshots,
/// loaded on recovery.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The history id (`Engine::history`); empty in snapshots written before it existed.
    pub history: String,
    /// Every sale.
    pub sales: Vec<SaleView>,
    /// Every reservation still held, in any state.
    pub reservations: Vec<ReservationView>,
    /// What retention left of purged reservations.
    pub tombs: Vec<TombView>,
    /// Every sale's waiting room, by sku (empty in snapshots written before rooms).
    pub rooms: Vec<RoomView>,
}

/// One sale's waiting room in a snapshot: its settings and its state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoomView {
    /// The sale's sku.
    pub sku: String,
    /// The room's settings.
    pub config: crate::room::RoomConfig,
    /// What the room's ops built.
    pub state: crate::room::RoomState,
}

/// One sale's whole state, as a move hands it from one group's engine to another's
/// (`Engine::export_sale`, `Engine::import_sale`; encoded by `wal::handover`). The per-user
/// limit usage is not stored: it follows from the reservations and tombstones, as after a
/// snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SaleExport {
    /// The fingerprint of the reservation key the tokens were derived with: the
    /// destination must derive the same ones.
    pub fingerprint: String,
    /// The sale, in the state it had before it was frozen (the one it opens in).
    pub sale: SaleView,
    /// Its reservations, in any state.
    pub reservations: Vec<ReservationView>,
    /// What retention left of its purged reservations.
    pub tombs: Vec<TombView>,
    /// The sale's waiting room, if it has one: its buyers keep their places and tickets
    /// on the destination. `None` from a source that predates moving rooms.
    pub room: Option<RoomView>,
}

/// By hand because the room's settings are not `Hash`: an import is known again by the
/// hash of everything it carries, the room included.
impl std::hash::Hash for SaleExport {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.fingerprint.hash(h);
        self.sale.hash(h);
        self.reservations.hash(h);
        self.tombs.hash(h);
        self.room
            .as_ref()
            .map(|r| {
                let c = &r.config;
                (
                    &r.sku,
                    (c.max_rate_per_sec, c.over_admit_permille, c.admit_ttl_ms),
                    (c.expiring_window_ms, c.max_waiting, c.opens_at_ms),
                    &r.state,
                )
            })
            .hash(h);
    }
}
