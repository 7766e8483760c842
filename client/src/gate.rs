//! The reservation gate as the checkout flow, the sweeper and the rebuild see it: one
//! trait, two transports — the TCP server ([`StockgateClient`]) and the engine embedded
//! in-process ([`EngineGate`]) — so the lifecycle logic is written once.
//!
//! Errors use [`ClientError`] for both: the embedded engine's errors map onto the same
//! protocol errors the server would have sent.

use std::future::Future;
use std::sync::Arc;

use futures::future::join_all;
use stockgate_core::durable::WaitDurable;
use stockgate_core::engine::error::EngineError;
use stockgate_core::engine::types::{
    PaymentCheck, ReservationState as EngineState, ReservationView, SaleView,
};
use stockgate_core::engine::{
    Engine, Lsn, ReleaseReason, ReserveOutcome as EngineOutcome, ReserveRequest,
};

use crate::client::{ClientError, StockgateClient};
use crate::types::{
    CommitOk, ExpiredReservation, ReservationInfo, ReservationState, ReserveOutcome, SaleInfo,
    SaleRecord,
};

/// What the lifecycle needs from the server. Implementations are cheap to clone.
pub trait ReservationGate: Clone + Send + Sync + 'static {
    /// `RESERVE sku user admission request_id qty`: holds `qty` units for `user`; a repeated
    /// `request_id` returns the first reservation instead of taking more.
    fn reserve(
        &self,
        sku: &str,
        user: &str,
        admission: &str,
        request_id: &str,
        qty: u32,
    ) -> impl Future<Output = Result<ReserveOutcome, ClientError>> + Send;

    /// `EXPIRED [COUNT count] [SKU sku]`: RESERVED holds past their deadline, for the sweeper to
    /// release.
    fn expired(
        &self,
        count: usize,
        sku: Option<&str>,
    ) -> impl Future<Output = Result<Vec<ExpiredReservation>, ClientError>> + Send;

    /// `RELEASE token [REASON reason]`; `None` lets the server derive the reason from
    /// the hold's deadline. The reason reaches the feed entry only.
    fn release(
        &self,
        token: &str,
        reason: Option<ReleaseReason>,
    ) -> impl Future<Output = Result<bool, ClientError>> + Send;

    /// `COMMIT token`: refused with [`ClientError::Expired`] past the hold's expiry.
    fn commit(&self, token: &str) -> impl Future<Output = Result<CommitOk, ClientError>> + Send;

    /// `COMMIT token VERIFIED`: for callers whose ledger accepted the payment before the
    /// deadline (the checkout flow after its guarded ledger commit, the sweeper's cleanup
    /// of paid orders); a hold past its expiry still commits.
    fn commit_verified(
        &self,
        token: &str,
    ) -> impl Future<Output = Result<CommitOk, ClientError>> + Send;

    /// `RESERVATION token`; `Ok(None)` when the server does not know the token.
    fn reservation(
        &self,
        token: &str,
    ) -> impl Future<Output = Result<Option<ReservationInfo>, ClientError>> + Send;

    /// `EXTEND token ms`: sets the hold's deadline to `ms` ms from now; the result is the new
    /// deadline in ms since the Unix epoch.
    fn extend(&self, token: &str, ms: u64)
        -> impl Future<Output = Result<i64, ClientError>> + Send;

    /// `SALE.INFO`; `Ok(None)` when the server does not know the sale (-NOSALE).
    fn sale_info(
        &self,
        sku: &str,
    ) -> impl Future<Output = Result<Option<SaleInfo>, ClientError>> + Send;

    /// `SALE.LIST`: the keys of every sale the server holds.
    fn sale_list(&self) -> impl Future<Output = Result<Vec<String>, ClientError>> + Send;

    /// The server's history id (`stockgate_ledger::identity`); `None` while it reports none.
    fn history(&self) -> impl Future<Output = Result<Option<String>, ClientError>> + Send;

    /// `SALE.ADJUST sku delta` → new total. Use `stockgate_ledger::adjust::adjust_sale`, which
    /// writes the ledger first; this is its server step.
    fn adjust(
        &self,
        sku: &str,
        delta: i64,
    ) -> impl Future<Output = Result<i64, ClientError>> + Send;

    /// `SALE.FENCE` with the ledger's parameters (so a server that lost the sale gets it
    /// back fenced, with 0 available).
    fn fence(&self, sale: &SaleRecord) -> impl Future<Output = Result<(), ClientError>> + Send;

    /// `SALE.RESTORE ... STATE state` → (newly restored, server-derived token). A token
    /// the server already holds is left as it is (`false`), whatever `state` says.
    #[allow(clippy::too_many_arguments)]
    fn restore(
        &self,
        sku: &str,
        user: &str,
        request_id: &str,
        qty: u32,
        expires_at_ms: i64,
        created_at_ms: i64,
        state: ReservationState,
    ) -> impl Future<Output = Result<(bool, String), ClientError>> + Send;

    /// `SALE.REBUILD` → available.
    fn rebuild(
        &self,
        sku: &str,
        total: u64,
        committed: u64,
        fingerprint: &str,
    ) -> impl Future<Output = Result<i64, ClientError>> + Send;

    /// Release many (concurrently; over TCP they are pipelined on one connection).
    fn release_many(
        &self,
        tokens: &[String],
        reason: Option<ReleaseReason>,
    ) -> impl Future<Output = Vec<Result<bool, ClientError>>> + Send {
        async move { join_all(tokens.iter().map(|t| self.release(t, reason))).await }
    }

    /// Commit many ledger-verified payments (concurrently), as [`Self::commit_verified`].
    fn commit_verified_many(
        &self,
        tokens: &[String],
    ) -> impl Future<Output = Vec<Result<CommitOk, ClientError>>> + Send {
        async move { join_all(tokens.iter().map(|t| self.commit_verified(t))).await }
    }
}

