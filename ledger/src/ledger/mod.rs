//! The ledger: the durable judge of every reservation's fate (docs/design.md, "Ledger").
//!
//! One interface, two backends that pass the same test suite:
//! - [`postgres::PgLedger`] (production; schema in `migrations/`),
//! - [`embedded::SledLedger`] (a checkout service that embeds the engine and runs no database).
//!
//! The state machine of an order (keyed by its reservation token):
//!
//! ```text
//!            materialize
//!  (none) ─────────────────► PENDING ──commit (unexpired)──► COMMITTED
//!    │                         │  │                              │
//!    │ sweeper tombstone       │  └─cancel (buyer)─► CANCELLED   │ server says RELEASED/NORES
//!    ▼                         ▼ sweeper (expired)      │        ▼ (compensation)
//!  CANCELLED_BY_SWEEPER ◄──────┘                        │   REFUND_REQUIRED ──► REFUNDED
//!    │  (a capture that arrives for CANCELLED*, or for an expired PENDING, when the
//!    └──────────────────────────► REFUND_REQUIRED ◄─────┘   money already moved)
//! ```
//!
//! Every transition writes one audit event in the same transaction.

pub mod embedded;
pub mod migrations;
pub mod pg_schema;
pub mod postgres;

use std::future::Future;

use crate::types::{ExpiredReservation, ReservationInfo};

/// Status of an order. The strings are the values stored in SQL (CHECK constraint).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum OrderStatus {
    /// Reserved on the server and written to the ledger, not yet paid.
    Pending,
    /// Paid: the units are sold.
    Committed,
    /// Buyer abandoned explicitly (checkout app).
    Cancelled,
    /// Expired and reclaimed by the sweeper (or a tombstone for a never-materialized token).
    CancelledBySweeper,
    /// Money moved for a reservation that was no longer ours to sell: refund it.
    RefundRequired,
    /// The refund was made.
    Refunded,
}

impl OrderStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [OrderStatus; 6] = [
        OrderStatus::Pending,
        OrderStatus::Committed,
        OrderStatus::Cancelled,
        OrderStatus::CancelledBySweeper,
        OrderStatus::RefundRequired,
        OrderStatus::Refunded,
    ];

    /// The status as stored in SQL.
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Pending => "PENDING",
            OrderStatus::Committed => "COMMITTED",
            OrderStatus::Cancelled => "CANCELLED",
            OrderStatus::CancelledBySweeper => "CANCELLED_BY_SWEEPER",
            OrderStatus::RefundRequired => "REFUND_REQUIRED",
            OrderStatus::Refunded => "REFUNDED",
        }
    }

    /// Parses the SQL spelling; `None` for any other word.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// Cancelled in any way: the units are not sold and may go back to stock.
    pub fn is_cancelled(self) -> bool {
        matches!(
            self,
            OrderStatus::Cancelled | OrderStatus::CancelledBySweeper
        )
    }

    /// Whether `self → to` is a legal transition (mirrors the SQL trigger).
    pub fn can_become(self, to: OrderStatus) -> bool {
        use OrderStatus::*;
        matches!(
            (self, to),
            (Pending, Committed)
                | (Pending, Cancelled)
                | (Pending, CancelledBySweeper)
                | (Pending, RefundRequired)
                | (Cancelled, RefundRequired)
                | (CancelledBySweeper, RefundRequired)
                | (Committed, RefundRequired)
                | (RefundRequired, Refunded)
        )
    }
}

impl std::fmt::Display for OrderStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

// The sale record moved to the client (`stockgate_client::types`): the gate's `fence`
// takes it too. Re-exported here, its old path.
pub use stockgate_client::types::SaleRecord;

/// Where an allocation adjustment stands (see `migrations/0002_allocation_adjustments.sql`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum AdjustmentStatus {
    /// In the ledger (the allocation already moved), not yet confirmed on the server.
    Recorded,
    /// The server's total includes it.
    Applied,
    /// The server refused it; the allocation was moved back.
    Refused,
}

