//! The systems under test: how each one is started, primed for a workload, asked to
//! reserve one unit, and audited afterwards.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection, Row};
use stockgate_testkit::pgtemp::{PgOptions, TempPostgres};

use crate::proc::{free_port, ChildGuard, TempDir};
use crate::resp::{encode, Reply, RespConn};
use crate::token::{fnv1a, hex, mint_admission, Keyring, ReservationKey};

pub const RESERVE_LUA: &str = include_str!("../../lua/reserve.lua");
pub const RELEASE_LUA: &str = include_str!("../../lua/release.lua");
pub const RESERVE_PER_USER_LUA: &str = include_str!("../../lua/reserve_per_user.lua");

/// Rows the "spread" Postgres target splits the stock over.
pub const PG_ROWS: u32 = 16;
/// "Unlimited" stock for the throughput workload.
pub const UNLIMITED: u64 = 1_000_000_000_000;
/// Reservation TTL the Redis baseline records (docs/design.md default: 630 s).
const TTL_SECS: u64 = 630;
const KID: &str = "bench";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum TargetKind {
    StockgateNo,
    StockgateEverysec,
    StockgateAlways,
    RedisLua,
    RedisLuaAof,
    RedisPerUser,
    PgHotRow,
    PgRows16,
    /// Not a baseline: the broken check-then-act pattern, to show the oversell detector.
    RedisGetDecr,
    /// A stockgate server (or group member) already running at `--addr`: nothing is
    /// started or stopped, connections AUTH with `--auth`, admission tokens are signed
    /// with the deployment's `--secret-file`.
    StockgateAtAddr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Stockgate,
    Redis,
    Postgres,
}

impl TargetKind {
    pub const ALL: [TargetKind; 8] = [
        TargetKind::StockgateNo,
        TargetKind::StockgateEverysec,
        TargetKind::StockgateAlways,
        TargetKind::RedisLua,
        TargetKind::RedisLuaAof,
        TargetKind::RedisPerUser,
        TargetKind::PgHotRow,
        TargetKind::PgRows16,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TargetKind::StockgateNo => "stockgate-fsync-no",
            TargetKind::StockgateEverysec => "stockgate-fsync-everysec",
            TargetKind::StockgateAlways => "stockgate-fsync-always",
            TargetKind::RedisLua => "redis-lua",
            TargetKind::RedisLuaAof => "redis-lua-aof",
            TargetKind::RedisPerUser => "redis-lua-per-user",
            TargetKind::PgHotRow => "pg-hot-row",
            TargetKind::PgRows16 => "pg-16-rows",
            TargetKind::RedisGetDecr => "redis-get-decr",
            TargetKind::StockgateAtAddr => "stockgate-at-addr",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            TargetKind::StockgateNo => "stockgate --fsync no (WAL written, never fsynced)",
            TargetKind::StockgateEverysec => "stockgate --fsync everysec",
            TargetKind::StockgateAlways => "stockgate --fsync always (fdatasync before reply)",
            TargetKind::RedisLua => "redis-server, reserve.lua by EVALSHA, no persistence",
            TargetKind::RedisLuaAof => {
                "redis-server, reserve.lua, appendonly yes, appendfsync everysec"
            }
            TargetKind::RedisPerUser => {
                "redis-server, reserve_per_user.lua (SET EX + DECRBY), no persistence"
            }
            TargetKind::PgHotRow => {
                "Postgres 15 defaults, UPDATE ... WHERE available > 0 on one row"
            }
            TargetKind::PgRows16 => {
                "Postgres 15 defaults, the same UPDATE over 16 rows (user-hashed, probe on miss)"
            }
            TargetKind::RedisGetDecr => {
                "BROKEN ON PURPOSE: GET the stock, then DECR in a second round trip \
                 (opt-in; must be reported OVERSOLD)"
            }
            TargetKind::StockgateAtAddr => "the stockgate deployment at --addr (started elsewhere)",
        }
    }

    pub fn parse(s: &str) -> Option<TargetKind> {
        let s = s.trim();
        TargetKind::ALL
            .into_iter()
            .chain([TargetKind::RedisGetDecr])
            .find(|t| {
                t.name() == s
                    || match t {
                        TargetKind::StockgateNo => s == "stockgate-no",
                        TargetKind::StockgateEverysec => s == "stockgate-everysec",
                        TargetKind::StockgateAlways => s == "stockgate-always",
                        TargetKind::PgRows16 => s == "pg-rows",
                        _ => false,
                    }
            })
    }

    pub fn family(self) -> Family {
        match self {
            TargetKind::StockgateNo
            | TargetKind::StockgateEverysec
            | TargetKind::StockgateAlways
            | TargetKind::StockgateAtAddr => Family::Stockgate,
            TargetKind::RedisLua
            | TargetKind::RedisLuaAof
            | TargetKind::RedisPerUser
            | TargetKind::RedisGetDecr => Family::Redis,
            TargetKind::PgHotRow | TargetKind::PgRows16 => Family::Postgres,
        }
    }

    /// Postgres is driven one statement at a time per connection (sqlx does not pipeline).
    pub fn supports_pipeline(self) -> bool {
        self.family() != Family::Postgres
    }

    fn fsync(self) -> &'static str {
        match self {
            TargetKind::StockgateEverysec => "everysec",
            TargetKind::StockgateAlways => "always",
            _ => "no",
        }
    }
}

