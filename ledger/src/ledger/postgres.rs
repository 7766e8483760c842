//! Postgres ledger (sqlx runtime query API; schema in `migrations/`).
//!
//! Every order transition is a call of the ledger's own function
//! (`migrations/0006_ledger_functions.sql`: `materialize_order`, `pay_order`,
//! `cancel_order`, ...), the same one a checkout in another language calls: each takes
//! its row lock, decides, and appends the audit row in one statement, so there is one copy
//! of each rule and it costs one round trip. Here the functions' SQLSTATEs (SG001..SG004)
//! become [`LedgerError`]s. Expiry is judged by the database clock (`now()`), as
//! docs/design.md's rule states.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use sqlx::{Executor, Row};

use super::pg_schema::{self, MovedLedger, SchemaError};
use super::{
    adjustment_next, adjustment_retry, check_adjustment, Adjustment, AdjustmentOutcome,
    AdjustmentStatus, Binding, Ledger, LedgerError, LedgerPay, Materialized, NewOrder, Order,
    OrderEvent, OrderStatus, PayVerdict, ReleaseReason, SaleRecord, SkuTotals, SweepVerdict,
};
use crate::types::{ExpiredReservation, ReservationInfo};

pub use super::migrations::migrator;

/// Pool settings.
#[derive(Clone, Debug)]
pub struct PgLedgerOptions {
    /// Most connections the pool opens to Postgres.
    pub max_connections: u32,
    /// How long a call waits for a connection. Short, so a sweeper notices an
    /// unreachable database quickly and backs off instead of hanging.
    pub acquire_timeout: Duration,
    /// The schema the ledger lives in (`pg_schema::validate_schema`); default `stockgate`.
    pub schema: String,
}

impl Default for PgLedgerOptions {
    fn default() -> Self {
        PgLedgerOptions {
            max_connections: 16,
            acquire_timeout: Duration::from_secs(5),
            schema: pg_schema::DEFAULT_SCHEMA.to_string(),
        }
    }
}

/// The order ledger in Postgres; cloning shares the pool.
#[derive(Clone, Debug)]
pub struct PgLedger {
    pool: PgPool,
    schema: String,
}

const ORDER_COLS: &str = "reservation_token, sku, user_id, request_id, qty, status, \
     reservation_expires_at, reservation_created_at, payment_ref, created_at, updated_at";

fn status_of(s: &str) -> Result<OrderStatus, LedgerError> {
    OrderStatus::parse(s).ok_or_else(|| LedgerError::Corrupt(format!("unknown status `{s}`")))
}

fn order_from_row(r: &PgRow) -> Result<Order, LedgerError> {
    let qty: i32 = r.try_get("qty")?;
    let created: Option<DateTime<Utc>> = r.try_get("reservation_created_at")?;
    Ok(Order {
        token: r.try_get("reservation_token")?,
        sku: r.try_get("sku")?,
        user: r.try_get("user_id")?,
        request_id: r.try_get("request_id")?,
        qty: u32::try_from(qty).map_err(|_| LedgerError::Corrupt(format!("qty {qty}")))?,
        status: status_of(r.try_get::<&str, _>("status")?)?,
        expires_at_ms: r
            .try_get::<DateTime<Utc>, _>("reservation_expires_at")?
            .timestamp_millis(),
        reservation_created_at_ms: created.map(|c| c.timestamp_millis()),
        payment_ref: r.try_get("payment_ref")?,
        created_at_ms: r
            .try_get::<DateTime<Utc>, _>("created_at")?
            .timestamp_millis(),
        updated_at_ms: r
            .try_get::<DateTime<Utc>, _>("updated_at")?
            .timestamp_millis(),
    })
}

const SALE_COLS: &str =
    "sku, initial_allocation, allocation, shards, ttl_ms, per_user_limit, key_fingerprint";

const ADJ_COLS: &str = "adjustment_id, sku, delta, allocation_after, status, server_total, \
     detail, created_at, updated_at";

