//! The TCP server: accept loop, one task per connection, pipelining, limits, graceful
//! shutdown. Knows nothing of stock: commands go to `cmd::dispatch`.
//!
//! A connection reads whatever the socket has, runs every complete command in it,
//! encodes all replies into one buffer, waits once for the log position of the batch's
//! last state change to be acknowledged by the WAL, and then writes the whole buffer
//! with one syscall: one wake-up per pipelined batch, never a reply ahead of its record.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::cmd::{table, Ctx};
use crate::engine::{Engine, Lsn};
use crate::protocol::{parse_command, Limits, Parsed, Reply};

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub bind: String,
    pub port: u16,
    pub data_dir: String,
    pub fsync: String,
    pub durable: bool,
    pub auto_release: bool,
    pub default_shards: u16,
    pub default_ttl_ms: u64,
    pub retention_ms: u64,
    pub limits: Limits,
    pub max_clients: usize,
    /// Bytes a client may leave buffered in an unfinished command (slowloris guard).
    pub max_query_buffer: usize,
    /// Bytes of replies one batch may produce before the client is disconnected.
    pub max_output_buffer: usize,
    /// Disconnect clients silent this long; 0 = never.
    pub idle_timeout_ms: u64,
    /// Disconnect clients that do not read their replies for this long.
    pub write_timeout_ms: u64,
    /// How often expiry, auto-release and retention run.
    pub tick_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            bind: "127.0.0.1".into(),
            port: 7379,
            data_dir: "./stockgate-data".into(),
            fsync: "everysec".into(),
            durable: false,
            auto_release: false,
            default_shards: 16,
            default_ttl_ms: 630_000,
            retention_ms: 86_400_000,
            limits: Limits::default(),
            max_clients: 10_000,
            max_query_buffer: 8 * 1024 * 1024,
            max_output_buffer: 64 * 1024 * 1024,
            idle_timeout_ms: 0,
            write_timeout_ms: 30_000,
            tick_ms: 20,
        }
    }
}

/// What the server needs from the persistence layer. `NoDurability` for a memory-only
/// server; the WAL implements it in `persist`.
pub trait Durability: Send + Sync {
    /// Resolves when everything up to `lsn` is acknowledged by the log. An error means
    /// the record may not be on disk: the reply must not be sent.
    fn wait(&self, lsn: Lsn) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>>;
    /// `SAVE`: write a snapshot now.
    fn save(&self, engine: &Engine) -> Result<(), String>;
    /// Lines for INFO's Persistence section.
    fn info(&self) -> String;
}

pub struct NoDurability;

impl Durability for NoDurability {
    fn wait(&self, _lsn: Lsn) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>> {
        Box::pin(async { Ok(()) })
    }
    fn save(&self, _engine: &Engine) -> Result<(), String> {
        Err("persistence is disabled".into())
    }
    fn info(&self) -> String {
        "aof_enabled:0\r\n".into()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Admin,
    Checkout,
    Sweeper,
}

impl Role {
    pub fn bit(self) -> u8 {
        match self {
            Role::Admin => table::ADMIN,
            Role::Checkout => table::CHECKOUT,
            Role::Sweeper => table::SWEEPER,
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "admin" => Some(Role::Admin),
            "checkout" => Some(Role::Checkout),
            "sweeper" => Some(Role::Sweeper),
            _ => None,
        }
    }
}

/// Configured users. Passwords are kept only as SHA-256 digests and compared in constant
/// time, so neither a timing side channel nor a memory dump gives them away.
pub struct Users {
    users: Vec<(String, [u8; 32], Role)>,
}

fn digest(b: &[u8]) -> [u8; 32] {
    Sha256::digest(b).into()
}

fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let mut d = 0u8;
    for i in 0..32 {
        d |= a[i] ^ b[i];
    }
    d == 0
}