/// Where the external programs are.
#[derive(Clone, Debug)]
pub struct Tools {
    pub stockgate: PathBuf,
    pub redis_server: PathBuf,
    pub start_timeout: Duration,
    /// `--addr`: the deployment to benchmark instead of starting stockgate.
    pub remote: Option<Remote>,
}

/// A running deployment given by `--addr`, `--auth` and `--secret-file`.
#[derive(Clone)]
pub struct Remote {
    pub addr: SocketAddr,
    pub auth: Option<Auth>,
    pub keyring: Keyring,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("addr", &self.addr)
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
}

/// `AUTH user password`. Its `Debug` shows the user only: the password is never printed.
#[derive(Clone)]
pub struct Auth {
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Auth({}, password hidden)", self.user)
    }
}

/// Connect and, for a deployment with users, authenticate. The error names the user and
/// the server's refusal, never the password.
async fn resp_connect(addr: SocketAddr, auth: Option<&Auth>) -> Result<RespConn> {
    let mut c = RespConn::connect(addr).await?;
    if let Some(a) = auth {
        match c.cmd(&["AUTH", &a.user, &a.password]).await? {
            Reply::Simple(s) if s == "OK" => {}
            Reply::Error(e) => bail!("{addr} refused AUTH as user {}: {e}", a.user),
            other => bail!("{addr} answered AUTH with {other:?}"),
        }
    }
    Ok(c)
}

/// A started target.
pub enum Server {
    Stockgate {
        child: ChildGuard,
        addr: SocketAddr,
        secret: Vec<u8>,
        _dir: TempDir,
    },
    /// Nothing of ours to stop: the deployment at `--addr`.
    Remote(Remote),
    Redis {
        child: ChildGuard,
        addr: SocketAddr,
        sha_reserve: String,
        sha_release: String,
        sha_per_user: String,
        _dir: TempDir,
    },
    Postgres {
        pg: Box<TempPostgres>,
        opts: PgConnectOptions,
    },
}

pub async fn start(kind: TargetKind, tools: &Tools, max_conns: usize) -> Result<Server> {
    if kind == TargetKind::StockgateAtAddr {
        let remote = tools
            .remote
            .clone()
            .ok_or_else(|| anyhow!("the stockgate-at-addr target needs --addr"))?;
        // Fail here, once, rather than in every point: unreachable, or AUTH refused.
        let mut c = resp_connect(remote.addr, remote.auth.as_ref()).await?;
        c.cmd(&["PING"]).await?.ok()?;
        return Ok(Server::Remote(remote));
    }
    match kind.family() {
        Family::Stockgate => start_stockgate(kind, tools).await,
        Family::Redis => start_redis(kind, tools).await,
        Family::Postgres => start_postgres(tools, max_conns).await,
    }
}

