//! Fail closed, then rebuild from the ledger (DESIGN.md, "Durability"):
//! a sale whose server state is unproven is FENCED (refuses RESERVE) until
//! `available = initial allocation − committed − verified pending` is restored from the
//! ledger, with each verified pending reservation put back with its expiry so it can
//! still commit or expire.
//!
//! "Verified": the server re-derives each pending order's token from
//! `(sku, user, request-id)` with its reservation key; a token that differs from the
//! ledger's means another key, and the rebuild aborts (it would break idempotency).
//!
//! Commits racing the rebuild: a restored reservation can be committed on the server
//! while the sale is fenced. `SALE.REBUILD` counts units of RESERVED reservations at its
//! own instant, so the committed figure we pass must exclude exactly the orders still
//! RESERVED then. We pass "ledger COMMITTED minus those RESERVED on the server just
//! before", and afterwards check that none of those moved; if one did (its commit may have
//! landed before the rebuild and been counted nowhere), we fence again and redo. Erring
//! this way can only undersell, never oversell.

use std::collections::HashSet;

use futures::future::join_all;
use tracing::{info, warn};

use crate::client::ClientError;
use crate::gate::ReservationGate;
use crate::ledger::{Ledger, LedgerError, Order, OrderStatus};
use crate::types::ReservationState;

#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    #[error("sale {0} is unknown to the ledger: nothing to rebuild from")]
    UnknownSale(String),
    #[error("sale {0} is not fenced; fence it first (or pass --fence)")]
    NotFenced(String),
    #[error("reservation key mismatch: ledger has {ledger}, server has {server}")]
    FingerprintMismatch { ledger: String, server: String },
    #[error("token mismatch for order {ledger_token}: server derived {server_token} (different reservation key?)")]
    TokenMismatch {
        ledger_token: String,
        server_token: String,
    },
    #[error("pending order {0} has no request id: cannot re-derive its token")]
    NoRequestId(String),
    #[error("commits kept racing the rebuild after {0} attempts; the sale stays fenced")]
    Unstable(u32),
    #[error("ledger: {0}")]
    Ledger(#[from] LedgerError),
    #[error("server: {0}")]
    Gate(#[from] ClientError),
}

#[derive(Clone, Debug)]
pub struct RebuildOptions {
    /// Fence a sale that is open (operator-initiated rebuild). Without it, only a fenced
    /// or lost sale is rebuilt.
    pub fence_if_open: bool,
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

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RebuildReport {
    pub sku: String,
    pub total: u64,
    /// Committed units passed to SALE.REBUILD (ledger COMMITTED not still RESERVED).
    pub committed_units: u64,
    /// Pending orders put back (or found already present).
    pub restored: u64,
    pub restored_units: u64,
    pub available: i64,
    /// The server did not know the sale (lost state) and it was created fenced.
    pub was_lost: bool,
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
    let sale = ledger
        .sale(sku)
        .await?
        .ok_or_else(|| RebuildError::UnknownSale(sku.to_string()))?;
    let mut was_lost = false;
    let info = match gate.sale_info(sku).await? {
        None => {
            warn!(sku, "server does not know the sale: state lost; fencing");
            gate.fence(&sale).await?;
            was_lost = true;
            gate.sale_info(sku).await?
        }
        Some(i) if !i.is_fenced() => {
            if !opts.fence_if_open {
                return Err(RebuildError::NotFenced(sku.to_string()));
            }
            gate.fence(&sale).await?;
            gate.sale_info(sku).await?
        }
        Some(i) => Some(i),
    };
    let Some(info) = info else {
        return Err(RebuildError::Gate(ClientError::NoSale));
    };
    let server_fp = info.key_fingerprint.clone();
    match &sale.key_fingerprint {
        Some(l) if *l != server_fp => {
            return Err(RebuildError::FingerprintMismatch {
                ledger: l.clone(),
                server: server_fp,
            })
        }
        Some(_) => {}
        None => {
            // First time we learn it: the per-token check below still verifies the key.
            let mut s = sale.clone();
            s.key_fingerprint = Some(server_fp.clone());
            ledger.register_sale(&s).await?;
        }
    }

    for attempt in 1..=opts.max_attempts {
        // 1. Put back every verified pending reservation (idempotent across attempts).
        let pending = ledger.orders(sku, Some(OrderStatus::Pending)).await?;
        let mut restored_units = 0u64;
        for chunk in pending.chunks(CHUNK) {
            let results = join_all(chunk.iter().map(|o| restore_one(gate, o))).await;
            for r in results {
                r?;
            }
            restored_units += chunk.iter().map(|o| u64::from(o.qty)).sum::<u64>();
        }

        // 2. Orders whose reservation is RESERVED on the server right now: pending ones
        //    just restored, and committed ones whose server COMMIT has not landed yet.
        let committed = ledger.orders(sku, Some(OrderStatus::Committed)).await?;
        let candidates: Vec<&Order> = pending.iter().chain(committed.iter()).collect();
        let reserved_now = reserved_tokens(gate, &candidates).await?;

        // 3. Committed units the server must count as committed (the rest it counts as
        //    reserved, and its own COMMIT moves them over later).
        let committed_units: u64 = committed
            .iter()
            .filter(|o| !reserved_now.contains(&o.token))
            .map(|o| u64::from(o.qty))
            .sum();
        let available = gate
            .rebuild(sku, sale.initial_allocation, committed_units, &server_fp)
            .await?;

        // 4. Did any of those move while we computed? Then the figure may be stale.
        let still: Vec<&Order> = candidates
            .iter()
            .copied()
            .filter(|o| reserved_now.contains(&o.token))
            .collect();
        let still_reserved = reserved_tokens(gate, &still).await?;
        if still_reserved.len() == reserved_now.len() {
            let report = RebuildReport {
                sku: sku.to_string(),
                total: sale.initial_allocation,
                committed_units,
                restored: pending.len() as u64,
                restored_units,
                available,
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

async fn restore_one<G: ReservationGate>(gate: &G, o: &Order) -> Result<(), RebuildError> {
    let request_id = o
        .request_id
        .as_deref()
        .ok_or_else(|| RebuildError::NoRequestId(o.token.clone()))?;
    let created = o.reservation_created_at_ms.unwrap_or(o.created_at_ms);
    let (_new, token) = gate
        .restore(&o.sku, &o.user, request_id, o.qty, o.expires_at_ms, created)
        .await?;
    if token != o.token {
        return Err(RebuildError::TokenMismatch {
            ledger_token: o.token.clone(),
            server_token: token,
        });
    }
    Ok(())
}

async fn reserved_tokens<G: ReservationGate>(
    gate: &G,
    orders: &[&Order],
) -> Result<HashSet<String>, RebuildError> {
    let mut out = HashSet::new();
    for chunk in orders.chunks(CHUNK) {
        let results = join_all(chunk.iter().map(|o| gate.reservation(&o.token))).await;
        for (o, r) in chunk.iter().zip(results) {
            if let Some(info) = r? {
                if info.state == ReservationState::Reserved {
                    out.insert(o.token.clone());
                }
            }
        }
    }
    Ok(out)
}