impl ReservationGate for StockgateClient {
    async fn reserve(
        &self,
        sku: &str,
        user: &str,
        admission: &str,
        request_id: &str,
        qty: u32,
    ) -> Result<ReserveOutcome, ClientError> {
        StockgateClient::reserve(self, sku, user, admission, request_id, qty).await
    }
    async fn expired(
        &self,
        count: usize,
        sku: Option<&str>,
    ) -> Result<Vec<ExpiredReservation>, ClientError> {
        StockgateClient::expired(self, count, sku).await
    }
    async fn release(
        &self,
        token: &str,
        reason: Option<ReleaseReason>,
    ) -> Result<bool, ClientError> {
        StockgateClient::release_as(self, token, reason).await
    }
    async fn commit(&self, token: &str) -> Result<CommitOk, ClientError> {
        StockgateClient::commit(self, token).await
    }
    async fn commit_verified(&self, token: &str) -> Result<CommitOk, ClientError> {
        StockgateClient::commit_verified(self, token).await
    }
    async fn reservation(&self, token: &str) -> Result<Option<ReservationInfo>, ClientError> {
        StockgateClient::reservation(self, token).await
    }
    async fn extend(&self, token: &str, ms: u64) -> Result<i64, ClientError> {
        StockgateClient::extend(self, token, ms).await
    }
    async fn sale_info(&self, sku: &str) -> Result<Option<SaleInfo>, ClientError> {
        match StockgateClient::sale_info(self, sku).await {
            Ok(i) => Ok(Some(i)),
            Err(ClientError::NoSale) => Ok(None),
            Err(e) => Err(e),
        }
    }
    async fn sale_list(&self) -> Result<Vec<String>, ClientError> {
        StockgateClient::sale_list(self).await
    }
    async fn history(&self) -> Result<Option<String>, ClientError> {
        StockgateClient::history(self).await
    }
    async fn adjust(&self, sku: &str, delta: i64) -> Result<i64, ClientError> {
        self.sale_adjust(sku, delta).await
    }
    async fn fence(&self, sale: &SaleRecord) -> Result<(), ClientError> {
        self.sale_fence(
            &sale.sku,
            Some(sale.allocation),
            sale.shards,
            sale.ttl_ms,
            sale.per_user_limit,
        )
        .await
    }
    async fn restore(
        &self,
        sku: &str,
        user: &str,
        request_id: &str,
        qty: u32,
        expires_at_ms: i64,
        created_at_ms: i64,
        state: ReservationState,
    ) -> Result<(bool, String), ClientError> {
        self.sale_restore(
            sku,
            user,
            request_id,
            qty,
            expires_at_ms,
            created_at_ms,
            state,
        )
        .await
    }
    async fn rebuild(
        &self,
        sku: &str,
        total: u64,
        committed: u64,
        fingerprint: &str,
    ) -> Result<i64, ClientError> {
        self.sale_rebuild(sku, total, committed, fingerprint).await
    }
}

