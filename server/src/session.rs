//! What a command may see of the server: the shared server state (configuration, users,
//! statistics, durability) and the state of its own connection.
//!
//! Its own module so that both the network layer (`server`) and the commands (`cmd`)
//! depend on it, and neither on the other.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU16, AtomicU64};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use crate::engine::{Engine, Lsn};
use crate::metrics::{Metrics, Recorder};
use crate::protocol::{Limits, Reply};

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
    /// The five limits below are the values at start: the running server reads
    /// `Shared::live`, which `CONFIG SET` changes.
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

/// What the commands, INFO and the network layer need of replication (`crate::raft`
/// implements it; a trait so this module does not depend on that one). A single node
/// has none (`Shared::repl` unset).
pub trait Replication: Send + Sync {
    /// The error a write gets before it runs (`READONLY ...`, `LOADING ...`), if any.
    fn write_refusal(&self) -> Option<&'static str>;
    /// The error a read of stock state gets, if any (a member still catching up).
    fn read_refusal(&self) -> Option<&'static str>;
    /// The error a read of the order feed gets, if any.
    fn feed_refusal(&self) -> Option<&'static str> {
        None
    }
    fn is_replica(&self) -> bool;
    /// The client address (`host:port`) of the group's leader when it is another member
    /// (cluster mode sends what this member refuses there, as `-MOVED`).
    fn other_leader_addr(&self) -> Option<String> {
        None
    }
    /// INFO's `# Replication` section.
    fn info(&self) -> String;
    fn role_reply(&self) -> Reply;
    /// `WAIT`: replicas that have `lsn` once `n` do or `timeout` passed.
    fn wait_count(
        &self,
        lsn: Lsn,
        n: usize,
        timeout: std::time::Duration,
    ) -> Pin<Box<dyn Future<Output = usize> + Send + '_>>;
    /// `SENTINEL ...`: a Raft group member answers the discovery commands.
    fn sentinel(&self, _args: &[&[u8]]) -> Reply {
        Reply::err("ERR SENTINEL is answered by the members of a Raft group (--raft-id); this server is not one")
    }
    /// `RAFT.*`: membership commands of a Raft group member; the future gives the reply.
    fn raft(
        &self,
        _sub: &str,
        _args: &[&[u8]],
    ) -> Result<Pin<Box<dyn Future<Output = Reply> + Send>>, Reply> {
        Err(Reply::err(
            "ERR this server is not a member of a Raft group (--raft-id)",
        ))
    }
}

pub use crate::users::{
    Role, UserDb, Users, UsersSource, ADMIN, CHECKOUT, REPLICATION, SENTINEL, SWEEPER,
};

#[derive(Default)]
pub struct Stats {
    pub connected: AtomicU64,
    pub connections: AtomicU64,
    pub commands: AtomicU64,
    /// Bytes read from and written to clients (INFO's `total_net_input_bytes` /
    /// `total_net_output_bytes`), added once per batch like `commands`.
    pub net_input_bytes: AtomicU64,
    pub net_output_bytes: AtomicU64,
    pub rejected: AtomicU64,
    pub auth_failures: AtomicU64,
    pub noperm: AtomicU64,
    pub protocol_errors: AtomicU64,
    pub qbuf_disconnects: AtomicU64,
    pub obuf_disconnects: AtomicU64,
    pub idle_disconnects: AtomicU64,
}

pub struct Shared {
    pub config: ServerConfig,
    /// `None`: no users configured, every connection is admin.
    pub users: Option<UserDb>,
    /// The settings `CONFIG SET` changes while the server runs.
    pub live: crate::live::LiveSettings,
    /// The config file the server was started with (`CONFIG REWRITE` writes it).
    pub config_file: Option<std::path::PathBuf>,
    /// The binary's `serve` flags: `CONFIG SET` checks a value with its flag's parser,
    /// and tells a setting fixed at start from one that does not exist.
    pub flags: Option<clap::Command>,
    pub stats: Stats,
    pub started: Instant,
    pub local_port: AtomicU16,
    pub durability: Arc<dyn Durability>,
    /// The order feed (XREAD...), set by the binary when it runs with a WAL.
    pub feed: std::sync::OnceLock<Arc<crate::feed::Feed>>,
    /// Command/latency/error/sale counters, the slow log (see `metrics`).
    pub metrics: Metrics,
    /// Replication, set by the binary when it runs with a WAL.
    pub repl: std::sync::OnceLock<Arc<dyn Replication>>,
    /// PUBLISH/SUBSCRIBE channels (Sentinel's hello channel).
    pub pubsub: crate::pubsub::Hub,
    /// Live connections, for CLIENT KILL.
    pub clients: crate::pubsub::Clients,
    /// Cluster mode (`--cluster-enabled yes`): the slot map and this node's place in it.
    pub cluster: std::sync::OnceLock<Arc<crate::cluster::Cluster>>,
}

impl Shared {
    /// Users given once, not reloadable (tests, embedding).
    pub fn new(
        config: ServerConfig,
        users: Option<Users>,
        durability: Arc<dyn Durability>,
    ) -> Self {
        Shared::with_user_db(config, users.map(UserDb::fixed), durability)
    }

    /// Users `ACL LOAD` can read again (the binary, from `--users-file`).
    pub fn with_user_db(
        config: ServerConfig,
        users: Option<UserDb>,
        durability: Arc<dyn Durability>,
    ) -> Self {
        Shared {
            live: crate::live::LiveSettings::new(&config),
            config_file: None,
            flags: None,
            config,
            users,
            stats: Stats::default(),
            started: Instant::now(),
            local_port: AtomicU16::new(0),
            durability,
            feed: std::sync::OnceLock::new(),
            metrics: Metrics::new(),
            repl: std::sync::OnceLock::new(),
            pubsub: crate::pubsub::Hub::default(),
            clients: crate::pubsub::Clients::default(),
            cluster: std::sync::OnceLock::new(),
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
    /// `Some` between `MULTI` and `EXEC`/`DISCARD`: the commands queued so far.
    pub multi: Option<MultiQueue>,
    /// `REPLCONF listening-port`: the port a replica serves clients on.
    pub repl_port: Option<u16>,
    /// What this connection's commands recorded since the batch began; the connection
    /// publishes it into `Shared::metrics` before the batch's replies leave.
    pub recorder: Recorder,
}

/// A transaction being queued. The logic lives in `cmd::multi`; the queue lives here
/// because it belongs to the connection.
#[derive(Default)]
pub struct MultiQueue {
    pub commands: Vec<Vec<Bytes>>,
    /// Bytes of the queued arguments, bounded like an unfinished command's buffer.
    pub bytes: usize,
    /// A command was refused while queuing: `EXEC` must run nothing (`-EXECABORT`).
    pub aborted: bool,
    /// In cluster mode, the slot of the first queued command with a key, and whether a
    /// later one had another slot (`EXEC` then answers `-CROSSSLOT`).
    pub slot: Option<u16>,
    pub cross_slot: bool,
}

impl ConnState {
    /// A new connection: RESP2, no name, `role` None until AUTH when users are configured.
    pub fn new(id: u64, role: Option<Role>, addr: String, laddr: String) -> Self {
        ConnState {
            id,
            proto: 2,
            name: None,
            role,
            user_name: None,
            lib_name: String::new(),
            lib_ver: String::new(),
            addr,
            laddr,
            multi: None,
            repl_port: None,
            recorder: Recorder::default(),
        }
    }

    pub fn in_multi(&self) -> bool {
        self.multi.is_some()
    }

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