async fn start_stockgate(kind: TargetKind, tools: &Tools) -> Result<Server> {
    let dir = TempDir::new("sgbench-sg")?;
    let secret: [u8; 32] = rand::random();
    let secret_file = dir.path().join("secret");
    std::fs::write(&secret_file, format!("{KID} {}\n", hex(&secret)))
        .with_context(|| format!("writing {}", secret_file.display()))?;
    let mut cmd = Command::new(&tools.stockgate);
    cmd.arg("--bind")
        .arg("127.0.0.1")
        .arg("--port")
        .arg("0")
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--secret-file")
        .arg(&secret_file)
        .arg("--fsync")
        .arg(kind.fsync())
        .current_dir(dir.path());
    let mut child = ChildGuard::spawn(kind.name(), &mut cmd, &dir.path().join("server.log"))?;
    let line = child
        .wait_for_line("listening on ", tools.start_timeout)
        .await?;
    let addr_text = line
        .split("listening on ")
        .nth(1)
        .map(str::trim)
        .unwrap_or_default();
    let addr: SocketAddr = addr_text
        .parse()
        .with_context(|| format!("parsing the address in {line:?}"))?;
    Ok(Server::Stockgate {
        child,
        addr,
        secret: secret.to_vec(),
        _dir: dir,
    })
}

async fn start_redis(kind: TargetKind, tools: &Tools) -> Result<Server> {
    let dir = TempDir::new("sgbench-redis")?;
    let mut last_err = None;
    // The probed port can be taken between probe and bind: retry with another one.
    for _ in 0..3 {
        let port = free_port()?;
        let mut cmd = Command::new(&tools.redis_server);
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--daemonize", "no", "--protected-mode", "no"])
            .args(["--logfile", "", "--maxclients", "10000"])
            .arg("--dir")
            .arg(dir.path());
        if kind == TargetKind::RedisLuaAof {
            cmd.args(["--appendonly", "yes", "--appendfsync", "everysec"]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
        let mut child = ChildGuard::spawn(
            kind.name(),
            &mut cmd,
            &dir.path().join(format!("redis-{port}.log")),
        )?;
        match child
            .wait_for_line("Ready to accept connections", tools.start_timeout)
            .await
        {
            Ok(_) => {
                let addr: SocketAddr = ([127, 0, 0, 1], port).into();
                let mut c = RespConn::connect(addr).await?;
                let sha_reserve = script_load(&mut c, RESERVE_LUA).await?;
                let sha_release = script_load(&mut c, RELEASE_LUA).await?;
                let sha_per_user = script_load(&mut c, RESERVE_PER_USER_LUA).await?;
                return Ok(Server::Redis {
                    child,
                    addr,
                    sha_reserve,
                    sha_release,
                    sha_per_user,
                    _dir: dir,
                });
            }
            Err(e) => {
                let _ = child.stop(libc::SIGKILL, Duration::from_secs(5)).await;
                last_err = Some(e);
            }
        }
    }
    Err(last_err.unwrap_or_else(|| anyhow!("redis-server did not start")))
}

async fn script_load(c: &mut RespConn, script: &str) -> Result<String> {
    let r = c.cmd(&["SCRIPT", "LOAD", script]).await?.ok()?;
    r.as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("SCRIPT LOAD replied {r:?}"))
}

async fn start_postgres(tools: &Tools, max_conns: usize) -> Result<Server> {
    let opts = PgOptions {
        durable: true,
        settings: vec![("max_connections".into(), (max_conns + 20).to_string())],
        start_timeout: tools.start_timeout.max(Duration::from_secs(30)),
    };
    let pg = TempPostgres::start_with(opts)
        .await
        .context("starting a temporary Postgres cluster")?;
    let conn_opts: PgConnectOptions = pg
        .url()
        .parse()
        .with_context(|| format!("parsing {}", pg.url()))?;
    let conn_opts = conn_opts.disable_statement_logging();
    let mut c = PgConnection::connect_with(&conn_opts).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS inventory (sku text NOT NULL, shard int NOT NULL, \
         available bigint NOT NULL, PRIMARY KEY (sku, shard))",
    )
    .execute(&mut c)
    .await?;
    let _ = c.close().await;
    Ok(Server::Postgres {
        pg: Box::new(pg),
        opts: conn_opts,
    })
}

