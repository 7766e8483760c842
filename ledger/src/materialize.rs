//! The materializer: reads the order feed (`XREAD` on `stockgate:events`) and writes the
//! orders into the Postgres ledger exactly once.
//!
//! Exactly once, whatever crashes: one SQL transaction per batch holds both the orders
//! the batch implies and the consumer's new position (`feed_position`). The transaction
//! first locks the position row and checks it is still the one the batch was read after;
//! so either the batch's orders *and* the position are in the ledger, or neither is, and
//! the next run re-reads exactly the entries after the committed position. On top of
//! that every write is idempotent (`ON CONFLICT DO NOTHING`, transitions conditional on
//! `status = 'PENDING'`), so two materializers racing, or a checkout that wrote the same
//! order itself, still yield one row per reservation.
//!
//! What each entry does:
//! - `reserved`  → a `PENDING` order, the same row the checkout flow writes;
//! - `committed` → `COMMITTED`, only if the order is still `PENDING`; a token with no
//!   order yet (its `reserved` is on another group's feed: a sale moved here) gets one
//!   from the entry's own fields first;
//! - `released`  → `CANCELLED`, only if the order is still `PENDING` (the units went
//!   back: the server refuses the capture, so the order cannot be paid any more); a
//!   token with no order gets one first, as for `committed`;
//! - `extended`  → the `PENDING` order's deadline moves with the server's;
//! - anything else (sale events, purges) only moves the position.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Value;
use sqlx::postgres::{PgConnection, PgPool};
use sqlx::Row;

use crate::client::{ClientConfig, ClientError};
use crate::sentinel::{Retry, SentinelConfig, SentinelConn, ServerTarget};

/// The all-events stream (`server/src/feed`).
pub const ALL_EVENTS: &str = "stockgate:events";

/// Why the materializer stopped or a batch was not written; a transient one is retried from the
/// committed position.
#[derive(Debug, thiserror::Error)]
pub enum MaterializeError {
    /// The feed no longer has the position: resynchronise from the ledger.
    #[error("feed position trimmed: {0}")]
    Trimmed(String),
    /// The feed read from is not the history the ledger's position was taken from (a
    /// different entry at that position, or a feed that ends before it): reading on
    /// would skip or invent orders. Only an operator can decide what to do.
    #[error("feed history mismatch: {0}")]
    History(String),
    /// The server is not the one the ledger is bound to ([`crate::identity`]).
    #[error(transparent)]
    Identity(#[from] crate::identity::IdentityError),
    /// The feed answered an error the materializer does not handle otherwise.
    #[error("feed error: {0}")]
    Feed(String),
    /// The connection to the server failed.
    #[error("feed connection: {0}")]
    Connection(#[from] redis::RedisError),
    /// The Postgres call failed; the batch's transaction rolled back.
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    /// A feed reply of a shape `XREAD` never gives.
    #[error("unexpected feed reply: {0}")]
    Protocol(String),
    /// Sentinel mode: no primary found within the configured attempts (no Sentinel
    /// answered, or none named a node that answers `ROLE` as master), a refusal
    /// (`-READONLY`, `-NOREPLICAS`) that outlasted them, or an invalid configuration.
    #[error("feed primary: {0}")]
    Primary(#[source] ClientError),
    /// Opening or migrating the ledger failed (unreachable, wrong schema, ...).
    #[error(transparent)]
    Ledger(#[from] crate::LedgerError),
}

/// One entry of the feed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeedEvent {
    /// The entry's log position (LSN), the first part of its stream id.
    pub lsn: u64,
    /// Field-value pairs in the entry's order. A vector, not a map: an entry has at most
    /// ten fields, a scan of them is as fast as a hash lookup, and the strings are the
    /// reply's own buffers moved in (the materializer decodes ~10,000 entries per batch,
    /// and a map per entry was a third of its CPU).
    pub fields: Vec<(String, String)>,
}

impl FeedEvent {
    /// 64-bit FNV-1a over the entry's LSN and fields: what the ledger stores beside its
    /// position to recognise the entry again on any node. FNV and not std's hasher, whose
    /// output may change between Rust releases (the ledger outlives the binary).
    pub fn fingerprint(&self) -> i64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for b in bytes {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            // A separator, so ("ab", "c") and ("a", "bc") differ.
            h ^= 0xff;
            h = h.wrapping_mul(0x0100_0000_01b3);
        };
        eat(&self.lsn.to_le_bytes());
        for (k, v) in &self.fields {
            eat(k.as_bytes());
            eat(v.as_bytes());
        }
        h as i64
    }

    /// The entry's `type` field (`reserved`, `committed`, `released`, ...), empty when absent.
    pub fn kind(&self) -> &str {
        self.get("type").unwrap_or("")
    }
    /// The value of field `k`, if the entry has it.
    pub fn get(&self, k: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(name, _)| name == k)
            .map(|(_, v)| v.as_str())
    }
    fn num(&self, k: &str) -> Result<i64, MaterializeError> {
        self.get(k)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| MaterializeError::Protocol(format!("entry {}-0: field {k}", self.lsn)))
    }
    fn text(&self, k: &str) -> Result<String, MaterializeError> {
        self.get(k)
            .map(str::to_owned)
            .ok_or_else(|| MaterializeError::Protocol(format!("entry {}-0: field {k}", self.lsn)))
    }
}

/// The orders a batch's `committed` and `released` entries describe on their own (their
/// token, sku, buyer, request id and quantity; the finish time stands in for the
/// deadline), written only for tokens that have no order yet. Entries of the older
/// format, without those fields, are left out.
#[derive(Default)]
struct Unseen {
    token: Vec<String>,
    sku: Vec<String>,
    user: Vec<String>,
    request_id: Vec<String>,
    qty: Vec<i32>,
    at_ms: Vec<i64>,
    created: Vec<Option<i64>>,
}