fn adjustment_from_row(r: &PgRow) -> Result<Adjustment, LedgerError> {
    let after: i64 = r.try_get("allocation_after")?;
    let status: &str = r.try_get("status")?;
    Ok(Adjustment {
        id: r.try_get("adjustment_id")?,
        sku: r.try_get("sku")?,
        delta: r.try_get("delta")?,
        allocation_after: u64::try_from(after)
            .map_err(|_| LedgerError::Corrupt(format!("allocation_after {after}")))?,
        status: AdjustmentStatus::parse(status)
            .ok_or_else(|| LedgerError::Corrupt(format!("adjustment status `{status}`")))?,
        server_total: r.try_get("server_total")?,
        detail: r.try_get("detail")?,
        created_at_ms: r
            .try_get::<DateTime<Utc>, _>("created_at")?
            .timestamp_millis(),
        updated_at_ms: r
            .try_get::<DateTime<Utc>, _>("updated_at")?
            .timestamp_millis(),
    })
}

/// A ledger function's error as a [`LedgerError`]: its SQLSTATEs (SG001 refused, SG002
/// conflict, SG003 not found, SG004 invalid argument) carry the meaning, the message the
/// words. SG001's message is `order <token> is <STATUS>: <what>`, whence the status.
fn fn_error(e: sqlx::Error, token: &str) -> LedgerError {
    let sqlx::Error::Database(d) = &e else {
        return e.into();
    };
    let msg = d.message().to_string();
    match d.code().as_deref() {
        Some("SG001") => {
            let status = msg
                .strip_prefix(&format!("order {token} is "))
                .and_then(|rest| rest.split(':').next())
                .and_then(OrderStatus::parse);
            match status {
                Some(status) => LedgerError::Refused {
                    token: token.to_string(),
                    status,
                },
                None => LedgerError::Conflict(msg),
            }
        }
        Some("SG002") => LedgerError::Conflict(msg),
        Some("SG003") => LedgerError::NotFound(token.to_string()),
        Some("SG004") => LedgerError::Invalid(msg),
        _ => e.into(),
    }
}

/// A text outcome a ledger function returned that this code does not know.
fn unknown_outcome(function: &str, got: &str) -> LedgerError {
    LedgerError::Corrupt(format!("{function} returned `{got}`"))
}

fn qty_i32(qty: u32) -> Result<i32, LedgerError> {
    i32::try_from(qty).map_err(|_| LedgerError::Invalid(format!("qty {qty} too large")))
}

/// A CHECK violation (23514) as the conflict it stands for; anything else as a DB error.
fn check_violation(e: sqlx::Error, what: impl FnOnce() -> String) -> LedgerError {
    match &e {
        sqlx::Error::Database(d) if d.code().as_deref() == Some("23514") => {
            LedgerError::Conflict(what())
        }
        _ => e.into(),
    }
}

fn sale_from_row(r: &PgRow) -> Result<SaleRecord, LedgerError> {
    let alloc: i64 = r.try_get("initial_allocation")?;
    let current: i64 = r.try_get("allocation")?;
    let shards: Option<i32> = r.try_get("shards")?;
    let ttl: Option<i64> = r.try_get("ttl_ms")?;
    let limit: Option<i32> = r.try_get("per_user_limit")?;
    let bad = |what: &str| LedgerError::Corrupt(format!("sales.{what} out of range"));
    Ok(SaleRecord {
        sku: r.try_get("sku")?,
        initial_allocation: u64::try_from(alloc).map_err(|_| bad("initial_allocation"))?,
        allocation: u64::try_from(current).map_err(|_| bad("allocation"))?,
        shards: shards
            .map(u16::try_from)
            .transpose()
            .map_err(|_| bad("shards"))?,
        ttl_ms: ttl.map(u64::try_from).transpose().map_err(|_| bad("ttl"))?,
        per_user_limit: limit
            .map(u32::try_from)
            .transpose()
            .map_err(|_| bad("limit"))?,
        key_fingerprint: r.try_get("key_fingerprint")?,
    })
}

fn to_i64(v: u64, what: &str) -> Result<i64, LedgerError> {
    i64::try_from(v).map_err(|_| LedgerError::Conflict(format!("{what} {v} too large")))
}

impl PgLedger {
    /// The ledger in the default schema (`stockgate`).
    pub async fn connect(url: &str) -> Result<Self, LedgerError> {
        Self::connect_with(url, PgLedgerOptions::default()).await
    }