impl Users {
    /// Users file: one `<user> <role> <password>` per line; `#` comments.
    pub fn parse(text: &str) -> Result<Users, String> {
        let mut users = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut p = line.splitn(3, char::is_whitespace);
            let (Some(u), Some(r), Some(pw)) = (p.next(), p.next(), p.next()) else {
                return Err(format!(
                    "users file line {}: expected `<user> <role> <password>`",
                    i + 1
                ));
            };
            let role = Role::parse(r).ok_or_else(|| {
                format!(
                    "users file line {}: role must be admin, checkout or sweeper",
                    i + 1
                )
            })?;
            users.push((u.to_string(), digest(pw.trim().as_bytes()), role));
        }
        Ok(Users { users })
    }

    pub fn add(&mut self, user: &str, password: &str, role: Role) {
        self.users
            .push((user.to_string(), digest(password.as_bytes()), role));
    }

    pub fn empty() -> Users {
        Users { users: Vec::new() }
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    pub fn check(&self, user: &[u8], pass: &[u8]) -> Option<Role> {
        let d = digest(pass);
        let mut found = None;
        // Look at every entry so the time taken does not say which user exists.
        for (u, pw, role) in &self.users {
            let ok = ct_eq(pw, &d);
            if u.as_bytes() == user && ok && found.is_none() {
                found = Some(*role);
            }
        }
        found
    }
}

#[derive(Default)]
pub struct Stats {
    pub connected: AtomicU64,
    pub connections: AtomicU64,
    pub commands: AtomicU64,
    pub rejected: AtomicU64,
    pub auth_failures: AtomicU64,
    pub noperm: AtomicU64,
    pub protocol_errors: AtomicU64,
    pub qbuf_disconnects: AtomicU64,
    pub obuf_disconnects: AtomicU64,
    pub idle_disconnects: AtomicU64,
    pub reserved: AtomicU64,
    pub replay: AtomicU64,
    pub soldout: AtomicU64,
    pub limit: AtomicU64,
}

impl Stats {
    pub fn count_reserve(&self, reply: &Reply) {
        if let Reply::Array(items) = reply {
            let c = match items.first() {
                Some(Reply::Bulk(b)) if b == b"RESERVED" => &self.reserved,
                Some(Reply::Bulk(b)) if b == b"REPLAY" => &self.replay,
                Some(Reply::Bulk(b)) if b == b"SOLDOUT" => &self.soldout,
                Some(Reply::Bulk(b)) if b == b"LIMIT" => &self.limit,
                _ => return,
            };
            c.fetch_add(1, Ordering::Relaxed);
        }
    }
}

pub struct Shared {
    pub config: ServerConfig,
    /// `None`: no users configured, every connection is admin.
    pub users: Option<Users>,
    pub stats: Stats,
    pub started: Instant,
    pub local_port: AtomicU16,
    pub durability: Arc<dyn Durability>,
    /// Command/latency/error/sale counters, the slow log (see `metrics`).
    pub metrics: crate::metrics::Metrics,
}

impl Shared {
    pub fn new(
        config: ServerConfig,
        users: Option<Users>,
        durability: Arc<dyn Durability>,
    ) -> Self {
        Shared {
            config,
            users,
            stats: Stats::default(),
            started: Instant::now(),
            local_port: AtomicU16::new(0),
            durability,
            metrics: crate::metrics::Metrics::new(),
        }
    }
}

/// Per-connection state.
pub struct ConnState {
    pub id: u64,
    pub proto: u8,
    pub name: Option<String>,
    pub role: Option<Role>,
    pub user_name: Option<String>,
    pub lib_name: String,
    pub lib_ver: String,
    pub addr: String,
    pub laddr: String,
}

impl ConnState {
    pub fn describe(&self) -> String {
        format!(
            "id={} addr={} laddr={} name={} db=0 resp={} user={} lib-name={} lib-ver={}",
            self.id,
            self.addr,
            self.laddr,
            self.name.as_deref().unwrap_or(""),
            self.proto,
            self.user_name.as_deref().unwrap_or("default"),
            self.lib_name,
            self.lib_ver
        )
    }
}

static NEXT_CLIENT_ID: AtomicU64 = AtomicU64::new(1);

/// Runs the server until `shutdown` resolves; then stops accepting, lets each connection
/// finish the batch it is running, and returns once all are gone (or after 10 s).
pub async fn serve(
    listener: TcpListener,
    engine: Arc<Engine>,
    shared: Arc<Shared>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    if let Ok(a) = listener.local_addr() {
        shared.local_port.store(a.port(), Ordering::Relaxed);
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    let ticker = {
        let engine = engine.clone();
        let period = Duration::from_millis(shared.config.tick_ms.max(1));
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let mut iv = tokio::time::interval(period);
            iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = iv.tick() => { engine.tick(); }
                    _ = stop.changed() => break,
                }
            }
        })
    };
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => {
                let (stream, addr) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let st = &shared.stats;
                st.connections.fetch_add(1, Ordering::Relaxed);
                if st.connected.load(Ordering::Relaxed) as usize >= shared.config.max_clients {
                    st.rejected.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(async move {
                        let mut s = stream;
                        let _ = tokio::time::timeout(Duration::from_secs(1), s.write_all(b"-ERR max number of clients reached\r\n")).await;
                    });
                    continue;
                }
                st.connected.fetch_add(1, Ordering::Relaxed);
                let (engine, shared, stop) = (engine.clone(), shared.clone(), stop_rx.clone());
                conns.spawn(async move {
                    handle(stream, addr, &engine, &shared, stop).await;
                    shared.stats.connected.fetch_sub(1, Ordering::Relaxed);
                });
            }
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    conns.abort_all();
    let _ = ticker.await;
    Ok(())
}

