//! Typed async client for the stockgate protocol (docs/protocol.md), over redis-rs.
//!
//! Two transports, one API:
//! - one address ([`StockgateClient::connect`]): a [`ConnectionManager`], one multiplexed
//!   connection (concurrent calls are pipelined on it, so a clone per task costs nothing)
//!   that reconnects on its own after the server restarts. A call that fails because the
//!   connection dropped returns [`ClientError::Connection`]; the next call uses the new
//!   connection. Calls are never retried: the caller decides (RESERVE and RELEASE are
//!   idempotent, so retrying is safe for them).
//! - a Sentinel-managed group ([`StockgateClient::connect_sentinel`], module
//!   [`crate::sentinel`]): the primary Sentinel names, found again after a failover; calls
//!   refused with `-READONLY`/`-NOREPLICAS` are retried, and so are the idempotent ones
//!   after a connection error (each method says which it is).

use std::sync::Arc;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Value;

pub use crate::conn_config::ClientConfig;
pub use crate::error::ClientError;
use crate::live::LiveWatch;
use crate::sentinel::{Retry, SentinelConfig, SentinelConn, ServerTarget};
use crate::tls::TlsConfig;
use crate::value::{as_int, as_string};

use crate::types::{
    CommitOk, ExpiredReservation, ReservationInfo, ReservationState, ReserveOutcome, RoomInfo,
    RoomOptions, RoomStatus, RoomTicket, SaleInfo,
};

/// Typed stockgate client. Cheap to clone (clones share the connection).
#[derive(Clone)]
pub struct StockgateClient {
    conn: Transport,
}

// The plain variant is the connection manager itself, as the client always held it:
// boxing it would add an allocation to every clone (one per call and per task).
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum Transport {
    /// The connection, and what a live watch opens its own connection from.
    Direct(ConnectionManager, Arc<WatchTarget>),
    Sentinel(Arc<SentinelConn>),
}

/// Where a live watch of a one-address client connects: the address (with its TLS and
/// credentials) the client was made for, and how long connecting and subscribing may take.
struct WatchTarget {
    info: redis::ConnectionInfo,
    timeout: std::time::Duration,
}

impl std::fmt::Debug for StockgateClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StockgateClient")
    }
}

impl StockgateClient {
    /// Connects to `addr` (`host:port`, or a `redis://[user:pass@]host:port` URL for AUTH) with the
    /// default settings.
    pub async fn connect(addr: &str) -> Result<Self, ClientError> {
        Self::connect_with(addr, ClientConfig::default()).await
    }

    /// Connects to `addr` with these timeouts and retries; the connection reconnects by itself
    /// after a failure.
    pub async fn connect_with(addr: &str, cfg: ClientConfig) -> Result<Self, ClientError> {
        Self::connect_tls_with(addr, None, cfg).await
    }

    /// [`Self::connect_with`] over TLS with `tls` (None: plain, unless `addr` is
    /// `rediss://`).
    pub async fn connect_tls_with(
        addr: &str,
        tls: Option<&TlsConfig>,
        cfg: ClientConfig,
    ) -> Result<Self, ClientError> {
        let client = crate::tls::redis_client(addr, tls).map_err(ClientError::Connection)?;
        let watch = Arc::new(WatchTarget {
            info: client.get_connection_info().clone(),
            timeout: cfg.connect_timeout.max(cfg.response_timeout),
        });
        let mcfg = ConnectionManagerConfig::new()
            .set_connection_timeout(cfg.connect_timeout)
            .set_response_timeout(cfg.response_timeout)
            .set_number_of_retries(cfg.reconnect_retries)
            .set_max_delay(1000);
        let conn = ConnectionManager::new_with_config(client, mcfg)
            .await
            .map_err(|e| ClientError::Connection(crate::tls::explain(e)))?;
        Ok(StockgateClient {
            conn: Transport::Direct(conn, watch),
        })
    }

    /// The primary of a Sentinel-managed group (see [`crate::sentinel`]): discovered now
    /// (`NoPrimary` if no Sentinel names a master within the configured attempts), and
    /// again by every call that meets a failover.
    pub async fn connect_sentinel(cfg: SentinelConfig) -> Result<Self, ClientError> {
        Self::connect_sentinel_with(cfg, ClientConfig::default()).await
    }

    /// [`Self::connect_sentinel`] with connection timeouts (`reconnect_retries` is
    /// unused: the Sentinel config's attempts and backoff apply).
    pub async fn connect_sentinel_with(
        cfg: SentinelConfig,
        client_cfg: ClientConfig,
    ) -> Result<Self, ClientError> {
        let conn = SentinelConn::connect(cfg, client_cfg).await?;
        Ok(StockgateClient {
            conn: Transport::Sentinel(conn),
        })
    }

