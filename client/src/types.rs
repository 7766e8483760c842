//! Values exchanged with the server, independent of transport (TCP or embedded engine).

/// Outcome of `RESERVE`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReserveOutcome {
    /// New reservation: `qty` units taken.
    Reserved {
        token: String,
        expires_at_ms: i64,
        shard: u16,
    },
    /// This `(sku, user, request-id)` was seen before; nothing taken.
    Replay {
        token: String,
        expires_at_ms: i64,
        shard: u16,
    },
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
    Committed,
    AlreadyCommitted,
}

/// One entry of `EXPIRED`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpiredReservation {
    pub token: String,
    pub sku: String,
    pub user: String,
    pub qty: u32,
    pub shard: u16,
    pub expires_at_ms: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReservationState {
    Reserved,
    Committed,
    Released,
}

impl ReservationState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reserved => "RESERVED",
            Self::Committed => "COMMITTED",
            Self::Released => "RELEASED",
        }
    }

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
    pub token: String,
    pub sku: String,
    pub user: String,
    pub request_id: String,
    pub qty: u32,
    pub shard: u16,
    pub state: ReservationState,
    pub expires_at_ms: i64,
    pub created_at_ms: i64,
}

/// Reply of `SALE.INFO`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SaleInfo {
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub committed: i64,
    pub shards: i64,
    pub ttl_ms: i64,
    pub limit: i64,
    /// `OPEN`, `PAUSED` or `FENCED`.
    pub state: String,
    pub key_fingerprint: String,
    pub shard_available: Vec<i64>,
}

impl SaleInfo {
    pub fn is_fenced(&self) -> bool {
        self.state == "FENCED"
    }
}

/// Milliseconds since the Unix epoch by the system clock.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
