//! `stockgate`: the server binary and its token-minting helper. Flags: docs/protocol.md.
//!
//! The flags and the config file are this file's; what they start is the library's
//! composition root (`stockgate_server::app`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use stockgate_server::app;
use stockgate_server::cli::{int_in, I64_MAX};
use stockgate_server::config_file;
use stockgate_server::engine::{EngineConfig, MAX_SHARDS, MAX_TTL_MS};
use stockgate_server::users::UsersSource;
use stockgate_server::wal::FsyncPolicy;

#[derive(Parser)]
#[command(
    name = "stockgate",
    version,
    about = "Flash-sale inventory reservation server speaking RESP (the Redis protocol)",
    long_about = "stockgate sells exactly the units it has: RESERVE takes stock atomically \
                  (admission token checked, idempotent per request id, per-user limits), \
                  every change is in a write-ahead log before it is acknowledged, and \
                  expired reservations are listed for a sweeper (or released with \
                  --auto-release). Any Redis client can talk to it: \
                  redis-cli -p 7379 SALE.CREATE SKU 1000",
    args_conflicts_with_subcommands = true,
    // A later flag wins over an earlier one: a member re-executing itself (deposed, or
    // restarting on a snapshot) appends `--port <the port it had bound>` to its own
    // command line.
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the server (the default when no subcommand is given).
    // Boxed: the flags make it much larger than the other variants.
    Serve(Box<ServeArgs>),
    /// Mint an admission token (what the waiting room does) and print it on stdout.
    MintToken(MintArgs),
    /// A live terminal view of a running server: sales, rates, p99, errors, sweeper lag.
    Top(TopArgs),
}

#[derive(Args)]
struct TopArgs {
    /// The server to watch.
    #[arg(long, default_value = "127.0.0.1:7379")]
    server: String,
    /// `--auth USER PASSWORD` (any role may read INFO; LATENCY needs admin).
    #[arg(long, num_args = 2, value_names = ["USER", "PASSWORD"])]
    auth: Option<Vec<String>>,
    /// Poll interval in milliseconds.
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<u64>(100, 3_600_000), default_value_t = 1000)]
    interval_ms: u64,
    /// Print one screen as text (two polls one interval apart) and exit.
    #[arg(long)]
    once: bool,
    /// Connect over TLS (to a --tls-port), verifying the server with --cacert, or
    /// without it with this machine's trusted CAs (SSL_CERT_FILE / SSL_CERT_DIR honoured).
    #[arg(long, env = "STOCKGATE_TLS", action = clap::ArgAction::SetTrue,
          value_parser = clap::builder::BoolishValueParser::new())]
    tls: bool,
    /// PEM file of the CA certificate(s) that verify the server's certificate (with --tls;
    /// left out: the system's trusted CAs).
    #[arg(long, env = "STOCKGATE_TLS_CACERT", value_name = "FILE")]
    cacert: Option<PathBuf>,
    /// PEM file of this client's certificate, for a server with --tls-auth-clients yes
    /// (with --key).
    #[arg(long, env = "STOCKGATE_TLS_CERT", value_name = "FILE")]
    cert: Option<PathBuf>,
    /// PEM file of the private key of --cert.
    #[arg(long, env = "STOCKGATE_TLS_KEY", value_name = "FILE")]
    key: Option<PathBuf>,
}

