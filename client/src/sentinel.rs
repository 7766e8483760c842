//! A connection to whichever node the "sentinels" name the primary (a Raft group's
//! members, which answer the Sentinel discovery commands, or real Redis Sentinels), the
//! way redis-py's `Sentinel(...).master_for(name)` behaves: ask the sentinels
//! (`SENTINEL get-master-addr-by-name`, first that answers), confirm with `ROLE` that the
//! node is a master, and on a connection error, `-READONLY`, `-NOREPLICAS` or `-LOADING` ask again
//! and retry, a bounded number of times with backoff.
//!
//! Why not `redis::sentinel::SentinelClient` (redis 0.27): it puts no timeout on the
//! Sentinel queries nor on its `ROLE` check (a stopped Sentinel or node hangs discovery
//! forever), and it only hands out a plain connection: finding the new primary after a
//! failover, and deciding which commands may be sent again, would be ours anyway.
//!
//! What is retried: `-READONLY`, `-NOREPLICAS` and `-LOADING` are refusals before the
//! command ran (`raft::node`'s refusals), so any command is sent again. After a connection
//! error the command may or may not have run on the old primary; only commands whose
//! repetition changes nothing are sent again: RESERVE (same request id → `REPLAY`),
//! COMMIT and RELEASE (per token), EXTEND, reads, the sale commands that state their
//! result (`SALE.CREATE` with the same parameters, `SALE.FENCE`, `SALE.RESTORE`,
//! `SALE.PAUSE`/`RESUME`). `SALE.ADJUST` (a delta) and `SALE.REBUILD` are not: the error
//! goes to the caller, whose own retry (`adjust --id`, a re-run of `rebuild`) reads the
//! server first.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo,
    Value,
};
use tracing::{debug, info, warn};

use crate::conn_config::ClientConfig;
use crate::error::ClientError;
use crate::tls::TlsConfig;
use crate::value::as_string;

/// Where the Sentinels are, what they call the group, and how hard to try.
#[derive(Clone, Debug)]
pub struct SentinelConfig {
    /// Sentinel addresses: `host:port` or `redis://[user:pass@]host:port` (a Sentinel
    /// with `requirepass`).
    pub sentinels: Vec<String>,
    /// The name in `sentinel monitor <name> ...`.
    pub master_name: String,
    /// Credentials for the nodes the Sentinels name (AUTH), if the group has users.
    pub node_username: Option<String>,
    /// The password for those nodes, with `node_username` (or alone, for `requirepass`).
    pub node_password: Option<String>,
    /// Connect + answer timeout of each Sentinel query and of the `ROLE` check.
    pub sentinel_timeout: Duration,
    /// Attempts per command, the first included. With the default backoff, 40 attempts
    /// span about 19 s: several failovers of 2–3 s.
    pub max_attempts: u32,
    /// Backoff before the second attempt, doubled each time up to `backoff_max`.
    pub backoff_min: Duration,
    /// The longest backoff between attempts.
    pub backoff_max: Duration,
}

impl SentinelConfig {
    /// A configuration for the group `master_name` monitored by `sentinels`, with the default
    /// timeouts, attempts and backoff.
    pub fn new(sentinels: Vec<String>, master_name: impl Into<String>) -> Self {
        SentinelConfig {
            sentinels,
            master_name: master_name.into(),
            node_username: None,
            node_password: None,
            sentinel_timeout: Duration::from_secs(1),
            max_attempts: 40,
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_millis(500),
        }
    }

    /// `host:port[,host:port...]` as the command-line tools take it.
    pub fn parse_list(list: &str) -> Vec<String> {
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    }

    fn backoff(&self, attempt: u32) -> Duration {
        // attempt ≥ 1 here; the shift is capped so a large `max_attempts` cannot overflow.
        let factor = 1u32 << attempt.saturating_sub(1).min(16);
        self.backoff_min
            .saturating_mul(factor)
            .min(self.backoff_max)
    }
}