impl Server {
    pub async fn stop(self) -> Result<()> {
        match self {
            Server::Stockgate { mut child, .. } => {
                child.stop(libc::SIGTERM, Duration::from_secs(15)).await
            }
            Server::Redis { mut child, .. } => {
                child.stop(libc::SIGTERM, Duration::from_secs(15)).await
            }
            Server::Remote(_) => Ok(()),
            Server::Postgres { pg, .. } => {
                // Fast shutdown and removal happen on drop (blocking, bounded at 20 s).
                drop(pg);
                Ok(())
            }
        }
    }

    pub fn check_alive(&mut self) -> Result<()> {
        match self {
            Server::Stockgate { child, .. } | Server::Redis { child, .. } => child.check_alive(),
            // A deployment that went away fails the next point's connections instead.
            Server::Remote(_) => Ok(()),
            Server::Postgres { pg, .. } => {
                if pg.is_running() {
                    Ok(())
                } else {
                    bail!("postgres is no longer running")
                }
            }
        }
    }

    fn resp_addr(&self) -> Result<SocketAddr> {
        match self {
            Server::Stockgate { addr, .. } | Server::Redis { addr, .. } => Ok(*addr),
            Server::Remote(r) => Ok(r.addr),
            Server::Postgres { .. } => bail!("not a RESP target"),
        }
    }

    /// A RESP connection, authenticated where the target needs it.
    async fn resp(&self) -> Result<RespConn> {
        let auth = match self {
            Server::Remote(r) => r.auth.as_ref(),
            _ => None,
        };
        resp_connect(self.resp_addr()?, auth).await
    }
}

/// What the workload asks of a target: one sale of `units` for `buyers` users.
#[derive(Clone, Debug)]
pub struct SaleSpec {
    pub sku: String,
    pub units: u64,
    pub buyers: u32,
    /// Storm: every buyer sends exactly one request. Throughput: requests cycle through
    /// the buyers with fresh request ids (unlimited stock, no per-user limit).
    pub storm: bool,
}

/// Everything a worker needs to build requests for one target (shared, read-only).
pub struct Plan {
    pub kind: TargetKind,
    pub sale: SaleSpec,
    users: Vec<String>,
    /// stockgate: one admission token per buyer.
    admission: Vec<String>,
    /// Redis: the harness derives reservation tokens as the application would.
    /// Derives reservation tokens the way stockgate does (the application's job here).
    res_key: ReservationKey,
    sha_reserve: String,
    expiry_secs: String,
    stock_key: String,
    index_key: String,
    res_prefix: String,
    user_prefix: String,
    pg_opts: Option<PgConnectOptions>,
}

/// The outcome of one reserve attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Reserved,
    Replay,
    SoldOut,
    Limit,
    Error(String),
}

