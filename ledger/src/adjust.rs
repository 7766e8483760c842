//! Change a sale's allocation with one truth: the ledger first, then the server.
//!
//! `stockgate-sweeper adjust --sku S --delta N [--id ADJ-ID]` calls [`adjust_sale`]:
//! 1. the ledger records adjustment `id` and moves the allocation (a retry with the same
//!    id finds it recorded and moves nothing);
//! 2. the server's total is compared with the ledger's allocation to learn whether the
//!    server already has this adjustment (a crash between `SALE.ADJUST` and step 4);
//! 3. if it does not, `SALE.ADJUST sku delta`;
//! 4. the ledger marks the adjustment APPLIED (or REFUSED, moving the allocation back, if
//!    the server refused it — e.g. a withdrawal of more than is available).
//!
//! Whatever step a crash interrupts, re-running the same id brings the server to the
//! ledger's allocation with the adjustment applied exactly once. A fenced or lost sale is
//! not adjusted on the server: its rebuild sets the server's total to the ledger's
//! allocation, which already includes the adjustment, and confirms it.
//!
//! Two processes running the *same* id at the same moment could both send it; ids are an
//! operator's retry key, not a lock.

use tracing::{info, warn};

use crate::client::ClientError;
use crate::gate::ReservationGate;
use crate::ledger::{Adjustment, AdjustmentOutcome, AdjustmentStatus, Ledger, LedgerError};
use crate::sweeper::explain_total;

/// Why an adjustment did not complete; the message says what the operator can do.
#[derive(Debug, thiserror::Error)]
pub enum AdjustError {
    /// The ledger and the server could not be shown to share one history (see
    /// [`IdentityError`](crate::identity::IdentityError)).
    #[error(transparent)]
    Identity(#[from] crate::identity::IdentityError),
    /// The ledger has no sale with this key.
    #[error("sale {0} is unknown to the ledger")]
    UnknownSale(String),
    /// An adjustment with this id was refused by the server before; ids are not reused.
    #[error(
        "adjustment {id} was refused by the server earlier ({reason}); nothing changed; use a new id"
    )]
    RefusedEarlier {
        /// The adjustment's id.
        id: String,
        /// The server's refusal, as recorded.
        reason: String,
    },
    /// The server refused the adjustment (for example a withdrawal of more than is available); the
    /// ledger moved its allocation back.
    #[error(
        "the server refused adjustment {id}: {reason}; the ledger's allocation was moved back"
    )]
    Refused {
        /// The adjustment's id.
        id: String,
        /// The server's refusal.
        reason: String,
    },
    /// The sale is fenced or unknown on the server: the adjustment stays recorded and its rebuild
    /// applies it.
    #[error(
        "sale {0} is fenced or unknown on the server; adjustment recorded in the ledger: \
         `stockgate-sweeper rebuild --sku {0}` applies it"
    )]
    NotOpen(String),
    /// The server's total matches neither the ledger's allocation with nor without the unconfirmed
    /// adjustments, so it was changed outside the ledger.
    #[error(
        "server total {server_total} of {sku} is not the ledger's allocation {allocation} \
         minus unconfirmed adjustments: someone changed it by hand; refusing to guess \
         (record the difference with an adjustment, or `rebuild --fence`)"
    )]
    Unexplained {
        /// The sale.
        sku: String,
        /// The server's total units.
        server_total: i64,
        /// The ledger's allocation in units.
        allocation: u64,
    },
    /// The ledger call failed.
    #[error("ledger: {0}")]
    Ledger(#[from] LedgerError),
    /// The server call failed; the adjustment is recorded, so a retry with the same id finishes it.
    #[error("server: {0} (the adjustment is recorded; retry with the same id)")]
    Gate(#[from] ClientError),
}

/// How an adjustment reached the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdjustResult {
    /// `SALE.ADJUST` was sent by this call.
    Applied,
    /// The server already had it (an earlier attempt got that far), now confirmed.
    AlreadyOnServer,
    /// The ledger had it confirmed already: nothing to do.
    AlreadyApplied,
}

/// What [`adjust_sale`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdjustReport {
    /// The adjustment as the ledger holds it afterwards.
    pub adjustment: Adjustment,
    /// How it reached the server.
    pub result: AdjustResult,
    /// The ledger's allocation and the server's total afterwards.
    pub allocation: u64,
    /// The server's total afterwards.
    pub server_total: i64,
}

/// Adjust `sku` by `delta` under adjustment id `id`. See the module docs.
pub async fn adjust_sale<L: Ledger, G: ReservationGate>(
    ledger: &L,
    gate: &G,
    sku: &str,
    id: &str,
    delta: i64,
) -> Result<AdjustReport, AdjustError> {
    let bound = crate::identity::check_bound(ledger, gate.history().await?).await?;
    crate::identity::check_sale(ledger, &bound, sku).await?;
    adjust_checked(ledger, gate, sku, id, delta).await
}