impl AdjustmentStatus {
    /// The status as stored in the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            AdjustmentStatus::Recorded => "RECORDED",
            AdjustmentStatus::Applied => "APPLIED",
            AdjustmentStatus::Refused => "REFUSED",
        }
    }

    /// Parses the stored spelling; `None` for any other word.
    pub fn parse(s: &str) -> Option<Self> {
        [
            AdjustmentStatus::Recorded,
            AdjustmentStatus::Applied,
            AdjustmentStatus::Refused,
        ]
        .into_iter()
        .find(|x| x.as_str() == s)
    }
}

/// One allocation adjustment, keyed by its id (the operator's idempotency key).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Adjustment {
    /// The operator's id for the adjustment: a retry with the same id changes nothing again.
    pub id: String,
    /// The sale's key.
    pub sku: String,
    /// Units added to the allocation (negative: withdrawn).
    pub delta: i64,
    /// The allocation right after it was recorded.
    pub allocation_after: u64,
    /// The order's status.
    pub status: AdjustmentStatus,
    /// The server's total when it was confirmed there, if known.
    pub server_total: Option<i64>,
    /// Why it ended as it did (the server's refusal), if anything was noted.
    pub detail: Option<String>,
    /// When the reservation was made, in ms since the Unix epoch.
    pub created_at_ms: i64,
    /// When the row last changed, in ms since the Unix epoch.
    pub updated_at_ms: i64,
}

/// How an adjustment ended on the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdjustmentOutcome {
    /// The server's total includes it (`server_total`, when known).
    Applied {
        /// The server's total units after it, if known.
        server_total: Option<i64>,
    },
    /// The server refused it: the allocation moves back by `-delta`.
    Refused {
        /// The server's refusal.
        reason: String,
    },
}

/// What materialize writes: a server reservation turning into a PENDING order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewOrder {
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
    /// When the hold lapses unless committed, in ms since the Unix epoch.
    pub expires_at_ms: i64,
    /// When the reservation was made, in ms since the Unix epoch.
    pub created_at_ms: i64,
}

/// An order row.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Order {
    /// The reservation's token.
    pub token: String,
    /// The sale's key.
    pub sku: String,
    /// The buyer's id.
    pub user: String,
    /// None for sweeper tombstones (EXPIRED does not carry the request id).
    pub request_id: Option<String>,
    /// Units held.
    pub qty: u32,
    /// The order's status.
    pub status: OrderStatus,
    /// When the hold lapses unless committed, in ms since the Unix epoch.
    pub expires_at_ms: i64,
    /// When the server made the reservation, in ms since the Unix epoch (`None` when the order was
    /// not materialized from the server's record); tells this hold from a later one under the same
    /// token.
    pub reservation_created_at_ms: Option<i64>,
    /// The payment's reference, once one was attached; a refund needs it.
    pub payment_ref: Option<String>,
    /// When the reservation was made, in ms since the Unix epoch.
    pub created_at_ms: i64,
    /// When the row last changed, in ms since the Unix epoch.
    pub updated_at_ms: i64,
}

impl Order {
    /// Whether the server's reservation `r` (for this order's token) is the hold this order
    /// was materialized from — the one its payment paid for — and not a later hold of the
    /// same `(sku, user, request-id)` (created after the paid one was purged by retention or
    /// lost with the server's state, so same token).
    ///
    /// Same quantity, and the same creation time (kept exactly since materialize reads it
    /// from the server) or the same expiry (exact from RESERVE; it differs only if an
    /// EXTEND reached the server but not the ledger). A later hold differs in both: it was
    /// created later, with a new deadline.
    pub fn same_hold(&self, r: &ReservationInfo) -> bool {
        r.sku == self.sku
            && r.user == self.user
            && r.qty == self.qty
            && (self.reservation_created_at_ms == Some(r.created_at_ms)
                || self.expires_at_ms == r.expires_at_ms)
    }
}