/// Prepare the sale on the target and build the request plan.
pub async fn prepare(kind: TargetKind, server: &Server, sale: SaleSpec) -> Result<Arc<Plan>> {
    let users: Vec<String> = (0..sale.buyers).map(|b| format!("buyer{b}")).collect();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .context("clock before 1970")?;
    let shard_tag = format!("{}_SHARD_1", sale.sku);
    let mut plan = Plan {
        kind,
        sale: sale.clone(),
        users,
        admission: Vec::new(),
        res_key: ReservationKey::from_bytes(&rand::random()),
        sha_reserve: String::new(),
        expiry_secs: (now.as_secs() + TTL_SECS).to_string(),
        stock_key: format!("{{{shard_tag}}}:stock"),
        index_key: format!("{{{shard_tag}}}:expiry_index"),
        res_prefix: format!("{{{shard_tag}}}:reservation:"),
        user_prefix: format!("{{{shard_tag}}}:user:"),
        pg_opts: None,
    };
    match server {
        Server::Stockgate { .. } | Server::Remote(_) => {
            let expires = now.as_millis() as u64 + 3_600_000;
            plan.admission = match server {
                Server::Remote(r) => plan
                    .users
                    .iter()
                    .map(|u| r.keyring.mint(&sale.sku, u, expires))
                    .collect(),
                Server::Stockgate { secret, .. } => plan
                    .users
                    .iter()
                    .map(|u| mint_admission(secret, KID, &sale.sku, u, expires))
                    .collect(),
                _ => Vec::new(),
            };
            let mut c = server.resp().await?;
            let total = sale.units.to_string();
            // Storm: one unit per buyer, as a flash sale would set it. Throughput: buyers
            // come back with new request ids, so no per-user limit.
            let limit = if sale.storm { "1" } else { "0" };
            let r = c
                .cmd(&["SALE.CREATE", &sale.sku, &total, "LIMIT", limit])
                .await?
                .ok()?;
            if r.as_str() != Some("OK") {
                bail!("SALE.CREATE replied {r:?}");
            }
        }
        Server::Redis {
            addr,
            sha_reserve,
            sha_per_user,
            ..
        } => {
            plan.sha_reserve = if kind == TargetKind::RedisPerUser {
                sha_per_user.clone()
            } else {
                sha_reserve.clone()
            };
            let mut c = RespConn::connect(*addr).await?;
            c.cmd(&["FLUSHALL"]).await?.ok()?;
            c.cmd(&["SET", &plan.stock_key, &sale.units.to_string()])
                .await?
                .ok()?;
        }
        Server::Postgres { opts, .. } => {
            let mut c = PgConnection::connect_with(opts).await?;
            sqlx::query("TRUNCATE inventory").execute(&mut c).await?;
            let rows = if kind == TargetKind::PgHotRow {
                1
            } else {
                PG_ROWS
            };
            for (shard, units) in split(sale.units, rows).into_iter().enumerate() {
                sqlx::query("INSERT INTO inventory (sku, shard, available) VALUES ($1, $2, $3)")
                    .bind(&sale.sku)
                    .bind(shard as i32)
                    .bind(units)
                    .execute(&mut c)
                    .await?;
            }
            sqlx::query("VACUUM ANALYZE inventory")
                .execute(&mut c)
                .await?;
            let _ = c.close().await;
            plan.pg_opts = Some(opts.clone());
        }
    }
    Ok(Arc::new(plan))
}

/// `total` over `n` rows, remainder to the first rows (as stockgate splits shards).
fn split(total: u64, n: u32) -> Vec<i64> {
    let n = n.max(1) as u64;
    (0..n)
        .map(|i| (total / n + u64::from(i < total % n)) as i64)
        .collect()
}

/// One worker's connection.
pub enum Conn {
    Resp(RespConn),
    Pg(Box<PgConnection>),
}

pub async fn connect(server: &Server, plan: &Plan) -> Result<Conn> {
    match &plan.pg_opts {
        Some(opts) => {
            let c = tokio::time::timeout(Duration::from_secs(60), PgConnection::connect_with(opts))
                .await
                .map_err(|_| anyhow!("connecting to postgres timed out"))??;
            Ok(Conn::Pg(Box::new(c)))
        }
        None => Ok(Conn::Resp(server.resp().await?)),
    }
}

impl Plan {
    /// The user of a request: a buyer from the pool, or (per-user Redis baseline under
    /// the throughput workload, whose script allows one reservation per user) a fresh one.
    fn user<'a>(&'a self, buyer: u32, req_id: &'a str) -> &'a str {
        if !self.sale.storm && self.kind == TargetKind::RedisPerUser {
            req_id
        } else {
            self.users
                .get(buyer as usize)
                .map(String::as_str)
                .unwrap_or("buyer0")
        }
    }

