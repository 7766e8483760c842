//! The checkout flow as a library (docs/design.md, lifecycle steps 1–3 and 5):
//! reserve on the server → materialize the PENDING order → commit on payment
//! (ledger PENDING → COMMITTED first, then `COMMIT` on the server) or cancel.
//!
//! The reservation token is the correlation key everywhere, and also the payment
//! idempotency key: a second capture with the same token is the same payment.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use stockgate_core::engine::ReleaseReason;
use tracing::{error, warn};

use crate::client::ClientError;
use crate::gate::ReservationGate;
use crate::ledger::{
    Ledger, LedgerError, LedgerPay, Materialized, NewOrder, OrderStatus, PayVerdict,
};
use crate::types::{now_ms, CommitOk, ReservationState, ReserveOutcome};

/// Why a checkout step did not go through; each tells the shop what to show the buyer or retry.
#[derive(Debug, thiserror::Error)]
pub enum CheckoutError {
    /// No units left to reserve.
    #[error("sold out")]
    SoldOut,
    /// Per-user limit reached; the user's live reservations, to resume or cancel one.
    #[error(
        "per-user limit of {limit} units reached: the user holds {held} units ({} reservations \
         not yet paid)",
        live_tokens.len()
    )]
    Limit {
        /// Tokens of the user's reservations not yet paid.
        live_tokens: Vec<String>,
        /// The sale's per-user limit in units.
        limit: u32,
        /// Units the user holds now.
        held: u64,
    },
    /// The ledger already holds this reservation as cancelled (e.g. swept): the checkout
    /// cannot continue with it.
    #[error("reservation {token} is {status} in the ledger")]
    Refused {
        /// The reservation's token.
        token: String,
        /// Its status in the ledger.
        status: OrderStatus,
    },
    /// The server call failed; [`ClientError::is_transient`] says whether a retry may help.
    #[error("server: {0}")]
    Gate(#[from] ClientError),
    /// The ledger call failed.
    #[error("ledger: {0}")]
    Ledger(#[from] LedgerError),
}

/// A reservation that is materialized in the ledger: the buyer may pay for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    /// The reservation's token, the key the payment and every later step use.
    pub token: String,
    /// The sale.
    pub sku: String,
    /// The buyer.
    pub user: String,
    /// The shop's id for this reservation attempt; a retry with the same id gets the same hold.
    pub request_id: String,
    /// Units held.
    pub qty: u32,
    /// When the hold lapses unless paid, in ms since the Unix epoch.
    pub expires_at_ms: i64,
    /// A retry of an earlier RESERVE (same request id): nothing new was taken.
    pub replay: bool,
    /// Already paid (a retry after the commit).
    pub already_committed: bool,
}

/// Result of a payment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PayOutcome {
    /// Sold. `server_confirmed` is false when the ledger committed but the server could not
    /// be told yet (unreachable, fenced, or the hold's deadline passed and this gate's role
    /// may not send `COMMIT ... VERIFIED`): the sweeper's COMMITTED branch finishes it.
    Committed {
        /// Whether the server has the commit too.
        server_confirmed: bool,
    },
    /// Same token paid before (payment idempotency).
    AlreadyCommitted,
    /// Refused and no money moved: the payment must not be captured.
    Refused {
        /// The order's status in the ledger, if it has one.
        status: Option<OrderStatus>,
    },
    /// Refused and no money moved: the buyer's paid units of the split sale this order
    /// is a part of would exceed the parent's per-user limit (docs/cluster.md, "A split
    /// sale"). The order stays PENDING and its hold live: release it (or let it expire).
    Limit,
    /// Money moved for a reservation that was no longer ours to sell (late, cancelled,
    /// or over a split sale's per-user limit): to be refunded.
    RefundRequired {
        /// The status the order had when the payment arrived.
        previous: OrderStatus,
    },
}

/// The checkout service over a ledger and a gate.
#[derive(Clone)]
pub struct Checkout<L: Ledger, G: ReservationGate> {
    ledger: L,
    gate: G,
    /// Set once the server refused `COMMIT ... VERIFIED` to this gate's role.
    plain_commit_only: Arc<AtomicBool>,
}