    /// The ledger at `url` with these pool settings. Connections open lazily, so this succeeds
    /// while the database is down and calls fail (and are retried by their callers) until it is
    /// back.
    pub async fn connect_with(url: &str, opts: PgLedgerOptions) -> Result<Self, LedgerError> {
        pg_schema::validate_schema(&opts.schema)?;
        // Every connection, including those opened after a reconnect, looks in the
        // ledger's schema only, so unqualified names never reach another schema's tables.
        let set_path = pg_schema::search_path_sql(&opts.schema);
        // connect_lazy: a sweeper must start (and back off) even while Postgres is down.
        let pool = PgPoolOptions::new()
            .max_connections(opts.max_connections)
            .acquire_timeout(opts.acquire_timeout)
            .after_connect(move |conn, _meta| {
                let set_path = set_path.clone();
                Box::pin(async move {
                    conn.execute(set_path.as_str()).await?;
                    Ok(())
                })
            })
            .connect_lazy(url)?;
        Ok(PgLedger {
            pool,
            schema: opts.schema,
        })
    }

    /// A ledger over a pool the caller built. Its connections must already have
    /// `search_path` set to `schema` alone (as [`Self::connect_with`] does), or the
    /// queries would look elsewhere.
    pub fn from_pool(pool: PgPool, schema: &str) -> Result<Self, LedgerError> {
        pg_schema::validate_schema(schema)?;
        Ok(PgLedger {
            pool,
            schema: schema.to_string(),
        })
    }

    /// The connection pool, for callers that run their own SQL next to the ledger's (tests,
    /// migrations).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The schema the ledger lives in.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// Create the ledger's schema if it does not exist yet (`migrate` does this first;
    /// for callers that run a [`Migrator`](sqlx::migrate::Migrator) of their own).
    pub async fn ensure_schema(&self) -> Result<(), LedgerError> {
        let mut conn = self.pool.acquire().await?;
        pg_schema::ensure_schema(&mut conn, &self.schema).await
    }

    /// Create the schema if needed and apply `migrations/` there (idempotent; concurrent
    /// callers serialize on sqlx's lock). A ledger found only where versions before the
    /// schema option kept it (normally `public`) is refused with
    /// [`SchemaError::OldLayout`]: moving it is the operator's decision,
    /// [`Self::migrate_moving_old_layout`].
    pub async fn migrate(&self) -> Result<(), LedgerError> {
        self.prepare(false).await.map(|_| ())
    }

    /// [`Self::migrate`], but a ledger of the old layout is first moved into the schema
    /// (one transaction) and reported. What `stockgate-sweeper migrate` runs.
    pub async fn migrate_moving_old_layout(&self) -> Result<Option<MovedLedger>, LedgerError> {
        self.prepare(true).await
    }

    async fn prepare(&self, move_old: bool) -> Result<Option<MovedLedger>, LedgerError> {
        let schema = self.schema.as_str();
        let mut conn = self.pool.acquire().await?;
        let mut moved = None;
        if let Some(old) = pg_schema::old_layout_schema(&mut conn)
            .await?
            .filter(|old| old != schema)
        {
            let here = pg_schema::has_ledger(&mut conn, schema).await?;
            let there = pg_schema::holds_old_ledger(&mut conn, &old).await?;
            if there && here {
                // Only a tool of an older version started after the move writes there.
                tracing::warn!(
                    "schema {old} also holds a stockgate ledger; it is not used (this ledger \
                     is in schema {schema}). Check that no tool of an older version still \
                     runs against it, then drop it"
                );
            } else if there {
                if !move_old {
                    return Err(SchemaError::OldLayout {
                        found_in: old,
                        schema: schema.to_string(),
                    }
                    .into());
                }
                moved = pg_schema::move_old_ledger(&mut conn, &old, schema).await?;
            }
        }
        pg_schema::ensure_schema(&mut conn, schema).await?;
        drop(conn);
        migrator().run(&self.pool).await?;
        Ok(moved)
    }