    /// One address or a Sentinel group, as the command-line tools are given it.
    pub async fn connect_target(target: &ServerTarget) -> Result<Self, ClientError> {
        match target {
            ServerTarget::Addr(a) => Self::connect(a).await,
            ServerTarget::TlsAddr(a, tls) => {
                Self::connect_tls_with(a, Some(tls), ClientConfig::default()).await
            }
            ServerTarget::Sentinel(c) => Self::connect_sentinel(c.clone()).await,
        }
    }

    /// The node this client sends to: the Sentinel-named primary in use (None between a
    /// failure and the next discovery); None for a plain address.
    pub fn primary_addr(&self) -> Option<String> {
        match &self.conn {
            Transport::Direct(..) => None,
            Transport::Sentinel(s) => s.primary_addr(),
        }
    }

    /// A command whose repetition changes nothing: retried through a failover.
    async fn call(&self, cmd: &redis::Cmd) -> Result<Value, ClientError> {
        self.call_with(cmd, Retry::Idempotent).await
    }

    async fn call_with(&self, cmd: &redis::Cmd, retry: Retry) -> Result<Value, ClientError> {
        // RESP3 can also deliver errors as values inside aggregates; top-level errors
        // come back as Err.
        match &self.conn {
            Transport::Direct(c, _) => {
                let mut conn = c.clone();
                Ok(cmd.query_async(&mut conn).await?)
            }
            Transport::Sentinel(s) => s.call(cmd, retry).await,
        }
    }

    /// `PING`: succeeds when the server answers.
    pub async fn ping(&self) -> Result<(), ClientError> {
        self.call(&redis::cmd("PING")).await.map(|_| ())
    }

    /// `RESERVE sku user admission-token request-id [QTY n] WITHLIMIT` (a LIMIT reply then
    /// carries the limit and the units held). Through Sentinel a lost
    /// reply is retried with the same request id, so the retry answers `Replay` if the
    /// first send took effect on the node that is now the primary.
    pub async fn reserve(
        &self,
        sku: &str,
        user: &str,
        admission_token: &str,
        request_id: &str,
        qty: u32,
    ) -> Result<ReserveOutcome, ClientError> {
        let mut cmd = redis::cmd("RESERVE");
        cmd.arg(sku).arg(user).arg(admission_token).arg(request_id);
        if qty != 1 {
            cmd.arg("QTY").arg(qty);
        }
        cmd.arg("WITHLIMIT");
        let v = self.call(&cmd).await?;
        parse_reserve(&v).ok_or_else(|| proto("RESERVE", &v))
    }

    /// `RELEASE token`: true if this call returned the units. Through Sentinel, a RELEASE
    /// whose reply was lost is sent again and may answer false: the first send returned
    /// them (exactly once either way).
    pub async fn release(&self, token: &str) -> Result<bool, ClientError> {
        self.release_as(token, None).await
    }

    /// `RELEASE token REASON reason`: as [`Self::release`], stating why for the feed.
    pub async fn release_as(
        &self,
        token: &str,
        reason: Option<stockgate_core::engine::ReleaseReason>,
    ) -> Result<bool, ClientError> {
        let mut cmd = redis::cmd("RELEASE");
        cmd.arg(token);
        if let Some(r) = reason {
            cmd.arg("REASON").arg(r.as_str());
        }
        let v = self.call(&cmd).await?;
        as_int(&v)
            .map(|n| n == 1)
            .ok_or_else(|| proto("RELEASE", &v))
    }

    /// `COMMIT token`. `-RELEASED` → [`ClientError::Released`], `-NORES` →
    /// [`ClientError::NoReservation`], `-EXPIRED` → [`ClientError::Expired`].
    /// A hold past its expiry is refused: [`ClientError::Expired`].
    pub async fn commit(&self, token: &str) -> Result<CommitOk, ClientError> {
        self.commit_cmd(redis::cmd("COMMIT").arg(token)).await
    }

    /// `COMMIT token VERIFIED`: the caller states that the ledger accepted the payment
    /// before the hold's deadline, so a hold past its expiry still commits. Only the
    /// sweeper and admin roles may send it (`-NOPERM` otherwise, as
    /// [`ClientError::Server`] with code `NOPERM`).
    pub async fn commit_verified(&self, token: &str) -> Result<CommitOk, ClientError> {
        self.commit_cmd(redis::cmd("COMMIT").arg(token).arg("VERIFIED"))
            .await
    }

    async fn commit_cmd(&self, cmd: &redis::Cmd) -> Result<CommitOk, ClientError> {
        let v = self.call(cmd).await?;
        match as_int(&v) {
            Some(1) => Ok(CommitOk::Committed),
            Some(0) => Ok(CommitOk::AlreadyCommitted),
            _ => Err(proto("COMMIT", &v)),
        }
    }

    /// `STOCK sku`: units still free to reserve.
    pub async fn stock(&self, sku: &str) -> Result<i64, ClientError> {
        let v = self.call(redis::cmd("STOCK").arg(sku)).await?;
        as_int(&v).ok_or_else(|| proto("STOCK", &v))
    }