/// One audit row: a transition, written in the same transaction as the transition.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OrderEvent {
    /// The row's increasing id: the order of transitions.
    pub id: i64,
    /// The reservation's token.
    pub token: String,
    /// None for the creation of the row.
    pub from: Option<OrderStatus>,
    /// The status after the transition.
    pub to: OrderStatus,
    /// Who made it (for example `checkout` or `sweeper`).
    pub actor: String,
    /// Free-form context, if any (a payment reference, a reason).
    pub detail: Option<String>,
    /// When the transition happened, in ms since the Unix epoch.
    pub at_ms: i64,
}

/// What [`Ledger::materialize`] did with a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Materialized {
    /// A new PENDING order was written.
    Created,
    /// Retry of a materialize that already happened.
    AlreadyPending,
    /// Retry after the order was paid.
    AlreadyCommitted,
}

/// The ledger's answer to a payment (`pay_order`, docs/ledger.md "The ledger's functions").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PayVerdict {
    /// PENDING within its deadline → COMMITTED: send `COMMIT` to the server.
    Committed,
    /// Paid before (the token is the payment idempotency key): check the server's hold is
    /// this order's ([`Ledger::is_hold`]) before sending `COMMIT`.
    AlreadyCommitted,
    /// Late, cancelled or being refunded, and no money moved: do not capture. Nothing
    /// changed.
    Refused,
    /// Late, cancelled or being refunded, and money moved: the order is REFUND_REQUIRED.
    RefundRequired,
    /// No order for the token: nothing to attach a refund to.
    NotFound,
    /// The order is a part of a split sale, and paying it would take the buyer's paid
    /// units of the whole parent over its per-user limit (migration 0010); no money
    /// moved, nothing changed. With money moved the verdict is [`PayVerdict::RefundRequired`].
    Limit,
}

impl PayVerdict {
    /// The outcome string `pay_order` returns.
    pub fn as_str(self) -> &'static str {
        match self {
            PayVerdict::Committed => "COMMITTED",
            PayVerdict::AlreadyCommitted => "ALREADY_COMMITTED",
            PayVerdict::Refused => "REFUSED",
            PayVerdict::RefundRequired => "REFUND_REQUIRED",
            PayVerdict::NotFound => "NOT_FOUND",
            PayVerdict::Limit => "LIMIT",
        }
    }

    /// Parses the outcome string; `None` for any other word.
    pub fn parse(s: &str) -> Option<Self> {
        [
            PayVerdict::Committed,
            PayVerdict::AlreadyCommitted,
            PayVerdict::Refused,
            PayVerdict::RefundRequired,
            PayVerdict::NotFound,
            PayVerdict::Limit,
        ]
        .into_iter()
        .find(|v| v.as_str() == s)
    }
}

/// What [`Ledger::pay`] decided, and the status the order had before (None: no order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LedgerPay {
    /// What the payment may do.
    pub verdict: PayVerdict,
    /// The order's status before the call (`None`: no order).
    pub previous: Option<OrderStatus>,
}

/// What [`Ledger::commit`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LedgerCommit {
    /// PENDING → COMMITTED by this call.
    Committed,
    /// Same reservation token = same payment (the token is the payment idempotency key).
    AlreadyCommitted,
}

/// Why the sweeper may give a reservation's units back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseReason {
    /// This pass moved PENDING → CANCELLED_BY_SWEEPER.
    CancelledNow,
    /// Found CANCELLED_BY_SWEEPER: an earlier sweep died between SQL and the release.
    AlreadyCancelledBySweeper,
    /// Found CANCELLED: the checkout app died between SQL and its RELEASE.
    CancelledByBuyer,
    /// Found REFUND_REQUIRED / REFUNDED: the units were never sold.
    Refund,
    /// No order at all: a tombstone was written first so a late materialize is refused.
    Tombstoned,
}

/// The ledger's verdict on one expired reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SweepVerdict {
    /// Give the units back with `RELEASE`, for this reason.
    Release(ReleaseReason),
    /// COMMITTED in the ledger: `COMMIT` on the server (cleanup, no stock back).
    CommitCleanup,
    /// Still PENDING and not expired by the ledger's clock (extended, clock skew, or a
    /// concurrent transition holds the row): leave it for a later pass.
    Skip,
}