    /// One round of the sweep's ledger step (`sweep_cancel_expired`): verdicts by token,
    /// `None` for a token without an order (it needs a tombstone).
    async fn sweep_cancel(
        &self,
        tokens: &[String],
    ) -> Result<HashMap<String, Option<SweepVerdict>>, LedgerError> {
        let rows = sqlx::query("SELECT token, verdict FROM sweep_cancel_expired($1)")
            .bind(tokens)
            .fetch_all(&self.pool)
            .await?;
        let mut out = HashMap::with_capacity(rows.len());
        for r in &rows {
            let token: String = r.try_get(0)?;
            let verdict: String = r.try_get(1)?;
            let v = match verdict.as_str() {
                "CANCELLED_NOW" => Some(SweepVerdict::Release(ReleaseReason::CancelledNow)),
                "ALREADY_CANCELLED_BY_SWEEPER" => Some(SweepVerdict::Release(
                    ReleaseReason::AlreadyCancelledBySweeper,
                )),
                "CANCELLED_BY_BUYER" => {
                    Some(SweepVerdict::Release(ReleaseReason::CancelledByBuyer))
                }
                "REFUND" => Some(SweepVerdict::Release(ReleaseReason::Refund)),
                "COMMIT_CLEANUP" => Some(SweepVerdict::CommitCleanup),
                "SKIP" => Some(SweepVerdict::Skip),
                "MISSING" => None,
                other => return Err(unknown_outcome("sweep_cancel_expired", other)),
            };
            out.insert(token, v);
        }
        Ok(out)
    }

    /// The sweep's tombstones (`sweep_tombstone`) for reservations with no order. Returns
    /// the tokens whose tombstone this call wrote (the others found an order that a
    /// materialize wrote first).
    async fn sweep_tombstone(
        &self,
        items: &[&ExpiredReservation],
    ) -> Result<Vec<String>, LedgerError> {
        let tokens: Vec<String> = items.iter().map(|i| i.token.clone()).collect();
        let skus: Vec<String> = items.iter().map(|i| i.sku.clone()).collect();
        let users: Vec<String> = items.iter().map(|i| i.user.clone()).collect();
        let qtys: Vec<i32> = items
            .iter()
            .map(|i| qty_i32(i.qty))
            .collect::<Result<_, _>>()?;
        let exp: Vec<i64> = items.iter().map(|i| i.expires_at_ms).collect();
        let rows = sqlx::query("SELECT token, verdict FROM sweep_tombstone($1, $2, $3, $4, $5)")
            .bind(&tokens)
            .bind(&skus)
            .bind(&users)
            .bind(&qtys)
            .bind(&exp)
            .fetch_all(&self.pool)
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let verdict: String = r.try_get(1)?;
            match verdict.as_str() {
                "TOMBSTONED" => out.push(r.try_get(0)?),
                "EXISTS" => {}
                other => return Err(unknown_outcome("sweep_tombstone", other)),
            }
        }
        Ok(out)
    }
}

impl Ledger for PgLedger {
    async fn register_sale(&self, sale: &SaleRecord) -> Result<(), LedgerError> {
        let alloc = to_i64(sale.initial_allocation, "allocation")?;
        let row = sqlx::query(
            "INSERT INTO sales (sku, initial_allocation, allocation, shards, ttl_ms, per_user_limit, \
                                key_fingerprint) \
             VALUES ($1, $2, $2, $3, $4, $5, $6) \
             ON CONFLICT (sku) DO UPDATE SET \
                 key_fingerprint = COALESCE(sales.key_fingerprint, EXCLUDED.key_fingerprint), \
                 updated_at = now() \
             RETURNING initial_allocation, key_fingerprint",
        )
        .bind(&sale.sku)
        .bind(alloc)
        .bind(sale.shards.map(i32::from))
        .bind(sale.ttl_ms.map(|t| to_i64(t, "ttl")).transpose()?)
        .bind(sale.per_user_limit.map(|l| i32::try_from(l).unwrap_or(i32::MAX)))
        .bind(&sale.key_fingerprint)
        .fetch_one(&self.pool)
        .await?;
        let stored_alloc: i64 = row.try_get(0)?;
        let stored_fp: Option<String> = row.try_get(1)?;
        if stored_alloc != alloc {
            return Err(LedgerError::Conflict(format!(
                "sale {} exists with allocation {stored_alloc}",
                sale.sku
            )));
        }
        if let (Some(a), Some(b)) = (&stored_fp, &sale.key_fingerprint) {
            if a != b {
                return Err(LedgerError::Conflict(format!(
                    "sale {} is bound to reservation key {a}, not {b}",
                    sale.sku
                )));
            }
        }
        Ok(())
    }

    async fn sale(&self, sku: &str) -> Result<Option<SaleRecord>, LedgerError> {
        let row = sqlx::query(&format!("SELECT {SALE_COLS} FROM sales WHERE sku = $1"))
            .bind(sku)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(sale_from_row).transpose()
    }

    async fn sales(&self) -> Result<Vec<SaleRecord>, LedgerError> {
        let rows = sqlx::query(&format!("SELECT {SALE_COLS} FROM sales ORDER BY sku"))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(sale_from_row).collect()
    }