#[derive(Args, Clone)]
struct ServeArgs {
    /// A config file in redis.conf's syntax: `directive value` per line, where each
    /// directive is one of these flags without its dashes (`port 7000`, `auto-release
    /// yes`), `#` comments, `include other.conf`. Flags given here win over the file;
    /// CONFIG REWRITE writes live settings back into it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to listen on. Without users configured, only loopback is allowed unless
    /// --allow-open is given.
    #[arg(long, default_value = "127.0.0.1")]
    bind: String,
    /// TCP port; 0 picks a free one (the first stdout line says which), except with a
    /// fixed --tls-port: then 0 turns the plain port off and only TLS is served (Redis's
    /// `port 0`).
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<u16>(0, 65535), default_value_t = 7379)]
    port: u16,
    /// Where the WAL, snapshots, the admission secret and the reservation key live.
    #[arg(long, default_value = "./stockgate-data")]
    data_dir: PathBuf,
    /// Admission keys, one `<kid> <hex secret>` per line; first signs, all verify.
    /// Default: <data-dir>/secret, created on first start.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// The reservation key (32 raw bytes or 64 hex chars). Default:
    /// <data-dir>/reservation.key, created on the first start of an empty data dir. Keep
    /// it outside the data dir if the data dir may be lost: a new key would give retries
    /// new tokens. A missing key is never re-created once the data dir holds state; a
    /// named file is created only with --create-keys.
    #[arg(long)]
    reservation_key_file: Option<PathBuf>,
    /// Create the file named by --reservation-key-file if it does not exist (only for a
    /// data dir that holds no state yet).
    #[arg(long)]
    create_keys: bool,
    /// When an acknowledged change is on disk: always (fdatasync before every
    /// acknowledgement, batched), everysec (written before the reply, fsync once a
    /// second), no (written before the reply, the OS decides). A Raft group member
    /// ignores it: its Raft log syncs every batch before counting it, its WAL once a second.
    #[arg(long, default_value = "everysec")]
    fsync: FsyncPolicy,
    /// Release expired reservations without a sweeper (deployments with no ledger).
    #[arg(long)]
    auto_release: bool,
    /// Default shard count of new sales.
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<u16>(1, MAX_SHARDS as i128), default_value_t = 16)]
    shards: u16,
    /// Default reservation TTL of new sales (10 min + 30 s grace).
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<u64>(1, MAX_TTL_MS as i128), default_value_t = 630_000)]
    ttl_ms: u64,
    /// How long finished reservations stay queryable before they are purged.
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<u64>(0, I64_MAX), default_value_t = 86_400_000)]
    retention_ms: u64,
    /// Users file: one `<user> <admin|checkout|sweeper|replication|sentinel> <password>` per line.
    #[arg(long)]
    users_file: Option<PathBuf>,
    /// Password of the `default` user (role admin), like Redis's requirepass.
    #[arg(long, env = "STOCKGATE_REQUIREPASS", hide_env_values = true)]
    requirepass: Option<String>,
    /// Allow serving without passwords on a non-loopback address.
    #[arg(long)]
    allow_open: bool,
    /// Maximum simultaneous clients; more are refused with an error.
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<usize>(1, 10_000_000), default_value_t = 10_000)]
    maxclients: usize,
    /// Largest bulk string argument, in bytes.
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<usize>(1, I64_MAX), default_value_t = 1024 * 1024)]
    max_bulk: usize,
    /// Most arguments in one command.
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<usize>(1, I64_MAX), default_value_t = 1024)]
    max_args: usize,
    /// Bytes a client may leave in an unfinished command before it is disconnected.
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<usize>(1, I64_MAX), default_value_t = 8 * 1024 * 1024)]
    max_query_buffer: usize,
    /// Bytes of replies one pipelined batch may produce before the client is cut off.
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<usize>(1, I64_MAX), default_value_t = 64 * 1024 * 1024)]
    max_output_buffer: usize,
    /// Disconnect clients idle this long (ms); 0 = never.
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<u64>(0, I64_MAX), default_value_t = 0)]
    idle_timeout_ms: u64,
    /// Disconnect clients that leave their replies unread this long (ms).
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<u64>(0, I64_MAX), default_value_t = 30_000)]
    write_timeout_ms: u64,
    /// WAL segment size in MiB before rolling to a new file.
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<u64>(1, 1 << 20), default_value_t = 64)]
    segment_mib: u64,
    /// Write a snapshot (and delete the log it covers) after this many records. In a
    /// Raft group the same: a member's snapshot, after which its Raft log is compacted.
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<u64>(1, I64_MAX), default_value_t = 2_000_000)]
    snapshot_records: u64,
    /// Size the reservation table for this many reservations up front (0: grow on
    /// demand). Avoids rehashing a large table under sustained load.
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<usize>(0, u32::MAX as i128), default_value_t = 0)]
    expected_reservations: usize,
    /// Event loops serving connections, each an OS thread with its own listener on the
    /// port (SO_REUSEPORT: the kernel spreads new connections over them) and its own FIFO
    /// run queue; 0 = one per two cores the process may use (its affinity mask, cgroup
    /// quota), rounded up: 1 on a 1- or 2-core machine (see docs/benchmarks.md, "Per core").
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<usize>(0, 1024), default_value_t = 0)]
    threads: usize,
    /// Accept queue length of each listener (Redis's `tcp-backlog`, same default; the
    /// kernel caps it at net.core.somaxconn). Connections the kernel has completed but
    /// the server has not accepted yet wait here.
    #[arg(long, default_value_t = 511, allow_negative_numbers = true, value_parser = int_in::<u32>(1, 65535))]
    tcp_backlog: u32,
    /// How much log already covered by snapshots stays on disk for the order feed
    /// (XREAD, and consumer groups lagging behind): `0` (none: the feed reaches back to
    /// the last snapshot), or sizes and/or ages, e.g. `1GiB`, `6h`, `2GiB,24h` (kept while
    /// within every limit; a group whose position falls past it gets a `trimmed` error).
    #[arg(long, default_value = "0", value_parser = stockgate_server::feed::retention::parse)]
    feed_retention: stockgate_server::wal::FeedRetention,
    /// On WAL corruption, cut the log at the first bad record (losing what follows)
    /// instead of refusing to start. Says what it drops.
    #[arg(long)]
    repair: bool,
    /// Removed: Redis-style replication failed over by Sentinel can lose acknowledged
    /// reservations. Kept only to say so; a Raft group (--raft-id) replaces it.
    #[arg(long, value_name = "HOST:PORT", hide = true)]
    replicaof: Option<String>,
    /// Removed with --replicaof (see there).
    #[arg(long, hide = true)]
    min_replicas_ack: Option<usize>,
    /// Run as member N of a Raft-replicated group (docs/replication.md): writes
    /// are acknowledged once a majority has them durable; the leader is elected.
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<u64>(1, I64_MAX))]
    raft_id: Option<u64>,
    /// Address this member listens on for its peers (Raft RPCs), e.g. 127.0.0.1:17379.
    #[arg(long, requires = "raft_id")]
    raft_listen: Option<String>,
    /// The group's members, this one included, comma-separated
    /// ID=CLIENT_HOST:PORT/RAFT_HOST:PORT: whom --raft-bootstrap forms the group of.
    /// Ignored without --raft-bootstrap.
    #[arg(long, requires = "raft_id", value_delimiter = ',')]
    raft_peers: Vec<String>,
    /// Form a new group of --raft-peers: give it to ONE member, on the group's very
    /// first start. The others (and any member started on an empty data dir) wait, take
    /// no part in votes, until a group admits them. Ignored once this member holds Raft
    /// state.
    #[arg(long, requires = "raft_id")]
    raft_bootstrap: bool,
    /// Reach peer ID through ADDR instead of its announced Raft address (a proxy, a NAT):
    /// ID=HOST:PORT, repeatable.
    #[arg(long, requires = "raft_id")]
    raft_route: Vec<String>,
    /// The name Sentinel-aware clients ask for (`SENTINEL get-master-addr-by-name NAME`).
    #[arg(long, default_value = "stockgate")]
    group_name: String,
    /// Leader heartbeat interval, which openraft also takes as the time an append to a
    /// follower may take (longer ones are cut and sent again). With the election
    /// timeouts below: a dead leader is replaced within about the maximum election
    /// timeout plus one round trip.
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<u64>(1, I64_MAX), default_value_t = 100)]
    raft_heartbeat_ms: u64,
    /// Shortest election timeout: a follower that hears no leader this long stands for
    /// election; a leader that heard no majority this long stops serving.
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<u64>(1, I64_MAX), default_value_t = 300)]
    raft_election_min_ms: u64,
    /// Longest election timeout (each follower picks at random between the two).
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<u64>(1, I64_MAX), default_value_t = 600)]
    raft_election_max_ms: u64,
    /// This member's Raft log was lost: start empty (the old WAL is set aside) under a
    /// new incarnation, taking no part in votes until the group re-admits it
    /// (`RAFT.READMIT ID` on the leader).
    #[arg(long, requires = "raft_id")]
    rejoin_empty: bool,
    /// Serve Prometheus metrics (/metrics), JSON (/json) and the status page (/) here,
    /// e.g. 127.0.0.1:9379. Off unless given; loopback only unless
    /// --metrics-allow-remote (the endpoint has no authentication).
    #[arg(long)]
    metrics_addr: Option<String>,
    /// Allow --metrics-addr on a non-loopback address.
    #[arg(long)]
    metrics_allow_remote: bool,
    /// Sales exported with their own `sku` label; the rest are summed as sku="_other".
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<usize>(0, I64_MAX), default_value_t = 50)]
    metrics_max_sales: usize,
    /// Log commands taking at least this many microseconds in the slow log; -1 disables,
    /// 0 logs every command (as Redis).
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<i64>(-1, I64_MAX), default_value_t = 10_000, allow_hyphen_values = true)]
    slowlog_log_slower_than: i64,
    /// Entries kept in the slow log.
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<usize>(0, I64_MAX), default_value_t = 128)]
    slowlog_max_len: usize,
    /// Redis Cluster routing (docs/cluster.md): `yes` needs --cluster-config; keys of
    /// slots other groups own are answered `-MOVED`.
    #[arg(long, default_value = "no", value_parser = ["yes", "no"])]
    cluster_enabled: String,
    /// The slot map: groups, their slot ranges and their nodes (docs/cluster.md).
    #[arg(long, value_name = "FILE")]
    cluster_config: Option<PathBuf>,
    /// This node's id in the map. Default: the only node listed with --port.
    #[arg(long, value_name = "ID")]
    cluster_node: Option<String>,
    /// The user this node logs in as when it asks other groups' members `ROLE` to find
    /// their leaders (with --cluster-password-file; default: the `default` user).
    #[arg(long, value_name = "USER")]
    cluster_user: Option<String>,
    /// A file whose first line is the password for those `ROLE` probes, needed when the
    /// other groups' members require passwords (docs/cluster.md, "How leaders are found").
    #[arg(long, value_name = "FILE")]
    cluster_password_file: Option<PathBuf>,
    #[command(flatten)]
    log: stockgate_server::metrics::logging::LogArgs,
    // ---- TLS: --tls-port, --tls-cert-file, ... (server/src/tls/args.rs) ----
    #[command(flatten)]
    tls: stockgate_server::tls::args::TlsArgs,
    // ---- end TLS ----
}

