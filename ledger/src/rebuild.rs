//! Fail closed, then rebuild from the ledger (docs/design.md, "Durability"):
//! a sale whose server state is unproven is FENCED (refuses RESERVE) until
//! `available = allocation − committed − verified pending` is restored from the ledger.
//!
//! The ledger is the one truth for everything the server must know again:
//! - the *current* allocation (`sales.allocation`: the initial one plus every recorded
//!   adjustment), never the initial one, so units withdrawn with `adjust` stay withdrawn;
//! - every pending order, put back RESERVED with its expiry so it can still commit or
//!   expire;
//! - every paid order, put back COMMITTED, so a retry of its `(sku, user, request-id)`
//!   REPLAYs instead of taking stock again, and its units count against the per-user
//!   limit;
//! - every cancelled or refunded order that has a request id, put back RELEASED, so a
//!   retry REPLAYs (and is then refused by the ledger) instead of holding stock until it
//!   expires. Sweeper tombstones have no request id: the server cannot derive their token,
//!   and their retry takes a unit that the sweeper gives back after the TTL.
//!
//! "Verified": the server re-derives each order's token from `(sku, user, request-id)`
//! with its reservation key; a token that differs from the ledger's means another key, and
//! the rebuild aborts (it would break idempotency).
//!
//! Commits racing the rebuild: a restored reservation can be committed on the server
//! while the sale is fenced. `SALE.REBUILD` counts units of RESERVED reservations at its
//! own instant, so the committed figure we pass must exclude exactly the orders still
//! RESERVED then. We pass "ledger COMMITTED minus those RESERVED on the server just
//! before", and afterwards check that none of those moved; if one did (its commit may have
//! landed before the rebuild and been counted nowhere), we fence again and redo. Erring
//! this way can only undersell, never oversell.
//!
//! A ledger-COMMITTED order whose token the server holds RESERVED as *another* hold (one
//! created after the paid one was lost: other creation time, expiry or quantity) is not the
//! hold the payment paid for: that hold is released, and the paid units are counted as
//! committed.

use std::collections::HashMap;

use futures::future::join_all;
use stockgate_core::engine::ReleaseReason;
use tracing::{error, info, warn};

use crate::client::ClientError;
use crate::gate::ReservationGate;
use crate::ledger::{
    Adjustment, AdjustmentOutcome, Ledger, LedgerError, Order, OrderStatus, SaleRecord,
};
use crate::types::{ReservationInfo, ReservationState, SaleInfo};