async fn handle(
    mut stream: TcpStream,
    addr: SocketAddr,
    engine: &Engine,
    shared: &Shared,
    mut stop: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let cfg = &shared.config;
    let mut conn = ConnState {
        id: NEXT_CLIENT_ID.fetch_add(1, Ordering::Relaxed),
        proto: 2,
        name: None,
        role: if shared.users.is_some() {
            None
        } else {
            Some(Role::Admin)
        },
        user_name: None,
        lib_name: String::new(),
        lib_ver: String::new(),
        addr: addr.to_string(),
        laddr: stream
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default(),
    };
    let mut inbuf = BytesMut::with_capacity(16 * 1024);
    let mut out = BytesMut::with_capacity(16 * 1024);
    let mut rec = shared.metrics.recorder();
    let idle = (cfg.idle_timeout_ms > 0).then(|| Duration::from_millis(cfg.idle_timeout_ms));
    let write_timeout = Duration::from_millis(cfg.write_timeout_ms.max(1));
    loop {
        if inbuf.capacity() - inbuf.len() < 4096 {
            inbuf.reserve(16 * 1024);
        }
        let read = tokio::select! {
            r = stream.read_buf(&mut inbuf) => r,
            _ = stop.changed() => return,
            _ = async {
                match idle {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending::<()>().await,
                }
            } => {
                shared.stats.idle_disconnects.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        match read {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let mut lsn: Lsn = 0;
        let mut close = false;
        loop {
            match parse_command(&mut inbuf, &cfg.limits) {
                Ok(Parsed::Command(argv)) => {
                    if argv.is_empty() {
                        continue;
                    }
                    shared.stats.commands.fetch_add(1, Ordering::Relaxed);
                    let mut ctx = Ctx {
                        engine,
                        conn: &mut conn,
                        shared,
                    };
                    let o = crate::metrics::dispatch_timed(&mut rec, &mut ctx, &argv);
                    lsn = lsn.max(o.lsn);
                    o.reply.encode(conn.proto, &mut out);
                    if o.close {
                        close = true;
                        break;
                    }
                    if out.len() > cfg.max_output_buffer {
                        shared
                            .stats
                            .obuf_disconnects
                            .fetch_add(1, Ordering::Relaxed);
                        out.clear();
                        Reply::err("ERR output buffer limit reached; closing connection")
                            .encode(conn.proto, &mut out);
                        close = true;
                        break;
                    }
                }
                Ok(Parsed::Incomplete) => break,
                Err(e) => {
                    shared.stats.protocol_errors.fetch_add(1, Ordering::Relaxed);
                    Reply::err(format!("ERR {e}")).encode(conn.proto, &mut out);
                    close = true;
                    break;
                }
            }
        }
        if !close && inbuf.len() > cfg.max_query_buffer {
            shared
                .stats
                .qbuf_disconnects
                .fetch_add(1, Ordering::Relaxed);
            Reply::err("ERR Protocol error: query buffer limit exceeded")
                .encode(conn.proto, &mut out);
            close = true;
        }
        // Counters of this batch are visible before its replies are.
        rec.flush(&shared.metrics);
        if lsn > 0 {
            if let Err(e) = shared.durability.wait(lsn).await {
                // Fail closed: the record may not be on disk, so no acknowledgement leaves.
                tracing::error!("write-ahead log failed, dropping connection: {e}");
                return;
            }
        }
        if !out.is_empty() {
            match tokio::time::timeout(write_timeout, stream.write_all(&out)).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return,
                Err(_) => {
                    shared
                        .stats
                        .obuf_disconnects
                        .fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
            if out.capacity() > 1024 * 1024 {
                out = BytesMut::with_capacity(16 * 1024);
            } else {
                out.clear();
            }
        }
        if close {
            let _ = stream.shutdown().await;
            return;
        }
    }
}