    async fn record_adjustment(
        &self,
        sku: &str,
        id: &str,
        delta: i64,
    ) -> Result<Adjustment, LedgerError> {
        check_adjustment(id, delta)?;
        // One statement: the allocation moves only if this id is new (the INSERT returned
        // a row), so a retry after a lost reply cannot move it twice. The sale row is
        // locked by the UPDATE, so concurrent adjustments of one sale serialize.
        let row = sqlx::query(&format!(
            "WITH s AS ( \
                 SELECT sku, allocation FROM sales WHERE sku = $1 FOR UPDATE \
             ), ins AS ( \
                 INSERT INTO sale_adjustments (adjustment_id, sku, delta, allocation_after) \
                 SELECT $2, s.sku, $3, s.allocation + $3 FROM s \
                 ON CONFLICT (adjustment_id) DO NOTHING \
                 RETURNING {ADJ_COLS} \
             ), upd AS ( \
                 UPDATE sales SET allocation = allocation + $3, updated_at = now() \
                 WHERE sku = $1 AND EXISTS (SELECT 1 FROM ins) \
             ) \
             SELECT {ADJ_COLS} FROM ins"
        ))
        .bind(sku)
        .bind(id)
        .bind(delta)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| check_violation(e, || format!("allocation of {sku} would go negative")))?;
        if let Some(r) = row {
            return adjustment_from_row(&r);
        }
        match self.adjustment(id).await? {
            Some(existing) => adjustment_retry(&existing, sku, delta),
            None => Err(LedgerError::UnknownSale(sku.to_string())),
        }
    }

    async fn finish_adjustment(
        &self,
        id: &str,
        outcome: &AdjustmentOutcome,
    ) -> Result<Adjustment, LedgerError> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(&format!(
            "SELECT {ADJ_COLS} FROM sale_adjustments WHERE adjustment_id = $1 FOR UPDATE"
        ))
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Err(LedgerError::NotFound(format!("adjustment {id}")));
        };
        let existing = adjustment_from_row(&row)?;
        let Some(to) = adjustment_next(&existing, outcome)? else {
            return Ok(existing);
        };
        let (server_total, detail) = match outcome {
            AdjustmentOutcome::Applied { server_total } => (*server_total, None),
            AdjustmentOutcome::Refused { reason } => (None, Some(reason.as_str())),
        };
        if to == AdjustmentStatus::Refused {
            // The server never had it: the allocation goes back.
            sqlx::query(
                "UPDATE sales SET allocation = allocation - $2, updated_at = now() WHERE sku = $1",
            )
            .bind(&existing.sku)
            .bind(existing.delta)
            .execute(&mut *tx)
            .await
            .map_err(|e| {
                check_violation(e, || {
                    format!("reverting {id} would make the allocation negative")
                })
            })?;
        }
        let row = sqlx::query(&format!(
            "UPDATE sale_adjustments SET status = $2, server_total = $3, detail = $4, \
                 updated_at = now() \
             WHERE adjustment_id = $1 RETURNING {ADJ_COLS}"
        ))
        .bind(id)
        .bind(to.as_str())
        .bind(server_total)
        .bind(detail)
        .fetch_one(&mut *tx)
        .await?;
        let out = adjustment_from_row(&row)?;
        tx.commit().await?;
        Ok(out)
    }

    async fn adjustment(&self, id: &str) -> Result<Option<Adjustment>, LedgerError> {
        let row = sqlx::query(&format!(
            "SELECT {ADJ_COLS} FROM sale_adjustments WHERE adjustment_id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(adjustment_from_row).transpose()
    }

    async fn adjustments(
        &self,
        sku: &str,
        only_recorded: bool,
    ) -> Result<Vec<Adjustment>, LedgerError> {
        let rows = sqlx::query(&format!(
            "SELECT {ADJ_COLS} FROM sale_adjustments \
             WHERE sku = $1 AND (NOT $2 OR status = 'RECORDED') \
             ORDER BY created_at, adjustment_id"
        ))
        .bind(sku)
        .bind(only_recorded)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(adjustment_from_row).collect()
    }

    async fn materialize(&self, o: &NewOrder) -> Result<Materialized, LedgerError> {
        let out: String =
            sqlx::query_scalar("SELECT materialize_order($1, $2, $3, $4, $5, $6, $7)")
                .bind(&o.token)
                .bind(&o.sku)
                .bind(&o.user)
                .bind(&o.request_id)
                .bind(qty_i32(o.qty)?)
                .bind(o.expires_at_ms)
                .bind(o.created_at_ms)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| fn_error(e, &o.token))?;
        match out.as_str() {
            "CREATED" => Ok(Materialized::Created),
            "ALREADY_PENDING" => Ok(Materialized::AlreadyPending),
            "ALREADY_COMMITTED" => Ok(Materialized::AlreadyCommitted),
            other => Err(unknown_outcome("materialize_order", other)),
        }
    }

    async fn extend(&self, token: &str, expires_at_ms: i64) -> Result<(), LedgerError> {
        let out: String = sqlx::query_scalar("SELECT extend_order($1, $2)")
            .bind(token)
            .bind(expires_at_ms)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| fn_error(e, token))?;
        match out.as_str() {
            "EXTENDED" => Ok(()),
            other => Err(unknown_outcome("extend_order", other)),
        }
    }

    async fn pay(
        &self,
        token: &str,
        payment_ref: &str,
        money_moved: bool,
    ) -> Result<LedgerPay, LedgerError> {
        let row = sqlx::query("SELECT outcome, previous_status FROM pay_order($1, $2, $3)")
            .bind(token)
            .bind(payment_ref)
            .bind(money_moved)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| fn_error(e, token))?;
        let outcome: String = row.try_get(0)?;
        let previous: Option<String> = row.try_get(1)?;
        Ok(LedgerPay {
            verdict: PayVerdict::parse(&outcome)
                .ok_or_else(|| unknown_outcome("pay_order", &outcome))?,
            previous: previous.as_deref().map(status_of).transpose()?,
        })
    }

    async fn is_hold(&self, token: &str, r: &ReservationInfo) -> Result<bool, LedgerError> {
        sqlx::query_scalar("SELECT order_is_hold($1, $2, $3, $4, $5, $6)")
            .bind(token)
            .bind(&r.sku)
            .bind(&r.user)
            .bind(qty_i32(r.qty)?)
            .bind(r.created_at_ms)
            .bind(r.expires_at_ms)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| fn_error(e, token))
    }

    async fn cancel(&self, token: &str) -> Result<(), LedgerError> {
        let out: String = sqlx::query_scalar("SELECT cancel_order($1)")
            .bind(token)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| fn_error(e, token))?;
        match out.as_str() {
            "CANCELLED" | "ALREADY_CANCELLED" => Ok(()),
            other => Err(unknown_outcome("cancel_order", other)),
        }
    }

    async fn mark_refund_required(
        &self,
        token: &str,
        payment_ref: Option<&str>,
        reason: &str,
    ) -> Result<OrderStatus, LedgerError> {
        let previous: String = sqlx::query_scalar("SELECT mark_refund_required($1, $2, $3)")
            .bind(token)
            .bind(payment_ref)
            .bind(reason)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| fn_error(e, token))?;
        status_of(&previous)
    }

    async fn mark_refunded(&self, token: &str) -> Result<(), LedgerError> {
        let out: String = sqlx::query_scalar("SELECT mark_refunded($1)")
            .bind(token)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| fn_error(e, token))?;
        match out.as_str() {
            "REFUNDED" | "ALREADY_REFUNDED" => Ok(()),
            other => Err(unknown_outcome("mark_refunded", other)),
        }
    }

    async fn reconcile_expired(
        &self,
        batch: &[ExpiredReservation],
    ) -> Result<Vec<SweepVerdict>, LedgerError> {
        let mut verdicts: HashMap<String, SweepVerdict> = HashMap::with_capacity(batch.len());
        let mut todo: Vec<&ExpiredReservation> = batch.iter().collect();
        // A tombstone can lose to a concurrent materialize; the loser is judged again from
        // the top. Two rounds settle it (the row exists after the first); the third is
        // belt and braces, and anything still open is skipped for a later pass.
        for _round in 0..3 {
            if todo.is_empty() {
                break;
            }
            let tokens: Vec<String> = todo.iter().map(|i| i.token.clone()).collect();
            let judged = self.sweep_cancel(&tokens).await?;
            let mut missing = Vec::new();
            for item in &todo {
                match judged.get(&item.token) {
                    Some(Some(v)) => {
                        verdicts.insert(item.token.clone(), *v);
                    }
                    Some(None) => missing.push(*item),
                    None => {}
                }
            }
            if missing.is_empty() {
                break;
            }
            for t in self.sweep_tombstone(&missing).await? {
                verdicts.insert(t, SweepVerdict::Release(ReleaseReason::Tombstoned));
            }
            todo = missing
                .into_iter()
                .filter(|i| !verdicts.contains_key(&i.token))
                .collect();
        }
        Ok(batch
            .iter()
            .map(|i| {
                verdicts
                    .get(&i.token)
                    .copied()
                    .unwrap_or(SweepVerdict::Skip)
            })
            .collect())
    }

    async fn order(&self, token: &str) -> Result<Option<Order>, LedgerError> {
        let row = sqlx::query(&format!(
            "SELECT {ORDER_COLS} FROM orders WHERE reservation_token = $1"
        ))
        .bind(token)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(order_from_row).transpose()
    }

    async fn events(&self, token: &str) -> Result<Vec<OrderEvent>, LedgerError> {
        let rows = sqlx::query(
            "SELECT id, reservation_token, from_status, to_status, actor, detail, at \
             FROM order_events WHERE reservation_token = $1 ORDER BY id",
        )
        .bind(token)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let from: Option<&str> = r.try_get("from_status")?;
                Ok(OrderEvent {
                    id: r.try_get("id")?,
                    token: r.try_get("reservation_token")?,
                    from: from.map(status_of).transpose()?,
                    to: status_of(r.try_get::<&str, _>("to_status")?)?,
                    actor: r.try_get("actor")?,
                    detail: r.try_get("detail")?,
                    at_ms: r.try_get::<DateTime<Utc>, _>("at")?.timestamp_millis(),
                })
            })
            .collect()
    }

    async fn orders(
        &self,
        sku: &str,
        status: Option<OrderStatus>,
    ) -> Result<Vec<Order>, LedgerError> {
        let rows = sqlx::query(&format!(
            "SELECT {ORDER_COLS} FROM orders WHERE sku = $1 AND ($2::text IS NULL OR status = $2) \
             ORDER BY id"
        ))
        .bind(sku)
        .bind(status.map(|s| s.as_str()))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(order_from_row).collect()
    }

    async fn totals(&self, sku: &str) -> Result<SkuTotals, LedgerError> {
        let rows = sqlx::query(
            "SELECT status, count(*)::int8 AS n, COALESCE(sum(qty), 0)::int8 AS units \
             FROM orders WHERE sku = $1 GROUP BY status",
        )
        .bind(sku)
        .fetch_all(&self.pool)
        .await?;
        let mut t = SkuTotals::default();
        for r in &rows {
            let status = status_of(r.try_get::<&str, _>("status")?)?;
            let n = u64::try_from(r.try_get::<i64, _>("n")?).unwrap_or(0);
            let units = u64::try_from(r.try_get::<i64, _>("units")?).unwrap_or(0);
            add_totals(&mut t, status, n, units);
        }
        Ok(t)
    }

    async fn bound_histories(&self) -> Result<Vec<Binding>, LedgerError> {
        let rows = sqlx::query(
            "SELECT history_id, group_name FROM server_bindings ORDER BY bound_at, history_id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(Binding {
                    history_id: r.try_get(0)?,
                    group: r.try_get(1)?,
                })
            })
            .collect()
    }

    async fn bind_history(
        &self,
        expected: Option<&str>,
        id: &str,
    ) -> Result<Option<String>, LedgerError> {
        let mut tx = self.pool.begin().await?;
        let bound = lock_bindings(&mut tx).await?;
        match expected {
            None if bound.is_empty() => {
                sqlx::query("INSERT INTO server_bindings (history_id) VALUES ($1)")
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
            }
            Some(old) if bound.len() == 1 && bound[0] == old && old != id => {
                replace_binding(&mut tx, old, id).await?;
            }
            _ => {}
        }
        tx.commit().await?;
        self.bound_history().await
    }

    async fn add_binding(&self, id: &str, group: Option<&str>) -> Result<bool, LedgerError> {
        let mut tx = self.pool.begin().await?;
        let bound = lock_bindings(&mut tx).await?;
        if bound.iter().any(|b| b == id) {
            return Ok(false);
        }
        if let [only] = bound.as_slice() {
            // Every sale without a history was registered against the one binding.
            sqlx::query("UPDATE sales SET history_id = $1 WHERE history_id IS NULL")
                .bind(only)
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query("INSERT INTO server_bindings (history_id, group_name) VALUES ($1, $2)")
            .bind(id)
            .bind(group)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn remove_binding(&self, id: &str) -> Result<bool, LedgerError> {
        let n = sqlx::query("DELETE FROM server_bindings WHERE history_id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok(n > 0)
    }

    async fn sale_histories(&self) -> Result<Vec<(String, Option<String>)>, LedgerError> {
        let rows = sqlx::query("SELECT sku, history_id FROM sales ORDER BY sku")
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }

    async fn record_sale_history(
        &self,
        sku: &str,
        history: &str,
    ) -> Result<Option<String>, LedgerError> {
        Ok(sqlx::query_scalar(
            "UPDATE sales SET history_id = COALESCE(history_id, $2) WHERE sku = $1 \
             RETURNING history_id",
        )
        .bind(sku)
        .bind(history)
        .fetch_optional(&self.pool)
        .await?
        .flatten())
    }

    async fn move_sale_history(
        &self,
        sku: &str,
        from: &str,
        to: &str,
    ) -> Result<Option<String>, LedgerError> {
        Ok(sqlx::query_scalar(
            "UPDATE sales SET history_id = CASE WHEN history_id IS NULL OR history_id = $2              THEN $3 ELSE history_id END WHERE sku = $1 RETURNING history_id",
        )
        .bind(sku)
        .bind(from)
        .bind(to)
        .fetch_optional(&self.pool)
        .await?
        .flatten())
    }

    async fn live_pending_orders(&self, sku: &str) -> Result<Vec<Order>, LedgerError> {
        // `>= now()`: exactly the orders `commit` would still accept (served by the
        // partial index orders_pending_by_expiry).
        let rows = sqlx::query(&format!(
            "SELECT {ORDER_COLS} FROM orders \
             WHERE sku = $1 AND status = 'PENDING' AND reservation_expires_at >= now() \
             ORDER BY reservation_expires_at"
        ))
        .bind(sku)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(order_from_row).collect()
    }
}

/// Locks the bindings against every other binder until the transaction ends (so two
/// tools binding at once see one another's result) and returns them.
async fn lock_bindings(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
) -> Result<Vec<String>, LedgerError> {
    sqlx::query("LOCK TABLE server_bindings IN SHARE ROW EXCLUSIVE MODE")
        .execute(&mut **tx)
        .await?;
    Ok(
        sqlx::query_scalar("SELECT history_id FROM server_bindings ORDER BY bound_at")
            .fetch_all(&mut **tx)
            .await?,
    )
}

/// `rebind`: the one binding `old` becomes `new`, and what was recorded on `old` (its
/// sales, unrecorded ones included, and its materializers' positions) follows it, so the
/// feed position's fingerprint is still checked against the new server's feed.
async fn replace_binding(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    old: &str,
    new: &str,
) -> Result<(), LedgerError> {
    sqlx::query(
        "UPDATE server_bindings SET history_id = $1, bound_at = now() WHERE history_id = $2",
    )
    .bind(new)
    .bind(old)
    .execute(&mut **tx)
    .await?;
    sqlx::query("UPDATE sales SET history_id = $1 WHERE history_id = $2 OR history_id IS NULL")
        .bind(new)
        .bind(old)
        .execute(&mut **tx)
        .await?;
    sqlx::query(
        "UPDATE feed_position p SET history_id = $1 WHERE history_id IN ($2, '') \
         AND NOT EXISTS (SELECT 1 FROM feed_position q \
                         WHERE q.consumer = p.consumer AND q.history_id = $1)",
    )
    .bind(new)
    .bind(old)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub(crate) fn add_totals(t: &mut SkuTotals, status: OrderStatus, n: u64, units: u64) {
    match status {
        OrderStatus::Pending => {
            t.pending_orders += n;
            t.pending_units += units;
        }
        OrderStatus::Committed => {
            t.committed_orders += n;
            t.committed_units += units;
        }
        OrderStatus::Cancelled => t.cancelled_orders += n,
        OrderStatus::CancelledBySweeper => t.cancelled_by_sweeper_orders += n,
        OrderStatus::RefundRequired => t.refund_required_orders += n,
        OrderStatus::Refunded => t.refunded_orders += n,
    }
}
