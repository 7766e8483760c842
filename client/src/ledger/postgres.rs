//! Postgres ledger (sqlx runtime query API; schema in `migrations/`).
//!
//! The hot transitions (materialize, commit, the sweeper's batch) are single statements:
//! a data-modifying CTE performs the conditional UPDATE/INSERT and appends the audit row,
//! so transition and audit are atomic and cost one round trip. Rare transitions (cancel,
//! refund, extend) lock the row in a short transaction and decide in Rust.
//! Expiry is judged by the database clock (`now()`), as docs/design.md's rule states.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};

use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use sqlx::{Executor, Row};

use super::pg_schema::{self, MovedLedger, SchemaError};
use super::{
    adjustment_next, adjustment_retry, check_adjustment, commit_not_applied, materialize_existing,
    refund_allowed, verdict_from_status, Adjustment, AdjustmentOutcome, AdjustmentStatus, Ledger,
    LedgerCommit, LedgerError, Materialized, NewOrder, Order, OrderEvent, OrderStatus,
    ReleaseReason, SaleRecord, SkuTotals, SweepVerdict,
};
use crate::types::ExpiredReservation;

pub use super::migrations::migrator;

/// Pool settings.
#[derive(Clone, Debug)]
pub struct PgLedgerOptions {
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

#[derive(Clone, Debug)]
pub struct PgLedger {
    pool: PgPool,
    schema: String,
}

const ORDER_COLS: &str = "reservation_token, sku, user_id, request_id, qty, status, \
     reservation_expires_at, reservation_created_at, payment_ref, created_at, updated_at";

fn ts(ms: i64) -> Result<DateTime<Utc>, LedgerError> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .ok_or_else(|| LedgerError::Conflict(format!("timestamp {ms} ms out of range")))
}

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

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The schema the ledger lives in.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// Create the ledger's schema if it does not exist yet (`migrate` does this first;
    /// for callers that run a [`Migrator`] of their own).
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

    async fn read_status(&self, token: &str) -> Result<Option<(OrderStatus, bool)>, LedgerError> {
        let row = sqlx::query(
            "SELECT status, reservation_expires_at < now() AS expired \
             FROM orders WHERE reservation_token = $1",
        )
        .bind(token)
        .fetch_optional(&self.pool)
        .await?;
        match row {
            None => Ok(None),
            Some(r) => Ok(Some((
                status_of(r.try_get::<&str, _>("status")?)?,
                r.try_get("expired")?,
            ))),
        }
    }

    /// Step 1 of the sweep: PENDING → CANCELLED_BY_SWEEPER for the expired ones.
    /// Rows another transaction holds are skipped (SKIP LOCKED) instead of waited for:
    /// the holder is deciding their fate (a commit, another sweeper); a later pass sees
    /// the result. Locks are taken in token order, so concurrent sweepers never deadlock.
    async fn sweep_cancel(&self, tokens: &[String]) -> Result<Vec<String>, LedgerError> {
        let rows = sqlx::query(
            "WITH claim AS ( \
                 SELECT id FROM orders \
                 WHERE reservation_token = ANY($1) AND status = 'PENDING' \
                   AND reservation_expires_at < now() \
                 ORDER BY reservation_token \
                 FOR UPDATE SKIP LOCKED \
             ), upd AS ( \
                 UPDATE orders o SET status = 'CANCELLED_BY_SWEEPER', cancelled_at = now(), \
                        updated_at = now() \
                 FROM claim WHERE o.id = claim.id \
                 RETURNING o.reservation_token \
             ), ev AS ( \
                 INSERT INTO order_events (reservation_token, from_status, to_status, actor, detail) \
                 SELECT reservation_token, 'PENDING', 'CANCELLED_BY_SWEEPER', 'sweeper', 'expired' \
                 FROM upd \
             ) \
             SELECT reservation_token FROM upd",
        )
        .bind(tokens)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| r.try_get::<String, _>(0).map_err(LedgerError::from))
            .collect()
    }

    /// Step 3 of the sweep: tombstones for tokens with no order at all. Returns the tokens
    /// whose tombstone this call inserted (a conflict means a materialize got there first).
    async fn sweep_tombstone(
        &self,
        items: &[&ExpiredReservation],
    ) -> Result<Vec<String>, LedgerError> {
        let tokens: Vec<String> = items.iter().map(|i| i.token.clone()).collect();
        let skus: Vec<String> = items.iter().map(|i| i.sku.clone()).collect();
        let users: Vec<String> = items.iter().map(|i| i.user.clone()).collect();
        let qtys: Vec<i32> = items
            .iter()
            .map(|i| i32::try_from(i.qty).unwrap_or(i32::MAX))
            .collect();
        let exp: Vec<DateTime<Utc>> = items
            .iter()
            .map(|i| ts(i.expires_at_ms))
            .collect::<Result<_, _>>()?;
        let rows = sqlx::query(
            "WITH ins AS ( \
                 INSERT INTO orders (reservation_token, sku, user_id, qty, status, \
                                     reservation_expires_at, cancelled_at) \
                 SELECT t, s, u, q, 'CANCELLED_BY_SWEEPER', e, now() \
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::int4[], $5::timestamptz[]) \
                      AS x(t, s, u, q, e) \
                 ORDER BY t \
                 ON CONFLICT (reservation_token) DO NOTHING \
                 RETURNING reservation_token \
             ), ev AS ( \
                 INSERT INTO order_events (reservation_token, from_status, to_status, actor, detail) \
                 SELECT reservation_token, NULL, 'CANCELLED_BY_SWEEPER', 'sweeper', 'tombstone' \
                 FROM ins \
             ) \
             SELECT reservation_token FROM ins",
        )
        .bind(&tokens)
        .bind(&skus)
        .bind(&users)
        .bind(&qtys)
        .bind(&exp)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| r.try_get::<String, _>(0).map_err(LedgerError::from))
            .collect()
    }

    async fn read_statuses(
        &self,
        tokens: &[String],
    ) -> Result<HashMap<String, OrderStatus>, LedgerError> {
        let rows = sqlx::query(
            "SELECT reservation_token, status FROM orders WHERE reservation_token = ANY($1)",
        )
        .bind(tokens)
        .fetch_all(&self.pool)
        .await?;
        let mut out = HashMap::with_capacity(rows.len());
        for r in &rows {
            out.insert(
                r.try_get::<String, _>(0)?,
                status_of(r.try_get::<&str, _>(1)?)?,
            );
        }
        Ok(out)
    }

    /// A locked read-decide-write transition for the rare paths. `decide` gets the
    /// current status and whether the reservation expired, and returns the new status
    /// (None = nothing to do) or an error.
    async fn locked_transition<T>(
        &self,
        token: &str,
        actor: &str,
        detail: Option<&str>,
        payment_ref: Option<&str>,
        decide: impl FnOnce(OrderStatus, bool) -> Result<(Option<OrderStatus>, T), LedgerError>,
    ) -> Result<T, LedgerError> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "SELECT status, reservation_expires_at < now() AS expired FROM orders \
             WHERE reservation_token = $1 FOR UPDATE",
        )
        .bind(token)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Err(LedgerError::NotFound(token.to_string()));
        };
        let from = status_of(row.try_get::<&str, _>("status")?)?;
        let expired: bool = row.try_get("expired")?;
        let (to, out) = decide(from, expired)?;
        if let Some(to) = to {
            sqlx::query(
                "UPDATE orders SET status = $2, updated_at = now(), \
                     payment_ref = COALESCE(NULLIF($3, ''), payment_ref), \
                     cancelled_at = CASE WHEN $2 IN ('CANCELLED', 'CANCELLED_BY_SWEEPER') \
                                         THEN now() ELSE cancelled_at END \
                 WHERE reservation_token = $1",
            )
            .bind(token)
            .bind(to.as_str())
            .bind(payment_ref)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "INSERT INTO order_events (reservation_token, from_status, to_status, actor, detail) \
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(token)
            .bind(from.as_str())
            .bind(to.as_str())
            .bind(actor)
            .bind(detail)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
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
        let qty = i32::try_from(o.qty)
            .map_err(|_| LedgerError::Conflict(format!("qty {} too large", o.qty)))?;
        // ON CONFLICT DO NOTHING: a retry, or a row the sweeper tombstoned first, wins.
        let row = sqlx::query(
            "WITH ins AS ( \
                 INSERT INTO orders (reservation_token, sku, user_id, request_id, qty, status, \
                                     reservation_expires_at, reservation_created_at) \
                 VALUES ($1, $2, $3, $4, $5, 'PENDING', $6, $7) \
                 ON CONFLICT (reservation_token) DO NOTHING \
                 RETURNING reservation_token \
             ), ev AS ( \
                 INSERT INTO order_events (reservation_token, from_status, to_status, actor) \
                 SELECT reservation_token, NULL, 'PENDING', 'checkout' FROM ins \
             ) \
             SELECT count(*) FROM ins",
        )
        .bind(&o.token)
        .bind(&o.sku)
        .bind(&o.user)
        .bind(&o.request_id)
        .bind(qty)
        .bind(ts(o.expires_at_ms)?)
        .bind(ts(o.created_at_ms)?)
        .fetch_one(&self.pool)
        .await?;
        let inserted: i64 = row.try_get(0)?;
        if inserted == 1 {
            return Ok(Materialized::Created);
        }
        match self.order(&o.token).await? {
            Some(existing) => materialize_existing(&existing, o),
            // Cannot happen (rows are never deleted), but do not guess.
            None => Err(LedgerError::Conflict(format!(
                "order {} vanished during materialize",
                o.token
            ))),
        }
    }

    async fn extend(&self, token: &str, expires_at_ms: i64) -> Result<(), LedgerError> {
        let at = ts(expires_at_ms)?;
        let n = sqlx::query(
            "UPDATE orders SET reservation_expires_at = $2, updated_at = now() \
             WHERE reservation_token = $1 AND status = 'PENDING'",
        )
        .bind(token)
        .bind(at)
        .execute(&self.pool)
        .await?
        .rows_affected();
        if n == 1 {
            return Ok(());
        }
        match self.read_status(token).await? {
            None => Err(LedgerError::NotFound(token.to_string())),
            Some((status, _)) => Err(LedgerError::Refused {
                token: token.to_string(),
                status,
            }),
        }
    }

    async fn commit(&self, token: &str, payment_ref: &str) -> Result<LedgerCommit, LedgerError> {
        // `>= now()` is the exact complement of the sweeper's `< now()`: at any instant a
        // PENDING order can be committed or swept, never both; the row lock orders racers.
        let row = sqlx::query(
            "WITH upd AS ( \
                 UPDATE orders SET status = 'COMMITTED', payment_ref = $2, \
                        committed_at = now(), updated_at = now() \
                 WHERE reservation_token = $1 AND status = 'PENDING' \
                   AND reservation_expires_at >= now() \
                 RETURNING reservation_token \
             ), ev AS ( \
                 INSERT INTO order_events (reservation_token, from_status, to_status, actor, detail) \
                 SELECT reservation_token, 'PENDING', 'COMMITTED', 'payment', $2 FROM upd \
             ) \
             SELECT count(*) FROM upd",
        )
        .bind(token)
        .bind(payment_ref)
        .fetch_one(&self.pool)
        .await?;
        let n: i64 = row.try_get(0)?;
        if n == 1 {
            return Ok(LedgerCommit::Committed);
        }
        let cur = self.read_status(token).await?;
        commit_not_applied(token, cur)
    }

    async fn cancel(&self, token: &str) -> Result<(), LedgerError> {
        self.locked_transition(
            token,
            "checkout",
            Some("buyer cancelled"),
            None,
            |from, _| match from {
                OrderStatus::Pending => Ok((Some(OrderStatus::Cancelled), ())),
                OrderStatus::Cancelled => Ok((None, ())),
                status => Err(LedgerError::Refused {
                    token: token.to_string(),
                    status,
                }),
            },
        )
        .await
    }

    async fn mark_refund_required(
        &self,
        token: &str,
        payment_ref: Option<&str>,
        reason: &str,
    ) -> Result<OrderStatus, LedgerError> {
        // An empty reference is "unknown", never a value that may replace the stored one.
        let payment_ref = payment_ref.filter(|r| !r.is_empty());
        self.locked_transition(
            token,
            "payment",
            Some(reason),
            payment_ref,
            |from, expired| {
                if from == OrderStatus::RefundRequired {
                    Ok((None, from))
                } else if refund_allowed(from, expired) {
                    Ok((Some(OrderStatus::RefundRequired), from))
                } else {
                    Err(LedgerError::Refused {
                        token: token.to_string(),
                        status: from,
                    })
                }
            },
        )
        .await
    }

    async fn mark_refunded(&self, token: &str) -> Result<(), LedgerError> {
        self.locked_transition(
            token,
            "payment",
            Some("refunded"),
            None,
            |from, _| match from {
                OrderStatus::RefundRequired => Ok((Some(OrderStatus::Refunded), ())),
                OrderStatus::Refunded => Ok((None, ())),
                status => Err(LedgerError::Refused {
                    token: token.to_string(),
                    status,
                }),
            },
        )
        .await
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
            for t in self.sweep_cancel(&tokens).await? {
                verdicts.insert(t, SweepVerdict::Release(ReleaseReason::CancelledNow));
            }
            let rest: Vec<String> = tokens
                .into_iter()
                .filter(|t| !verdicts.contains_key(t))
                .collect();
            if rest.is_empty() {
                break;
            }
            let statuses = self.read_statuses(&rest).await?;
            let mut missing = Vec::new();
            for item in &todo {
                if verdicts.contains_key(&item.token) {
                    continue;
                }
                match statuses.get(&item.token) {
                    Some(s) => {
                        verdicts.insert(item.token.clone(), verdict_from_status(*s));
                    }
                    None => missing.push(*item),
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

    async fn bound_history(&self) -> Result<Option<String>, LedgerError> {
        Ok(
            sqlx::query_scalar("SELECT history_id FROM server_binding WHERE singleton")
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    async fn bind_history(
        &self,
        expected: Option<&str>,
        id: &str,
    ) -> Result<Option<String>, LedgerError> {
        let q = match expected {
            None => sqlx::query(
                "INSERT INTO server_binding (history_id) VALUES ($1) ON CONFLICT DO NOTHING",
            )
            .bind(id),
            Some(old) => sqlx::query(
                "UPDATE server_binding SET history_id = $1, bound_at = now() \
                 WHERE singleton AND history_id = $2",
            )
            .bind(id)
            .bind(old),
        };
        q.execute(&self.pool).await?;
        self.bound_history().await
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
