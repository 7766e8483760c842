//! Embedded ledger on sled, for a checkout service that embeds the engine and runs no
//! database. Same state machine as the Postgres ledger; serializable sled transactions
//! over the `orders` and `events` trees make each transition and its audit row atomic,
//! and decide races (exactly one of a commit and a cancellation wins).
//!
//! Expiry is judged by an injected clock (the engine's clock in an embedded deployment),
//! the way the Postgres ledger uses `now()`.

use std::sync::Arc;

use sled::transaction::{
    ConflictableTransactionError, TransactionError, Transactional, TransactionalTree,
};

use super::{
    adjustment_next, adjustment_retry, check_adjustment, materialize_existing, pay_decision,
    refund_allowed, verdict_from_status, Adjustment, AdjustmentOutcome, AdjustmentStatus, Binding,
    Ledger, LedgerError, LedgerPay, Materialized, NewOrder, Order, OrderEvent, OrderStatus,
    ReleaseReason, SaleRecord, SkuTotals, SweepVerdict,
};
use crate::types::{now_ms, ExpiredReservation, ReservationInfo};

/// Milliseconds since the Unix epoch.
pub type LedgerClock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// The key of the server binding in the `meta` tree.
const BINDING_KEY: &[u8] = b"server_history";

/// The order ledger on sled, for a service that embeds the engine; cloning shares the database.
#[derive(Clone)]
pub struct SledLedger {
    db: sled::Db,
    sales: sled::Tree,
    /// Key: adjustment id → JSON [`Adjustment`].
    adjustments: sled::Tree,
    orders: sled::Tree,
    /// Key: token, 0x00, event id (big-endian) → JSON event. Ordered per token.
    events: sled::Tree,
    /// Ledger-wide settings: the server binding (`BINDING_KEY`).
    meta: sled::Tree,
    clock: LedgerClock,
    /// Flush to disk after every transition (before the caller acts on the server).
    durable: bool,
    /// sled 0.34 can deadlock when a flush runs concurrently with transactions (seen
    /// here: a flusher holding the concurrency-control read lock waits for a log position
    /// that a transaction blocked on the write lock would produce). Transactions share
    /// this lock; a flush takes it exclusively. sled's own background flusher is off for
    /// the same reason: we flush explicitly.
    flush_gate: Arc<std::sync::RwLock<()>>,
}

impl std::fmt::Debug for SledLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledLedger")
            .field("durable", &self.durable)
            .finish()
    }
}

type TxResult<T> = Result<T, ConflictableTransactionError<LedgerError>>;

fn abort<T>(e: LedgerError) -> TxResult<T> {
    Err(ConflictableTransactionError::Abort(e))
}

fn corrupt(e: serde_json::Error) -> LedgerError {
    LedgerError::Corrupt(e.to_string())
}

fn from_tx(e: TransactionError<LedgerError>) -> LedgerError {
    match e {
        TransactionError::Abort(e) => e,
        TransactionError::Storage(e) => LedgerError::Sled(e),
    }
}

/// A sale as stored. Ledgers written before allocations were tracked have no
/// `allocation`: their `initial_allocation` already included every mirrored adjustment
/// (that was the old meaning), so it is the current allocation.
#[derive(serde::Deserialize)]
struct StoredSale {
    sku: String,
    initial_allocation: u64,
    #[serde(default)]
    allocation: Option<u64>,
    shards: Option<u16>,
    ttl_ms: Option<u64>,
    per_user_limit: Option<u32>,
    key_fingerprint: Option<String>,
}

fn decode_sale(bytes: &[u8]) -> Result<SaleRecord, LedgerError> {
    let s: StoredSale = serde_json::from_slice(bytes).map_err(corrupt)?;
    Ok(SaleRecord {
        sku: s.sku,
        initial_allocation: s.initial_allocation,
        allocation: s.allocation.unwrap_or(s.initial_allocation),
        shards: s.shards,
        ttl_ms: s.ttl_ms,
        per_user_limit: s.per_user_limit,
        key_fingerprint: s.key_fingerprint,
    })
}

fn decode_adjustment(bytes: &[u8]) -> Result<Adjustment, LedgerError> {
    serde_json::from_slice(bytes).map_err(corrupt)
}