/// [`adjust_sale`] for a caller that has already shown `gate` to be the server `sku`
/// lives on by other means: the parts of a split sale (`stockgate_tools::split`) live on several
/// groups, each checked against the history its `split_parts` row recorded.
pub async fn adjust_checked<L: Ledger, G: ReservationGate>(
    ledger: &L,
    gate: &G,
    sku: &str,
    id: &str,
    delta: i64,
) -> Result<AdjustReport, AdjustError> {
    // 1. Ledger first: from here on the ledger's allocation includes it.
    let adj = match ledger.record_adjustment(sku, id, delta).await {
        Ok(a) => a,
        Err(LedgerError::UnknownSale(s)) => return Err(AdjustError::UnknownSale(s)),
        Err(e) => return Err(e.into()),
    };
    match adj.status {
        AdjustmentStatus::Recorded => {}
        AdjustmentStatus::Applied => return already_applied(ledger, gate, sku, adj).await,
        AdjustmentStatus::Refused => {
            return Err(AdjustError::RefusedEarlier {
                id: adj.id,
                reason: adj.detail.unwrap_or_default(),
            })
        }
    }

    // 2. Does the server have it already? Read the server, then the ledger: any
    //    adjustment the server has was recorded before, so it is in what we read next.
    let Some(info) = gate.sale_info(sku).await? else {
        return Err(AdjustError::NotOpen(sku.to_string()));
    };
    if info.is_fenced() {
        return Err(AdjustError::NotOpen(sku.to_string()));
    }
    let allocation = current_allocation(ledger, sku).await?;
    if is_on_server(ledger, sku, &adj, info.total, allocation).await? {
        return confirm_on_server(ledger, sku, id, info.total, allocation).await;
    }

    // 3. The server.
    let new_total = send_to_server(ledger, gate, sku, id, delta).await?;
    if i128::from(new_total) != i128::from(info.total) + i128::from(delta) {
        warn!(
            sku,
            id,
            before = info.total,
            delta,
            after = new_total,
            "the server's total moved by more than this adjustment: another change ran concurrently"
        );
    }

    // 4. Confirm.
    let adj = ledger
        .finish_adjustment(
            id,
            &AdjustmentOutcome::Applied {
                server_total: Some(new_total),
            },
        )
        .await?;
    info!(sku, id, delta, new_total, "adjustment applied");
    Ok(AdjustReport {
        adjustment: adj,
        result: AdjustResult::Applied,
        allocation: current_allocation(ledger, sku).await?,
        server_total: new_total,
    })
}

/// Step 1's answer for an adjustment the ledger already confirmed.
async fn already_applied<L: Ledger, G: ReservationGate>(
    ledger: &L,
    gate: &G,
    sku: &str,
    adj: Adjustment,
) -> Result<AdjustReport, AdjustError> {
    let allocation = current_allocation(ledger, sku).await?;
    let server_total = gate.sale_info(sku).await?.map_or(-1, |i| i.total);
    Ok(AdjustReport {
        adjustment: adj,
        result: AdjustResult::AlreadyApplied,
        allocation,
        server_total,
    })
}

/// Step 2: whether the server's total already includes `adj`, judged by which of the
/// unconfirmed adjustments explain the gap between the server's total and the ledger's
/// allocation.
async fn is_on_server<L: Ledger>(
    ledger: &L,
    sku: &str,
    adj: &Adjustment,
    server_total: i64,
    allocation: u64,
) -> Result<bool, AdjustError> {
    let unconfirmed = ledger.adjustments(sku, true).await?;
    if i128::from(server_total) == i128::from(allocation) {
        return Ok(true);
    }
    match explain_total(server_total, allocation, &unconfirmed) {
        Some(missing) => Ok(!missing.iter().any(|a| a.id == adj.id)),
        None => Err(AdjustError::Unexplained {
            sku: sku.to_string(),
            server_total,
            allocation,
        }),
    }
}

/// Step 2's end when an earlier attempt got the adjustment to the server: confirmed.
async fn confirm_on_server<L: Ledger>(
    ledger: &L,
    sku: &str,
    id: &str,
    server_total: i64,
    allocation: u64,
) -> Result<AdjustReport, AdjustError> {
    warn!(
        sku,
        id, "the server already has this adjustment (an earlier attempt sent it): confirming it"
    );
    let adj = ledger
        .finish_adjustment(
            id,
            &AdjustmentOutcome::Applied {
                server_total: Some(server_total),
            },
        )
        .await?;
    Ok(AdjustReport {
        adjustment: adj,
        result: AdjustResult::AlreadyOnServer,
        allocation,
        server_total,
    })
}

/// Step 3: `SALE.ADJUST` → the server's new total. A refusal is recorded in the ledger
/// before it is returned.
async fn send_to_server<L: Ledger, G: ReservationGate>(
    ledger: &L,
    gate: &G,
    sku: &str,
    id: &str,
    delta: i64,
) -> Result<i64, AdjustError> {
    match gate.adjust(sku, delta).await {
        Ok(t) => Ok(t),
        Err(ClientError::Server { code, detail }) if code == "ERR" => {
            // Refused and nothing changed there (not enough available to withdraw, out of
            // range): the ledger must not keep an allocation the server never had.
            let reason = if detail.is_empty() { code } else { detail };
            ledger
                .finish_adjustment(
                    id,
                    &AdjustmentOutcome::Refused {
                        reason: reason.clone(),
                    },
                )
                .await?;
            Err(AdjustError::Refused {
                id: id.to_string(),
                reason,
            })
        }
        Err(ClientError::Fenced) | Err(ClientError::NoSale) => {
            Err(AdjustError::NotOpen(sku.to_string()))
        }
        Err(e) => Err(e.into()),
    }
}

async fn current_allocation<L: Ledger>(ledger: &L, sku: &str) -> Result<u64, AdjustError> {
    Ok(ledger
        .sale(sku)
        .await?
        .ok_or_else(|| AdjustError::UnknownSale(sku.to_string()))?
        .allocation)
}