/// Where a tool's server is: one address, or a Sentinel-managed group.
#[derive(Clone, Debug)]
pub enum ServerTarget {
    /// `host:port` or `redis://user:pass@host:port` (`rediss://` for TLS verified by the
    /// system's roots).
    Addr(String),
    /// `host:port` or a `redis://`/`rediss://` URL, over TLS with these settings.
    TlsAddr(String, TlsConfig),
    /// A group found through its Sentinels.
    Sentinel(SentinelConfig),
}

impl ServerTarget {
    /// The target the command-line tools' flags name: `--sentinel` (a `host:port,...`
    /// list) with `--master-name` and the optional node credentials, or else `server`.
    /// The error is the flag problem, for the tool to report.
    pub fn from_flags(
        server: &str,
        sentinel: Option<&str>,
        master_name: Option<&str>,
        node_username: Option<&str>,
        node_password: Option<&str>,
    ) -> Result<ServerTarget, String> {
        let Some(list) = sentinel else {
            return Ok(ServerTarget::Addr(server.to_owned()));
        };
        let sentinels = SentinelConfig::parse_list(list);
        if sentinels.is_empty() {
            return Err("--sentinel: no address".into());
        }
        let Some(name) = master_name.filter(|n| !n.is_empty()) else {
            return Err("--sentinel needs --master-name".into());
        };
        let mut cfg = SentinelConfig::new(sentinels, name);
        cfg.node_username = node_username.map(str::to_owned);
        cfg.node_password = node_password.map(str::to_owned);
        Ok(ServerTarget::Sentinel(cfg))
    }
}

impl ServerTarget {
    /// This target over TLS when `tls` is given (from [`crate::tls::TlsArgs::load`]).
    /// Sentinel over TLS is not supported: the error says so.
    pub fn with_tls(self, tls: Option<TlsConfig>) -> Result<ServerTarget, String> {
        match (self, tls) {
            (t, None) => Ok(t),
            (ServerTarget::Addr(a) | ServerTarget::TlsAddr(a, _), Some(tls)) => {
                Ok(ServerTarget::TlsAddr(a, tls))
            }
            (ServerTarget::Sentinel(_), Some(_)) => {
                Err("TLS through --sentinel is not supported: name the server with --server".into())
            }
        }
    }
}

impl std::fmt::Display for ServerTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServerTarget::Addr(a) => f.write_str(a),
            ServerTarget::TlsAddr(a, _) => write!(f, "{a} (TLS)"),
            ServerTarget::Sentinel(c) => write!(
                f,
                "primary of {:?} by Sentinel {}",
                c.master_name,
                c.sentinels.join(",")
            ),
        }
    }
}

/// Whether a command may be sent again after a connection error (the reply was lost, so
/// it may have run).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Running it twice has the effect of running it once.
    Idempotent,
    /// Only refusals (`-READONLY`, `-NOREPLICAS`, `-LOADING`: it did not run) are retried.
    RefusalsOnly,
}

#[derive(Clone)]
struct Current {
    generation: u64,
    addr: String,
    conn: MultiplexedConnection,
}

/// The shared state behind every clone of a Sentinel-backed `StockgateClient`.
pub struct SentinelConn {
    cfg: SentinelConfig,
    client_cfg: ClientConfig,
    sentinels: Vec<ConnectionInfo>,
    /// The connection in use; `None` once it failed. Held only to clone or replace it,
    /// never across an await.
    current: Mutex<Option<Current>>,
    /// One discovery at a time: when many calls fail together (a killed primary fails
    /// every call in flight), the first one rediscovers and the others use its result.
    discovering: tokio::sync::Mutex<()>,
    generation: AtomicU64,
    /// Discovery rounds started: a call that waited for another call's round and finds no
    /// connection after it shares that round's failure instead of running its own (with
    /// many calls waiting, rounds one after the other would multiply the delay).
    rounds: AtomicU64,
    /// The Sentinel that answered last is asked first next time (redis-py does the same).
    preferred: AtomicUsize,
}