fn decode_order(bytes: &[u8]) -> Result<Order, LedgerError> {
    serde_json::from_slice(bytes).map_err(corrupt)
}

fn encode<T: serde::Serialize>(v: &T) -> Result<Vec<u8>, LedgerError> {
    serde_json::to_vec(v).map_err(corrupt)
}

fn event_key(token: &str, id: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(token.len() + 9);
    k.extend_from_slice(token.as_bytes());
    k.push(0);
    k.extend_from_slice(&id.to_be_bytes());
    k
}

/// Inside a transaction: read an order.
fn tx_get(orders: &TransactionalTree, token: &str) -> TxResult<Option<Order>> {
    match orders.get(token.as_bytes())? {
        None => Ok(None),
        Some(b) => match decode_order(&b) {
            Ok(o) => Ok(Some(o)),
            Err(e) => abort(e),
        },
    }
}

/// Inside a transaction: write an order and append its audit event.
fn tx_put(
    orders: &TransactionalTree,
    events: &TransactionalTree,
    order: &Order,
    from: Option<OrderStatus>,
    actor: &str,
    detail: Option<&str>,
) -> TxResult<()> {
    let bytes = match encode(order) {
        Ok(b) => b,
        Err(e) => return abort(e),
    };
    orders.insert(order.token.as_bytes(), bytes)?;
    let id = events.generate_id()?;
    let ev = OrderEvent {
        id: i64::try_from(id).unwrap_or(i64::MAX),
        token: order.token.clone(),
        from,
        to: order.status,
        actor: actor.to_string(),
        detail: detail.map(str::to_string),
        at_ms: order.updated_at_ms,
    };
    let ev_bytes = match encode(&ev) {
        Ok(b) => b,
        Err(e) => return abort(e),
    };
    events.insert(event_key(&order.token, id), ev_bytes)?;
    Ok(())
}

impl SledLedger {
    /// Open (or create) a ledger at `path`, with the system clock, flushing after each
    /// transition.
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<Self, LedgerError> {
        let db = sled::Config::new().path(path).flush_every_ms(None).open()?;
        Self::from_db(db, Arc::new(now_ms), true)
    }

    /// A throwaway in-memory ledger (tests, demos).
    pub fn temporary() -> Result<Self, LedgerError> {
        let db = sled::Config::new()
            .temporary(true)
            .flush_every_ms(None)
            .open()?;
        Self::from_db(db, Arc::new(now_ms), false)
    }

    /// A ledger over an opened sled database. `clock` judges expiry (ms since the Unix epoch);
    /// `durable` flushes to disk after each transition, which an in-memory database does not need.
    pub fn from_db(db: sled::Db, clock: LedgerClock, durable: bool) -> Result<Self, LedgerError> {
        Ok(SledLedger {
            sales: db.open_tree("sales")?,
            adjustments: db.open_tree("adjustments")?,
            orders: db.open_tree("orders")?,
            events: db.open_tree("events")?,
            meta: db.open_tree("meta")?,
            db,
            clock,
            durable,
            flush_gate: Arc::new(std::sync::RwLock::new(())),
        })
    }

    /// Use another clock (e.g. the embedded engine's).
    pub fn with_clock(mut self, clock: LedgerClock) -> Self {
        self.clock = clock;
        self
    }