    /// `EXPIRED [COUNT n] [SKU sku]`.
    pub async fn expired(
        &self,
        count: usize,
        sku: Option<&str>,
    ) -> Result<Vec<ExpiredReservation>, ClientError> {
        let mut cmd = redis::cmd("EXPIRED");
        cmd.arg("COUNT").arg(count);
        if let Some(s) = sku {
            cmd.arg("SKU").arg(s);
        }
        let v = self.call(&cmd).await?;
        let Value::Array(items) = &v else {
            return Err(proto("EXPIRED", &v));
        };
        items
            .iter()
            .map(|it| parse_expired(it).ok_or_else(|| proto("EXPIRED", it)))
            .collect()
    }

    /// `RESERVATION token`; None if unknown.
    pub async fn reservation(&self, token: &str) -> Result<Option<ReservationInfo>, ClientError> {
        let v = self.call(redis::cmd("RESERVATION").arg(token)).await?;
        if matches!(v, Value::Nil) {
            return Ok(None);
        }
        parse_reservation(&v)
            .map(Some)
            .ok_or_else(|| proto("RESERVATION", &v))
    }

    /// `EXTEND token ms` → new `expires_at_ms`.
    pub async fn extend(&self, token: &str, ms: u64) -> Result<i64, ClientError> {
        let v = self.call(redis::cmd("EXTEND").arg(token).arg(ms)).await?;
        as_int(&v).ok_or_else(|| proto("EXTEND", &v))
    }

    /// `SALE.CREATE sku total [SHARDS n] [TTL ms] [LIMIT n]`.
    pub async fn sale_create(
        &self,
        sku: &str,
        total: u64,
        shards: Option<u16>,
        ttl_ms: Option<u64>,
        limit: Option<u32>,
    ) -> Result<(), ClientError> {
        let mut cmd = redis::cmd("SALE.CREATE");
        cmd.arg(sku).arg(total);
        push_sale_opts(&mut cmd, shards, ttl_ms, limit);
        self.call(&cmd).await.map(|_| ())
    }

    /// The server's history id (`INFO server`'s `stockgate_history`, see
    /// `stockgate_ledger::identity`); `None` while it reports none.
    pub async fn history(&self) -> Result<Option<String>, ClientError> {
        let v = self.call(redis::cmd("INFO").arg("server")).await?;
        history_in_info(&v).ok_or_else(|| proto("INFO", &v))
    }

    /// `SALE.INFO sku`: the sale's counters and state.
    pub async fn sale_info(&self, sku: &str) -> Result<SaleInfo, ClientError> {
        let v = self.call(redis::cmd("SALE.INFO").arg(sku)).await?;
        parse_sale_info(&v).ok_or_else(|| proto("SALE.INFO", &v))
    }

    /// `SALE.LIST`: the keys of every sale the server holds.
    pub async fn sale_list(&self) -> Result<Vec<String>, ClientError> {
        let v = self.call(&redis::cmd("SALE.LIST")).await?;
        let Value::Array(items) = &v else {
            return Err(proto("SALE.LIST", &v));
        };
        items
            .iter()
            .map(|i| as_string(i).ok_or_else(|| proto("SALE.LIST", i)))
            .collect()
    }

    /// `SALE.PAUSE sku`: `RESERVE` on the sale answers `-PAUSED` until it is resumed.
    pub async fn sale_pause(&self, sku: &str) -> Result<(), ClientError> {
        self.call(redis::cmd("SALE.PAUSE").arg(sku))
            .await
            .map(|_| ())
    }

    /// `SALE.RESUME sku`: accepts reservations again.
    pub async fn sale_resume(&self, sku: &str) -> Result<(), ClientError> {
        self.call(redis::cmd("SALE.RESUME").arg(sku))
            .await
            .map(|_| ())
    }

    /// `SALE.ADJUST sku delta` → new total. Not resent after a lost reply (a delta would
    /// apply twice): `adjust_sale` retried with the same id finds out what happened.
    pub async fn sale_adjust(&self, sku: &str, delta: i64) -> Result<i64, ClientError> {
        let v = self
            .call_with(
                redis::cmd("SALE.ADJUST").arg(sku).arg(delta),
                Retry::RefusalsOnly,
            )
            .await?;
        as_int(&v).ok_or_else(|| proto("SALE.ADJUST", &v))
    }

    /// `SALE.FENCE sku [TOTAL n] [SHARDS n] [TTL ms] [LIMIT n]`: fence an existing sale, or
    /// create it fenced with 0 available if the server does not know it.
    pub async fn sale_fence(
        &self,
        sku: &str,
        total: Option<u64>,
        shards: Option<u16>,
        ttl_ms: Option<u64>,
        limit: Option<u32>,
    ) -> Result<(), ClientError> {
        let mut cmd = redis::cmd("SALE.FENCE");
        cmd.arg(sku);
        if let Some(t) = total {
            cmd.arg("TOTAL").arg(t);
        }
        push_sale_opts(&mut cmd, shards, ttl_ms, limit);
        self.call(&cmd).await.map(|_| ())
    }