    /// Append one RESERVE-equivalent command (RESP targets).
    pub fn encode(&self, buf: &mut Vec<u8>, buyer: u32, req_id: &str) {
        let user = self.user(buyer, req_id);
        match self.kind.family() {
            Family::Stockgate => {
                let tok = self
                    .admission
                    .get(buyer as usize)
                    .map(String::as_str)
                    .unwrap_or("");
                encode(
                    buf,
                    &[
                        b"RESERVE",
                        self.sale.sku.as_bytes(),
                        user.as_bytes(),
                        tok.as_bytes(),
                        req_id.as_bytes(),
                    ],
                );
            }
            Family::Redis if self.kind == TargetKind::RedisPerUser => {
                let token = self.res_key.derive(&self.sale.sku, user, req_id);
                let user_key = format!("{}{user}", self.user_prefix);
                encode(
                    buf,
                    &[
                        b"EVALSHA",
                        self.sha_reserve.as_bytes(),
                        b"2",
                        self.stock_key.as_bytes(),
                        user_key.as_bytes(),
                        b"1",
                        b"600",
                        token.as_bytes(),
                    ],
                );
            }
            Family::Redis => {
                let token = self.res_key.derive(&self.sale.sku, user, req_id);
                let res_key = format!("{}{token}", self.res_prefix);
                encode(
                    buf,
                    &[
                        b"EVALSHA",
                        self.sha_reserve.as_bytes(),
                        b"3",
                        self.stock_key.as_bytes(),
                        self.index_key.as_bytes(),
                        res_key.as_bytes(),
                        self.sale.sku.as_bytes(),
                        user.as_bytes(),
                        b"1",
                        TTL_SECS.to_string().as_bytes(),
                        self.expiry_secs.as_bytes(),
                        token.as_bytes(),
                    ],
                );
            }
            Family::Postgres => {}
        }
    }

    /// The broken pattern, step 1: read the stock.
    pub fn encode_naive_get(&self, buf: &mut Vec<u8>) {
        encode(buf, &[b"GET", self.stock_key.as_bytes()]);
    }

    /// The broken pattern, step 2 (only if step 1 saw stock): take a unit.
    pub fn encode_naive_decr(&self, buf: &mut Vec<u8>) {
        encode(buf, &[b"DECR", self.stock_key.as_bytes()]);
    }

    /// Interpret a RESP reply; stockgate's RESERVED carries the reservation token.
    pub fn classify(&self, reply: Reply) -> (Outcome, Option<String>) {
        match self.kind.family() {
            Family::Stockgate => match reply {
                Reply::Array(Some(items)) => {
                    let first = items.first().and_then(Reply::as_str).unwrap_or("");
                    match first {
                        "RESERVED" => (
                            Outcome::Reserved,
                            items.get(1).and_then(Reply::as_str).map(str::to_string),
                        ),
                        "REPLAY" => (Outcome::Replay, None),
                        "SOLDOUT" => (Outcome::SoldOut, None),
                        "LIMIT" => (Outcome::Limit, None),
                        other => (Outcome::Error(format!("unexpected reply {other:?}")), None),
                    }
                }
                Reply::Error(e) => (Outcome::Error(e), None),
                other => (Outcome::Error(format!("unexpected reply {other:?}")), None),
            },
            _ => match reply {
                Reply::Int(1) => (Outcome::Reserved, None),
                Reply::Int(2) if self.kind == TargetKind::RedisPerUser => (Outcome::Limit, None),
                Reply::Int(2) => (Outcome::Replay, None),
                Reply::Int(0) => (Outcome::SoldOut, None),
                Reply::Error(e) => (Outcome::Error(e), None),
                other => (Outcome::Error(format!("unexpected reply {other:?}")), None),
            },
        }
    }

    /// One reservation on Postgres (autocommit, default durability).
    pub async fn pg_reserve(&self, c: &mut PgConnection, buyer: u32, req_id: &str) -> Outcome {
        match self.pg_reserve_inner(c, buyer, req_id).await {
            Ok(o) => o,
            Err(e) => Outcome::Error(e.to_string()),
        }
    }