    /// Whether to flush to disk after each transition.
    pub fn with_durability(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    async fn flush(&self) -> Result<(), LedgerError> {
        if self.durable {
            self.sync().await?;
        }
        Ok(())
    }

    /// Flush everything written so far to disk. Runs on the blocking pool (fsync).
    pub async fn sync(&self) -> Result<(), LedgerError> {
        let gate = self.flush_gate.clone();
        let db = self.db.clone();
        let res = tokio::task::spawn_blocking(move || {
            let _excl = gate.write().unwrap_or_else(|p| p.into_inner());
            db.flush()
        })
        .await
        .map_err(|e| LedgerError::Corrupt(format!("flush task failed: {e}")))?;
        res?;
        Ok(())
    }

    /// Exclusive side of `flush_gate`, held while a transaction runs. Exclusive, not
    /// shared: concurrent sled 0.34 transactions deadlocked against its own IO threads
    /// here (three transactions waiting in `ConcurrencyControl::write` while the IO
    /// threads waited in `ConcurrencyControl::read`, seen with gdb in the commit-vs-cancel
    /// race). One transaction at a time costs little: each is a few microseconds.
    fn tx_guard(&self) -> std::sync::RwLockWriteGuard<'_, ()> {
        // A poisoned lock only means another thread panicked mid-transaction; sled rolled
        // that transaction back, so the guard is still good.
        self.flush_gate.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Run a read-decide-write transition on one order.
    /// `decide(current, now)` returns the new order (None = no change) and the result.
    fn transition<T>(
        &self,
        token: &str,
        actor: &str,
        detail: Option<&str>,
        decide: impl Fn(Option<&Order>, i64) -> Result<(Option<Order>, T), LedgerError>,
    ) -> Result<T, LedgerError> {
        let now = (self.clock)();
        let _g = self.tx_guard();
        (&self.orders, &self.events)
            .transaction(|(orders, events)| {
                let cur = tx_get(orders, token)?;
                let (next, out) = match decide(cur.as_ref(), now) {
                    Ok(x) => x,
                    Err(e) => return abort(e),
                };
                if let Some(next) = next {
                    tx_put(
                        orders,
                        events,
                        &next,
                        cur.as_ref().map(|c| c.status),
                        actor,
                        detail,
                    )?;
                }
                Ok(out)
            })
            .map_err(from_tx)
    }

    fn moved(cur: &Order, to: OrderStatus, now: i64) -> Order {
        let mut o = cur.clone();
        o.status = to;
        o.updated_at_ms = now;
        o
    }
}

impl Ledger for SledLedger {
    async fn register_sale(&self, sale: &SaleRecord) -> Result<(), LedgerError> {
        let sku = sale.sku.clone();
        let res = {
            let _g = self.tx_guard();
            self.sales.transaction(|t| {
                let stored = match t.get(sku.as_bytes())? {
                    Some(b) => match decode_sale(&b) {
                        Ok(s) => Some(s),
                        Err(e) => return abort(e),
                    },
                    None => None,
                };
                let next = match stored {
                    // A new sale has had no adjustments yet.
                    None => SaleRecord {
                        allocation: sale.initial_allocation,
                        ..sale.clone()
                    },
                    Some(mut s) => {
                        if s.initial_allocation != sale.initial_allocation {
                            return abort(LedgerError::Conflict(format!(
                                "sale {} exists with allocation {}",
                                s.sku, s.initial_allocation
                            )));
                        }
                        match (&s.key_fingerprint, &sale.key_fingerprint) {
                            (Some(a), Some(b)) if a != b => {
                                return abort(LedgerError::Conflict(format!(
                                    "sale {} is bound to reservation key {a}, not {b}",
                                    s.sku
                                )))
                            }
                            (None, Some(b)) => s.key_fingerprint = Some(b.clone()),
                            _ => {}
                        }
                        s
                    }
                };
                match encode(&next) {
                    Ok(b) => t.insert(sku.as_bytes(), b)?,
                    Err(e) => return abort(e),
                };
                Ok(())
            })
        }
        .map_err(from_tx);
        res?;
        self.flush().await
    }

    async fn sale(&self, sku: &str) -> Result<Option<SaleRecord>, LedgerError> {
        match self.sales.get(sku.as_bytes())? {
            None => Ok(None),
            Some(b) => decode_sale(&b).map(Some),
        }
    }

    async fn sales(&self) -> Result<Vec<SaleRecord>, LedgerError> {
        self.sales
            .iter()
            .map(|kv| {
                let (_, v) = kv?;
                decode_sale(&v)
            })
            .collect()
    }