#[derive(Args)]
struct MintArgs {
    /// Secret file to sign with (first line, or the one named by --kid).
    #[arg(long, required_unless_present = "data_dir")]
    secret_file: Option<PathBuf>,
    /// Data dir whose `secret` file to use.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Key id to sign with (default: the first line's).
    #[arg(long)]
    kid: Option<String>,
    #[arg(long)]
    sku: String,
    #[arg(long)]
    user: String,
    /// Validity from now.
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<u64>(1, I64_MAX), default_value_t = 60_000)]
    ttl_ms: u64,
}

fn main() -> ExitCode {
    let cli = match parse_cli() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("stockgate: {e}");
            return ExitCode::from(1);
        }
    };
    match cli.cmd {
        Some(Cmd::MintToken(m)) => mint(m),
        Some(Cmd::Top(t)) => top(t),
        Some(Cmd::Serve(s)) => serve(*s),
        None => serve(cli.serve),
    }
}

/// `stockgate serve`'s flags, as the config file and CONFIG SET check values with them.
fn serve_command() -> clap::Command {
    <ServeArgs as Args>::augment_args(clap::Command::new("serve"))
}

/// The command line, with `--config FILE`'s directives put in front of the flags given
/// (as `--name=value`): every value is checked by its flag's parser, and a flag on the
/// command line wins over the file because it comes later.
fn parse_cli() -> Result<Cli, String> {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let config = match Cli::try_parse_from(&argv) {
        Ok(cli) => match &cli.cmd {
            Some(Cmd::Serve(s)) => s.config.clone(),
            None => cli.serve.config.clone(),
            Some(_) => None,
        }
        .map_or(Ok(cli), Err),
        // The command line may be complete only with the file (`--raft-listen` given,
        // `raft-id` in the file): look for `--config` and parse again with the file.
        Err(e) => Err(config_flag(&argv).ok_or(e).unwrap_or_else(|e| e.exit())),
    };
    let path = match config {
        Ok(cli) => return Ok(cli),
        Err(path) => path,
    };
    let directives = config_file::read(&path).map_err(|e| e.to_string())?;
    let from_file =
        config_file::to_args(&directives, &serve_command()).map_err(|e| e.to_string())?;
    let at = argv
        .iter()
        .position(|a| a == "serve")
        .map_or(1, |i| i + 1)
        .min(argv.len());
    let mut full = argv[..at].to_vec();
    full.extend(from_file);
    full.extend_from_slice(&argv[at..]);
    Ok(Cli::parse_from(full))
}