    async fn pg_reserve_inner(
        &self,
        c: &mut PgConnection,
        buyer: u32,
        req_id: &str,
    ) -> Result<Outcome> {
        let sku = &self.sale.sku;
        if self.kind == TargetKind::PgHotRow {
            let r = sqlx::query(
                "UPDATE inventory SET available = available - 1 \
                 WHERE sku = $1 AND shard = 0 AND available > 0",
            )
            .bind(sku)
            .execute(&mut *c)
            .await?;
            return Ok(if r.rows_affected() == 1 {
                Outcome::Reserved
            } else {
                Outcome::SoldOut
            });
        }
        // The SQL version of sharding: the buyer's row first, then (only when it is empty)
        // any row that still has stock; sold out only when the sum is zero.
        let user = self.user(buyer, req_id);
        let home = (fnv1a(user) % PG_ROWS as u64) as i32;
        let r = sqlx::query(
            "UPDATE inventory SET available = available - 1 \
             WHERE sku = $1 AND shard = $2 AND available > 0",
        )
        .bind(sku)
        .bind(home)
        .execute(&mut *c)
        .await?;
        if r.rows_affected() == 1 {
            return Ok(Outcome::Reserved);
        }
        for _ in 0..1000 {
            let r = sqlx::query(
                "UPDATE inventory SET available = available - 1 WHERE sku = $1 AND available > 0 \
                 AND shard = (SELECT shard FROM inventory WHERE sku = $1 AND available > 0 \
                 ORDER BY random() LIMIT 1)",
            )
            .bind(sku)
            .execute(&mut *c)
            .await?;
            if r.rows_affected() == 1 {
                return Ok(Outcome::Reserved);
            }
            let left: i64 = sqlx::query(
                "SELECT COALESCE(SUM(available), 0)::bigint FROM inventory WHERE sku = $1",
            )
            .bind(sku)
            .fetch_one(&mut *c)
            .await?
            .try_get(0)?;
            if left <= 0 {
                return Ok(Outcome::SoldOut);
            }
        }
        bail!("no row with stock found after 1000 probes")
    }
}

/// The target's own account of the sale after a run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Audit {
    /// Units the target says are still available (sum over shards/rows).
    pub available: i64,
    /// Units the target says it handed out (reservations recorded / decrements).
    pub handed_out: i64,
    /// Any shard, row or counter below zero.
    pub negative: bool,
    /// Release of one reservation returned its unit exactly once (None: not checked).
    pub release_exactly_once: Option<bool>,
    pub notes: Vec<String>,
}

