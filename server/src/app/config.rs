//! The server's settings as the command line and its config file give them, grouped by
//! what each part of the start needs, and what follows from them: the settings the
//! lower layers take ([`ServerConfig`], [`EngineConfig`], [`WalOptions`]) and the checks
//! across flags, worded with the flags' names. Each flag's own parser has checked its
//! value's range already.
//!
//! No `Debug`: [`UsersSource`] holds `--requirepass`.

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::PathBuf;

use crate::engine::{EngineConfig, MAX_SHARDS, MAX_TTL_MS};
use crate::protocol::Limits;
use crate::session::ServerConfig;
use crate::tls::args::TlsArgs;
use crate::users::UsersSource;
use crate::wal::{FeedRetention, FsyncPolicy, WalOptions};

/// Everything `run` starts a server from.
pub struct Config {
    /// Where the WAL, snapshots, the admission secret and the reservation key live.
    pub data_dir: PathBuf,
    /// The client port and the event loops that serve it.
    pub listen: Listen,
    /// TLS on the client port, the metrics endpoint and the links between nodes.
    pub tls: TlsArgs,
    /// Where the admission keys and the reservation key are read from.
    pub keys: KeyFiles,
    /// Who may log in (`--users-file`, `--requirepass`); nobody configured is open mode.
    pub users: UsersSource,
    /// Open mode on a non-loopback address (`--allow-open`).
    pub allow_open: bool,
    /// Defaults of new sales, retention, auto-release, the table's initial size.
    pub engine: EngineConfig,
    /// The write-ahead log and its snapshots.
    pub wal: WalSettings,
    /// What one client may send, hold and take.
    pub clients: ClientLimits,
    /// This server as a member of a Raft group (`--raft-id`), if it is one.
    pub raft: Option<RaftSettings>,
    /// Redis Cluster routing.
    pub cluster: ClusterSettings,
    /// The metrics endpoint and what is recorded for it.
    pub metrics: MetricsSettings,
    /// The config file the server was started with (`CONFIG REWRITE` writes it).
    pub config_file: Option<PathBuf>,
    /// The `serve` flags, whose parsers `CONFIG SET` checks a value with.
    pub flags: Option<clap::Command>,
}

/// The client port and its listeners.
pub struct Listen {
    /// The address the client port listens on (`--bind`).
    pub bind: String,
    /// The plain client port; 0 picks a free one, or is no plain port beside a fixed
    /// `--tls-port`.
    pub port: u16,
    /// Accept queue length of each listener (`--tcp-backlog`).
    pub tcp_backlog: u32,
    /// Event loops (`--threads`); 0 picks from the cores this process may use.
    pub threads: usize,
}

/// Where the keys are read from (`--secret-file`, `--reservation-key-file`).
pub struct KeyFiles {
    /// The admission keys; default `<data-dir>/secret`, created on first start.
    pub secret_file: Option<PathBuf>,
    /// The reservation key; default `<data-dir>/reservation.key`.
    pub reservation_key_file: Option<PathBuf>,
    /// Create a named reservation key file that does not exist yet (`--create-keys`).
    pub create_keys: bool,
}

/// The write-ahead log.
pub struct WalSettings {
    /// When an acknowledged change is on disk (`--fsync`).
    pub fsync: FsyncPolicy,
    /// Segment size in MiB (`--segment-mib`).
    pub segment_mib: u64,
    /// Cut the log at the first bad record instead of refusing to start (`--repair`).
    pub repair: bool,
    /// Log covered by snapshots kept for the order feed (`--feed-retention`).
    pub feed_retention: FeedRetention,
    /// A snapshot after this many records (`--snapshot-records`).
    pub snapshot_records: u64,
}