    async fn record_adjustment(
        &self,
        sku: &str,
        id: &str,
        delta: i64,
    ) -> Result<Adjustment, LedgerError> {
        check_adjustment(id, delta)?;
        let now = (self.clock)();
        let g = self.tx_guard();
        // The sale and the adjustment in one transaction: the allocation moves only when
        // the id is new, so a retry cannot move it twice.
        let out = (&self.sales, &self.adjustments)
            .transaction(|(sales, adjs)| {
                if let Some(b) = adjs.get(id.as_bytes())? {
                    return match decode_adjustment(&b)
                        .and_then(|a| adjustment_retry(&a, sku, delta))
                    {
                        Ok(a) => Ok(a),
                        Err(e) => abort(e),
                    };
                }
                let Some(b) = sales.get(sku.as_bytes())? else {
                    return abort(LedgerError::UnknownSale(sku.to_string()));
                };
                let mut sale = match decode_sale(&b) {
                    Ok(s) => s,
                    Err(e) => return abort(e),
                };
                let Some(next) = sale.allocation.checked_add_signed(delta) else {
                    return abort(LedgerError::Conflict(format!(
                        "allocation of {sku} would go negative"
                    )));
                };
                sale.allocation = next;
                let adj = Adjustment {
                    id: id.to_string(),
                    sku: sku.to_string(),
                    delta,
                    allocation_after: next,
                    status: AdjustmentStatus::Recorded,
                    server_total: None,
                    detail: None,
                    created_at_ms: now,
                    updated_at_ms: now,
                };
                match (encode(&sale), encode(&adj)) {
                    (Ok(sb), Ok(ab)) => {
                        sales.insert(sku.as_bytes(), sb)?;
                        adjs.insert(id.as_bytes(), ab)?;
                    }
                    (Err(e), _) | (_, Err(e)) => return abort(e),
                }
                Ok(adj)
            })
            .map_err(from_tx)?;
        drop(g);
        self.flush().await?;
        Ok(out)
    }

    async fn finish_adjustment(
        &self,
        id: &str,
        outcome: &AdjustmentOutcome,
    ) -> Result<Adjustment, LedgerError> {
        let now = (self.clock)();
        let g = self.tx_guard();
        let out = (&self.sales, &self.adjustments)
            .transaction(|(sales, adjs)| {
                let Some(b) = adjs.get(id.as_bytes())? else {
                    return abort(LedgerError::NotFound(format!("adjustment {id}")));
                };
                let mut adj = match decode_adjustment(&b) {
                    Ok(a) => a,
                    Err(e) => return abort(e),
                };
                let to = match adjustment_next(&adj, outcome) {
                    Ok(Some(to)) => to,
                    Ok(None) => return Ok(adj),
                    Err(e) => return abort(e),
                };
                if to == AdjustmentStatus::Refused {
                    // The server never had it: the allocation goes back.
                    let Some(sb) = sales.get(adj.sku.as_bytes())? else {
                        return abort(LedgerError::UnknownSale(adj.sku.clone()));
                    };
                    let mut sale = match decode_sale(&sb) {
                        Ok(s) => s,
                        Err(e) => return abort(e),
                    };
                    let Some(back) = adj
                        .delta
                        .checked_neg()
                        .and_then(|d| sale.allocation.checked_add_signed(d))
                    else {
                        return abort(LedgerError::Conflict(format!(
                            "reverting {id} would make the allocation negative"
                        )));
                    };
                    sale.allocation = back;
                    match encode(&sale) {
                        Ok(sb) => sales.insert(adj.sku.as_bytes(), sb)?,
                        Err(e) => return abort(e),
                    };
                }
                adj.status = to;
                adj.updated_at_ms = now;
                match outcome {
                    AdjustmentOutcome::Applied { server_total } => adj.server_total = *server_total,
                    AdjustmentOutcome::Refused { reason } => adj.detail = Some(reason.clone()),
                }
                match encode(&adj) {
                    Ok(ab) => adjs.insert(id.as_bytes(), ab)?,
                    Err(e) => return abort(e),
                };
                Ok(adj)
            })
            .map_err(from_tx)?;
        drop(g);
        self.flush().await?;
        Ok(out)
    }

    async fn adjustment(&self, id: &str) -> Result<Option<Adjustment>, LedgerError> {
        match self.adjustments.get(id.as_bytes())? {
            None => Ok(None),
            Some(b) => decode_adjustment(&b).map(Some),
        }
    }