impl SentinelConn {
    /// Validates the configuration and connects to the primary, retrying discovery as a
    /// call retries (`max_attempts`, backoff).
    pub async fn connect(
        cfg: SentinelConfig,
        client_cfg: ClientConfig,
    ) -> Result<Arc<SentinelConn>, ClientError> {
        if cfg.sentinels.is_empty() {
            return Err(ClientError::Config("no Sentinel address given".into()));
        }
        if cfg.master_name.is_empty() {
            return Err(ClientError::Config("no master name given".into()));
        }
        let sentinels = cfg
            .sentinels
            .iter()
            .map(|s| {
                let url = if s.contains("://") {
                    s.clone()
                } else {
                    format!("redis://{s}")
                };
                url.as_str()
                    .into_connection_info()
                    .map_err(|e| ClientError::Config(format!("Sentinel address {s:?}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let conn = Arc::new(SentinelConn {
            cfg,
            client_cfg,
            sentinels,
            current: Mutex::new(None),
            discovering: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
            rounds: AtomicU64::new(0),
            preferred: AtomicUsize::new(0),
        });
        // Bounded like a call: a tool started during a failover waits for its end.
        let mut attempt = 0;
        loop {
            match conn.connection().await {
                Ok(_) => return Ok(conn),
                Err(e) if attempt + 1 < conn.cfg.max_attempts => {
                    attempt += 1;
                    debug!(attempt, error = %e, "no primary yet");
                    tokio::time::sleep(conn.cfg.backoff(attempt)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The primary in use (discovered first if none is) with the node credentials, and the
    /// timeout a connection to it gets: where a live watch subscribes.
    pub(crate) async fn primary_info(&self) -> Result<(ConnectionInfo, Duration), ClientError> {
        let current = self.connection().await?;
        let bad = || ClientError::Config(format!("primary address {:?}", current.addr));
        let (host, port) = current.addr.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let info = ConnectionInfo {
            addr: ConnectionAddr::Tcp(host.to_string(), port),
            redis: RedisConnectionInfo {
                username: self.cfg.node_username.clone(),
                password: self.cfg.node_password.clone(),
                ..Default::default()
            },
        };
        let timeout = self
            .client_cfg
            .connect_timeout
            .max(self.client_cfg.response_timeout);
        Ok((info, timeout))
    }

    /// The address of the primary in use, if connected.
    pub fn primary_addr(&self) -> Option<String> {
        self.lock_current().as_ref().map(|c| c.addr.clone())
    }

    fn lock_current(&self) -> std::sync::MutexGuard<'_, Option<Current>> {
        // A panic elsewhere while holding this lock leaves at worst a stale connection,
        // which the next failure replaces: the poison carries no meaning here.
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends `cmd` to the primary, rediscovering it and retrying as the module doc says.
    pub async fn call(&self, cmd: &redis::Cmd, retry: Retry) -> Result<Value, ClientError> {
        let mut last = None;
        for attempt in 0..self.cfg.max_attempts.max(1) {
            if attempt > 0 {
                tokio::time::sleep(self.cfg.backoff(attempt)).await;
            }
            let cur = match self.connection().await {
                Ok(c) => c,
                Err(e) => {
                    debug!(attempt, error = %e, "no primary yet");
                    last = Some(e);
                    continue;
                }
            };
            let mut conn = cur.conn.clone();
            let err = match cmd.query_async::<Value>(&mut conn).await {
                Ok(v) => return Ok(v),
                Err(e) => ClientError::from(e),
            };
            match &err {
                ClientError::ReadOnly | ClientError::NoReplicas | ClientError::Loading => {
                    // A replica, a fenced former primary, a primary without enough
                    // replicas (yet), or a leader still catching up: it did not run the
                    // command. Ask the Sentinels again.
                    debug!(attempt, primary = %cur.addr, error = %err, "refused; rediscovering");
                    self.invalidate(cur.generation);
                }
                ClientError::Connection(_) => {
                    self.invalidate(cur.generation);
                    if retry != Retry::Idempotent {
                        return Err(err);
                    }
                    debug!(attempt, primary = %cur.addr, error = %err, "connection lost; rediscovering");
                }
                _ => return Err(err),
            }
            last = Some(err);
        }
        Err(last.unwrap_or_else(|| ClientError::NoPrimary {
            master_name: self.cfg.master_name.clone(),
            detail: "no attempt made".into(),
        }))
    }

    /// Drops the connection of `generation` if it is still the one in use (a newer one,
    /// found by a concurrent call, is kept).
    fn invalidate(&self, generation: u64) {
        let mut cur = self.lock_current();
        if cur.as_ref().is_some_and(|c| c.generation == generation) {
            *cur = None;
        }
    }

    async fn connection(&self) -> Result<Current, ClientError> {
        if let Some(c) = self.lock_current().clone() {
            return Ok(c);
        }
        let round = self.rounds.load(Ordering::Acquire);
        let _one = self.discovering.lock().await;
        // Another call may have found the primary while this one waited.
        if let Some(c) = self.lock_current().clone() {
            return Ok(c);
        }
        if self.rounds.load(Ordering::Acquire) != round {
            return Err(ClientError::NoPrimary {
                master_name: self.cfg.master_name.clone(),
                detail: "a concurrent discovery found none".into(),
            });
        }
        self.rounds.fetch_add(1, Ordering::AcqRel);
        let (addr, conn) = self.discover().await?;
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let c = Current {
            generation,
            addr,
            conn,
        };
        *self.lock_current() = Some(c.clone());
        Ok(c)
    }

    /// One round over the Sentinels, the last one that answered first.
    async fn discover(&self) -> Result<(String, MultiplexedConnection), ClientError> {
        let n = self.sentinels.len();
        let start = self.preferred.load(Ordering::Relaxed) % n;
        let mut why = Vec::new();
        for i in 0..n {
            let idx = (start + i) % n;
            let sentinel = &self.cfg.sentinels[idx];
            let (host, port) = match self.ask_sentinel(idx).await {
                Ok(Some(hp)) => hp,
                Ok(None) => {
                    why.push(format!("{sentinel}: does not know the master"));
                    continue;
                }
                Err(e) => {
                    why.push(format!("{sentinel}: {e}"));
                    continue;
                }
            };
            match self.connect_primary(&host, port).await {
                Ok(conn) => {
                    self.preferred.store(idx, Ordering::Relaxed);
                    let addr = format!("{host}:{port}");
                    info!(primary = %addr, sentinel = %sentinel, master = %self.cfg.master_name, "connected to the primary named by Sentinel");
                    return Ok((addr, conn));
                }
                Err(e) => why.push(format!("{sentinel} names {host}:{port}: {e}")),
            }
        }
        let detail = why.join("; ");
        warn!(master = %self.cfg.master_name, %detail, "no primary found");
        Err(ClientError::NoPrimary {
            master_name: self.cfg.master_name.clone(),
            detail,
        })
    }

    /// `SENTINEL get-master-addr-by-name`: `None` if this Sentinel does not monitor it.
    async fn ask_sentinel(&self, idx: usize) -> Result<Option<(String, u16)>, String> {
        let t = self.cfg.sentinel_timeout;
        let client = redis::Client::open(self.sentinels[idx].clone()).map_err(|e| e.to_string())?;
        let acfg = AsyncConnectionConfig::new()
            .set_connection_timeout(t)
            .set_response_timeout(t);
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&acfg)
            .await
            .map_err(|e| e.to_string())?;
        let v: Value = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.cfg.master_name)
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        match &v {
            Value::Nil => Ok(None),
            Value::Array(a) if a.len() == 2 => {
                let host = as_string(&a[0]);
                let port = as_string(&a[1]).and_then(|p| p.parse::<u16>().ok());
                match (host, port) {
                    (Some(h), Some(p)) => Ok(Some((h, p))),
                    _ => Err(format!("unexpected reply {v:?}")),
                }
            }
            _ => Err(format!("unexpected reply {v:?}")),
        }
    }

    /// Connects to `host:port` and checks `ROLE` says master: a Sentinel's view can lag
    /// (it still names the killed primary, or a node it has just made a replica).
    async fn connect_primary(
        &self,
        host: &str,
        port: u16,
    ) -> Result<MultiplexedConnection, String> {
        let info = ConnectionInfo {
            addr: ConnectionAddr::Tcp(host.to_string(), port),
            redis: RedisConnectionInfo {
                username: self.cfg.node_username.clone(),
                password: self.cfg.node_password.clone(),
                ..Default::default()
            },
        };
        let client = redis::Client::open(info).map_err(|e| e.to_string())?;
        let acfg = AsyncConnectionConfig::new()
            .set_connection_timeout(self.client_cfg.connect_timeout)
            .set_response_timeout(self.client_cfg.response_timeout);
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&acfg)
            .await
            .map_err(|e| e.to_string())?;
        // The ROLE check gets the short timeout: a stopped node must not hold discovery
        // for the whole response timeout.
        let role = tokio::time::timeout(
            self.cfg
                .sentinel_timeout
                .max(self.client_cfg.connect_timeout),
            redis::cmd("ROLE").query_async::<Value>(&mut conn),
        )
        .await
        .map_err(|_| "ROLE timed out".to_string())?
        .map_err(|e| e.to_string())?;
        let first = match &role {
            Value::Array(a) => a.first().and_then(as_string),
            _ => None,
        };
        match first.as_deref() {
            Some("master") => Ok(conn),
            Some(other) => Err(format!("ROLE is {other}, not master")),
            None => Err(format!("unexpected ROLE reply {role:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let c = SentinelConfig::new(vec!["127.0.0.1:1".into()], "sg");
        assert_eq!(c.backoff(1), Duration::from_millis(50));
        assert_eq!(c.backoff(2), Duration::from_millis(100));
        assert_eq!(c.backoff(5), Duration::from_millis(500));
        assert_eq!(c.backoff(1000), Duration::from_millis(500));
        let total: Duration = (1..c.max_attempts).map(|a| c.backoff(a)).sum();
        assert!(total > Duration::from_secs(15), "{total:?}");
    }

    #[test]
    fn targets_from_flags() {
        let t = ServerTarget::from_flags("h:1", None, Some("sg"), None, None);
        assert!(matches!(t, Ok(ServerTarget::Addr(a)) if a == "h:1"));
        let t = ServerTarget::from_flags("h:1", Some("a:1,b:2"), Some("sg"), Some("u"), Some("p"));
        match t {
            Ok(ServerTarget::Sentinel(c)) => {
                assert_eq!(c.sentinels, vec!["a:1", "b:2"]);
                assert_eq!(c.master_name, "sg");
                assert_eq!(
                    (c.node_username.as_deref(), c.node_password.as_deref()),
                    (Some("u"), Some("p"))
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(ServerTarget::from_flags("h:1", Some(" , "), Some("sg"), None, None).is_err());
        assert!(ServerTarget::from_flags("h:1", Some("a:1"), None, None, None).is_err());
        assert!(ServerTarget::from_flags("h:1", Some("a:1"), Some(""), None, None).is_err());
    }

    #[test]
    fn parses_address_lists() {
        assert_eq!(
            SentinelConfig::parse_list("a:1, b:2,,c:3"),
            vec!["a:1", "b:2", "c:3"]
        );
    }

    #[tokio::test]
    async fn refuses_empty_configs() {
        let e = SentinelConn::connect(SentinelConfig::new(vec![], "sg"), ClientConfig::default())
            .await
            .err();
        assert!(matches!(e, Some(ClientError::Config(_))), "{e:?}");
        let e = SentinelConn::connect(
            SentinelConfig::new(vec!["127.0.0.1:1".into()], ""),
            ClientConfig::default(),
        )
        .await
        .err();
        assert!(matches!(e, Some(ClientError::Config(_))), "{e:?}");
    }

    #[tokio::test]
    async fn no_sentinel_answering_is_no_primary() {
        // A port nothing listens on (bound, then released).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("port");
        let mut cfg = SentinelConfig::new(vec![format!("127.0.0.1:{port}")], "sg");
        cfg.max_attempts = 2;
        let e = SentinelConn::connect(cfg, ClientConfig::default())
            .await
            .err();
        assert!(matches!(e, Some(ClientError::NoPrimary { .. })), "{e:?}");
    }
}