/// What one client may send, hold and take.
pub struct ClientLimits {
    /// Simultaneous clients (`--maxclients`).
    pub max_clients: usize,
    /// Largest bulk string argument, in bytes (`--max-bulk`).
    pub max_bulk: usize,
    /// Most arguments in one command (`--max-args`).
    pub max_args: usize,
    /// Bytes of an unfinished command (`--max-query-buffer`).
    pub max_query_buffer: usize,
    /// Bytes of replies of one batch (`--max-output-buffer`).
    pub max_output_buffer: usize,
    /// Idle time before a client is disconnected, in ms; 0 = never.
    pub idle_timeout_ms: u64,
    /// Time a client may leave its replies unread, in ms.
    pub write_timeout_ms: u64,
}

/// A Raft group member's flags, checked by `raft::member_config`.
pub struct RaftSettings {
    /// `--raft-id`.
    pub id: u64,
    /// `--raft-listen`: where the peers reach this member.
    pub listen: Option<String>,
    /// `--raft-peers`: `ID=CLIENT_HOST:PORT/RAFT_HOST:PORT` each.
    pub peers: Vec<String>,
    /// `--raft-bootstrap`: form a new group of the peers.
    pub bootstrap: bool,
    /// `--raft-route`: `ID=HOST:PORT` each.
    pub routes: Vec<String>,
    /// `--group-name`.
    pub group_name: String,
    /// `--raft-heartbeat-ms`.
    pub heartbeat_ms: u64,
    /// `--raft-election-min-ms`.
    pub election_min_ms: u64,
    /// `--raft-election-max-ms`.
    pub election_max_ms: u64,
    /// `--rejoin-empty`.
    pub rejoin_empty: bool,
    /// The command line a deposed member re-executes.
    pub restart_argv: Vec<OsString>,
}

/// Redis Cluster routing's flags.
pub struct ClusterSettings {
    /// `--cluster-enabled yes`.
    pub enabled: bool,
    /// `--cluster-config`: the slot map.
    pub config: Option<PathBuf>,
    /// `--cluster-node`: this node's id in the map.
    pub node: Option<String>,
    /// `--cluster-user`: the login of the `ROLE` probes.
    pub user: Option<String>,
    /// `--cluster-password-file`: the probes' password, its first line.
    pub password_file: Option<PathBuf>,
}

/// The metrics endpoint and the slow log.
pub struct MetricsSettings {
    /// `--metrics-addr`.
    pub addr: Option<String>,
    /// `--metrics-allow-remote`.
    pub allow_remote: bool,
    /// `--metrics-max-sales`.
    pub max_sales: usize,
    /// `--slowlog-log-slower-than`, in microseconds; -1 disables.
    pub slowlog_log_slower_than: i64,
    /// `--slowlog-max-len`.
    pub slowlog_max_len: usize,
}

impl Config {
    /// The settings as started, which INFO and `CONFIG GET` show.
    pub(super) fn server_config(&self) -> ServerConfig {
        let c = &self.clients;
        ServerConfig {
            bind: self.listen.bind.clone(),
            port: self.listen.port,
            data_dir: self.data_dir.display().to_string(),
            fsync: self.wal_fsync().to_string(),
            durable: true,
            auto_release: self.engine.auto_release,
            default_shards: self.engine.default_shards,
            default_ttl_ms: self.engine.default_ttl_ms,
            retention_ms: self.engine.retention_ms,
            limits: Limits {
                max_bulk: c.max_bulk,
                max_args: c.max_args,
                max_inline: 64 * 1024,
            },
            max_clients: c.max_clients,
            max_query_buffer: c.max_query_buffer,
            max_output_buffer: c.max_output_buffer,
            idle_timeout_ms: c.idle_timeout_ms,
            write_timeout_ms: c.write_timeout_ms,
            ..ServerConfig::default()
        }
    }

    /// The engine's settings, its shard count and hold time within the engine's bounds.
    pub(super) fn engine_config(&self) -> Result<EngineConfig, String> {
        let e = &self.engine;
        if e.default_shards == 0 || e.default_shards > MAX_SHARDS {
            return Err("--shards must be between 1 and 1024".into());
        }
        if e.default_ttl_ms == 0 || e.default_ttl_ms > MAX_TTL_MS {
            return Err("--ttl-ms must be between 1 and 2592000000".into());
        }
        Ok(e.clone())
    }