    async fn adjustments(
        &self,
        sku: &str,
        only_recorded: bool,
    ) -> Result<Vec<Adjustment>, LedgerError> {
        let mut out = Vec::new();
        for kv in self.adjustments.iter() {
            let (_, v) = kv?;
            let a = decode_adjustment(&v)?;
            if a.sku == sku && (!only_recorded || a.status == AdjustmentStatus::Recorded) {
                out.push(a);
            }
        }
        out.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        Ok(out)
    }

    async fn materialize(&self, o: &NewOrder) -> Result<Materialized, LedgerError> {
        let out = self.transition(&o.token, "checkout", None, |cur, now| match cur {
            Some(existing) => Ok((None, materialize_existing(existing, o)?)),
            None => Ok((
                Some(Order {
                    token: o.token.clone(),
                    sku: o.sku.clone(),
                    user: o.user.clone(),
                    request_id: Some(o.request_id.clone()),
                    qty: o.qty,
                    status: OrderStatus::Pending,
                    expires_at_ms: o.expires_at_ms,
                    reservation_created_at_ms: Some(o.created_at_ms),
                    payment_ref: None,
                    created_at_ms: now,
                    updated_at_ms: now,
                }),
                Materialized::Created,
            )),
        })?;
        if out == Materialized::Created {
            self.flush().await?;
        }
        Ok(out)
    }

    async fn extend(&self, token: &str, expires_at_ms: i64) -> Result<(), LedgerError> {
        // Not a status change: written without an audit row, like the SQL UPDATE.
        let now = (self.clock)();
        let g = self.tx_guard();
        self.orders
            .transaction(|orders| {
                let Some(cur) = tx_get(orders, token)? else {
                    return abort(LedgerError::NotFound(token.to_string()));
                };
                if cur.status != OrderStatus::Pending {
                    return abort(LedgerError::Refused {
                        token: token.to_string(),
                        status: cur.status,
                    });
                }
                let mut next = cur;
                next.expires_at_ms = expires_at_ms;
                next.updated_at_ms = now;
                match encode(&next) {
                    Ok(b) => orders.insert(token.as_bytes(), b)?,
                    Err(e) => return abort(e),
                };
                Ok(())
            })
            .map_err(from_tx)?;
        drop(g);
        self.flush().await
    }

    async fn pay(
        &self,
        token: &str,
        payment_ref: &str,
        money_moved: bool,
    ) -> Result<LedgerPay, LedgerError> {
        // The detail of the audit row depends on the edge, so the transition is written
        // here rather than through `transition`'s single detail.
        let now = (self.clock)();
        let g = self.tx_guard();
        let out = (&self.orders, &self.events)
            .transaction(|(orders, events)| {
                let cur = tx_get(orders, token)?;
                // Same rule as `pay_order`: PENDING within its deadline (`expires >= now`).
                let seen = cur
                    .as_ref()
                    .map(|c| (c.status, c.expires_at_ms >= now, c.payment_ref.as_deref()));
                let (to, answer) = match pay_decision(token, seen, payment_ref, money_moved) {
                    Ok(x) => x,
                    Err(e) => return abort(e),
                };
                if let (Some(to), Some(c)) = (to, cur.as_ref()) {
                    let mut next = Self::moved(c, to, now);
                    let detail = if to == OrderStatus::Committed {
                        next.payment_ref = Some(payment_ref.to_string());
                        payment_ref
                    } else {
                        if !payment_ref.is_empty() {
                            next.payment_ref = Some(payment_ref.to_string());
                        }
                        "payment after the reservation ended"
                    };
                    tx_put(
                        orders,
                        events,
                        &next,
                        Some(c.status),
                        "payment",
                        Some(detail),
                    )?;
                }
                Ok((to.is_some(), answer))
            })
            .map_err(from_tx)?;
        drop(g);
        if out.0 {
            self.flush().await?;
        }
        Ok(out.1)
    }

    async fn is_hold(&self, token: &str, r: &ReservationInfo) -> Result<bool, LedgerError> {
        Ok(self.order(token).await?.is_some_and(|o| o.same_hold(r)))
    }