/// The hold RESERVE took or found, as `(token, expires_at_ms, replay)`; a refusal as its
/// [`CheckoutError`].
fn taken_hold(outcome: ReserveOutcome) -> Result<(String, i64, bool), CheckoutError> {
    match outcome {
        ReserveOutcome::Reserved {
            token,
            expires_at_ms,
            ..
        } => Ok((token, expires_at_ms, false)),
        ReserveOutcome::Replay {
            token,
            expires_at_ms,
            ..
        } => Ok((token, expires_at_ms, true)),
        ReserveOutcome::SoldOut => Err(CheckoutError::SoldOut),
        ReserveOutcome::Limit {
            live_tokens,
            limit,
            held,
        } => Err(CheckoutError::Limit {
            live_tokens,
            limit,
            held,
        }),
    }
}

impl<L: Ledger, G: ReservationGate> Checkout<L, G> {
    /// A checkout over `ledger` (the record of orders) and `gate` (the server, or an embedded
    /// engine).
    pub fn new(ledger: L, gate: G) -> Self {
        Checkout {
            ledger,
            gate,
            plain_commit_only: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The ledger, for reads the flow does not wrap (order lookups, reports).
    pub fn ledger(&self) -> &L {
        &self.ledger
    }

    /// The gate, for calls the flow does not wrap.
    pub fn gate(&self) -> &G {
        &self.gate
    }

    /// Reserve on the server, then materialize the PENDING order. Retry-safe: the same
    /// `request_id` yields the same token, and materialize is idempotent.
    pub async fn start(
        &self,
        sku: &str,
        user: &str,
        admission: &str,
        request_id: &str,
        qty: u32,
    ) -> Result<Hold, CheckoutError> {
        let outcome = self
            .gate
            .reserve(sku, user, admission, request_id, qty)
            .await?;
        let (token, expires_at_ms, replay) = taken_hold(outcome)?;
        let (qty, created_at_ms, expires_at_ms) =
            self.read_back(&token, replay, qty, expires_at_ms).await?;
        let order = NewOrder {
            token: token.clone(),
            sku: sku.to_string(),
            user: user.to_string(),
            request_id: request_id.to_string(),
            qty,
            expires_at_ms,
            created_at_ms,
        };
        let m = self.materialize(&order).await?;
        if m == Materialized::AlreadyCommitted && !replay {
            self.release_new_hold_of_paid_request(&order).await?;
        }
        Ok(Hold {
            token,
            sku: order.sku,
            user: order.user,
            request_id: order.request_id,
            qty,
            expires_at_ms,
            replay,
            already_committed: m == Materialized::AlreadyCommitted,
        })
    }

    /// The new hold's `(qty, created_at_ms, expires_at_ms)` as the server recorded it. Read
    /// back: a replay's qty and times are the original's, not this request's; and the
    /// server's exact creation time is what identifies this hold later (see
    /// `Ledger::is_hold`), so the ledger records the server's, not ours.
    async fn read_back(
        &self,
        token: &str,
        replay: bool,
        qty: u32,
        expires_at_ms: i64,
    ) -> Result<(u32, i64, i64), CheckoutError> {
        match self.gate.reservation(token).await {
            Ok(Some(r)) => Ok((r.qty, r.created_at_ms, r.expires_at_ms)),
            Ok(None) => Ok((qty, now_ms(), expires_at_ms)),
            // The hold exists; an approximate creation time only weakens the identity
            // check to the expiry, which is exact. Do not fail the checkout for it.
            Err(e) if !replay => {
                warn!(token = %token, error = %e, "could not read the new reservation back");
                Ok((qty, now_ms(), expires_at_ms))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The server took stock again for a request that is already paid: it no longer knew
    /// the paid hold (purged by retention, or lost and rebuilt without it), so this new
    /// hold is not the one the payment paid for. Give its units back now rather than
    /// letting it sit until the sweeper finds it.
    async fn release_new_hold_of_paid_request(
        &self,
        order: &NewOrder,
    ) -> Result<(), CheckoutError> {
        let (token, sku, user, request_id) = (
            order.token.as_str(),
            order.sku.as_str(),
            order.user.as_str(),
            order.request_id.as_str(),
        );
        error!(token = %token, sku, user, request_id, "a paid request took a new hold on the server: releasing it");
        self.gate.release(token, None).await?;
        Ok(())
    }

    /// Materialize alone (for callers that reserve elsewhere). Refused if the token was
    /// already cancelled — in particular tombstoned by a sweeper.
    pub async fn materialize(&self, order: &NewOrder) -> Result<Materialized, CheckoutError> {
        match self.ledger.materialize(order).await {
            Ok(m) => Ok(m),
            Err(LedgerError::Refused { token, status }) => {
                Err(CheckoutError::Refused { token, status })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// A payment for `token`. `money_moved`: the provider already took the money (a
    /// capture webhook, a one-step charge); false for authorize-then-capture, where a
    /// refusal simply means "do not capture".
    ///
    /// Ledger first, in one call of the ledger's payment step ([`Ledger::pay`],
    /// `pay_order`): PENDING → COMMITTED only while the reservation is unexpired; then
    /// `COMMIT` on the server. A late or cancelled reservation is refused; if money
    /// moved, the ledger marks the order REFUND_REQUIRED in the same step — never a sale
    /// beyond stock.
    pub async fn pay(
        &self,
        token: &str,
        payment_ref: &str,
        money_moved: bool,
    ) -> Result<PayOutcome, CheckoutError> {
        let paid = match self.ledger.pay(token, payment_ref, money_moved).await {
            Ok(p) => p,
            Err(LedgerError::Refused { token, status }) => {
                return Err(CheckoutError::Refused { token, status })
            }
            Err(e) => return Err(e.into()),
        };
        let fresh = match ledger_pay_step(token, money_moved, paid)? {
            ControlFlow::Continue(fresh) => fresh,
            ControlFlow::Break(outcome) => return Ok(outcome),
        };
        if !fresh && !self.server_holds_this_payment(token).await? {
            // A retry of a payment the ledger already has, and the server's hold for this
            // token (if any) is not the one it paid for: committing it would sell a unit
            // twice. The paid units are already counted.
            return Ok(PayOutcome::AlreadyCommitted);
        }
        self.pay_on_server(token, payment_ref, fresh).await
    }

    /// The server step of [`Checkout::pay`], once the ledger committed the payment
    /// (`fresh`: by this call, not an earlier one): `COMMIT`, and what its answer means
    /// for the buyer.
    async fn pay_on_server(
        &self,
        token: &str,
        payment_ref: &str,
        fresh: bool,
    ) -> Result<PayOutcome, CheckoutError> {
        match self.commit_on_server(token).await {
            Ok(CommitOk::Committed) => Ok(if fresh {
                PayOutcome::Committed {
                    server_confirmed: true,
                }
            } else {
                PayOutcome::AlreadyCommitted
            }),
            Ok(CommitOk::AlreadyCommitted) => Ok(PayOutcome::AlreadyCommitted),
            Err(ClientError::Released) => {
                // The units went back to stock and may be sold again: this sale cannot
                // stand. (Cannot happen while everyone follows the ledger-first rule.)
                error!(token = %token, "ledger committed but server had released: REFUND_REQUIRED");
                let previous = self
                    .ledger
                    .mark_refund_required(token, Some(payment_ref), "server released the units")
                    .await?;
                Ok(PayOutcome::RefundRequired { previous })
            }
            Err(ClientError::NoReservation) if fresh => {
                // The server does not hold this reservation (lost and rebuilt without it):
                // its units were counted as available again.
                error!(token = %token, "ledger committed but server has no reservation: REFUND_REQUIRED");
                let previous = self
                    .ledger
                    .mark_refund_required(
                        token,
                        Some(payment_ref),
                        "server has no such reservation",
                    )
                    .await?;
                Ok(PayOutcome::RefundRequired { previous })
            }
            // A retry long after the sale (the server purged its record): the ledger
            // already holds the truth.
            Err(ClientError::NoReservation) => Ok(PayOutcome::AlreadyCommitted),
            // `Expired`: the payment was accepted in time but this connection may not say
            // so (see `commit_on_server`); the sweeper, which may, commits the late hold.
            Err(e)
                if e.is_transient() || matches!(e, ClientError::Fenced | ClientError::Expired) =>
            {
                warn!(token = %token, error = %e, "ledger committed; server COMMIT deferred to the sweeper");
                Ok(if fresh {
                    PayOutcome::Committed {
                        server_confirmed: false,
                    }
                } else {
                    PayOutcome::AlreadyCommitted
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// `COMMIT` after the ledger committed the payment under its expiry guard: the
    /// payment was in time even if this COMMIT arrives after the hold's deadline, so it
    /// is sent `VERIFIED`. A connection whose role may not state that (`checkout`: only
    /// sweeper and admin may) gets `-NOPERM` once, and from then on sends the plain form,
    /// which commits holds still within their deadline.
    async fn commit_on_server(&self, token: &str) -> Result<CommitOk, ClientError> {
        if !self.plain_commit_only.load(Ordering::Relaxed) {
            match self.gate.commit_verified(token).await {
                Err(ClientError::Server { code, .. }) if code == "NOPERM" => {
                    self.plain_commit_only.store(true, Ordering::Relaxed);
                }
                other => return other,
            }
        }
        self.gate.commit(token).await
    }

    /// For a payment already committed in the ledger: whether the server's reservation for
    /// `token` is the hold that payment paid for (so `COMMIT` may finish it). A RESERVED
    /// hold that is not is released (nobody paid for it); an unknown token (purged after
    /// retention) has nothing to finish.
    async fn server_holds_this_payment(&self, token: &str) -> Result<bool, CheckoutError> {
        let Some(r) = self.gate.reservation(token).await? else {
            return Ok(false);
        };
        if self.ledger.is_hold(token, &r).await? {
            return Ok(true);
        }
        error!(
            token = %token,
            state = r.state.as_str(),
            server_created_at_ms = r.created_at_ms,
            server_expires_at_ms = r.expires_at_ms,
            "paid order, but the server's hold for its token is another one: not committing it"
        );
        if r.state == ReservationState::Reserved {
            self.gate.release(token, None).await?;
        }
        Ok(false)
    }

    /// Buyer abandons: ledger PENDING → CANCELLED first, then `RELEASE`, so the units are
    /// back at once. If this dies in between, the sweeper finds the CANCELLED order when the
    /// reservation expires and releases it.
    pub async fn cancel(&self, token: &str) -> Result<bool, CheckoutError> {
        match self.ledger.cancel(token).await {
            Ok(()) => {}
            Err(LedgerError::Refused { token, status }) => {
                return Err(CheckoutError::Refused { token, status })
            }
            Err(e) => return Err(e.into()),
        }
        Ok(self
            .gate
            .release(token, Some(ReleaseReason::Cancel))
            .await?)
    }

    /// Extend the hold: server first (it refuses expired reservations), then the ledger.
    /// If the ledger step fails, the ledger keeps the earlier deadline, which only makes it
    /// stricter (a payment between the two deadlines is refused), never looser.
    pub async fn extend(&self, token: &str, ms: u64) -> Result<i64, CheckoutError> {
        let at = self.gate.extend(token, ms).await?;
        self.ledger.extend(token, at).await?;
        Ok(at)
    }
}

/// What the ledger's payment step decided for [`Checkout::pay`]: go on to the server
/// (`true` when this call committed the order, `false` when an earlier one did), or the
/// outcome already.
fn ledger_pay_step(
    token: &str,
    money_moved: bool,
    paid: LedgerPay,
) -> Result<ControlFlow<PayOutcome, bool>, CheckoutError> {
    Ok(match (paid.verdict, paid.previous) {
        (PayVerdict::Committed, _) => ControlFlow::Continue(true),
        (PayVerdict::AlreadyCommitted, _) => ControlFlow::Continue(false),
        (PayVerdict::Refused, status) => ControlFlow::Break(PayOutcome::Refused { status }),
        (PayVerdict::Limit, _) => ControlFlow::Break(PayOutcome::Limit),
        (PayVerdict::RefundRequired, Some(previous)) => {
            ControlFlow::Break(PayOutcome::RefundRequired { previous })
        }
        (PayVerdict::RefundRequired, None) => {
            return Err(LedgerError::Corrupt(format!(
                "pay_order marked {token} REFUND_REQUIRED without a previous status"
            ))
            .into())
        }
        (PayVerdict::NotFound, _) => {
            if money_moved {
                // No order to attach the compensation to: the caller must handle it.
                error!(token = %token, "money moved for a reservation the ledger never saw");
            }
            ControlFlow::Break(PayOutcome::Refused { status: None })
        }
    })
}