    /// When the WAL syncs. A group member's durable log is its Raft log, synced before
    /// every append is acknowledged whatever `--fsync` says; its WAL holds the same
    /// committed records again, which the Raft log can give back after a power loss, so
    /// it is synced once a second (and before a snapshot lets the Raft log drop them)
    /// instead of once per batch: one `fdatasync` per batch on each member, not two.
    pub(super) fn wal_fsync(&self) -> FsyncPolicy {
        if self.raft.is_some() {
            FsyncPolicy::EverySec
        } else {
            self.wal.fsync
        }
    }

    /// The log's options, with the crash tests' fault injection from the environment
    /// (unset in production).
    pub(super) fn wal_options(&self) -> WalOptions {
        let env_ms = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        WalOptions {
            fsync: self.wal_fsync(),
            segment_bytes: self.wal.segment_mib.max(1) << 20,
            repair: self.wal.repair,
            fault_write_delay_ms: env_ms("STOCKGATE_FAULT_WAL_DELAY_MS"),
            fault_sync_delay_ms: env_ms("STOCKGATE_FAULT_FSYNC_DELAY_MS"),
            feed_retention: self.wal.feed_retention,
            ..WalOptions::default()
        }
    }

    /// Without passwords every client is admin: allowed on loopback, elsewhere only when
    /// asked for with `--allow-open`.
    pub(super) fn check_open_mode(&self, has_users: bool) -> Result<(), String> {
        if has_users {
            return Ok(());
        }
        let bind = &self.listen.bind;
        if !is_loopback(bind) && !self.allow_open {
            return Err(format!(
                "refusing to serve without passwords on non-loopback address {bind} (configure --users-file/--requirepass or pass --allow-open)"
            ));
        }
        tracing::warn!("no users configured: every client is admin (open mode)");
        Ok(())
    }

    /// The metrics endpoint has no authentication: loopback only, unless asked for.
    pub(super) fn check_metrics_addr(&self) -> Result<(), String> {
        let Some(m) = &self.metrics.addr else {
            return Ok(());
        };
        let host = m.rsplit_once(':').map_or(m.as_str(), |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if !is_loopback(host) && !self.metrics.allow_remote {
            return Err(format!(
                "refusing --metrics-addr {m}: not loopback (the endpoint has no authentication; pass --metrics-allow-remote)"
            ));
        }
        Ok(())
    }

    /// Redis's `port 0`: no plain port, TLS only. Only with a fixed `--tls-port`: `--port
    /// 0 --tls-port 0` keeps picking a free port for each (tests and tools start servers
    /// so).
    pub(super) fn tls_only(&self) -> bool {
        self.listen.port == 0 && self.tls.tls_port.is_some_and(|t| t != 0)
    }

    /// The port this node serves clients on: the plain one, or the TLS one when TLS only.
    pub(super) fn client_port(&self) -> u16 {
        match self.tls.tls_port {
            Some(t) if self.tls_only() => t,
            _ => self.listen.port,
        }
    }
}

impl Listen {
    /// `--threads`, where 0 is one event loop per two cores this process may run on
    /// (rounded up), so one on a 1- or 2-core machine. `available_parallelism` honours the
    /// affinity mask (taskset) and cgroup quotas. Why half: at one request per connection
    /// most of a request's CPU is the kernel's TCP work, and the storm's tail on a 2-core
    /// machine was twice as long with a loop on every core as with one
    /// (docs/benchmarks.md, "Per core"): the loops are preempted by the kernel's network
    /// processing and by whatever else runs there.
    pub(super) fn event_loops(&self) -> usize {
        match self.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get().div_ceil(2)),
            n => n,
        }
    }
}

/// `localhost` or a loopback address.
fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|a| a.is_loopback())
}
