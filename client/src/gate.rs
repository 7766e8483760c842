//! The reservation gate as the checkout flow, the sweeper and the rebuild see it: one
//! trait, two transports — the TCP server ([`StockgateClient`]) and the engine embedded
//! in-process ([`EngineGate`]) — so the lifecycle logic is written once.
//!
//! Errors use [`ClientError`] for both: the embedded engine's errors map onto the same
//! protocol errors the server would have sent.

use std::future::Future;
use std::sync::Arc;

use futures::future::join_all;
use stockgate_server::engine::error::EngineError;
use stockgate_server::engine::types::{ResState, ReservationView, SaleView};
use stockgate_server::engine::{Engine, ReserveOutcome as EngineOutcome, ReserveRequest};

use crate::client::{ClientError, StockgateClient};
use crate::ledger::SaleRecord;
use crate::types::{
    CommitOk, ExpiredReservation, ReservationInfo, ReservationState, ReserveOutcome, SaleInfo,
};

/// What the lifecycle needs from the server. Implementations are cheap to clone.
pub trait ReservationGate: Clone + Send + Sync + 'static {
    fn reserve(
        &self,
        sku: &str,
        user: &str,
        admission: &str,
        request_id: &str,
        qty: u32,
    ) -> impl Future<Output = Result<ReserveOutcome, ClientError>> + Send;

    fn expired(
        &self,
        count: usize,
        sku: Option<&str>,
    ) -> impl Future<Output = Result<Vec<ExpiredReservation>, ClientError>> + Send;

    fn release(&self, token: &str) -> impl Future<Output = Result<bool, ClientError>> + Send;

    fn commit(&self, token: &str) -> impl Future<Output = Result<CommitOk, ClientError>> + Send;

    fn reservation(
        &self,
        token: &str,
    ) -> impl Future<Output = Result<Option<ReservationInfo>, ClientError>> + Send;

    fn extend(&self, token: &str, ms: u64)
        -> impl Future<Output = Result<i64, ClientError>> + Send;

    /// `SALE.INFO`; `Ok(None)` when the server does not know the sale (-NOSALE).
    fn sale_info(
        &self,
        sku: &str,
    ) -> impl Future<Output = Result<Option<SaleInfo>, ClientError>> + Send;

    fn sale_list(&self) -> impl Future<Output = Result<Vec<String>, ClientError>> + Send;

    /// `SALE.FENCE` with the ledger's parameters (so a server that lost the sale gets it
    /// back fenced, with 0 available).
    fn fence(&self, sale: &SaleRecord) -> impl Future<Output = Result<(), ClientError>> + Send;

    /// `SALE.RESTORE` → (newly restored, server-derived token).
    fn restore(
        &self,
        sku: &str,
        user: &str,
        request_id: &str,
        qty: u32,
        expires_at_ms: i64,
        created_at_ms: i64,
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
    ) -> impl Future<Output = Vec<Result<bool, ClientError>>> + Send {
        async move { join_all(tokens.iter().map(|t| self.release(t))).await }
    }

    /// Commit many (concurrently).
    fn commit_many(
        &self,
        tokens: &[String],
    ) -> impl Future<Output = Vec<Result<CommitOk, ClientError>>> + Send {
        async move { join_all(tokens.iter().map(|t| self.commit(t))).await }
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
    async fn release(&self, token: &str) -> Result<bool, ClientError> {
        StockgateClient::release(self, token).await
    }
    async fn commit(&self, token: &str) -> Result<CommitOk, ClientError> {
        StockgateClient::commit(self, token).await
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
    async fn fence(&self, sale: &SaleRecord) -> Result<(), ClientError> {
        self.sale_fence(
            &sale.sku,
            Some(sale.initial_allocation),
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
    ) -> Result<(bool, String), ClientError> {
        self.sale_restore(sku, user, request_id, qty, expires_at_ms, created_at_ms)
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

/// The engine embedded in-process (no TCP). The engine is synchronous and fast (no I/O
/// when built with a null sink), so its calls run inline on the async task.
#[derive(Clone)]
pub struct EngineGate {
    engine: Arc<Engine>,
}

impl EngineGate {
    pub fn new(engine: Arc<Engine>) -> Self {
        EngineGate { engine }
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }
}

impl std::fmt::Debug for EngineGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EngineGate")
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
        EngineError::Expired => ClientError::Expired,
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

fn state_of(s: ResState) -> ReservationState {
    match s {
        ResState::Reserved => ReservationState::Reserved,
        ResState::Committed => ReservationState::Committed,
        ResState::Released => ReservationState::Released,
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
            admission,
            request_id,
            qty,
        };
        let (out, _lsn) = self.engine.reserve(&req).map_err(engine_error)?;
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
            EngineOutcome::Limit { live } => ReserveOutcome::Limit {
                live_tokens: live.iter().map(|t| t.to_string()).collect(),
            },
        })
    }

    async fn expired(
        &self,
        count: usize,
        sku: Option<&str>,
    ) -> Result<Vec<ExpiredReservation>, ClientError> {
        Ok(self
            .engine
            .expired(count, sku)
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

    async fn release(&self, token: &str) -> Result<bool, ClientError> {
        Ok(self.engine.release(token).0)
    }

    async fn commit(&self, token: &str) -> Result<CommitOk, ClientError> {
        match self.engine.commit(token).map_err(engine_error)? {
            (true, _) => Ok(CommitOk::Committed),
            (false, _) => Ok(CommitOk::AlreadyCommitted),
        }
    }

    async fn reservation(&self, token: &str) -> Result<Option<ReservationInfo>, ClientError> {
        Ok(self.engine.reservation(token).map(|(v, _)| info_of(v)))
    }

    async fn extend(&self, token: &str, ms: u64) -> Result<i64, ClientError> {
        self.engine
            .extend(token, ms)
            .map(|(at, _)| ms_i64(at))
            .map_err(engine_error)
    }

    async fn sale_info(&self, sku: &str) -> Result<Option<SaleInfo>, ClientError> {
        match self.engine.sale_info(sku) {
            Ok(v) => Ok(Some(sale_info_of(&v, self.engine.key_fingerprint()))),
            Err(EngineError::NoSale) => Ok(None),
            Err(e) => Err(engine_error(e)),
        }
    }

    async fn sale_list(&self) -> Result<Vec<String>, ClientError> {
        Ok(self.engine.list_sales())
    }

    async fn fence(&self, sale: &SaleRecord) -> Result<(), ClientError> {
        self.engine
            .fence(
                &sale.sku,
                Some(sale.initial_allocation),
                sale.shards,
                sale.ttl_ms,
                sale.per_user_limit,
            )
            .map(|_| ())
            .map_err(engine_error)
    }

    async fn restore(
        &self,
        sku: &str,
        user: &str,
        request_id: &str,
        qty: u32,
        expires_at_ms: i64,
        created_at_ms: i64,
    ) -> Result<(bool, String), ClientError> {
        self.engine
            .restore(
                sku,
                user,
                request_id,
                qty,
                ms_u64(expires_at_ms),
                ms_u64(created_at_ms),
                ResState::Reserved,
            )
            .map(|(n, t, _)| (n, t.to_string()))
            .map_err(engine_error)
    }

    async fn rebuild(
        &self,
        sku: &str,
        total: u64,
        committed: u64,
        fingerprint: &str,
    ) -> Result<i64, ClientError> {
        self.engine
            .rebuild(sku, total, committed, fingerprint)
            .map(|(a, _)| a)
            .map_err(engine_error)
    }
}