impl Unseen {
    fn push(&mut self, ev: &FeedEvent) -> Result<(), MaterializeError> {
        let qty = ev
            .get("qty")
            .and_then(|v| v.parse::<i32>().ok())
            .unwrap_or(0);
        let (user, request_id) = (
            ev.get("user").unwrap_or(""),
            ev.get("request_id").unwrap_or(""),
        );
        if qty <= 0 || user.is_empty() || request_id.is_empty() {
            return Ok(());
        }
        self.token.push(ev.text("token")?);
        self.sku.push(ev.text("sku")?);
        self.user.push(user.to_owned());
        self.request_id.push(request_id.to_owned());
        self.qty.push(qty);
        self.at_ms.push(ev.num("at_ms")?);
        self.created.push(None);
        Ok(())
    }
}

/// A batch's entries sorted by kind into the columns of the ledger functions that apply
/// them (migrations/0007), one statement per kind.
#[derive(Default)]
struct Batch {
    /// `reserved`: token, sku, user, request id, qty, deadline, creation time.
    token: Vec<String>,
    sku: Vec<String>,
    user: Vec<String>,
    request_id: Vec<String>,
    qty: Vec<i32>,
    expires_at_ms: Vec<i64>,
    created_at_ms: Vec<i64>,
    /// `committed` and `released` tokens.
    committed: Vec<String>,
    released: Vec<String>,
    /// The orders the finishes describe on their own.
    finished: Unseen,
    /// `extended`: token and new deadline.
    ext_token: Vec<String>,
    ext_expires_at_ms: Vec<i64>,
}

impl Batch {
    fn sort(events: &[FeedEvent]) -> Result<Self, MaterializeError> {
        let mut b = Batch::default();
        for ev in events {
            match ev.kind() {
                "reserved" => {
                    b.token.push(ev.text("token")?);
                    b.sku.push(ev.text("sku")?);
                    b.user.push(ev.text("user")?);
                    b.request_id.push(ev.text("request_id")?);
                    b.qty.push(i32::try_from(ev.num("qty")?).map_err(|_| {
                        MaterializeError::Protocol(format!("entry {}-0: qty", ev.lsn))
                    })?);
                    b.expires_at_ms.push(ev.num("expires_at_ms")?);
                    b.created_at_ms.push(ev.num("created_at_ms")?);
                }
                "committed" => {
                    b.committed.push(ev.text("token")?);
                    b.finished.push(ev)?;
                }
                "released" => {
                    b.released.push(ev.text("token")?);
                    b.finished.push(ev)?;
                }
                "extended" => {
                    b.ext_token.push(ev.text("token")?);
                    b.ext_expires_at_ms.push(ev.num("expires_at_ms")?);
                }
                _ => {}
            }
        }
        Ok(b)
    }