/// Per-SKU sums over orders.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SkuTotals {
    /// Orders PENDING.
    pub pending_orders: u64,
    /// Units of PENDING orders.
    pub pending_units: u64,
    /// Orders COMMITTED.
    pub committed_orders: u64,
    /// Units of COMMITTED orders.
    pub committed_units: u64,
    /// Orders CANCELLED by the buyer.
    pub cancelled_orders: u64,
    /// Orders CANCELLED_BY_SWEEPER (expired, or tombstones).
    pub cancelled_by_sweeper_orders: u64,
    /// Orders REFUND_REQUIRED.
    pub refund_required_orders: u64,
    /// Orders REFUNDED.
    pub refunded_orders: u64,
}

/// Why a ledger call failed: a refused transition (the order's state forbids it) or a storage
/// failure.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The order's status forbids the transition.
    #[error("order {token} is {status}: refused")]
    Refused {
        /// The order's token.
        token: String,
        /// Its status.
        status: OrderStatus,
    },
    /// The payment came after the reservation's deadline.
    #[error("order {token}: its reservation expired, payment refused")]
    Expired {
        /// The order's token.
        token: String,
    },
    /// No order for this token.
    #[error("no order for reservation {0}")]
    NotFound(String),
    /// The same id or token arrived with other details, or a move the state machine does not allow.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The ledger has no sale with this key.
    #[error("sale {0} unknown to the ledger")]
    UnknownSale(String),
    /// An argument the ledger refuses (for example an adjustment of 0 units).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A Postgres call failed.
    #[error("database error: {0}")]
    Db(sqlx::Error),
    /// Postgres refused the connection's credentials (SQLSTATE class 28). `detail` is
    /// the server's message, which names the user, never the password.
    #[error(
        "the database refused the login: {detail}; check the user and password of \
         --database-url (DATABASE_URL)"
    )]
    LoginRefused {
        /// Postgres's message.
        detail: String,
    },
    /// Creating or upgrading the ledger's tables failed.
    #[error("applying the ledger schema failed: {0}")]
    Migrate(sqlx::migrate::MigrateError),
    /// The sled store failed.
    #[error("embedded store error: {0}")]
    Sled(#[from] sled::Error),
    /// Stored data the ledger cannot decode.
    #[error("corrupt ledger data: {0}")]
    Corrupt(String),
    /// The ledger's Postgres schema could not be checked, created or moved into.
    #[error(transparent)]
    Schema(#[from] pg_schema::SchemaError),
}

/// SQLSTATE class 28: invalid authorization (28000) and invalid password (28P01).
fn login_refused(e: &sqlx::Error) -> Option<LedgerError> {
    match e {
        sqlx::Error::Database(d) if d.code().is_some_and(|c| c.starts_with("28")) => {
            Some(LedgerError::LoginRefused {
                detail: d.message().to_string(),
            })
        }
        _ => None,
    }
}

impl From<sqlx::Error> for LedgerError {
    fn from(e: sqlx::Error) -> Self {
        login_refused(&e).unwrap_or(LedgerError::Db(e))
    }
}

impl From<sqlx::migrate::MigrateError> for LedgerError {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        match &e {
            sqlx::migrate::MigrateError::Execute(inner) => {
                login_refused(inner).unwrap_or(LedgerError::Migrate(e))
            }
            _ => LedgerError::Migrate(e),
        }
    }
}

impl LedgerError {
    /// The store is unreachable or overloaded: retry later, do nothing meanwhile.
    pub fn is_transient(&self) -> bool {
        match self {
            LedgerError::Schema(s) => s.db_error().is_some_and(db_transient),
            LedgerError::Db(e) => db_transient(e),
            LedgerError::Sled(_) => true,
            _ => false,
        }
    }
}

/// A database error that says "unreachable or overloaded", not "wrong".
fn db_transient(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
    ) || matches!(e, sqlx::Error::Database(d) if d.code().is_some_and(|c| {
        // 40001 serialization failure, 40P01 deadlock, 57P0x shutdown/cannot connect,
        // 08xxx connection exceptions, 53xxx insufficient resources.
        c == "40001" || c == "40P01" || c.starts_with("57P") || c.starts_with("08") || c.starts_with("53")
    }))
}