    async fn cancel(&self, token: &str) -> Result<(), LedgerError> {
        self.transition(
            token,
            "checkout",
            Some("buyer cancelled"),
            |cur, now| match cur {
                None => Err(LedgerError::NotFound(token.to_string())),
                Some(c) if c.status == OrderStatus::Pending => {
                    Ok((Some(Self::moved(c, OrderStatus::Cancelled, now)), ()))
                }
                Some(c) if c.status == OrderStatus::Cancelled => Ok((None, ())),
                Some(c) => Err(LedgerError::Refused {
                    token: token.to_string(),
                    status: c.status,
                }),
            },
        )?;
        self.flush().await
    }

    async fn mark_refund_required(
        &self,
        token: &str,
        payment_ref: Option<&str>,
        reason: &str,
    ) -> Result<OrderStatus, LedgerError> {
        // An empty reference is "unknown", never a value that may replace the stored one.
        let payment_ref = payment_ref.filter(|r| !r.is_empty());
        let prev = self.transition(token, "payment", Some(reason), |cur, now| match cur {
            None => Err(LedgerError::NotFound(token.to_string())),
            Some(c) if c.status == OrderStatus::RefundRequired => Ok((None, c.status)),
            Some(c) if refund_allowed(c.status, c.expires_at_ms < now) => {
                let mut next = Self::moved(c, OrderStatus::RefundRequired, now);
                if let Some(r) = payment_ref {
                    next.payment_ref = Some(r.to_string());
                }
                Ok((Some(next), c.status))
            }
            Some(c) => Err(LedgerError::Refused {
                token: token.to_string(),
                status: c.status,
            }),
        })?;
        self.flush().await?;
        Ok(prev)
    }

    async fn mark_refunded(&self, token: &str) -> Result<(), LedgerError> {
        self.transition(token, "payment", Some("refunded"), |cur, now| match cur {
            None => Err(LedgerError::NotFound(token.to_string())),
            Some(c) if c.status == OrderStatus::RefundRequired => {
                Ok((Some(Self::moved(c, OrderStatus::Refunded, now)), ()))
            }
            Some(c) if c.status == OrderStatus::Refunded => Ok((None, ())),
            Some(c) => Err(LedgerError::Refused {
                token: token.to_string(),
                status: c.status,
            }),
        })?;
        self.flush().await
    }

    async fn reconcile_expired(
        &self,
        batch: &[ExpiredReservation],
    ) -> Result<Vec<SweepVerdict>, LedgerError> {
        let mut out = Vec::with_capacity(batch.len());
        for item in batch {
            // One serializable transaction per reservation decides all branches at once:
            // conditional cancel, status read, or tombstone.
            let v = self.transition(&item.token, "sweeper", None, |cur, now| match cur {
                Some(c) if c.status == OrderStatus::Pending && c.expires_at_ms < now => Ok((
                    Some(Self::moved(c, OrderStatus::CancelledBySweeper, now)),
                    SweepVerdict::Release(ReleaseReason::CancelledNow),
                )),
                Some(c) => Ok((None, verdict_from_status(c.status))),
                None => Ok((
                    Some(Order {
                        token: item.token.clone(),
                        sku: item.sku.clone(),
                        user: item.user.clone(),
                        request_id: None,
                        qty: item.qty,
                        status: OrderStatus::CancelledBySweeper,
                        expires_at_ms: item.expires_at_ms,
                        reservation_created_at_ms: None,
                        payment_ref: None,
                        created_at_ms: now,
                        updated_at_ms: now,
                    }),
                    SweepVerdict::Release(ReleaseReason::Tombstoned),
                )),
            })?;
            out.push(v);
        }
        // One flush for the batch, before any release happens.
        self.flush().await?;
        Ok(out)
    }

    async fn order(&self, token: &str) -> Result<Option<Order>, LedgerError> {
        match self.orders.get(token.as_bytes())? {
            None => Ok(None),
            Some(b) => decode_order(&b).map(Some),
        }
    }

    async fn events(&self, token: &str) -> Result<Vec<OrderEvent>, LedgerError> {
        let mut prefix = token.as_bytes().to_vec();
        prefix.push(0);
        self.events
            .scan_prefix(prefix)
            .map(|kv| {
                let (_, v) = kv?;
                serde_json::from_slice(&v).map_err(corrupt)
            })
            .collect()
    }