/// The engine embedded in-process (no TCP). The engine is synchronous and fast, so its
/// calls run inline on the async task.
///
/// With a durability waiter ([`EngineGate::with_durability`]; the WAL's is
/// `stockgate_server::persist::WalDurability`) every call returns only once the log
/// position its answer depends on is durable, as the TCP server answers only after the
/// log acknowledged: the LSN the engine call returned, or — for answers that report a
/// state without an LSN of their own (errors, no-ops, lists, SALE.INFO) — the highest
/// LSN assigned so far, which covers whatever record made that state. Without a waiter
/// (an engine over a `NullSink`) nothing is waited for.
#[derive(Clone)]
pub struct EngineGate {
    engine: Arc<Engine>,
    durability: Option<Arc<dyn WaitDurable>>,
}

impl EngineGate {
    /// An engine whose log needs no waiting (a `NullSink`, tests).
    pub fn new(engine: Arc<Engine>) -> Self {
        EngineGate {
            engine,
            durability: None,
        }
    }

    /// An engine writing a log: every answer waits until what it reports is durable.
    pub fn with_durability(engine: Arc<Engine>, durability: Arc<dyn WaitDurable>) -> Self {
        EngineGate {
            engine,
            durability: Some(durability),
        }
    }

    /// The engine behind this gate, for callers that also administer or inspect it directly.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Wait until `lsn` is durable; 0 (the engine's "no record of its own") means the
    /// answer rests on whatever was logged before it: wait for the last LSN assigned.
    async fn durable(&self, lsn: Lsn) -> Result<(), ClientError> {
        let Some(d) = &self.durability else {
            return Ok(());
        };
        let lsn = if lsn == 0 {
            self.engine.last_lsn()
        } else {
            lsn
        };
        if lsn == 0 {
            return Ok(());
        }
        d.wait(lsn)
            .await
            .map_err(|e| ClientError::NotDurable(e.to_string()))
    }

    /// An answer without an LSN of its own (a read, a list, an error): it may report a
    /// state whose record is still in flight, so wait for everything assigned so far.
    async fn durable_now(&self) -> Result<(), ClientError> {
        self.durable(0).await
    }

    async fn commit_with(&self, token: &str, check: PaymentCheck) -> Result<CommitOk, ClientError> {
        match self.settle(self.engine.commit_with(token, check)).await? {
            true => Ok(CommitOk::Committed),
            false => Ok(CommitOk::AlreadyCommitted),
        }
    }

    /// An engine result: on success wait for its LSN, on error for the last LSN (the
    /// error — RELEASED, NORES, EXPIRED, FENCED... — reports a state too).
    async fn settle<T>(&self, r: Result<(T, Lsn), EngineError>) -> Result<T, ClientError> {
        match r {
            Ok((v, lsn)) => {
                self.durable(lsn).await?;
                Ok(v)
            }
            Err(e) => {
                self.durable_now().await?;
                Err(engine_error(e))
            }
        }
    }
}

impl std::fmt::Debug for EngineGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineGate")
            .field("durable", &self.durability.is_some())
            .finish()
    }
}