    /// `SALE.RESTORE sku user request-id qty expires_at_ms created_at_ms [STATE s]` →
    /// (newly restored, server-derived token). `state`: RESERVED (a pending order, still
    /// payable), COMMITTED (a paid order: a retry REPLAYs and its units count against the
    /// per-user limit) or RELEASED (a cancelled order: a retry REPLAYs, nothing is taken).
    #[allow(clippy::too_many_arguments)]
    pub async fn sale_restore(
        &self,
        sku: &str,
        user: &str,
        request_id: &str,
        qty: u32,
        expires_at_ms: i64,
        created_at_ms: i64,
        state: ReservationState,
    ) -> Result<(bool, String), ClientError> {
        let mut cmd = redis::cmd("SALE.RESTORE");
        cmd.arg(sku)
            .arg(user)
            .arg(request_id)
            .arg(qty)
            .arg(expires_at_ms)
            .arg(created_at_ms);
        // RESERVED is the default: leaving it out keeps pending restores working against a
        // server that predates STATE.
        if state != ReservationState::Reserved {
            cmd.arg("STATE").arg(state.as_str());
        }
        let v = self.call(&cmd).await?;
        match &v {
            Value::Array(a) if a.len() == 2 => match (as_int(&a[0]), as_string(&a[1])) {
                (Some(n), Some(t)) => Ok((n == 1, t)),
                _ => Err(proto("SALE.RESTORE", &v)),
            },
            _ => Err(proto("SALE.RESTORE", &v)),
        }
    }

    /// `SALE.REBUILD sku total committed key-fingerprint` → available. Not resent after a
    /// lost reply (it reopens the sale; a re-run of the rebuild starts from the fence).
    pub async fn sale_rebuild(
        &self,
        sku: &str,
        total: u64,
        committed: u64,
        key_fingerprint: &str,
    ) -> Result<i64, ClientError> {
        let v = self
            .call_with(
                redis::cmd("SALE.REBUILD")
                    .arg(sku)
                    .arg(total)
                    .arg(committed)
                    .arg(key_fingerprint),
                Retry::RefusalsOnly,
            )
            .await?;
        as_int(&v).ok_or_else(|| proto("SALE.REBUILD", &v))
    }
}

/// The waiting room (docs/protocol.md, section 4a). Every command is idempotent (a join
/// answers the place the user holds, a leave of no place changes nothing), so each is
/// retried through a failover like the other commands.
impl StockgateClient {
    /// `ROOM.OPEN sku [OPENS-AT ms] [RATE n] [OVERADMIT permille] [ADMIT-TTL ms] [WINDOW ms]
    /// [MAX n]` (admin). The same settings again succeed; other settings are refused with
    /// [`ClientError::Exists`], an unknown sale with [`ClientError::NoSale`], a setting out of
    /// range with [`ClientError::Server`] (code `ERR`).
    pub async fn open_room(&self, sku: &str, opts: &RoomOptions) -> Result<(), ClientError> {
        let mut cmd = redis::cmd("ROOM.OPEN");
        cmd.arg(sku);
        push_room_opts(&mut cmd, opts);
        self.call(&cmd).await.map(|_| ())
    }

    /// `ROOM.JOIN sku user`: the user's place, the same ticket again while the user holds
    /// one. Refused with [`ClientError::QueueFull`], [`ClientError::SoldOut`],
    /// [`ClientError::TooManyJoins`], [`ClientError::NoRoom`], [`ClientError::NoSale`].
    pub async fn join(&self, sku: &str, user: &str) -> Result<RoomTicket, ClientError> {
        let v = self
            .call(redis::cmd("ROOM.JOIN").arg(sku).arg(user))
            .await?;
        parse_room_join(&v).ok_or_else(|| proto("ROOM.JOIN", &v))
    }

    /// `ROOM.STATUS sku user ticket`: where the place is; [`RoomStatus::Admitted`] carries
    /// the admission token for [`Self::reserve`]. Refused with [`ClientError::BadTicket`],
    /// [`ClientError::NotQueued`], [`ClientError::NoRoom`], [`ClientError::NoSale`].
    pub async fn status(
        &self,
        sku: &str,
        user: &str,
        ticket: &str,
    ) -> Result<RoomStatus, ClientError> {
        let v = self
            .call(redis::cmd("ROOM.STATUS").arg(sku).arg(user).arg(ticket))
            .await?;
        parse_room_status(&v).ok_or_else(|| proto("ROOM.STATUS", &v))
    }