    async fn orders(
        &self,
        sku: &str,
        status: Option<OrderStatus>,
    ) -> Result<Vec<Order>, LedgerError> {
        // A full scan: the embedded ledger serves one process's sales, and this is used by
        // rebuilds and invariant checks, not by the hot path.
        let mut out = Vec::new();
        for kv in self.orders.iter() {
            let (_, v) = kv?;
            let o = decode_order(&v)?;
            if o.sku == sku && status.is_none_or(|s| s == o.status) {
                out.push(o);
            }
        }
        out.sort_by_key(|o| o.created_at_ms);
        Ok(out)
    }

    async fn totals(&self, sku: &str) -> Result<SkuTotals, LedgerError> {
        let mut t = SkuTotals::default();
        for o in self.orders(sku, None).await? {
            super::postgres::add_totals(&mut t, o.status, 1, u64::from(o.qty));
        }
        Ok(t)
    }

    async fn bound_histories(&self) -> Result<Vec<Binding>, LedgerError> {
        match self.meta.get(BINDING_KEY)? {
            None => Ok(Vec::new()),
            Some(v) => String::from_utf8(v.to_vec())
                .map(|history_id| {
                    vec![Binding {
                        history_id,
                        group: None,
                    }]
                })
                .map_err(|_| LedgerError::Corrupt("server binding is not UTF-8".into())),
        }
    }

    async fn bind_history(
        &self,
        expected: Option<&str>,
        id: &str,
    ) -> Result<Option<String>, LedgerError> {
        let old = expected.map(str::as_bytes);
        // A failed swap leaves the binding someone else set: reported below.
        let _ = self
            .meta
            .compare_and_swap(BINDING_KEY, old, Some(id.as_bytes()))?;
        self.flush().await?;
        self.bound_history().await
    }

    async fn add_binding(&self, id: &str, _group: Option<&str>) -> Result<bool, LedgerError> {
        match self.bound_history().await? {
            Some(b) if b == id => Ok(false),
            // The embedded ledger serves one process embedding one engine: one history.
            Some(b) => Err(LedgerError::Invalid(format!(
                "the embedded ledger follows one server history ({b}) and cannot be bound to \
                 a second one ({id}); a ledger for several groups is the Postgres ledger"
            ))),
            None => Ok(self.bind_history(None, id).await?.as_deref() == Some(id)),
        }
    }

    async fn remove_binding(&self, id: &str) -> Result<bool, LedgerError> {
        let removed = self
            .meta
            .compare_and_swap(BINDING_KEY, Some(id.as_bytes()), None::<&[u8]>)?
            .is_ok();
        self.flush().await?;
        Ok(removed)
    }

    async fn sale_histories(&self) -> Result<Vec<(String, Option<String>)>, LedgerError> {
        // One binding at most: every sale is that history's.
        let bound = self.bound_history().await?;
        Ok(self
            .sales()
            .await?
            .into_iter()
            .map(|s| (s.sku, bound.clone()))
            .collect())
    }

    async fn record_sale_history(
        &self,
        sku: &str,
        history: &str,
    ) -> Result<Option<String>, LedgerError> {
        match self.sale(sku).await? {
            None => Ok(None),
            Some(_) => Ok(Some(
                self.bound_history()
                    .await?
                    .unwrap_or_else(|| history.to_string()),
            )),
        }
    }

    async fn move_sale_history(
        &self,
        sku: &str,
        from: &str,
        to: &str,
    ) -> Result<Option<String>, LedgerError> {
        if from == to {
            return self.record_sale_history(sku, to).await;
        }
        // One process, one engine, one history: no slot of it can move to another group.
        Err(LedgerError::Invalid(format!(
            "the embedded ledger follows one server history and cannot record sale {sku}              on another ({to}); a ledger for several groups is the Postgres ledger"
        )))
    }

    async fn live_pending_orders(&self, sku: &str) -> Result<Vec<Order>, LedgerError> {
        // The ledger's clock and commit's `expires >= now`: what a payment could still take.
        let now = (self.clock)();
        let mut out: Vec<Order> = self
            .orders(sku, Some(OrderStatus::Pending))
            .await?
            .into_iter()
            .filter(|o| o.expires_at_ms >= now)
            .collect();
        out.sort_by_key(|o| o.expires_at_ms);
        Ok(out)
    }
}