/// The ledger interface. Methods are `Send` futures so one implementation can serve a
/// multi-threaded runtime; implementations are cheap to clone (pools, sled handles).
pub trait Ledger: Clone + Send + Sync + 'static {
    /// Record a sale (idempotent). Re-registering with another allocation is a conflict;
    /// a missing key fingerprint is filled in.
    fn register_sale(
        &self,
        sale: &SaleRecord,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send;

    /// The sale with this key, if the ledger has it.
    fn sale(
        &self,
        sku: &str,
    ) -> impl Future<Output = Result<Option<SaleRecord>, LedgerError>> + Send;

    /// Every sale the ledger knows.
    fn sales(&self) -> impl Future<Output = Result<Vec<SaleRecord>, LedgerError>> + Send;

    /// Record allocation adjustment `id` (ledger first: before `SALE.ADJUST`). The first
    /// call moves the allocation by `delta` in the same transaction; a retry with the same
    /// id, sku and delta returns the stored adjustment unchanged (whatever its status), so
    /// an adjustment is counted once however often it is retried. The same id with another
    /// sku or delta is a [`LedgerError::Conflict`]; an allocation that would go negative
    /// too. `delta` must not be 0.
    fn record_adjustment(
        &self,
        sku: &str,
        id: &str,
        delta: i64,
    ) -> impl Future<Output = Result<Adjustment, LedgerError>> + Send;

    /// RECORDED → APPLIED (idempotent), or RECORDED → REFUSED with the allocation moved
    /// back (idempotent). Any other move is a [`LedgerError::Conflict`].
    fn finish_adjustment(
        &self,
        id: &str,
        outcome: &AdjustmentOutcome,
    ) -> impl Future<Output = Result<Adjustment, LedgerError>> + Send;

    /// The adjustment with this id, if recorded.
    fn adjustment(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Option<Adjustment>, LedgerError>> + Send;

    /// Adjustments of a sale, oldest first; only the RECORDED (unconfirmed) ones if
    /// `only_recorded`.
    fn adjustments(
        &self,
        sku: &str,
        only_recorded: bool,
    ) -> impl Future<Output = Result<Vec<Adjustment>, LedgerError>> + Send;

    /// Insert the PENDING order for a reservation. Idempotent; refused
    /// ([`LedgerError::Refused`]) if the token was already cancelled (e.g. a sweeper
    /// tombstone), and a conflict if the same token arrives with other details.
    fn materialize(
        &self,
        order: &NewOrder,
    ) -> impl Future<Output = Result<Materialized, LedgerError>> + Send;

    /// Move the reservation deadline (mirror of `EXTEND`); only while PENDING.
    fn extend(
        &self,
        token: &str,
        expires_at_ms: i64,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send;

    /// The ledger step of a payment, with the expiry guard and the refund branch in one
    /// place (`pay_order`): PENDING within its deadline (`expires >= now`, the exact
    /// complement of the sweeper's `< now`) → COMMITTED with `payment_ref`; COMMITTED
    /// → already committed; otherwise (late, cancelled, being refunded) refused, and if
    /// `money_moved` the order becomes REFUND_REQUIRED. Only an order already REFUNDED
    /// that gets another payment (another non-empty `payment_ref`) is an error,
    /// [`LedgerError::Refused`]: its refund cannot be reopened.
    fn pay(
        &self,
        token: &str,
        payment_ref: &str,
        money_moved: bool,
    ) -> impl Future<Output = Result<LedgerPay, LedgerError>> + Send;

    /// [`Ledger::pay`] for a payment where no money moved yet, as a commit: refused
    /// payments are errors, [`LedgerError::Expired`] (still PENDING but past its
    /// deadline), [`LedgerError::Refused`] or [`LedgerError::NotFound`].
    fn commit(
        &self,
        token: &str,
        payment_ref: &str,
    ) -> impl Future<Output = Result<LedgerCommit, LedgerError>> + Send {
        async move {
            let p = self.pay(token, payment_ref, false).await?;
            commit_from_pay(token, p)
        }
    }

    /// Whether the server's reservation `r` for `token` is the hold this order was
    /// materialized from, the one its payment paid for ([`Order::same_hold`];
    /// `order_is_hold`). False when there is no order.
    fn is_hold(
        &self,
        token: &str,
        r: &ReservationInfo,
    ) -> impl Future<Output = Result<bool, LedgerError>> + Send;

    /// Buyer abandons: PENDING → CANCELLED (Ok also if already CANCELLED).
    fn cancel(&self, token: &str) -> impl Future<Output = Result<(), LedgerError>> + Send;

    /// Compensation: money moved for a reservation that was not (or is no longer) ours to
    /// sell. Allowed from CANCELLED, CANCELLED_BY_SWEEPER, COMMITTED (server lost or
    /// released the units) and from an expired PENDING. Returns the previous status
    /// (REFUND_REQUIRED again is a no-op and returns REFUND_REQUIRED).
    ///
    /// `payment_ref`: the payment to refund, when the caller knows it. `None` (or an empty
    /// string) keeps the stored reference: the refund needs it, and callers such as the
    /// sweeper only know the reservation token.
    fn mark_refund_required(
        &self,
        token: &str,
        payment_ref: Option<&str>,
        reason: &str,
    ) -> impl Future<Output = Result<OrderStatus, LedgerError>> + Send;

    /// REFUND_REQUIRED → REFUNDED.
    fn mark_refunded(&self, token: &str) -> impl Future<Output = Result<(), LedgerError>> + Send;

    /// The sweeper's SQL-first rule for a batch of expired reservations (docs/design.md,
    /// lifecycle step 4). Verdicts are in input order. Everything the verdicts rely on is
    /// durable when this returns.
    fn reconcile_expired(
        &self,
        batch: &[ExpiredReservation],
    ) -> impl Future<Output = Result<Vec<SweepVerdict>, LedgerError>> + Send;

    /// The order for this token, if any.
    fn order(&self, token: &str)
        -> impl Future<Output = Result<Option<Order>, LedgerError>> + Send;

    /// Audit rows of one order, oldest first.
    fn events(
        &self,
        token: &str,
    ) -> impl Future<Output = Result<Vec<OrderEvent>, LedgerError>> + Send;

    /// Orders of a SKU, optionally only those with `status`.
    fn orders(
        &self,
        sku: &str,
        status: Option<OrderStatus>,
    ) -> impl Future<Output = Result<Vec<Order>, LedgerError>> + Send;

    /// Sums over a sale's orders by status.
    fn totals(&self, sku: &str) -> impl Future<Output = Result<SkuTotals, LedgerError>> + Send;

    /// PENDING orders of a SKU whose reservation has not expired by the ledger's clock
    /// (the same clock and the same `expires >= now` rule as [`Ledger::commit`]): holds a
    /// payment may still commit, so the server must know every one of them.
    fn live_pending_orders(
        &self,
        sku: &str,
    ) -> impl Future<Output = Result<Vec<Order>, LedgerError>> + Send;

    /// The server histories this ledger describes (`crate::identity`), oldest binding
    /// first; empty until a tool first bound it. One per group of a cluster.
    fn bound_histories(&self) -> impl Future<Output = Result<Vec<Binding>, LedgerError>> + Send;

    /// The first history this ledger was bound to, if any (the only one, for a ledger of
    /// one group).
    fn bound_history(&self) -> impl Future<Output = Result<Option<String>, LedgerError>> + Send {
        async move {
            Ok(self
                .bound_histories()
                .await?
                .into_iter()
                .next()
                .map(|b| b.history_id))
        }
    }

    /// Binds the ledger to history `id` if its bindings are exactly `expected` (`None`:
    /// no binding yet; `Some(old)`: `old` alone, which `id` replaces, taking along the
    /// sales and feed positions recorded on `old`), and returns the first binding in
    /// place afterwards: two tools binding at once agree on one.
    fn bind_history(
        &self,
        expected: Option<&str>,
        id: &str,
    ) -> impl Future<Output = Result<Option<String>, LedgerError>> + Send;

    /// Adds history `id` (another group) to the bindings; `group` is the operator's name
    /// for it. Sales with no recorded history are first recorded on the binding in place
    /// when there is exactly one (they were all registered against it). Returns false if
    /// `id` was bound already.
    fn add_binding(
        &self,
        id: &str,
        group: Option<&str>,
    ) -> impl Future<Output = Result<bool, LedgerError>> + Send;

    /// Removes history `id` from the bindings; false if it was not bound.
    fn remove_binding(&self, id: &str) -> impl Future<Output = Result<bool, LedgerError>> + Send;

    /// Every sale with the history it lives on (`None`: not recorded, a sale registered
    /// before sales carried it).
    fn sale_histories(
        &self,
    ) -> impl Future<Output = Result<Vec<(String, Option<String>)>, LedgerError>> + Send;

    /// Records that `sku` lives on history `history`, unless a history is recorded for it
    /// already. Returns the history recorded afterwards, `None` for a sale the ledger
    /// does not know.
    fn record_sale_history(
        &self,
        sku: &str,
        history: &str,
    ) -> impl Future<Output = Result<Option<String>, LedgerError>> + Send;

    /// Records that `sku` lives on history `to` now that its slot moved there from `from`
    /// (`stockgate-sweeper move-slots --follow-ledger`): only when it is recorded on
    /// `from`, on `to` already, or on none, so a sale of a third group is never taken.
    /// Returns the history recorded afterwards, `None` for a sale the ledger does not know.
    fn move_sale_history(
        &self,
        sku: &str,
        from: &str,
        to: &str,
    ) -> impl Future<Output = Result<Option<String>, LedgerError>> + Send;
}

/// One server history a ledger is bound to (`server_bindings`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    /// The history id (`INFO server`'s `stockgate_history`).
    pub history_id: String,
    /// The operator's name for the group, if one was given (`bind --group`).
    pub group: Option<String>,
}

/// Decision for a `record_adjustment` that found the id already stored (shared by both
/// backends).
pub(crate) fn adjustment_retry(
    existing: &Adjustment,
    sku: &str,
    delta: i64,
) -> Result<Adjustment, LedgerError> {
    if existing.sku != sku || existing.delta != delta {
        return Err(LedgerError::Conflict(format!(
            "adjustment {} exists for {} with delta {}",
            existing.id, existing.sku, existing.delta
        )));
    }
    Ok(existing.clone())
}

/// The status `finish_adjustment` moves to, or None if it is already there (shared by
/// both backends).
pub(crate) fn adjustment_next(
    existing: &Adjustment,
    outcome: &AdjustmentOutcome,
) -> Result<Option<AdjustmentStatus>, LedgerError> {
    let to = match outcome {
        AdjustmentOutcome::Applied { .. } => AdjustmentStatus::Applied,
        AdjustmentOutcome::Refused { .. } => AdjustmentStatus::Refused,
    };
    match (existing.status, to) {
        (from, to) if from == to => Ok(None),
        (AdjustmentStatus::Recorded, to) => Ok(Some(to)),
        (from, to) => Err(LedgerError::Conflict(format!(
            "adjustment {} is {}, cannot become {}",
            existing.id,
            from.as_str(),
            to.as_str()
        ))),
    }
}

/// Validate an adjustment request before touching a store.
pub(crate) fn check_adjustment(id: &str, delta: i64) -> Result<(), LedgerError> {
    if id.is_empty() || id.len() > 128 || id.chars().any(|c| c.is_control()) {
        return Err(LedgerError::Invalid(
            "adjustment id must be 1 to 128 printable characters".into(),
        ));
    }
    if delta == 0 {
        return Err(LedgerError::Invalid(
            "adjustment delta must not be 0".into(),
        ));
    }
    Ok(())
}

/// Decision for a materialize that found an existing row (shared by both backends).
pub(crate) fn materialize_existing(
    existing: &Order,
    new: &NewOrder,
) -> Result<Materialized, LedgerError> {
    if existing.sku != new.sku || existing.user != new.user || existing.qty != new.qty {
        // A tombstone carries sku/user/qty from EXPIRED: the status check below matters
        // more than a detail mismatch, but the same token with other details is a bug.
        if !existing.status.is_cancelled() {
            return Err(LedgerError::Conflict(format!(
                "order {} exists with other details",
                new.token
            )));
        }
    }
    match existing.status {
        OrderStatus::Pending => Ok(Materialized::AlreadyPending),
        OrderStatus::Committed => Ok(Materialized::AlreadyCommitted),
        status => Err(LedgerError::Refused {
            token: new.token.clone(),
            status,
        }),
    }
}

/// A payment's verdict as the result of a commit (no money moved).
fn commit_from_pay(token: &str, p: LedgerPay) -> Result<LedgerCommit, LedgerError> {
    match (p.verdict, p.previous) {
        (PayVerdict::Committed, _) => Ok(LedgerCommit::Committed),
        (PayVerdict::AlreadyCommitted, _) => Ok(LedgerCommit::AlreadyCommitted),
        (PayVerdict::NotFound, _) | (_, None) => Err(LedgerError::NotFound(token.to_string())),
        (_, Some(OrderStatus::Pending)) => Err(LedgerError::Expired {
            token: token.to_string(),
        }),
        (_, Some(status)) => Err(LedgerError::Refused {
            token: token.to_string(),
            status,
        }),
    }
}

/// The embedded ledger's copy of `pay_order`'s decision (the SQL function is the
/// Postgres ledger's): from the order's status, whether its deadline is still ahead
/// (`expires >= now`), and the payment. Returns the status to move to (None: no change)
/// and the answer.
pub(crate) fn pay_decision(
    token: &str,
    order: Option<(OrderStatus, bool, Option<&str>)>,
    payment_ref: &str,
    money_moved: bool,
) -> Result<(Option<OrderStatus>, LedgerPay), LedgerError> {
    let Some((status, live, stored_ref)) = order else {
        return Ok((
            None,
            LedgerPay {
                verdict: PayVerdict::NotFound,
                previous: None,
            },
        ));
    };
    let answer = |verdict| LedgerPay {
        verdict,
        previous: Some(status),
    };
    Ok(match status {
        OrderStatus::Pending if live => {
            (Some(OrderStatus::Committed), answer(PayVerdict::Committed))
        }
        OrderStatus::Committed => (None, answer(PayVerdict::AlreadyCommitted)),
        _ if !money_moved => (None, answer(PayVerdict::Refused)),
        OrderStatus::Refunded => {
            // The refund is done and cannot be reopened; the same payment again is a
            // retry, another one needs a refund of its own.
            if !payment_ref.is_empty() && Some(payment_ref) != stored_ref {
                return Err(LedgerError::Refused {
                    token: token.to_string(),
                    status,
                });
            }
            (None, answer(PayVerdict::RefundRequired))
        }
        OrderStatus::RefundRequired => (None, answer(PayVerdict::RefundRequired)),
        _ => (
            Some(OrderStatus::RefundRequired),
            answer(PayVerdict::RefundRequired),
        ),
    })
}

/// The sweeper's verdict from an order's current status, once the conditional
/// cancellation did not apply (shared by both backends).
pub(crate) fn verdict_from_status(status: OrderStatus) -> SweepVerdict {
    match status {
        OrderStatus::CancelledBySweeper => {
            SweepVerdict::Release(ReleaseReason::AlreadyCancelledBySweeper)
        }
        OrderStatus::Cancelled => SweepVerdict::Release(ReleaseReason::CancelledByBuyer),
        OrderStatus::RefundRequired | OrderStatus::Refunded => {
            SweepVerdict::Release(ReleaseReason::Refund)
        }
        OrderStatus::Committed => SweepVerdict::CommitCleanup,
        OrderStatus::Pending => SweepVerdict::Skip,
    }
}

/// Whether a refund may be recorded from `status` (`expired` = PENDING past deadline).
pub(crate) fn refund_allowed(status: OrderStatus, expired: bool) -> bool {
    match status {
        OrderStatus::Pending => expired,
        OrderStatus::RefundRequired => true,
        s => s.can_become(OrderStatus::RefundRequired),
    }
}