/// The protocol error the server would have answered for an engine error.
pub fn engine_error(e: EngineError) -> ClientError {
    match e {
        EngineError::NoSale => ClientError::NoSale,
        EngineError::Fenced => ClientError::Fenced,
        EngineError::Paused => ClientError::Paused,
        EngineError::Denied(why) => ClientError::Denied(why.to_string()),
        EngineError::Exists => ClientError::Exists,
        EngineError::NoReservation => ClientError::NoReservation,
        EngineError::Expired | EngineError::LateCommit { .. } => ClientError::Expired,
        EngineError::Released => ClientError::Released,
        other => ClientError::Server {
            code: "ERR".into(),
            detail: other.to_string(),
        },
    }
}

fn ms_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn ms_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn state_of(s: EngineState) -> ReservationState {
    match s {
        EngineState::Reserved => ReservationState::Reserved,
        EngineState::Committed => ReservationState::Committed,
        EngineState::Released => ReservationState::Released,
    }
}

fn engine_state_of(s: ReservationState) -> EngineState {
    match s {
        ReservationState::Reserved => EngineState::Reserved,
        ReservationState::Committed => EngineState::Committed,
        ReservationState::Released => EngineState::Released,
    }
}

fn info_of(v: ReservationView) -> ReservationInfo {
    ReservationInfo {
        token: v.token,
        sku: v.sku,
        user: v.user,
        request_id: v.request_id,
        qty: v.qty,
        shard: v.shard,
        state: state_of(v.state),
        expires_at_ms: ms_i64(v.expires_at_ms),
        created_at_ms: ms_i64(v.created_at_ms),
    }
}

/// SALE.INFO's fields from the engine's view.
pub fn sale_info_of(v: &SaleView, key_fingerprint: &str) -> SaleInfo {
    SaleInfo {
        total: ms_i64(v.total),
        available: v.available,
        reserved: ms_i64(v.reserved),
        committed: ms_i64(v.committed),
        shards: i64::from(v.params.shards),
        ttl_ms: ms_i64(v.params.ttl_ms),
        limit: i64::from(v.params.limit),
        state: v.state.as_str().to_string(),
        key_fingerprint: key_fingerprint.to_string(),
        shard_available: v.shard_available.clone(),
    }
}

impl ReservationGate for EngineGate {
    async fn reserve(
        &self,
        sku: &str,
        user: &str,
        admission: &str,
        request_id: &str,
        qty: u32,
    ) -> Result<ReserveOutcome, ClientError> {
        let req = ReserveRequest {
            sku,
            user,
            admission: admission.as_bytes(),
            request_id,
            qty,
        };
        // SOLDOUT and LIMIT carry LSN 0: LIMIT names live tokens whose records may still be
        // in flight, so `settle` waits for the last LSN then.
        let out = self.settle(self.engine.reserve(&req)).await?;
        Ok(match out {
            EngineOutcome::Reserved {
                token,
                expires_at_ms,
                shard,
            } => ReserveOutcome::Reserved {
                token: token.to_string(),
                expires_at_ms: ms_i64(expires_at_ms),
                shard,
            },
            EngineOutcome::Replay {
                token,
                expires_at_ms,
                shard,
            } => ReserveOutcome::Replay {
                token: token.to_string(),
                expires_at_ms: ms_i64(expires_at_ms),
                shard,
            },
            EngineOutcome::SoldOut => ReserveOutcome::SoldOut,
            EngineOutcome::Limit { live, limit, held } => ReserveOutcome::Limit {
                live_tokens: live.iter().map(|t| t.to_string()).collect(),
                limit,
                held,
            },
        })
    }

    async fn expired(
        &self,
        count: usize,
        sku: Option<&str>,
    ) -> Result<Vec<ExpiredReservation>, ClientError> {
        let list = self.engine.expired(count, sku);
        self.durable_now().await?;
        Ok(list
            .into_iter()
            .map(|v| ExpiredReservation {
                token: v.token,
                sku: v.sku,
                user: v.user,
                qty: v.qty,
                shard: v.shard,
                expires_at_ms: ms_i64(v.expires_at_ms),
            })
            .collect())
    }