/// The value of `--config FILE` or `--config=FILE` on a raw command line.
fn config_flag(argv: &[std::ffi::OsString]) -> Option<PathBuf> {
    let mut it = argv.iter().skip(1);
    while let Some(a) = it.next() {
        let a = a.to_str()?;
        if a == "--config" {
            return it.next().map(PathBuf::from);
        }
        if let Some(v) = a.strip_prefix("--config=") {
            return Some(PathBuf::from(v));
        }
    }
    None
}

fn serve(a: ServeArgs) -> ExitCode {
    a.log.init();
    match config(a).and_then(app::run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stockgate: {e}");
            ExitCode::from(1)
        }
    }
}

/// The library's settings from the flags; refuses the flags that were removed.
fn config(a: ServeArgs) -> Result<app::Config, String> {
    if a.replicaof.is_some() || a.min_replicas_ack.is_some() {
        return Err("--replicaof and --min-replicas-ack were removed: replication failed over by Redis Sentinel can lose acknowledged reservations. Run a Raft group instead (--raft-id, --raft-listen, --raft-peers; docs/replication.md, \"Running a group\"): Sentinel-aware clients list the members where they listed the Sentinels".into());
    }
    let (clients, raft, cluster, metrics) = (clients(&a), raft(&a), cluster(&a), metrics(&a));
    Ok(app::Config {
        listen: app::Listen {
            bind: a.bind,
            port: a.port,
            tcp_backlog: a.tcp_backlog,
            threads: a.threads,
        },
        keys: app::KeyFiles {
            secret_file: a.secret_file,
            reservation_key_file: a.reservation_key_file,
            create_keys: a.create_keys,
        },
        users: UsersSource {
            file: a.users_file,
            requirepass: a.requirepass,
        },
        allow_open: a.allow_open,
        engine: EngineConfig {
            default_shards: a.shards,
            default_ttl_ms: a.ttl_ms,
            retention_ms: a.retention_ms,
            auto_release: a.auto_release,
            expected_reservations: a.expected_reservations,
        },
        wal: app::WalSettings {
            fsync: a.fsync,
            segment_mib: a.segment_mib,
            repair: a.repair,
            feed_retention: a.feed_retention,
            snapshot_records: a.snapshot_records,
        },
        clients,
        raft,
        cluster,
        metrics,
        tls: a.tls,
        data_dir: a.data_dir,
        config_file: a.config,
        flags: Some(serve_command()),
    })
}