/// Read the target's state back and, where the target has a release path, check that a
/// release gives its unit back exactly once (stockgate RELEASE, release.lua).
pub async fn audit(server: &Server, plan: &Plan, sample_token: Option<&str>) -> Result<Audit> {
    let sku = &plan.sale.sku;
    let mut a = Audit::default();
    match server {
        Server::Stockgate { .. } | Server::Remote(_) => {
            let mut c = server.resp().await?;
            let info = c.cmd(&["SALE.INFO", sku]).await?.ok()?;
            let field = |name: &str| -> Option<&Reply> {
                match &info {
                    Reply::Array(Some(items)) => items
                        .chunks(2)
                        .find(|kv| kv[0].as_str() == Some(name))
                        .and_then(|kv| kv.get(1)),
                    _ => None,
                }
            };
            let num = |name: &str| -> Result<i64> {
                field(name)
                    .and_then(Reply::as_int)
                    .ok_or_else(|| anyhow!("SALE.INFO has no integer {name}: {info:?}"))
            };
            a.available = num("available")?;
            a.handed_out = num("reserved")? + num("committed")?;
            let total = num("total")?;
            if let Some(Reply::Array(Some(shards))) = field("shard_available") {
                a.negative = shards.iter().any(|s| s.as_int().unwrap_or(0) < 0);
            }
            a.negative |= a.available < 0;
            if a.available + a.handed_out != total {
                a.notes.push(format!(
                    "available {} + handed out {} != total {total}",
                    a.available, a.handed_out
                ));
            }
            if let Some(tok) = sample_token {
                let r1 = c.cmd(&["RELEASE", tok]).await?.ok()?.as_int();
                let r2 = c.cmd(&["RELEASE", tok]).await?.ok()?.as_int();
                let after = c.cmd(&["STOCK", sku]).await?.ok()?.as_int();
                a.release_exactly_once =
                    Some(r1 == Some(1) && r2 == Some(0) && after == Some(a.available + 1));
            }
        }
        Server::Redis {
            addr, sha_release, ..
        } => {
            let mut c = RespConn::connect(*addr).await?;
            a.available = c
                .cmd(&["GET", &plan.stock_key])
                .await?
                .ok()?
                .as_int()
                .ok_or_else(|| anyhow!("stock key is not an integer"))?;
            a.negative = a.available < 0;
            if plan.kind == TargetKind::RedisGetDecr {
                // No records: what left the stock key is what was handed out.
                a.handed_out = plan.sale.units as i64 - a.available;
            } else if plan.kind == TargetKind::RedisPerUser {
                let keys = c.cmd(&["DBSIZE"]).await?.ok()?.as_int().unwrap_or(0);
                a.handed_out = keys - 1; // every key but the stock key is one reservation
            } else {
                a.handed_out = c
                    .cmd(&["ZCARD", &plan.index_key])
                    .await?
                    .ok()?
                    .as_int()
                    .unwrap_or(0);
                let first = c.cmd(&["ZRANGE", &plan.index_key, "0", "0"]).await?.ok()?;
                let tok = match &first {
                    Reply::Array(Some(items)) => items.first().and_then(Reply::as_str),
                    _ => None,
                };
                if let Some(tok) = tok {
                    let res_key = format!("{}{tok}", plan.res_prefix);
                    let args = [
                        "EVALSHA",
                        sha_release,
                        "3",
                        &plan.stock_key,
                        &plan.index_key,
                        &res_key,
                        tok,
                    ];
                    let r1 = c.cmd(&args).await?.ok()?.as_int();
                    let r2 = c.cmd(&args).await?.ok()?.as_int();
                    let after = c.cmd(&["GET", &plan.stock_key]).await?.ok()?.as_int();
                    a.release_exactly_once =
                        Some(r1 == Some(1) && r2 == Some(0) && after == Some(a.available + 1));
                }
            }
            if a.available + a.handed_out != plan.sale.units as i64 {
                a.notes.push(format!(
                    "stock {} + reservations {} != {}",
                    a.available, a.handed_out, plan.sale.units
                ));
            }
        }
        Server::Postgres { opts, .. } => {
            let mut c = PgConnection::connect_with(opts).await?;
            let row = sqlx::query(
                "SELECT COALESCE(SUM(available), 0)::bigint, COALESCE(MIN(available), 0)::bigint \
                 FROM inventory WHERE sku = $1",
            )
            .bind(sku)
            .fetch_one(&mut c)
            .await?;
            a.available = row.try_get(0)?;
            let min: i64 = row.try_get(1)?;
            a.negative = min < 0;
            a.handed_out = plan.sale.units as i64 - a.available;
            let _ = c.close().await;
        }
    }
    Ok(a)
}

/// Version strings for the report.
pub fn versions(tools: &Tools) -> Vec<(String, String)> {
    let t = Duration::from_secs(10);
    let probe = |p: &std::path::Path, args: &[&str]| {
        crate::proc::run_capture(p, args, t)
            .map(|s| s.lines().next().unwrap_or("").to_string())
            .unwrap_or_else(|e| format!("unknown ({e})"))
    };
    let pg_bin = std::env::var(stockgate_testkit::pgtemp::PG_BIN_ENV)
        .unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".to_string());
    vec![
        ("stockgate".into(), probe(&tools.stockgate, &["--version"])),
        (
            "redis-server".into(),
            probe(&tools.redis_server, &["--version"]),
        ),
        (
            "postgres".into(),
            probe(&PathBuf::from(pg_bin).join("postgres"), &["--version"]),
        ),
    ]
}