    async fn release(
        &self,
        token: &str,
        reason: Option<ReleaseReason>,
    ) -> Result<bool, ClientError> {
        // `:0` carries the LSN of the record that finished the reservation (or 0 for an
        // unknown token): "already released" is a state too.
        let (released, lsn) = self.engine.release_with(token, reason);
        self.durable(lsn).await?;
        Ok(released)
    }

    async fn commit(&self, token: &str) -> Result<CommitOk, ClientError> {
        self.commit_with(token, PaymentCheck::Unverified).await
    }

    async fn commit_verified(&self, token: &str) -> Result<CommitOk, ClientError> {
        self.commit_with(token, PaymentCheck::LedgerVerified).await
    }

    async fn reservation(&self, token: &str) -> Result<Option<ReservationInfo>, ClientError> {
        match self.engine.reservation(token) {
            Some((v, lsn)) => {
                self.durable(lsn).await?;
                Ok(Some(info_of(v)))
            }
            None => {
                // "Unknown" may be a purge still in flight.
                self.durable_now().await?;
                Ok(None)
            }
        }
    }

    async fn extend(&self, token: &str, ms: u64) -> Result<i64, ClientError> {
        self.settle(self.engine.extend(token, ms)).await.map(ms_i64)
    }

    async fn history(&self) -> Result<Option<String>, ClientError> {
        // An embedded engine begins its history on first use, as a server does on its
        // first start, durably before anyone binds to it.
        let lsn = match self.engine.history() {
            Some((_, lsn)) => lsn,
            None => self
                .engine
                .begin_history(&stockgate_core::engine::new_history_id()),
        };
        self.durable(lsn).await?;
        Ok(self.engine.history().map(|(id, _)| id.to_string()))
    }

    async fn sale_info(&self, sku: &str) -> Result<Option<SaleInfo>, ClientError> {
        let r = self.engine.sale_info(sku);
        self.durable_now().await?;
        match r {
            Ok(v) => Ok(Some(sale_info_of(&v, self.engine.key_fingerprint()))),
            Err(EngineError::NoSale) => Ok(None),
            Err(e) => Err(engine_error(e)),
        }
    }

    async fn sale_list(&self) -> Result<Vec<String>, ClientError> {
        let list = self.engine.list_sales();
        self.durable_now().await?;
        Ok(list)
    }

    async fn adjust(&self, sku: &str, delta: i64) -> Result<i64, ClientError> {
        // ADJUST 0 answers the total with LSN 0: `settle` waits for the last LSN then.
        self.settle(self.engine.adjust(sku, delta))
            .await
            .map(ms_i64)
    }

    async fn fence(&self, sale: &SaleRecord) -> Result<(), ClientError> {
        let r = self.engine.fence(
            &sale.sku,
            Some(sale.allocation),
            sale.shards,
            sale.ttl_ms,
            sale.per_user_limit,
        );
        self.settle(r.map(|lsn| ((), lsn))).await
    }

    async fn restore(
        &self,
        sku: &str,
        user: &str,
        request_id: &str,
        qty: u32,
        expires_at_ms: i64,
        created_at_ms: i64,
        state: ReservationState,
    ) -> Result<(bool, String), ClientError> {
        let r = self
            .engine
            .restore(
                sku,
                user,
                request_id,
                qty,
                ms_u64(expires_at_ms),
                ms_u64(created_at_ms),
                engine_state_of(state),
            )
            .map(|(n, t, lsn)| ((n, t.to_string()), lsn));
        self.settle(r).await
    }

    async fn rebuild(
        &self,
        sku: &str,
        total: u64,
        committed: u64,
        fingerprint: &str,
    ) -> Result<i64, ClientError> {
        self.settle(self.engine.rebuild(sku, total, committed, fingerprint))
            .await
    }
}