fn clients(a: &ServeArgs) -> app::ClientLimits {
    app::ClientLimits {
        max_clients: a.maxclients,
        max_bulk: a.max_bulk,
        max_args: a.max_args,
        max_query_buffer: a.max_query_buffer,
        max_output_buffer: a.max_output_buffer,
        idle_timeout_ms: a.idle_timeout_ms,
        write_timeout_ms: a.write_timeout_ms,
    }
}

fn raft(a: &ServeArgs) -> Option<app::RaftSettings> {
    Some(app::RaftSettings {
        id: a.raft_id?,
        listen: a.raft_listen.clone(),
        peers: a.raft_peers.clone(),
        bootstrap: a.raft_bootstrap,
        routes: a.raft_route.clone(),
        group_name: a.group_name.clone(),
        heartbeat_ms: a.raft_heartbeat_ms,
        election_min_ms: a.raft_election_min_ms,
        election_max_ms: a.raft_election_max_ms,
        rejoin_empty: a.rejoin_empty,
        // The command line as given, not `parse_cli`'s: a restart reads the config file
        // again.
        restart_argv: std::env::args_os().collect(),
    })
}

fn cluster(a: &ServeArgs) -> app::ClusterSettings {
    app::ClusterSettings {
        enabled: a.cluster_enabled == "yes",
        config: a.cluster_config.clone(),
        node: a.cluster_node.clone(),
        user: a.cluster_user.clone(),
        password_file: a.cluster_password_file.clone(),
    }
}

fn metrics(a: &ServeArgs) -> app::MetricsSettings {
    app::MetricsSettings {
        addr: a.metrics_addr.clone(),
        allow_remote: a.metrics_allow_remote,
        max_sales: a.metrics_max_sales,
        slowlog_log_slower_than: a.slowlog_log_slower_than,
        slowlog_max_len: a.slowlog_max_len,
    }
}

fn mint(m: MintArgs) -> ExitCode {
    let secret_file = match (m.secret_file, m.data_dir) {
        (Some(p), _) => p,
        (None, Some(d)) => d.join("secret"),
        (None, None) => unreachable!("clap requires one"),
    };
    let req = app::mint::MintRequest {
        secret_file,
        kid: m.kid,
        sku: m.sku,
        user: m.user,
        ttl_ms: m.ttl_ms,
    };
    match app::mint::mint(&req) {
        Ok(token) => {
            println!("{token}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("stockgate: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn top(t: TopArgs) -> ExitCode {
    let auth = t
        .auth
        .and_then(|a| Some((a.first()?.clone(), a.get(1)?.clone())));
    let o = app::top::TopOptions {
        server: t.server,
        auth,
        interval: Duration::from_millis(t.interval_ms),
        once: t.once,
        tls: app::top::TopTls {
            tls: t.tls,
            cacert: t.cacert,
            cert: t.cert,
            key: t.key,
        },
    };
    match app::top::top(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stockgate top: {e}");
            ExitCode::from(1)
        }
    }
}