    /// `ROOM.LEAVE sku user`: true if this call gave the user's place up, false if the user
    /// held none (also when a resent leave's first send gave it up).
    pub async fn leave(&self, sku: &str, user: &str) -> Result<bool, ClientError> {
        let v = self
            .call(redis::cmd("ROOM.LEAVE").arg(sku).arg(user))
            .await?;
        match as_int(&v) {
            Some(1) => Ok(true),
            Some(0) => Ok(false),
            _ => Err(proto("ROOM.LEAVE", &v)),
        }
    }

    /// `ROOM.INFO sku`: the room's settings and counts. Refused with [`ClientError::NoRoom`].
    pub async fn room_info(&self, sku: &str) -> Result<RoomInfo, ClientError> {
        let v = self.call(redis::cmd("ROOM.INFO").arg(sku)).await?;
        parse_room_info(&v).ok_or_else(|| proto("ROOM.INFO", &v))
    }
}

/// Live counts over RESP (docs/protocol.md section 4a, "Live counts over RESP"): each watch
/// subscribes on a connection of its own, to the address of a one-address client or to the
/// primary the Sentinels name now (see [`crate::live`]).
impl StockgateClient {
    /// `SUBSCRIBE sale:<sku>:live`: the counts now at once, then one per change (at most
    /// ~10 a second). Refused with [`ClientError::NoSale`] for an unknown sale, or
    /// [`ClientError::Server`] (code `ERR`) when the server has its most watchers.
    pub async fn watch_sale(&self, sku: &str) -> Result<LiveWatch, ClientError> {
        self.watch(crate::live::sale_channel(sku)).await
    }

    /// `SUBSCRIBE place:<ticket>` (the ticket [`Self::join`] gave): as [`Self::watch_sale`],
    /// each message with [`LiveCounts::you`](crate::types::LiveCounts::you), the buyer's
    /// place. The ticket is checked once, here: a forged or malformed one is
    /// [`ClientError::BadTicket`], one of a sale without a room [`ClientError::NoRoom`].
    pub async fn watch_place(&self, ticket: &str) -> Result<LiveWatch, ClientError> {
        self.watch(crate::live::place_channel(ticket)).await
    }

    async fn watch(&self, channel: String) -> Result<LiveWatch, ClientError> {
        match &self.conn {
            Transport::Direct(_, t) => LiveWatch::open(t.info.clone(), channel, t.timeout).await,
            Transport::Sentinel(s) => {
                let (info, timeout) = s.primary_info().await?;
                LiveWatch::open(info, channel, timeout).await
            }
        }
    }
}

fn push_room_opts(cmd: &mut redis::Cmd, o: &RoomOptions) {
    let settings = [
        ("OPENS-AT", o.opens_at_ms),
        ("RATE", o.rate.map(u64::from)),
        ("OVERADMIT", o.overadmit_permille.map(u64::from)),
        ("ADMIT-TTL", o.admit_ttl_ms),
        ("WINDOW", o.window_ms),
        ("MAX", o.max_waiting.map(u64::from)),
    ];
    for (word, value) in settings {
        if let Some(v) = value {
            cmd.arg(word).arg(v);
        }
    }
}

fn push_sale_opts(cmd: &mut redis::Cmd, shards: Option<u16>, ttl: Option<u64>, limit: Option<u32>) {
    if let Some(s) = shards {
        cmd.arg("SHARDS").arg(s);
    }
    if let Some(t) = ttl {
        cmd.arg("TTL").arg(t);
    }
    if let Some(l) = limit {
        cmd.arg("LIMIT").arg(l);
    }
}

/// The history id in an `INFO server` reply (`stockgate_history`, see
/// `stockgate_ledger::identity`): `Some(None)` when the field is absent or empty, `None` when the
/// reply is not INFO's text at all.
pub fn history_in_info(v: &Value) -> Option<Option<String>> {
    let text = match v {
        Value::BulkString(b) => String::from_utf8_lossy(b),
        Value::VerbatimString { text, .. } => text.as_str().into(),
        _ => return None,
    };
    Some(
        text.lines()
            .find_map(|l| l.trim_end().strip_prefix("stockgate_history:"))
            .filter(|id| !id.is_empty())
            .map(str::to_owned),
    )
}

fn proto(command: &'static str, v: &Value) -> ClientError {
    ClientError::Protocol {
        command,
        reply: format!("{v:?}"),
    }
}

/// A RESP3 map or a RESP2 flat field-value array, as (name, value) pairs.
fn as_pairs(v: &Value) -> Option<Vec<(String, &Value)>> {
    match v {
        Value::Map(m) => m
            .iter()
            .map(|(k, v)| as_string(k).map(|k| (k, v)))
            .collect(),
        Value::Array(a) if a.len() & 1 == 0 => a
            .chunks(2)
            .map(|c| as_string(&c[0]).map(|k| (k, &c[1])))
            .collect(),
        _ => None,
    }
}