    /// The orders: reserved → PENDING, batched into one statement, then the ones only
    /// a finish describes. Counted in `rep.created`.
    async fn write_orders(
        &self,
        tx: &mut PgConnection,
        rep: &mut BatchReport,
    ) -> Result<(), MaterializeError> {
        // One statement per kind, each a ledger function (migrations/0007): the rules
        // live in the ledger, beside the checkout's.
        if !self.token.is_empty() {
            rep.created = sqlx::query_scalar::<_, i64>(
                "SELECT materialize_reserved($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(&self.token)
            .bind(&self.sku)
            .bind(&self.user)
            .bind(&self.request_id)
            .bind(&self.qty)
            .bind(&self.expires_at_ms)
            .bind(&self.created_at_ms)
            .fetch_one(&mut *tx)
            .await? as u64;
        }
        let finished = &self.finished;
        if !finished.token.is_empty() {
            // A finish whose reservation this feed never carried (the sale moved here
            // from another group, whose materializer may not have read it yet): the
            // order is written from the finish itself, then moved like any other; the
            // other feed's `reserved`, read later, leaves it as it is.
            rep.created += sqlx::query_scalar::<_, i64>(
                "SELECT materialize_reserved($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(&finished.token)
            .bind(&finished.sku)
            .bind(&finished.user)
            .bind(&finished.request_id)
            .bind(&finished.qty)
            .bind(&finished.at_ms)
            .bind(&finished.created)
            .fetch_one(&mut *tx)
            .await? as u64;
        }
        Ok(())
    }

    /// The extensions, then the orders' moves to COMMITTED and CANCELLED, counted in
    /// `rep`.
    async fn write_moves(
        &self,
        tx: &mut PgConnection,
        rep: &mut BatchReport,
    ) -> Result<(), MaterializeError> {
        if !self.ext_token.is_empty() {
            sqlx::query("SELECT materialize_extended($1, $2)")
                .bind(&self.ext_token)
                .bind(&self.ext_expires_at_ms)
                .execute(&mut *tx)
                .await?;
        }
        for (tokens, to, n) in [
            (&self.committed, "COMMITTED", &mut rep.committed),
            (&self.released, "CANCELLED", &mut rep.cancelled),
        ] {
            if tokens.is_empty() {
                continue;
            }
            *n = sqlx::query_scalar::<_, i64>("SELECT materialize_transition($1, $2)")
                .bind(to)
                .bind(tokens)
                .fetch_one(&mut *tx)
                .await? as u64;
        }
        Ok(())
    }
}

/// The connection of a feed consumer ([`FeedReader`], [`crate::group::GroupReader`]):
/// one fixed address (redis-rs' connection manager, which reconnects to that address),
/// or the primary a Sentinel-managed group names ([`crate::sentinel`]: discovered, and
/// rediscovered on a connection error, `-READONLY` or `-NOREPLICAS`, with the bounded
/// attempts and backoff of [`SentinelConfig`]).
// The plain variant is the connection manager itself, as the readers always held it
// (the client's `Transport` does the same).
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub(crate) enum FeedConn {
    Direct(ConnectionManager),
    Sentinel(Arc<SentinelConn>),
}

/// Maps a server's error reply (a code) to the feed's typed errors.
fn reply_error(msg: String) -> MaterializeError {
    if msg.contains("trimmed") {
        MaterializeError::Trimmed(msg)
    } else {
        MaterializeError::Feed(msg)
    }
}

impl FeedConn {
    /// `addr`: `host:port` or a `redis://user:pass@host:port` URL. `response_timeout`
    /// must be longer than any `BLOCK` the reader asks for.
    pub(crate) async fn direct(
        addr: &str,
        tls: Option<&crate::tls::TlsConfig>,
        response_timeout: Duration,
    ) -> Result<FeedConn, MaterializeError> {
        let client = crate::tls::redis_client(addr, tls)?;
        let cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(Duration::from_secs(2))
            .set_response_timeout(response_timeout)
            .set_number_of_retries(3)
            .set_max_delay(1000);
        let conn = ConnectionManager::new_with_config(client, cfg)
            .await
            .map_err(crate::tls::explain)?;
        Ok(FeedConn::Direct(conn))
    }

    /// The primary of the group the Sentinels of `cfg` monitor, found now (retrying as
    /// `cfg` says: a consumer started during a failover waits for its end).
    pub(crate) async fn sentinel(
        cfg: SentinelConfig,
        response_timeout: Duration,
    ) -> Result<FeedConn, MaterializeError> {
        let client_cfg = ClientConfig {
            response_timeout,
            ..ClientConfig::default()
        };
        let conn = SentinelConn::connect(cfg, client_cfg)
            .await
            .map_err(MaterializeError::from_client)?;
        Ok(FeedConn::Sentinel(conn))
    }

    pub(crate) async fn target(
        target: &ServerTarget,
        response_timeout: Duration,
    ) -> Result<FeedConn, MaterializeError> {
        match target {
            ServerTarget::Addr(a) => FeedConn::direct(a, None, response_timeout).await,
            ServerTarget::TlsAddr(a, tls) => FeedConn::direct(a, Some(tls), response_timeout).await,
            ServerTarget::Sentinel(c) => FeedConn::sentinel(c.clone(), response_timeout).await,
        }
    }

    /// The Sentinel-named primary in use (None between a failure and the next
    /// discovery); None for a fixed address.
    pub(crate) fn primary_addr(&self) -> Option<String> {
        match self {
            FeedConn::Direct(_) => None,
            FeedConn::Sentinel(s) => s.primary_addr(),
        }
    }

    /// Sends `cmd`, mapping the server's error replies to typed errors. In Sentinel mode
    /// a refusal (`-READONLY`, `-NOREPLICAS`) is always resent to the rediscovered
    /// primary; after a connection error `cmd` is resent only with
    /// [`Retry::Idempotent`], which each caller states (and justifies) per command. The
    /// fixed-address mode sends once, as it always did (the connection manager
    /// reconnects for the next call).
    pub(crate) async fn call(
        &self,
        cmd: &redis::Cmd,
        retry: Retry,
    ) -> Result<Value, MaterializeError> {
        self.call_unless(cmd, retry, None)
            .await?
            .ok_or_else(|| MaterializeError::Protocol("unexpected error reply".into()))
    }

    /// [`FeedConn::call`], except that the error reply with code `tolerated` (e.g.
    /// `BUSYGROUP`) is `Ok(None)`.
    pub(crate) async fn call_unless(
        &self,
        cmd: &redis::Cmd,
        retry: Retry,
        tolerated: Option<&str>,
    ) -> Result<Option<Value>, MaterializeError> {
        match self {
            FeedConn::Direct(c) => {
                let mut conn = c.clone();
                match cmd.query_async(&mut conn).await {
                    Ok(v) => Ok(Some(v)),
                    Err(e) if tolerated.is_some() && e.code() == tolerated => Ok(None),
                    Err(e) if e.kind() != redis::ErrorKind::IoError && e.code().is_some() => {
                        Err(reply_error(e.to_string()))
                    }
                    Err(e) => Err(e.into()),
                }
            }
            FeedConn::Sentinel(s) => match s.call(cmd, retry).await {
                Ok(v) => Ok(Some(v)),
                Err(ClientError::Server { code, .. }) if tolerated.is_some_and(|t| t == code) => {
                    Ok(None)
                }
                Err(e) => Err(MaterializeError::from_client(e)),
            },
        }
    }
}

impl MaterializeError {
    /// A Sentinel-mode call's error: the server's own replies as the fixed-address mode
    /// reports them, connection errors as connection errors, the rest as `Primary`.
    fn from_client(e: ClientError) -> MaterializeError {
        match e {
            ClientError::Connection(e) => MaterializeError::Connection(e),
            ClientError::Server { code, detail } => reply_error(format!("{code}: {detail}")),
            other => MaterializeError::Primary(other),
        }
    }
}

/// A consumer of one feed stream with a position it holds itself (XREAD).
///
/// Every command it sends is a read (`XREAD`, `XRANGE`, `XINFO STREAM`): sending one
/// again changes nothing on the server, so in Sentinel mode each is resent to the new
/// leader after a connection error as well as after a refusal. Positions are LSNs, the
/// same on every member of a group, and a member's feed holds committed entries only, so
/// a read after position `p` means the same on the new leader. A feed of another history
/// is recognised by the entry at the position ([`FeedReader::check_history`]).
#[derive(Clone)]
pub struct FeedReader {
    conn: FeedConn,
    stream: String,
    /// The hold groups ([`FeedReader::hold`]) seen to exist on the server, so that only
    /// the first hold of a process asks: moving an existing one is then `SETID` alone.
    held: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

/// Longer than any BLOCK a [`FeedReader`] asks for.
const FEED_RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) fn bulk(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// A bulk or simple string reply as an owned `String`, its buffer moved, not copied
/// (invalid UTF-8, which the server never sends, is replaced).
fn into_text(v: Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(
            String::from_utf8(b)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
        ),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// The entries of one stream in an XREAD/XREADGROUP reply, taking the reply apart (its
/// strings become the entries' fields without a copy). An entry the log no longer has
/// (a pending entry re-read after its segment was deleted: `[id, nil]`) has no fields,
/// so its `kind()` is empty.
pub(crate) fn parse_entries(v: Value) -> Result<Vec<FeedEvent>, MaterializeError> {
    let bad = |what: &str| MaterializeError::Protocol(format!("feed entries: {what}"));
    let Value::Array(items) = v else {
        return Err(bad("not an array"));
    };
    let mut out = Vec::with_capacity(items.len());
    for it in items {
        let Value::Array(pair) = it else {
            return Err(bad("an entry is not an array"));
        };
        let mut pair = pair.into_iter();
        let (Some(id), Some(kv), None) = (pair.next(), pair.next(), pair.next()) else {
            return Err(bad("an entry is not [id, fields]"));
        };
        let lsn = match &id {
            Value::BulkString(b) => std::str::from_utf8(b)
                .ok()
                .and_then(|t| t.split_once('-'))
                .and_then(|(a, _)| a.parse().ok()),
            _ => None,
        }
        .ok_or_else(|| bad("an entry id"))?;
        let kv = match kv {
            Value::Array(kv) => kv,
            Value::Nil => Vec::new(),
            _ => return Err(bad("an entry's fields")),
        };
        let mut fields = Vec::with_capacity(kv.len() / 2);
        let mut kv = kv.into_iter();
        while let (Some(k), Some(v)) = (kv.next(), kv.next()) {
            let k = into_text(k).ok_or_else(|| bad("a field name"))?;
            let v = into_text(v).ok_or_else(|| bad("a field value"))?;
            fields.push((k, v));
        }
        out.push(FeedEvent { lsn, fields });
    }
    Ok(out)
}

/// The one stream's entries of an XREAD/XREADGROUP reply (RESP2 `[[stream, entries]]`
/// or RESP3 `{stream: entries}`); nil is none.
pub(crate) fn one_stream(v: Value) -> Result<Vec<FeedEvent>, MaterializeError> {
    match v {
        Value::Nil => Ok(Vec::new()),
        Value::Array(streams) => match streams.into_iter().next() {
            Some(Value::Array(pair)) if pair.len() == 2 => pair
                .into_iter()
                .nth(1)
                .map_or(Ok(Vec::new()), parse_entries),
            None => Ok(Vec::new()),
            Some(other) => Err(MaterializeError::Protocol(format!("{other:?}"))),
        },
        Value::Map(m) => match m.into_iter().next() {
            Some((_, es)) => parse_entries(es),
            None => Ok(Vec::new()),
        },
        other => Err(MaterializeError::Protocol(format!("{other:?}"))),
    }
}

impl FeedReader {
    /// `addr`: `host:port` or a `redis://user:pass@host:port` URL (role sweeper or admin).
    pub async fn connect(addr: &str, stream: &str) -> Result<Self, MaterializeError> {
        Ok(FeedReader {
            conn: FeedConn::direct(addr, None, FEED_RESPONSE_TIMEOUT).await?,
            stream: stream.to_owned(),
            held: Arc::default(),
        })
    }

    /// The feed of whichever node the Sentinels of `cfg` name primary, followed across
    /// failovers (see the type's doc). Node credentials: `cfg.node_username` /
    /// `node_password` (role sweeper or admin).
    pub async fn connect_sentinel(
        cfg: SentinelConfig,
        stream: &str,
    ) -> Result<Self, MaterializeError> {
        Ok(FeedReader {
            conn: FeedConn::sentinel(cfg, FEED_RESPONSE_TIMEOUT).await?,
            stream: stream.to_owned(),
            held: Arc::default(),
        })
    }

    /// [`FeedReader::connect`] or [`FeedReader::connect_sentinel`].
    pub async fn connect_target(
        target: &ServerTarget,
        stream: &str,
    ) -> Result<Self, MaterializeError> {
        Ok(FeedReader {
            conn: FeedConn::target(target, FEED_RESPONSE_TIMEOUT).await?,
            stream: stream.to_owned(),
            held: Arc::default(),
        })
    }

    /// The node read from in Sentinel mode (None between a failure and the next
    /// discovery); None with a fixed address.
    pub fn primary_addr(&self) -> Option<String> {
        self.conn.primary_addr()
    }

    /// Sends `cmd`: only reads, so resent after a lost reply too (the type's doc).
    async fn query(&self, cmd: &redis::Cmd) -> Result<Value, MaterializeError> {
        self.conn.call(cmd, Retry::Idempotent).await
    }

    /// LSN of the stream's last durable entry (0 when it has none): `XINFO STREAM`'s
    /// `last-generated-id`.
    pub async fn end(&self) -> Result<u64, MaterializeError> {
        let mut cmd = redis::cmd("XINFO");
        cmd.arg("STREAM").arg(&self.stream);
        let v = self.query(&cmd).await?;
        let bad = || MaterializeError::Protocol(format!("XINFO STREAM: {v:?}"));
        // RESP2: a flat [field, value, ...] array; RESP3: a map.
        let pairs: Vec<(&Value, &Value)> = match &v {
            Value::Array(kv) => kv
                .chunks(2)
                .filter_map(|c| Some((c.first()?, c.get(1)?)))
                .collect(),
            Value::Map(m) => m.iter().map(|(k, v)| (k, v)).collect(),
            _ => return Err(bad()),
        };
        let id = pairs
            .iter()
            .find(|(k, _)| bulk(k).as_deref() == Some("last-generated-id"))
            .and_then(|(_, v)| bulk(v))
            .ok_or_else(bad)?;
        id.split_once('-')
            .and_then(|(a, _)| a.parse().ok())
            .ok_or_else(bad)
    }

    /// Up to `count` entries after `after_lsn`, without blocking (`XRANGE (id + COUNT n`).
    pub async fn range_after(
        &self,
        after_lsn: u64,
        count: usize,
    ) -> Result<Vec<FeedEvent>, MaterializeError> {
        let mut cmd = redis::cmd("XRANGE");
        cmd.arg(&self.stream)
            .arg(format!("({after_lsn}-0"))
            .arg("+")
            .arg("COUNT")
            .arg(count);
        parse_entries(self.query(&cmd).await?)
    }

    /// The entry at `lsn` itself, if the feed has it (`XRANGE lsn-0 lsn-0`).
    pub async fn entry_at(&self, lsn: u64) -> Result<Option<FeedEvent>, MaterializeError> {
        let mut cmd = redis::cmd("XRANGE");
        cmd.arg(&self.stream)
            .arg(format!("{lsn}-0"))
            .arg(format!("{lsn}-0"));
        Ok(parse_entries(self.query(&cmd).await?)?
            .into_iter()
            .find(|e| e.lsn == lsn))
    }

    /// The history id of the node read from (`INFO server`, see [`crate::identity`]).
    pub async fn history(&self) -> Result<Option<String>, MaterializeError> {
        let v = self.query(redis::cmd("INFO").arg("server")).await?;
        crate::client::history_in_info(&v)
            .ok_or_else(|| MaterializeError::Protocol(format!("INFO: {v:?}")))
    }

    /// Checks that this feed holds the entry `(lsn, fingerprint)` a consumer's position
    /// names: the same entry there, or (when the entry itself is gone) a feed that
    /// reaches at least that far. `lsn` 0 or an unknown fingerprint names nothing.
    pub async fn check_history(
        &self,
        lsn: u64,
        fingerprint: Option<i64>,
    ) -> Result<(), MaterializeError> {
        let Some(want) = fingerprint.filter(|_| lsn > 0) else {
            return Ok(());
        };
        let at = self.primary_addr().unwrap_or_else(|| "the server".into());
        match self.entry_at(lsn).await? {
            Some(e) if e.fingerprint() == want => Ok(()),
            Some(e) => Err(MaterializeError::History(format!(
                "the ledger's position is entry {lsn}-0, but {at} holds a different entry \
                 there (type '{}'): this feed is another history (a server restored from an \
                 older copy, another group, or a node that was split from its group). \
                 Nothing was applied; point the materializer at the group the ledger came \
                 from, or rebuild the ledger's orders from this server (docs/replication.md, \
                 'The feed')",
                e.kind()
            ))),
            None => {
                let end = self.end().await?;
                if end < lsn {
                    Err(MaterializeError::History(format!(
                        "the ledger's position is entry {lsn}-0, but the feed of {at} ends at \
                         {end}-0: this server lost acknowledged records or is another \
                         history. Nothing was applied; point the materializer at the group \
                         the ledger came from"
                    )))
                } else {
                    // Gone by retention: the read after it says "trimmed".
                    Ok(())
                }
            }
        }
    }

    /// Registers `position` as consumer group `name`'s last-delivered id on this feed
    /// (`XGROUP SETID`, or `XGROUP CREATE` the first time). A Raft group's members never
    /// snapshot past a consumer group's position, so the entries after it stay readable
    /// on every member (docs/replication.md, "The feed"); on a single node it is only
    /// bookkeeping. The group is never read from.
    ///
    /// Every command is one the server answers without an error reply when things are
    /// as they should be: error replies are what operators' dashboards count
    /// (`errorstats`), so a first start must not put `NOGROUP` there, nor every restart
    /// `BUSYGROUP`. Whether the group exists is read first (`XINFO GROUPS`), once per
    /// process.
    pub async fn hold(&self, name: &str, position: u64) -> Result<(), MaterializeError> {
        // Both are idempotent (they state the result), so resent after a lost reply too.
        let id = format!("{position}-0");
        if !self.is_held(name) {
            let created = !self.group_exists(name).await? && self.create_group(name, &id).await?;
            self.mark_held(name, true);
            if created {
                return Ok(());
            }
        }
        let mut set = redis::cmd("XGROUP");
        set.arg("SETID").arg(&self.stream).arg(name).arg(&id);
        if self
            .conn
            .call_unless(&set, Retry::Idempotent, Some("NOGROUP"))
            .await?
            .is_some()
        {
            return Ok(());
        }
        // Destroyed by an operator since, or another node that lacks it.
        self.mark_held(name, false);
        if !self.create_group(name, &id).await? {
            // Created meanwhile by another instance: set it.
            self.conn.call(&set, Retry::Idempotent).await?;
        }
        self.mark_held(name, true);
        Ok(())
    }

    fn is_held(&self, name: &str) -> bool {
        self.held.lock().is_ok_and(|h| h.contains(name))
    }

    fn mark_held(&self, name: &str, held: bool) {
        if let Ok(mut h) = self.held.lock() {
            if held {
                h.insert(name.to_owned());
            } else {
                h.remove(name);
            }
        }
    }

    /// Whether consumer group `name` exists on this feed (`XINFO GROUPS`, a read).
    async fn group_exists(&self, name: &str) -> Result<bool, MaterializeError> {
        let mut cmd = redis::cmd("XINFO");
        cmd.arg("GROUPS").arg(&self.stream);
        let v = self.query(&cmd).await?;
        let Value::Array(groups) = &v else {
            return Err(MaterializeError::Protocol(format!("XINFO GROUPS: {v:?}")));
        };
        // Each group: RESP2 a flat [field, value, ...] array, RESP3 a map.
        Ok(groups.iter().any(|g| {
            let pairs: Vec<(&Value, &Value)> = match g {
                Value::Array(kv) => kv
                    .chunks(2)
                    .filter_map(|c| Some((c.first()?, c.get(1)?)))
                    .collect(),
                Value::Map(m) => m.iter().map(|(k, v)| (k, v)).collect(),
                _ => Vec::new(),
            };
            pairs.iter().any(|(k, v)| {
                bulk(k).as_deref() == Some("name") && bulk(v).as_deref() == Some(name)
            })
        }))
    }

    /// `XGROUP CREATE` of `name` at `id`; false when it exists already (`BUSYGROUP`:
    /// another instance created it meanwhile).
    async fn create_group(&self, name: &str, id: &str) -> Result<bool, MaterializeError> {
        let mut create = redis::cmd("XGROUP");
        create.arg("CREATE").arg(&self.stream).arg(name).arg(id);
        Ok(self
            .conn
            .call_unless(&create, Retry::Idempotent, Some("BUSYGROUP"))
            .await?
            .is_some())
    }

    /// Up to `count` entries after `after_lsn`, waiting up to `block_ms` for new ones.
    pub async fn read(
        &self,
        after_lsn: u64,
        count: usize,
        block_ms: u64,
    ) -> Result<Vec<FeedEvent>, MaterializeError> {
        self.xread(after_lsn, count, Some(block_ms)).await
    }

    /// Up to `count` entries after `after_lsn`, answering at once (no `BLOCK`; the
    /// server's `BLOCK 0` would wait, as Redis's does).
    pub async fn read_now(
        &self,
        after_lsn: u64,
        count: usize,
    ) -> Result<Vec<FeedEvent>, MaterializeError> {
        self.xread(after_lsn, count, None).await
    }

    async fn xread(
        &self,
        after_lsn: u64,
        count: usize,
        block_ms: Option<u64>,
    ) -> Result<Vec<FeedEvent>, MaterializeError> {
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT").arg(count);
        if let Some(ms) = block_ms {
            cmd.arg("BLOCK").arg(ms);
        }
        cmd.arg("STREAMS")
            .arg(&self.stream)
            .arg(format!("{after_lsn}-0"));
        one_stream(self.query(&cmd).await?)
    }
}

/// How far a materializer is behind the feed (see [`lag`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lag {
    /// The consumer's committed position (`feed_position.last_lsn`).
    pub position: u64,
    /// The feed's last durable entry (`last-generated-id` of `XINFO STREAM`).
    pub end: u64,
    /// `end - position`: log records not yet consumed. Group records take log positions
    /// too (the ids have gaps where they are), so this is an upper bound on entries.
    pub records: u64,
    /// Age of the oldest unconsumed entry that carries a timestamp, among the first
    /// [`LAG_SCAN`] after the position; if none of those does, the time since the
    /// position last moved. 0 when nothing is unconsumed.
    pub seconds: f64,
}

/// Entries [`lag`] examines after the position to date the oldest unconsumed one.
pub const LAG_SCAN: usize = 100;

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The lag of `consumer` (a row of `feed_position`) behind `reader`'s stream; `None`
/// if that consumer has never run (no row). Read-only on both sides, so a sweeper can
/// watch a materializer that is stopped, which is when the lag matters.
pub async fn lag(
    pool: &PgPool,
    reader: &FeedReader,
    consumer: &str,
) -> Result<Option<Lag>, MaterializeError> {
    // The consumer's position on this feed's history (each group's materializer has its
    // own); one from before positions carried a history ('') counts until it is claimed.
    let history = reader.history().await?;
    let Some(row) = sqlx::query(
        "SELECT last_lsn, (extract(epoch FROM updated_at) * 1000)::int8 \
         FROM feed_position WHERE consumer = $1 \
           AND ($2::text IS NULL OR history_id = $2 OR history_id = '') \
         ORDER BY history_id DESC LIMIT 1",
    )
    .bind(consumer)
    .bind(history)
    .fetch_optional(pool)
    .await?
    else {
        return Ok(None);
    };
    let position = row.try_get::<i64, _>(0)?.max(0) as u64;
    let moved_ms: i64 = row.try_get(1)?;
    let end = reader.end().await?;
    // The feed can be behind the position only if the server lost acknowledged records
    // (it cannot under its durability rules); report 0 rather than a huge unsigned lag.
    let records = end.saturating_sub(position);
    let seconds = if records == 0 {
        0.0
    } else {
        let first = reader.range_after(position, LAG_SCAN).await?;
        let oldest = first
            .iter()
            .filter_map(|e| {
                e.get("created_at_ms")
                    .or_else(|| e.get("at_ms"))
                    .and_then(|v| v.parse::<i64>().ok())
            })
            .min()
            .unwrap_or(moved_ms);
        (unix_ms() - oldest).max(0) as f64 / 1000.0
    };
    Ok(Some(Lag {
        position,
        end,
        records,
        seconds,
    }))
}

/// How a [`Materializer`] reads the feed.
#[derive(Clone, Debug)]
pub struct MaterializerConfig {
    /// Name of this consumer's row in `feed_position`.
    pub consumer: String,
    /// The stream read, normally the all-events stream [`ALL_EVENTS`].
    pub stream: String,
    /// Entries per XREAD and per SQL transaction.
    pub batch: usize,
    /// How long one `XREAD BLOCK` waits for new entries, in ms.
    pub block_ms: u64,
}

impl Default for MaterializerConfig {
    fn default() -> Self {
        MaterializerConfig {
            consumer: "materializer".into(),
            stream: ALL_EVENTS.into(),
            batch: 2000,
            block_ms: 1000,
        }
    }
}

/// What one batch did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// Feed entries the batch read.
    pub entries: usize,
    /// PENDING orders written.
    pub created: u64,
    /// Orders moved to COMMITTED.
    pub committed: u64,
    /// Orders moved to CANCELLED (their units went back).
    pub cancelled: u64,
    /// Position after the batch.
    pub position: u64,
}

/// Writes the orders the feed describes into the Postgres ledger, exactly once per entry (see the
/// module doc).
pub struct Materializer {
    pool: PgPool,
    /// The same pool as a ledger: the server binding (`crate::identity`).
    ledger: crate::ledger::postgres::PgLedger,
    reader: FeedReader,
    cfg: MaterializerConfig,
    /// The history of the group this materializer follows, once checked: its position
    /// is the `feed_position` row of (consumer, history), and a feed of another history
    /// later (even one the ledger is bound to) is refused.
    history: std::sync::Mutex<Option<String>>,
}

impl Materializer {
    /// A materializer writing into `ledger`'s database what it reads with `reader`.
    pub fn new(
        ledger: &crate::ledger::postgres::PgLedger,
        reader: FeedReader,
        cfg: MaterializerConfig,
    ) -> Self {
        Materializer {
            pool: ledger.pool().clone(),
            ledger: ledger.clone(),
            reader,
            cfg,
            history: std::sync::Mutex::new(None),
        }
    }

    fn pinned(&self) -> Option<String> {
        self.history.lock().map(|h| h.clone()).unwrap_or(None)
    }

    /// Checks that the node read from reports one of the ledger's bound histories, and
    /// the same one as every earlier check of this materializer. Returns it.
    async fn pin_history(&self) -> Result<String, MaterializeError> {
        let now = crate::identity::ensure_bound(&self.ledger, self.reader.history().await?).await?;
        let mut pinned = self
            .history
            .lock()
            .map_err(|_| MaterializeError::Feed("history lock poisoned".into()))?;
        match pinned.as_deref() {
            Some(h) if h != now => Err(MaterializeError::History(format!(
                "this materializer follows server history {h}, but the node it reads from now \
                 reports history {now} (another group); nothing was applied. Run one \
                 materializer per group"
            ))),
            Some(_) => Ok(now),
            None => {
                *pinned = Some(now.clone());
                Ok(now)
            }
        }
    }

    /// The history whose position this materializer moves (checked once).
    async fn history(&self) -> Result<String, MaterializeError> {
        match self.pinned() {
            Some(h) => Ok(h),
            None => self.pin_history().await,
        }
    }

    /// Keeps the feed from being compacted past `position` (see [`FeedReader::hold`]).
    /// Best effort: a hold left behind only keeps more of the log, so a failure (a
    /// failover in the middle, an older server) is logged and the next batch sets it.
    async fn hold(&self, position: u64) {
        let name = format!("hold.{}", self.cfg.consumer);
        if let Err(e) = self.reader.hold(&name, position).await {
            tracing::debug!("materializer: feed hold {name} at {position}: {e}");
        }
    }

    /// The committed position (creating the row at 0 on first use).
    pub async fn position(&self) -> Result<u64, MaterializeError> {
        Ok(self.position_and_fingerprint().await?.0)
    }

    /// The committed position and the fingerprint of the entry it names (None at 0).
    async fn position_and_fingerprint(&self) -> Result<(u64, Option<i64>), MaterializeError> {
        let history = self.history().await?;
        // A position written before positions carried their history, in a ledger that
        // had no binding then, is this consumer's first group's.
        sqlx::query(
            "UPDATE feed_position SET history_id = $2 WHERE consumer = $1 AND history_id = '' \
             AND NOT EXISTS (SELECT 1 FROM feed_position \
                             WHERE consumer = $1 AND history_id = $2)",
        )
        .bind(&self.cfg.consumer)
        .bind(&history)
        .execute(&self.pool)
        .await?;
        sqlx::query(
            "INSERT INTO feed_position (consumer, history_id, stream, last_lsn) \
             VALUES ($1, $2, $3, 0) ON CONFLICT (consumer, history_id) DO NOTHING",
        )
        .bind(&self.cfg.consumer)
        .bind(&history)
        .bind(&self.cfg.stream)
        .execute(&self.pool)
        .await?;
        let row = sqlx::query(
            "SELECT last_lsn, last_fingerprint FROM feed_position \
             WHERE consumer = $1 AND history_id = $2",
        )
        .bind(&self.cfg.consumer)
        .bind(&history)
        .fetch_one(&self.pool)
        .await?;
        let lsn: i64 = row.try_get(0)?;
        Ok((lsn.max(0) as u64, row.try_get(1)?))
    }

    /// The committed position, after checking that the feed read from holds the entry it
    /// names ([`FeedReader::check_history`]). Checked again whenever the reader has moved
    /// to another node (Sentinel mode), before anything read there is applied.
    async fn checked_position(
        &self,
        checked: &mut Option<Option<String>>,
    ) -> Result<u64, MaterializeError> {
        let (pos, fp) = self.position_and_fingerprint().await?;
        self.hold(pos).await;
        // Until one check ran on one node from start to end (a failover in the middle
        // re-runs it on the new node).
        for _ in 0..8 {
            let before = self.reader.primary_addr();
            if checked.as_ref() == Some(&before) && before.is_some() {
                return Ok(pos);
            }
            self.pin_history().await?;
            self.reader.check_history(pos, fp).await?;
            let after = self.reader.primary_addr();
            if after == before {
                *checked = Some(after);
                return Ok(pos);
            }
        }
        Err(MaterializeError::Feed(
            "the primary changed during every history check: retrying later".into(),
        ))
    }

    /// Reads one batch after the committed position and applies it (blocking up to
    /// `block_ms` when there is nothing new). An empty report means nothing arrived.
    pub async fn step(&self) -> Result<BatchReport, MaterializeError> {
        let mut checked = None;
        let pos = self.checked_position(&mut checked).await?;
        let events = self
            .reader
            .read(pos, self.cfg.batch, self.cfg.block_ms)
            .await?;
        if checked != Some(self.reader.primary_addr()) {
            // Read from another node than the one checked: check there, read again.
            return Ok(BatchReport {
                position: self.checked_position(&mut checked).await?,
                ..BatchReport::default()
            });
        }
        if events.is_empty() {
            return Ok(BatchReport {
                position: pos,
                ..BatchReport::default()
            });
        }
        let rep = self.apply(pos, &events).await?;
        if rep.entries > 0 {
            self.hold(rep.position).await;
        }
        Ok(rep)
    }

    /// Applies `events` (read after `pos`) and moves the position past them, in one
    /// transaction. If the position moved meanwhile (another materializer), applies
    /// nothing and reports the current position.
    pub async fn apply(
        &self,
        pos: u64,
        events: &[FeedEvent],
    ) -> Result<BatchReport, MaterializeError> {
        let last = events.last().map_or(pos, |e| e.lsn);
        let history = self.history().await?;
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "SELECT last_lsn FROM feed_position WHERE consumer = $1 AND history_id = $2 \
             FOR UPDATE",
        )
        .bind(&self.cfg.consumer)
        .bind(&history)
        .fetch_one(&mut *tx)
        .await?;
        let current: i64 = row.try_get(0)?;
        if current as u64 != pos {
            tx.rollback().await?;
            return Ok(BatchReport {
                position: current.max(0) as u64,
                ..BatchReport::default()
            });
        }
        let mut rep = BatchReport {
            entries: events.len(),
            position: last,
            ..BatchReport::default()
        };
        let batch = Batch::sort(events)?;
        batch.write_orders(&mut tx, &mut rep).await?;
        batch.write_moves(&mut tx, &mut rep).await?;
        sqlx::query("SELECT feed_set_position($1, $2, $3, $4)")
            .bind(&self.cfg.consumer)
            .bind(&history)
            .bind(last as i64)
            .bind(events.last().map(FeedEvent::fingerprint))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(rep)
    }

    /// Applies batches back to back, the next batch's `XREAD` in flight while the
    /// current one's transaction runs, so the feed read (server, network, parsing) and
    /// Postgres work at the same time instead of taking turns. Prefetching changes
    /// nothing about exactly-once: a batch is read after the position its predecessor
    /// *would* leave, and it is applied only if that transaction committed and left
    /// exactly that position (`apply` checks the row under its lock).
    ///
    /// With `drain`, returns the position once a blocking read finds nothing new;
    /// otherwise runs until an error, which it returns (the position is re-read from
    /// the ledger by the next call, so nothing prefetched outlives a failure).
    pub async fn pump(&self, drain: bool) -> Result<u64, MaterializeError> {
        let mut checked = None;
        let mut pos = self.checked_position(&mut checked).await?;
        let mut next = Vec::new();
        loop {
            if next.is_empty() {
                next = self
                    .reader
                    .read(pos, self.cfg.batch, self.cfg.block_ms)
                    .await?;
                if next.is_empty() {
                    if drain {
                        return Ok(pos);
                    }
                    continue;
                }
            }
            if checked != Some(self.reader.primary_addr()) {
                // Read from a node the position was not checked on (a failover between
                // reads): check there and read again from the committed position.
                pos = self.checked_position(&mut checked).await?;
                next.clear();
                continue;
            }
            let last = next.last().map_or(pos, |e| e.lsn);
            let (applied, following) = tokio::join!(
                self.apply(pos, &next),
                self.reader.read_now(last, self.cfg.batch)
            );
            let rep = applied?;
            if rep.entries > 0 {
                tracing::debug!(?rep, "materialized batch");
                self.hold(rep.position).await;
            }
            if rep.position == last {
                pos = last;
                // A failed prefetch is only re-read: the batch itself committed.
                next = following.unwrap_or_default();
            } else {
                // Another instance moved the position: continue from where it is.
                pos = rep.position;
                next.clear();
            }
        }
    }

    /// Runs batches ([`Materializer::pump`]) until `stop` resolves. Transient errors
    /// (server or database away) back off and retry; a trimmed position is returned,
    /// since only an operator can decide how to resynchronise.
    pub async fn run(
        &self,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<(), MaterializeError> {
        tokio::pin!(stop);
        let mut backoff = Duration::from_millis(100);
        loop {
            let started = std::time::Instant::now();
            let r = tokio::select! {
                _ = &mut stop => return Ok(()),
                r = self.pump(false) => r,
            };
            // A pump that ran a while before failing was healthy: start the backoff over.
            if started.elapsed() > Duration::from_secs(10) {
                backoff = Duration::from_millis(100);
            }
            match r {
                Ok(_) => backoff = Duration::from_millis(100),
                // Another history or another server: only an operator can decide. A
                // server that reports no history yet (a group electing) is retried.
                Err(
                    e @ (MaterializeError::Trimmed(_)
                    | MaterializeError::History(_)
                    | MaterializeError::Identity(crate::identity::IdentityError::Mismatch {
                        ..
                    })),
                ) => return Err(e),
                Err(e) => {
                    tracing::warn!("materializer: {e}; retrying in {backoff:?}");
                    tokio::select! {
                        _ = &mut stop => return Ok(()),
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn entry(id: &str, kv: &[&str]) -> Value {
        Value::Array(vec![b(id), Value::Array(kv.iter().map(|s| b(s)).collect())])
    }

    #[test]
    fn entries_of_resp2_and_resp3_replies() {
        let entries = || {
            Value::Array(vec![
                entry("7-0", &["type", "reserved", "token", "{S}t1", "qty", "2"]),
                // A pending entry whose record is gone: no fields.
                Value::Array(vec![b("9-0"), Value::Nil]),
            ])
        };
        let resp2 = Value::Array(vec![Value::Array(vec![b("stockgate:events"), entries()])]);
        let resp3 = Value::Map(vec![(b("stockgate:events"), entries())]);
        for v in [resp2, resp3] {
            let es = one_stream(v).unwrap();
            assert_eq!(es.len(), 2);
            assert_eq!(es[0].lsn, 7);
            assert_eq!(es[0].kind(), "reserved");
            assert_eq!(es[0].get("token"), Some("{S}t1"));
            assert_eq!(es[0].num("qty").unwrap(), 2);
            assert_eq!(es[0].get("user"), None);
            assert_eq!((es[1].lsn, es[1].kind()), (9, ""));
        }
        assert!(one_stream(Value::Nil).unwrap().is_empty());
        assert!(parse_entries(Value::Array(vec![b("x")])).is_err());
        assert!(parse_entries(Value::Array(vec![entry("no-lsn", &[])])).is_err());
    }

    #[test]
    fn fingerprints_name_one_entry() {
        let e = |lsn, kv: &[(&str, &str)]| FeedEvent {
            lsn,
            fields: kv.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect(),
        };
        let a = e(7, &[("type", "reserved"), ("token", "t1")]);
        assert_eq!(a.fingerprint(), a.clone().fingerprint());
        // The value this build computes, pinned: ledgers outlive binaries.
        assert_eq!(a.fingerprint(), 5_301_418_808_679_797_553);
        for other in [
            e(8, &[("type", "reserved"), ("token", "t1")]),
            e(7, &[("type", "reserved"), ("token", "t2")]),
            e(7, &[("type", "reserve"), ("dtoken", "t1")]),
            e(7, &[("type", "reserved")]),
        ] {
            assert_ne!(a.fingerprint(), other.fingerprint(), "{other:?}");
        }
    }
}