/// Why a rebuild did not complete; the sale stays fenced, so nothing is sold on unproven counts.
#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    /// The ledger and the server could not be shown to share one history (see
    /// [`IdentityError`](crate::identity::IdentityError)).
    #[error(transparent)]
    Identity(#[from] crate::identity::IdentityError),
    /// The ledger has no sale with this key.
    #[error("sale {0} is unknown to the ledger: nothing to rebuild from")]
    UnknownSale(String),
    /// The sale is open and the options did not ask to fence it.
    #[error("sale {0} is not fenced; fence it first (or pass --fence)")]
    NotFenced(String),
    /// The server derives reservation tokens with another key than the ledger's tokens were made
    /// with, so they could not be matched.
    #[error("reservation key mismatch: ledger has {ledger}, server has {server}")]
    FingerprintMismatch {
        /// The key fingerprint the ledger records.
        ledger: String,
        /// The key fingerprint the server reports.
        server: String,
    },
    /// The server derived another token for a ledger order than the ledger holds.
    #[error("token mismatch for order {ledger_token}: server derived {server_token} (different reservation key?)")]
    TokenMismatch {
        /// The token the ledger holds.
        ledger_token: String,
        /// The token the server derived for the same request.
        server_token: String,
    },
    /// A ledger order lacks the request id its token is derived from.
    #[error("order {0} has no request id: cannot re-derive its token")]
    NoRequestId(String),
    /// Commits kept landing during every attempt (the count is given).
    #[error("commits kept racing the rebuild after {0} attempts; the sale stays fenced")]
    Unstable(u32),
    /// The ledger call failed.
    #[error("ledger: {0}")]
    Ledger(#[from] LedgerError),
    /// The server call failed.
    #[error("server: {0}")]
    Gate(#[from] ClientError),
}

/// How [`rebuild_sale`] proceeds.
#[derive(Clone, Debug)]
pub struct RebuildOptions {
    /// Fence a sale that is open (operator-initiated rebuild). Without it, only a fenced
    /// or lost sale is rebuilt.
    pub fence_if_open: bool,
    /// Tries before giving up while commits keep racing the rebuild.
    pub max_attempts: u32,
}

impl Default for RebuildOptions {
    fn default() -> Self {
        RebuildOptions {
            fence_if_open: false,
            max_attempts: 5,
        }
    }
}

/// What a rebuild restored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RebuildReport {
    /// The sale.
    pub sku: String,
    /// The ledger's current allocation, which became the server's total.
    pub total: u64,
    /// Committed units passed to SALE.REBUILD (ledger COMMITTED not still RESERVED).
    pub committed_units: u64,
    /// Pending orders put back (or found already present).
    pub restored: u64,
    /// Units held by the pending orders put back.
    pub restored_units: u64,
    /// Paid orders put back COMMITTED (or found already present).
    pub restored_committed: u64,
    /// Cancelled/refunded orders put back RELEASED (or found already present).
    pub restored_released: u64,
    /// Holds released because they were not the hold the ledger's payment paid for.
    pub foreign_holds_released: u64,
    /// Units free to reserve after the rebuild.
    pub available: i64,
    /// The server did not know the sale (lost state) and it was created fenced.
    pub was_lost: bool,
    /// Tries it took.
    pub attempts: u32,
}

/// Concurrency of the per-order server calls.
const CHUNK: usize = 64;

/// Rebuild one sale from the ledger. See the module docs.
pub async fn rebuild_sale<L: Ledger, G: ReservationGate>(
    ledger: &L,
    gate: &G,
    sku: &str,
    opts: &RebuildOptions,
) -> Result<RebuildReport, RebuildError> {
    let bound = crate::identity::check_bound(ledger, gate.history().await?).await?;
    crate::identity::check_sale(ledger, &bound, sku).await?;
    // Unconfirmed adjustments first, then the sale: every adjustment read here is included
    // in the allocation read after it, so once the server's total is that allocation they
    // are all applied there.
    let unconfirmed = ledger.adjustments(sku, true).await?;
    let sale = ledger
        .sale(sku)
        .await?
        .ok_or_else(|| RebuildError::UnknownSale(sku.to_string()))?;
    let (info, was_lost) = fenced_sale_info(gate, &sale, sku, opts).await?;
    let server_fp = info.key_fingerprint.clone();
    check_fingerprint(ledger, &sale, &server_fp).await?;
    let finished = finished_orders(ledger, sku).await?;
    restore_all(gate, &finished, ReservationState::Released).await?;

    let mut foreign_holds_released = 0u64;
    for attempt in 1..=opts.max_attempts {
        let a = try_rebuild(ledger, gate, sku, &sale, &server_fp).await?;
        foreign_holds_released += a.foreign_holds_released;
        if a.stable {
            confirm_adjustments(ledger, &unconfirmed, sale.allocation).await?;
            let report = RebuildReport {
                sku: sku.to_string(),
                total: sale.allocation,
                committed_units: a.committed_units,
                restored: a.restored,
                restored_units: a.restored_units,
                restored_committed: a.restored_committed,
                restored_released: finished.len() as u64,
                foreign_holds_released,
                available: a.available,
                was_lost,
                attempts: attempt,
            };
            info!(?report, "sale rebuilt from the ledger");
            return Ok(report);
        }
        warn!(
            sku,
            attempt, "a restored reservation changed state during the rebuild; fencing again"
        );
        gate.fence(&sale).await?;
    }
    Err(RebuildError::Unstable(opts.max_attempts))
}

/// The sale's server state once it is fenced, and whether the server had lost it. A lost
/// sale is created fenced; an open one is fenced only when the options ask.
async fn fenced_sale_info<G: ReservationGate>(
    gate: &G,
    sale: &SaleRecord,
    sku: &str,
    opts: &RebuildOptions,
) -> Result<(SaleInfo, bool), RebuildError> {
    let mut was_lost = false;
    let info = match gate.sale_info(sku).await? {
        None => {
            warn!(sku, "server does not know the sale: state lost; fencing");
            gate.fence(sale).await?;
            was_lost = true;
            gate.sale_info(sku).await?
        }
        Some(i) if !i.is_fenced() => {
            if !opts.fence_if_open {
                return Err(RebuildError::NotFenced(sku.to_string()));
            }
            gate.fence(sale).await?;
            gate.sale_info(sku).await?
        }
        Some(i) => Some(i),
    };
    let Some(info) = info else {
        return Err(RebuildError::Gate(ClientError::NoSale));
    };
    Ok((info, was_lost))
}

/// The server must derive tokens with the key the ledger's tokens were made with; a
/// ledger that never learned the key's fingerprint records the server's.
async fn check_fingerprint<L: Ledger>(
    ledger: &L,
    sale: &SaleRecord,
    server_fp: &str,
) -> Result<(), RebuildError> {
    match &sale.key_fingerprint {
        Some(l) if *l != server_fp => Err(RebuildError::FingerprintMismatch {
            ledger: l.clone(),
            server: server_fp.to_owned(),
        }),
        Some(_) => Ok(()),
        None => {
            // First time we learn it: the per-token check below still verifies the key.
            let mut s = sale.clone();
            s.key_fingerprint = Some(server_fp.to_owned());
            ledger.register_sale(&s).await?;
            Ok(())
        }
    }
}

/// Finished orders that are not sales, to put back as RELEASED records once (their
/// status no longer matters to the counters, and a restore of a present token changes
/// nothing).
async fn finished_orders<L: Ledger>(ledger: &L, sku: &str) -> Result<Vec<Order>, RebuildError> {
    let mut finished = Vec::new();
    for status in [
        OrderStatus::Cancelled,
        OrderStatus::CancelledBySweeper,
        OrderStatus::RefundRequired,
        OrderStatus::Refunded,
    ] {
        finished.extend(
            ledger
                .orders(sku, Some(status))
                .await?
                .into_iter()
                // Tombstones: EXPIRED gave no request id, so no token can be re-derived.
                .filter(|o| o.request_id.is_some()),
        );
    }
    Ok(finished)
}

/// What one try restored and what `SALE.REBUILD` answered.
struct Attempt {
    /// Pending orders put back.
    restored: u64,
    /// Units of those.
    restored_units: u64,
    /// Paid orders put back.
    restored_committed: u64,
    /// Holds released because the payment did not pay for them.
    foreign_holds_released: u64,
    /// Committed units passed to `SALE.REBUILD`.
    committed_units: u64,
    /// Units free to reserve after it.
    available: i64,
    /// No order the figure counted as reserved changed state meanwhile.
    stable: bool,
}

/// One try: restore the pending and paid orders, rebuild the counters, and check that
/// the committed figure was not overtaken by a commit.
async fn try_rebuild<L: Ledger, G: ReservationGate>(
    ledger: &L,
    gate: &G,
    sku: &str,
    sale: &SaleRecord,
    server_fp: &str,
) -> Result<Attempt, RebuildError> {
    // 1. Put back every verified pending and paid order (idempotent across attempts).
    let pending = ledger.orders(sku, Some(OrderStatus::Pending)).await?;
    restore_all(gate, &pending, ReservationState::Reserved).await?;
    let restored_units: u64 = pending.iter().map(|o| u64::from(o.qty)).sum();
    let committed = ledger.orders(sku, Some(OrderStatus::Committed)).await?;
    restore_all(gate, &committed, ReservationState::Committed).await?;

    // 2. Orders whose reservation is RESERVED on the server right now: pending ones
    //    just restored, and committed ones whose server COMMIT has not landed yet.
    let candidates: Vec<&Order> = pending.iter().chain(committed.iter()).collect();
    let mut reserved_now = reserved_tokens(gate, &candidates).await?;
    let foreign_holds_released =
        release_foreign_holds(ledger, gate, sku, &committed, &mut reserved_now).await?;

    // 3. Committed units the server must count as committed (the rest it counts as
    //    reserved, and its own COMMIT moves them over later).
    let committed_units: u64 = committed
        .iter()
        .filter(|o| !reserved_now.contains_key(&o.token))
        .map(|o| u64::from(o.qty))
        .sum();
    let available = gate
        .rebuild(sku, sale.allocation, committed_units, server_fp)
        .await?;

    // 4. Did any of those move while we computed? Then the figure may be stale.
    let still: Vec<&Order> = candidates
        .iter()
        .copied()
        .filter(|o| reserved_now.contains_key(&o.token))
        .collect();
    let still_reserved = reserved_tokens(gate, &still).await?;
    Ok(Attempt {
        restored: pending.len() as u64,
        restored_units,
        restored_committed: committed.len() as u64,
        foreign_holds_released,
        committed_units,
        available,
        stable: still_reserved.len() == reserved_now.len(),
    })
}

/// A paid order's token held RESERVED by a hold the payment did not pay for: give that
/// hold back and count the paid units as committed (they are sold). Returns how many
/// holds were released; they leave `reserved_now`.
async fn release_foreign_holds<L: Ledger, G: ReservationGate>(
    ledger: &L,
    gate: &G,
    sku: &str,
    committed: &[Order],
    reserved_now: &mut HashMap<String, ReservationInfo>,
) -> Result<u64, RebuildError> {
    let mut released = 0u64;
    for o in committed {
        let Some(r) = reserved_now.get(&o.token) else {
            continue;
        };
        if ledger.is_hold(&o.token, r).await? {
            continue;
        }
        error!(
            sku,
            token = %o.token,
            ledger_qty = o.qty,
            server_qty = r.qty,
            server_created_at_ms = r.created_at_ms,
            "the server holds a paid order's token as another, unpaid hold: releasing it"
        );
        gate.release(&o.token, Some(ReleaseReason::Rebuild)).await?;
        reserved_now.remove(&o.token);
        released += 1;
    }
    Ok(released)
}

/// The server's total is now the ledger's allocation, which includes every adjustment
/// read before it.
async fn confirm_adjustments<L: Ledger>(
    ledger: &L,
    unconfirmed: &[Adjustment],
    allocation: u64,
) -> Result<(), RebuildError> {
    for a in unconfirmed {
        ledger
            .finish_adjustment(
                &a.id,
                &AdjustmentOutcome::Applied {
                    server_total: i64::try_from(allocation).ok(),
                },
            )
            .await?;
    }
    Ok(())
}

async fn restore_all<G: ReservationGate>(
    gate: &G,
    orders: &[Order],
    state: ReservationState,
) -> Result<(), RebuildError> {
    for chunk in orders.chunks(CHUNK) {
        for r in join_all(chunk.iter().map(|o| restore_one(gate, o, state))).await {
            r?;
        }
    }
    Ok(())
}

async fn restore_one<G: ReservationGate>(
    gate: &G,
    o: &Order,
    state: ReservationState,
) -> Result<(), RebuildError> {
    let request_id = o
        .request_id
        .as_deref()
        .ok_or_else(|| RebuildError::NoRequestId(o.token.clone()))?;
    let created = o.reservation_created_at_ms.unwrap_or(o.created_at_ms);
    let (_new, token) = gate
        .restore(
            &o.sku,
            &o.user,
            request_id,
            o.qty,
            o.expires_at_ms,
            created,
            state,
        )
        .await?;
    if token != o.token {
        return Err(RebuildError::TokenMismatch {
            ledger_token: o.token.clone(),
            server_token: token,
        });
    }
    Ok(())
}

/// The server's view of those orders that it holds RESERVED right now.
async fn reserved_tokens<G: ReservationGate>(
    gate: &G,
    orders: &[&Order],
) -> Result<HashMap<String, ReservationInfo>, RebuildError> {
    let mut out = HashMap::new();
    for chunk in orders.chunks(CHUNK) {
        let results = join_all(chunk.iter().map(|o| gate.reservation(&o.token))).await;
        for (o, r) in chunk.iter().zip(results) {
            if let Some(info) = r? {
                if info.state == ReservationState::Reserved {
                    out.insert(o.token.clone(), info);
                }
            }
        }
    }
    Ok(out)
}