fn field<'a>(pairs: &'a [(String, &'a Value)], name: &str) -> Option<&'a Value> {
    pairs
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| *v)
}

fn parse_reserve(v: &Value) -> Option<ReserveOutcome> {
    let Value::Array(a) = v else { return None };
    let kind = as_string(a.first()?)?;
    match kind.as_str() {
        "RESERVED" | "REPLAY" => {
            let token = as_string(a.get(1)?)?;
            let expires_at_ms = as_int(a.get(2)?)?;
            let shard = u16::try_from(as_int(a.get(3)?)?).ok()?;
            Some(if kind == "RESERVED" {
                ReserveOutcome::Reserved {
                    token,
                    expires_at_ms,
                    shard,
                }
            } else {
                ReserveOutcome::Replay {
                    token,
                    expires_at_ms,
                    shard,
                }
            })
        }
        "SOLDOUT" => Some(ReserveOutcome::SoldOut),
        // `LIMIT limit held [token...]`: the WITHLIMIT shape `reserve` asks for.
        "LIMIT" => {
            let Value::Array(tokens) = a.get(3)? else {
                return None;
            };
            Some(ReserveOutcome::Limit {
                live_tokens: tokens.iter().filter_map(as_string).collect(),
                limit: u32::try_from(as_int(a.get(1)?)?).ok()?,
                held: u64::try_from(as_int(a.get(2)?)?).ok()?,
            })
        }
        _ => None,
    }
}

fn parse_expired(v: &Value) -> Option<ExpiredReservation> {
    let Value::Array(a) = v else { return None };
    if a.len() < 6 {
        return None;
    }
    Some(ExpiredReservation {
        token: as_string(&a[0])?,
        sku: as_string(&a[1])?,
        user: as_string(&a[2])?,
        qty: u32::try_from(as_int(&a[3])?).ok()?,
        shard: u16::try_from(as_int(&a[4])?).ok()?,
        expires_at_ms: as_int(&a[5])?,
    })
}

fn parse_reservation(v: &Value) -> Option<ReservationInfo> {
    let p = as_pairs(v)?;
    Some(ReservationInfo {
        token: as_string(field(&p, "token")?)?,
        sku: as_string(field(&p, "sku")?)?,
        user: as_string(field(&p, "user")?)?,
        request_id: as_string(field(&p, "request_id")?)?,
        qty: u32::try_from(as_int(field(&p, "qty")?)?).ok()?,
        shard: u16::try_from(as_int(field(&p, "shard")?)?).ok()?,
        state: ReservationState::parse(&as_string(field(&p, "state")?)?)?,
        expires_at_ms: as_int(field(&p, "expires_at_ms")?)?,
        created_at_ms: as_int(field(&p, "created_at_ms")?)?,
    })
}

fn parse_sale_info(v: &Value) -> Option<SaleInfo> {
    let p = as_pairs(v)?;
    let shard_available = match field(&p, "shard_available") {
        Some(Value::Array(a)) => a.iter().filter_map(as_int).collect(),
        _ => Vec::new(),
    };
    Some(SaleInfo {
        total: as_int(field(&p, "total")?)?,
        available: as_int(field(&p, "available")?)?,
        reserved: as_int(field(&p, "reserved")?)?,
        committed: as_int(field(&p, "committed")?)?,
        shards: as_int(field(&p, "shards")?)?,
        ttl_ms: as_int(field(&p, "ttl_ms")?)?,
        limit: as_int(field(&p, "limit")?)?,
        state: as_string(field(&p, "state")?)?,
        key_fingerprint: field(&p, "key_fingerprint")
            .and_then(as_string)
            .unwrap_or_default(),
        shard_available,
    })
}

fn parse_room_join(v: &Value) -> Option<RoomTicket> {
    let Value::Array(a) = v else { return None };
    let [ticket, position, eta_ms] = a.as_slice() else {
        return None;
    };
    Some(RoomTicket {
        ticket: as_string(ticket)?,
        position: u64::try_from(as_int(position)?).ok()?,
        eta_ms: u64::try_from(as_int(eta_ms)?).ok()?,
    })
}

fn parse_room_status(v: &Value) -> Option<RoomStatus> {
    let Value::Array(a) = v else { return None };
    let word = as_string(a.first()?)?;
    let rest = &a[1..];
    Some(match (word.as_str(), rest) {
        ("WAITING", [position, eta_ms]) => RoomStatus::Waiting {
            position: u64::try_from(as_int(position)?).ok()?,
            eta_ms: u64::try_from(as_int(eta_ms)?).ok()?,
        },
        ("ADMITTED", [admission, until_ms]) => RoomStatus::Admitted {
            admission: as_string(admission)?,
            until_ms: as_int(until_ms)?,
        },
        ("BEFORE-OPEN", [opens_at_ms]) => RoomStatus::BeforeOpen {
            opens_at_ms: as_int(opens_at_ms)?,
        },
        ("RESERVED", []) => RoomStatus::Reserved,
        ("SOLDOUT", []) => RoomStatus::SoldOut,
        ("EXPIRED", []) => RoomStatus::Expired,
        ("LEFT", []) => RoomStatus::Left,
        _ => return None,
    })
}

fn parse_room_info(v: &Value) -> Option<RoomInfo> {
    let p = as_pairs(v)?;
    let u64_of = |name: &str| u64::try_from(as_int(field(&p, name)?)?).ok();
    let u32_of = |name: &str| u32::try_from(as_int(field(&p, name)?)?).ok();
    let flag = |name: &str| match as_int(field(&p, name)?)? {
        0 => Some(false),
        1 => Some(true),
        _ => None,
    };
    Some(RoomInfo {
        opens_at_ms: u64_of("opens_at_ms")?,
        rate: u32_of("rate")?,
        overadmit_permille: u32_of("overadmit_permille")?,
        admit_ttl_ms: u64_of("admit_ttl_ms")?,
        window_ms: u64_of("window_ms")?,
        max_waiting: u32_of("max_waiting")?,
        waiting: u64_of("waiting")?,
        admitted: u64_of("admitted")?,
        open: flag("open")?,
        sold_out: flag("sold_out")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bs(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn history_in_info_finds_the_field() {
        let info = bs("# Server\r\nredis_version:7.0.0\r\nstockgate_history:ab12\r\nrun_id:x\r\n");
        assert_eq!(history_in_info(&info), Some(Some("ab12".to_owned())));
        assert_eq!(
            history_in_info(&bs("# Server\r\nstockgate_history:\r\n")),
            Some(None)
        );
        assert_eq!(history_in_info(&bs("# Server\r\n")), Some(None));
        assert_eq!(history_in_info(&Value::Int(1)), None);
    }

    #[test]
    fn parses_replies() {
        let r = Value::Array(vec![
            bs("RESERVED"),
            bs("{A}t"),
            Value::Int(5),
            Value::Int(2),
        ]);
        assert_eq!(
            parse_reserve(&r),
            Some(ReserveOutcome::Reserved {
                token: "{A}t".into(),
                expires_at_ms: 5,
                shard: 2
            })
        );
        let l = Value::Array(vec![
            bs("LIMIT"),
            Value::Int(2),
            Value::Int(2),
            Value::Array(vec![bs("{A}x")]),
        ]);
        assert_eq!(
            parse_reserve(&l),
            Some(ReserveOutcome::Limit {
                live_tokens: vec!["{A}x".into()],
                limit: 2,
                held: 2,
            })
        );
        let e = Value::Array(vec![
            bs("{A}t"),
            bs("A"),
            bs("u"),
            Value::Int(1),
            Value::Int(3),
            Value::Int(9),
        ]);
        assert_eq!(parse_expired(&e).map(|x| x.expires_at_ms), Some(9));
        let res = Value::Array(
            [
                "token",
                "{A}t",
                "sku",
                "A",
                "user",
                "u",
                "request_id",
                "r",
                "state",
                "RESERVED",
            ]
            .iter()
            .map(|s| bs(s))
            .chain([
                bs("qty"),
                Value::Int(1),
                bs("shard"),
                Value::Int(0),
                bs("expires_at_ms"),
                Value::Int(10),
                bs("created_at_ms"),
                Value::Int(1),
            ])
            .collect(),
        );
        let info = parse_reservation(&res).expect("parse");
        assert_eq!(info.state, ReservationState::Reserved);
        assert_eq!(info.expires_at_ms, 10);
    }

    fn arr(items: Vec<Value>) -> Value {
        Value::Array(items)
    }

    #[test]
    fn parses_room_join_and_status() {
        let j = arr(vec![bs("t1|k|S|u|1|sig"), Value::Int(3), Value::Int(1500)]);
        assert_eq!(
            parse_room_join(&j),
            Some(RoomTicket {
                ticket: "t1|k|S|u|1|sig".into(),
                position: 3,
                eta_ms: 1500
            })
        );
        assert_eq!(parse_room_join(&arr(vec![bs("t"), Value::Int(1)])), None);
        assert_eq!(
            parse_room_join(&arr(vec![bs("t"), Value::Int(-1), Value::Int(0)])),
            None
        );
        let cases = [
            (
                vec![bs("WAITING"), Value::Int(4), Value::Int(2000)],
                RoomStatus::Waiting {
                    position: 4,
                    eta_ms: 2000,
                },
            ),
            (
                vec![bs("ADMITTED"), bs("tok.sig"), Value::Int(17)],
                RoomStatus::Admitted {
                    admission: "tok.sig".into(),
                    until_ms: 17,
                },
            ),
            (
                vec![bs("BEFORE-OPEN"), Value::Int(1_767_225_630_000)],
                RoomStatus::BeforeOpen {
                    opens_at_ms: 1_767_225_630_000,
                },
            ),
            (vec![bs("RESERVED")], RoomStatus::Reserved),
            (
                vec![Value::SimpleString("SOLDOUT".into())],
                RoomStatus::SoldOut,
            ),
            (vec![bs("EXPIRED")], RoomStatus::Expired),
            (vec![bs("LEFT")], RoomStatus::Left),
        ];
        for (reply, want) in cases {
            assert_eq!(parse_room_status(&arr(reply)), Some(want));
        }
        let admitted = parse_room_status(&arr(vec![bs("ADMITTED"), bs("a.b"), Value::Int(1)]));
        assert_eq!(
            admitted.as_ref().and_then(RoomStatus::admission),
            Some("a.b")
        );
        assert_eq!(RoomStatus::Left.admission(), None);
        for bad in [
            vec![],
            vec![bs("WAITING"), Value::Int(1)],
            vec![bs("ADMITTED"), bs("t")],
            vec![bs("LEFT"), Value::Int(1)],
            vec![bs("GONE")],
        ] {
            assert_eq!(parse_room_status(&arr(bad.clone())), None, "{bad:?}");
        }
        assert_eq!(parse_room_status(&bs("WAITING")), None);
    }

    #[test]
    fn parses_room_info_as_resp2_list_and_resp3_map() {
        let fields = [
            ("opens_at_ms", 0),
            ("rate", 100),
            ("overadmit_permille", 1000),
            ("admit_ttl_ms", 120_000),
            ("window_ms", 10_000),
            ("max_waiting", 1_000_000),
            ("waiting", 7),
            ("admitted", 2),
            ("open", 1),
            ("sold_out", 0),
        ];
        let want = RoomInfo {
            opens_at_ms: 0,
            rate: 100,
            overadmit_permille: 1000,
            admit_ttl_ms: 120_000,
            window_ms: 10_000,
            max_waiting: 1_000_000,
            waiting: 7,
            admitted: 2,
            open: true,
            sold_out: false,
        };
        let flat: Vec<Value> = fields
            .iter()
            .flat_map(|(k, v)| [bs(k), Value::Int(*v)])
            .collect();
        assert_eq!(parse_room_info(&arr(flat.clone())), Some(want.clone()));
        let map = Value::Map(
            fields
                .iter()
                .map(|(k, v)| (bs(k), Value::Int(*v)))
                .collect(),
        );
        assert_eq!(parse_room_info(&map), Some(want));
        assert_eq!(parse_room_info(&arr(flat[..flat.len() - 2].to_vec())), None);
        let mut two = flat;
        let last = two.len() - 1;
        two[last - 2] = Value::Int(2); // open: 2
        assert_eq!(parse_room_info(&arr(two)), None);
    }

    #[test]
    fn room_options_in_protocol_order() {
        let mut cmd = redis::cmd("ROOM.OPEN");
        cmd.arg("S");
        push_room_opts(
            &mut cmd,
            &RoomOptions {
                rate: Some(1000),
                admit_ttl_ms: Some(60_000),
                max_waiting: Some(45),
                ..RoomOptions::default()
            },
        );
        let args: Vec<String> = cmd
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                redis::Arg::Cursor => "<cursor>".into(),
            })
            .collect();
        assert_eq!(
            args,
            [
                "ROOM.OPEN",
                "S",
                "RATE",
                "1000",
                "ADMIT-TTL",
                "60000",
                "MAX",
                "45"
            ]
        );
    }

    fn server_error(line: &str) -> ClientError {
        let v = redis::parse_redis_value(format!("-{line}\r\n").as_bytes()).unwrap();
        ClientError::from(v.extract_error().unwrap_err())
    }

    #[test]
    fn room_error_replies_are_typed() {
        let full =
            server_error("QUEUEFULL queue full: 45 buyers are already waiting for this sale");
        assert!(
            matches!(&full, ClientError::QueueFull(d) if d.starts_with("queue full: 45")),
            "{full:?}"
        );
        assert!(matches!(
            server_error("SOLDOUT sold out"),
            ClientError::SoldOut
        ));
        assert!(matches!(
            server_error("TOOMANYJOINS too many joins: at most 4 places per user per sale"),
            ClientError::TooManyJoins
        ));
        assert!(matches!(
            server_error("NOROOM no waiting room for this sale"),
            ClientError::NoRoom
        ));
        let bad = server_error("BADTICKET stale ticket: replaced by a later join");
        assert!(
            matches!(&bad, ClientError::BadTicket(d) if d.starts_with("stale ticket")),
            "{bad:?}"
        );
        assert!(matches!(
            server_error("NOTQUEUED not in the queue"),
            ClientError::NotQueued
        ));
        for e in [full, bad, ClientError::NoRoom] {
            assert!(!e.is_transient(), "{e}");
        }
    }
}
