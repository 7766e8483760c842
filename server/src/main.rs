//! `stockgate`: the server binary and its token-minting helper. Flags: docs/protocol.md.

use std::io::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use stockgate_server::cli::{int_in, I64_MAX};
use stockgate_server::config_file;
use stockgate_server::engine::{EngineConfig, SystemClock, MAX_SHARDS, MAX_TTL_MS};
use stockgate_server::feed::{Feed, FeedLimits};
use stockgate_server::keyfiles;
use stockgate_server::persist::{recover_engine_with, WalDurability};
use stockgate_server::protocol::Limits;
use stockgate_server::raft::{self, RaftNode, RaftNodeConfig};
use stockgate_server::server::{serve, Ports, ServerConfig, Shared};
use stockgate_server::users::{UserDb, UsersSource};
use stockgate_server::wal::{FsyncPolicy, WalOptions};

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

/// The TLS client settings `stockgate top`'s flags ask for (None: plain TCP). The error
/// names the flag or file at fault.
fn top_tls(t: &TopArgs) -> Result<Option<Arc<rustls::ClientConfig>>, String> {
    let cert_key = match (&t.cert, &t.key) {
        (Some(c), Some(k)) => Some((c.as_path(), k.as_path())),
        (None, None) => None,
        (Some(_), None) => return Err("--cert needs --key".into()),
        (None, Some(_)) => return Err("--key needs --cert".into()),
    };
    if !t.tls {
        if t.cacert.is_some() || cert_key.is_some() {
            return Err("--cacert, --cert and --key need --tls".into());
        }
        return Ok(None);
    }
    stockgate_server::tls::client_config(t.cacert.as_deref(), cert_key)
        .map(Some)
        .map_err(|e| e.to_string())
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
    /// second), no (written before the reply, the OS decides).
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
        Some(Cmd::Serve(s)) => run(*s),
        None => run(cli.serve),
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

fn mint(m: MintArgs) -> ExitCode {
    use stockgate_server::engine::ident;
    use stockgate_server::engine::token::{hex_decode, mint_admission_token};
    for (field, ok) in [
        ("sku", ident::valid_sku(m.sku.as_bytes())),
        ("user", ident::valid_user(m.user.as_bytes())),
    ] {
        if !ok {
            eprintln!("stockgate: --{field}: {}", ident::invalid_message(field));
            return ExitCode::from(2);
        }
    }
    let path = match (&m.secret_file, &m.data_dir) {
        (Some(p), _) => p.clone(),
        (None, Some(d)) => d.join("secret"),
        (None, None) => unreachable!("clap requires one"),
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("stockgate: {}: {e}", path.display());
            return ExitCode::from(1);
        }
    };
    if let Err(e) = stockgate_server::engine::Keyring::parse(&text) {
        eprintln!("stockgate: {}: {e}", path.display());
        return ExitCode::from(1);
    }
    let line = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .find(|l| {
            m.kid
                .as_deref()
                .is_none_or(|k| l.split_whitespace().next() == Some(k))
        });
    let Some((kid, hex)) = line.and_then(|l| {
        let mut p = l.split_whitespace();
        Some((p.next()?, p.next()?))
    }) else {
        match &m.kid {
            Some(kid) => eprintln!("stockgate: no key with id {kid} in {}", path.display()),
            None => eprintln!("stockgate: no key in {}", path.display()),
        }
        return ExitCode::from(1);
    };
    let Some(secret) = hex_decode(hex) else {
        eprintln!(
            "stockgate: the secret of key {kid} in {} is not hex (expected `<kid> <hex secret>`)",
            path.display()
        );
        return ExitCode::from(1);
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    println!(
        "{}",
        mint_admission_token(&secret, kid, &m.sku, &m.user, now + m.ttl_ms)
    );
    ExitCode::SUCCESS
}

fn top(t: TopArgs) -> ExitCode {
    let auth = t
        .auth
        .as_ref()
        .and_then(|a| Some((a.first()?.as_str(), a.get(1)?.as_str())));
    let interval = Duration::from_millis(t.interval_ms.max(100));
    let tls = match top_tls(&t) {
        Ok(tls) => tls,
        Err(e) => {
            eprintln!("stockgate top: {e}");
            return ExitCode::from(1);
        }
    };
    let tls = tls.as_ref();
    let r = if t.once {
        stockgate_server::report::top::once(&t.server, auth, tls, interval).map(|lines| {
            for l in lines {
                println!("{l}");
            }
        })
    } else {
        stockgate_server::report::top::run(&t.server, auth, tls, interval)
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stockgate top: {}: {e}", t.server);
            ExitCode::from(1)
        }
    }
}

fn is_loopback(bind: &str) -> bool {
    bind == "localhost" || bind.parse::<IpAddr>().is_ok_and(|a| a.is_loopback())
}

fn run(a: ServeArgs) -> ExitCode {
    a.log.init();
    match run_inner(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stockgate: {e}");
            ExitCode::from(1)
        }
    }
}

/// The users of `--users-file` and `--requirepass`, which ACL LOAD reads again.
fn users_from(a: &ServeArgs) -> Result<Option<UserDb>, String> {
    let db = UserDb::from_source(UsersSource {
        file: a.users_file.clone(),
        requirepass: a.requirepass.clone(),
    })
    .map_err(|e| e.to_string())?;
    Ok((!db.snapshot().is_empty()).then_some(db))
}

/// The slot map and this node's place in it, when cluster mode is on.
fn cluster_from(a: &ServeArgs) -> Result<Option<stockgate_server::cluster::Cluster>, String> {
    match (a.cluster_enabled.as_str(), &a.cluster_config) {
        ("yes", Some(path)) => {
            let auth = cluster_probe_auth(a)?;
            stockgate_server::cluster::Cluster::load(
                &path.display().to_string(),
                a.cluster_node.as_deref(),
                client_port(a),
            )
            .map(|c| Some(c.with_probe_auth(auth)))
            .map_err(|e| e.to_string())
        }
        ("yes", None) => Err(
            "--cluster-enabled yes needs --cluster-config FILE (the slot map, docs/cluster.md)"
                .into(),
        ),
        (_, Some(_)) => Err("--cluster-config is only read with --cluster-enabled yes".into()),
        _ if a.cluster_user.is_some() || a.cluster_password_file.is_some() => Err(
            "--cluster-user and --cluster-password-file are only read with --cluster-enabled yes"
                .into(),
        ),
        _ => Ok(None),
    }
}

/// The login of the `ROLE` probes to other groups: `--cluster-password-file`'s first
/// line, as `--cluster-user` (or the default user).
fn cluster_probe_auth(
    a: &ServeArgs,
) -> Result<Option<stockgate_server::cluster::ProbeAuth>, String> {
    let Some(path) = &a.cluster_password_file else {
        return match a.cluster_user {
            Some(_) => Err("--cluster-user needs --cluster-password-file FILE (its first line is the password)".into()),
            None => Ok(None),
        };
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read --cluster-password-file {}: {e}",
            path.display()
        )
    })?;
    let password = text.lines().next().unwrap_or("");
    if password.is_empty() {
        return Err(format!(
            "--cluster-password-file {}: the first line must hold the password",
            path.display()
        ));
    }
    Ok(Some(stockgate_server::cluster::ProbeAuth::new(
        a.cluster_user.as_deref(),
        password,
    )))
}

fn run_inner(a: ServeArgs) -> Result<(), String> {
    let users = users_from(&a)?;
    let cluster = cluster_from(&a)?;
    check_open_mode(&a, users.is_some())?;
    let tls = tls_from(&a)?;
    let cluster = cluster_tls(&a, tls.as_ref(), cluster)?;
    std::fs::create_dir_all(&a.data_dir).map_err(|e| format!("{}: {e}", a.data_dir.display()))?;
    let keys = load_keys(&a)?;
    let secret_path = keys.secret_path.clone();
    let cfg = engine_config(&a)?;
    let mut raft_cfg = raft_config(&a)?;
    replication_tls(&a, tls.as_ref(), raft_cfg.as_mut())?;
    let prepared = match &raft_cfg {
        Some(c) => Some(raft::node::prepare(&a.data_dir, c)?),
        None => None,
    };
    let recovered = recover(&a, cfg, keys, raft_cfg.is_some())?;
    if a.replicaof.is_some() || a.min_replicas_ack.is_some() {
        return Err("--replicaof and --min-replicas-ack were removed: replication failed over by Redis Sentinel can lose acknowledged reservations. Run a Raft group instead (--raft-id, --raft-listen, --raft-peers; docs/replication.md, \"Running a group\"): Sentinel-aware clients list the members where they listed the Sentinels".into());
    }
    let replicated: Arc<dyn stockgate_server::session::Durability> = match &recovered.speculation {
        Some(spec) => Arc::new(raft::node::RaftDurability {
            local: recovered.durability.clone(),
            spec: spec.clone(),
        }),
        None => recovered.durability.clone(),
    };
    let mut shared = Shared::with_user_db(server_config(&a), users, replicated);
    shared.flags = Some(serve_command());
    shared.config_file = match &a.config {
        Some(p) => Some(std::fs::canonicalize(p).map_err(|e| format!("{}: {e}", p.display()))?),
        None => None,
    };
    let shared = Arc::new(shared);
    let feed = open_feed(&recovered);
    let _ = shared.feed.set(feed);
    let _ = shared.engine.set(recovered.engine.clone());
    if let Some(c) = cluster {
        let c = Arc::new(c);
        install_slot_log(&c, &recovered, shared.feed.get());
        let _ = shared.cluster.set(c);
    }
    let _ = shared.secret_file.set(secret_path);
    shared.metrics.configure(
        a.slowlog_log_slower_than,
        a.slowlog_max_len,
        a.metrics_max_sales,
    );
    check_metrics_addr(&a)?;
    if let Some((_, t)) = &tls {
        let _ = shared.tls.set(t.clone());
    }
    let threads = event_loops(a.threads);
    // Every worker is a current-thread runtime (`server::serve` says why): this one runs
    // the first, plus the background tasks; the others get a thread each.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("stockgate")
        .build()
        .map_err(|e| e.to_string())?;
    // One loop runs one command at a time: no reply can observe a RESERVE half done.
    recovered.engine.set_concurrent_callers(threads > 1);
    let (first, extra) = bind_ports(&a, tls.as_ref().map(|t| t.0), threads)?;
    let raft = raft_cfg.zip(prepared);
    let result = rt.block_on(serve_until_shutdown(
        &a, &recovered, shared, raft, first, extra,
    ));
    // Everything acknowledged is already written; this makes the tail durable too.
    match recovered.durability.wal.flush_and_close() {
        Ok(lsn) => tracing::info!("WAL flushed and closed at lsn {lsn}"),
        Err(e) => tracing::error!("WAL close failed: {e}"),
    }
    rt.shutdown_timeout(Duration::from_secs(2));
    result
}

/// Without passwords every client is admin: allowed on loopback, elsewhere only when
/// asked for with `--allow-open`.
fn check_open_mode(a: &ServeArgs, has_users: bool) -> Result<(), String> {
    if has_users {
        return Ok(());
    }
    if !is_loopback(&a.bind) && !a.allow_open {
        return Err(format!(
            "refusing to serve without passwords on non-loopback address {} (configure --users-file/--requirepass or pass --allow-open)",
            a.bind
        ));
    }
    tracing::warn!("no users configured: every client is admin (open mode)");
    Ok(())
}

/// The admission keyring and the reservation key, created in the data dir on first start.
struct Keys {
    admission: stockgate_server::engine::Keyring,
    secret_path: PathBuf,
    reservation: stockgate_server::engine::ReservationKey,
    reservation_path: PathBuf,
}

fn load_keys(a: &ServeArgs) -> Result<Keys, String> {
    let (admission, secret_path, created) =
        keyfiles::load_or_create_secret(&a.data_dir, a.secret_file.as_deref())
            .map_err(|e| e.to_string())?;
    if created {
        eprintln!(
            "stockgate: created admission secret {}",
            secret_path.display()
        );
    } else {
        eprintln!("stockgate: admission secret {}", secret_path.display());
    }
    let (reservation, reservation_path, reservation_created) =
        keyfiles::load_or_create_reservation_key(
            &a.data_dir,
            a.reservation_key_file.as_deref(),
            a.create_keys,
        )
        .map_err(|e| e.to_string())?;
    if reservation_created {
        eprintln!(
            "stockgate: created reservation key {} (fingerprint {})",
            reservation_path.display(),
            reservation.fingerprint()
        );
    }
    Ok(Keys {
        admission,
        secret_path,
        reservation,
        reservation_path,
    })
}

fn engine_config(a: &ServeArgs) -> Result<EngineConfig, String> {
    if a.shards == 0 || a.shards > MAX_SHARDS {
        return Err("--shards must be between 1 and 1024".into());
    }
    if a.ttl_ms == 0 || a.ttl_ms > MAX_TTL_MS {
        return Err("--ttl-ms must be between 1 and 2592000000".into());
    }
    Ok(EngineConfig {
        default_shards: a.shards,
        default_ttl_ms: a.ttl_ms,
        retention_ms: a.retention_ms,
        auto_release: a.auto_release,
        expected_reservations: a.expected_reservations,
    })
}

fn wal_options(a: &ServeArgs) -> WalOptions {
    let env_ms = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    WalOptions {
        fsync: a.fsync,
        segment_bytes: a.segment_mib.max(1) << 20,
        repair: a.repair,
        // Test-only fault injection (see WalOptions); unset in production.
        fault_write_delay_ms: env_ms("STOCKGATE_FAULT_WAL_DELAY_MS"),
        fault_sync_delay_ms: env_ms("STOCKGATE_FAULT_FSYNC_DELAY_MS"),
        feed_retention: a.feed_retention,
        ..WalOptions::default()
    }
}

/// The engine rebuilt from the data dir, its log, and (a Raft member) the speculation
/// its records go through instead of the WAL.
struct Recovered {
    engine: Arc<stockgate_server::engine::Engine>,
    durability: Arc<WalDurability>,
    report: stockgate_server::persist::RecoveryReport,
    speculation: Option<Arc<raft::speculation::Speculation>>,
}

fn recover(
    a: &ServeArgs,
    cfg: EngineConfig,
    keys: Keys,
    raft_member: bool,
) -> Result<Recovered, String> {
    let mut speculation: Option<Arc<raft::speculation::Speculation>> = None;
    let (engine, durability, report) = recover_engine_with(
        &a.data_dir,
        wal_options(a),
        cfg,
        Arc::new(SystemClock::new()),
        keys.admission,
        keys.reservation,
        |wal| {
            if !raft_member {
                return wal.clone();
            }
            // A member's engine writes into the leader's batches, not the WAL.
            let s = Arc::new(raft::speculation::Speculation::new(
                rand::random::<u64>(),
                wal.last_lsn(),
            ));
            speculation = Some(s.clone());
            s
        },
    )
    .map_err(refusal)?;
    engine.check_reservation_key(1000).map_err(|token| {
        format!(
            "reservation {token} in {} was not made with reservation key {} (fingerprint {}); start with the key that wrote this data dir. Refusing to start",
            a.data_dir.display(),
            keys.reservation_path.display(),
            engine.key_fingerprint()
        )
    })?;
    if let Some(t) = &report.truncated {
        tracing::warn!("WAL recovery: {t}");
    }
    tracing::info!(
        "recovered {} sales, {} reservations (snapshot lsn {}, {} records replayed) in {} ms",
        engine.list_sales().len(),
        engine.reservation_count(),
        report.snapshot_lsn,
        report.events_replayed,
        report.millis
    );
    Ok(Recovered {
        engine,
        durability,
        report,
        speculation,
    })
}

/// Why the server will not start on its data dir, and what to do about it. `--repair`
/// is the cure for a damaged log only: offered for anything else (a lock another process
/// holds, a permission) it would lead an operator to cut a healthy log.
fn refusal(e: stockgate_core::wal::WalError) -> String {
    use stockgate_core::wal::WalError;
    match e {
        WalError::Corrupt { .. } => format!("{e}\nstockgate: refusing to start; `--repair` cuts the log at the first bad record (what follows is lost; the ledger can rebuild)"),
        other => format!("{other}\nstockgate: refusing to start"),
    }
}

fn server_config(a: &ServeArgs) -> ServerConfig {
    ServerConfig {
        bind: a.bind.clone(),
        port: a.port,
        data_dir: a.data_dir.display().to_string(),
        fsync: a.fsync.to_string(),
        durable: true,
        auto_release: a.auto_release,
        default_shards: a.shards,
        default_ttl_ms: a.ttl_ms,
        retention_ms: a.retention_ms,
        limits: Limits {
            max_bulk: a.max_bulk,
            max_args: a.max_args,
            max_inline: 64 * 1024,
        },
        max_clients: a.maxclients,
        max_query_buffer: a.max_query_buffer,
        max_output_buffer: a.max_output_buffer,
        idle_timeout_ms: a.idle_timeout_ms,
        write_timeout_ms: a.write_timeout_ms,
        ..ServerConfig::default()
    }
}

/// The slot map's logged changes (`CLUSTER SETSLOT`): replayed from recovery, applied as
/// a Raft member takes them from its leader, re-logged by every snapshot of a single
/// node before it deletes the records.
fn install_slot_log(
    c: &Arc<stockgate_server::cluster::Cluster>,
    r: &Recovered,
    feed: Option<&Arc<Feed>>,
) {
    // A Raft member's snapshot carries the changes it covers in its state file; the
    // records after the snapshot follow.
    if let Some(feed) = feed {
        for (kind, body) in feed.state_file_records(r.report.snapshot_lsn).0 {
            c.apply_record(kind, &body);
        }
    }
    for (_, kind, body) in &r.report.opaque {
        c.apply_record(*kind, body);
    }
    let replay = c.clone();
    r.durability
        .add_replay_hook(Box::new(move |_lsn, kind, body| {
            replay.apply_record(kind, body)
        }));
    if let (None, Some(feed)) = (&r.speculation, feed) {
        let (cluster, feed) = (c.clone(), feed.clone());
        r.durability.add_checkpoint_hook(Box::new(move |_upto| {
            let mut last = 0;
            for change in cluster.checkpoint() {
                let (kind, body) = change.encode();
                last = feed.groups.log_opaque(kind, &body);
            }
            Ok(last)
        }));
    }
}

/// The order feed over the WAL, its consumer groups rebuilt and kept in the log.
fn open_feed(r: &Recovered) -> Arc<Feed> {
    let wal = r.durability.wal.clone();
    let feed = Arc::new(match &r.speculation {
        Some(spec) => Feed::with_group_sink(wal, spec.clone(), FeedLimits::default()),
        None => Feed::new(wal, FeedLimits::default()),
    });
    // Consumer groups keep their state in the log: rebuilt from the group records after
    // the snapshot, re-logged (checkpoint) by every snapshot before it deletes them.
    let (state, state_bad) = feed.load_state_file(r.report.snapshot_lsn);
    let (applied, bad) = feed.groups.recover(
        r.report
            .opaque
            .iter()
            .map(|(lsn, kind, body)| (*lsn, *kind, body.as_slice())),
    );
    let (applied, bad) = (applied + state, bad + state_bad);
    if applied + bad > 0 {
        tracing::info!(
            "recovered {} consumer group(s) from {applied} record(s){}",
            feed.groups.count(),
            if bad > 0 {
                format!(", {bad} undecodable record(s) skipped")
            } else {
                String::new()
            }
        );
    }
    // A single node's snapshots delete the records that described the consumer groups:
    // each snapshot logs a checkpoint of them first. A Raft member logs nothing of its own
    // (its records are the leader's): its snapshots (`raft::snapshot`) store the groups'
    // state beside themselves, and `SAVE` is refused.
    if r.speculation.is_none() {
        let hook_feed = feed.clone();
        r.durability
            .add_checkpoint_hook(Box::new(move |_upto| Ok(hook_feed.checkpoint_groups())));
    }
    // A member applies its leader's group records as they are committed.
    let replay_feed = feed.clone();
    r.durability
        .add_replay_hook(Box::new(move |lsn, kind, body| {
            replay_feed
                .groups
                .recover(std::iter::once((lsn, kind, body)));
        }));
    feed
}

/// The metrics endpoint has no authentication: loopback only, unless asked for.
fn check_metrics_addr(a: &ServeArgs) -> Result<(), String> {
    let Some(m) = &a.metrics_addr else {
        return Ok(());
    };
    let host = m.rsplit_once(':').map_or(m.as_str(), |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if !is_loopback(host) && !a.metrics_allow_remote {
        return Err(format!(
            "refusing --metrics-addr {m}: not loopback (the endpoint has no authentication; pass --metrics-allow-remote)"
        ));
    }
    Ok(())
}

/// `--threads`, where 0 is one event loop per two cores this process may run on (rounded
/// up), so one on a 1- or 2-core machine. `available_parallelism` honours the affinity
/// mask (taskset) and cgroup quotas. Why half: at one request per connection most of a
/// request's CPU is the kernel's TCP work, and the storm's tail on a 2-core machine was
/// twice as long with a loop on every core as with one (docs/benchmarks.md, "Per core"):
/// the loops are preempted by the kernel's network processing and by whatever else runs
/// there.
fn event_loops(threads: usize) -> usize {
    match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get().div_ceil(2)),
        n => n,
    }
}

/// Everything on the runtime: the Raft member (if any), the history's first record,
/// the background tasks, and the server until a shutdown signal.
async fn serve_until_shutdown(
    a: &ServeArgs,
    r: &Recovered,
    shared: Arc<Shared>,
    raft: Option<(RaftNodeConfig, raft::node::Prepared)>,
    first: Ports<std::net::TcpListener>,
    extra: Vec<Ports<std::net::TcpListener>>,
) -> Result<(), String> {
    let engine = &r.engine;
    let to_tokio = |l: std::net::TcpListener| {
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
        tokio::net::TcpListener::from_std(l).map_err(|e| e.to_string())
    };
    let listener = Ports {
        plain: first.plain.map(to_tokio).transpose()?,
        tls: first.tls.map(to_tokio).transpose()?,
    };
    let addr = match &listener.plain {
        Some(l) => Some(l.local_addr().map_err(|e| e.to_string())?),
        None => None,
    };
    let tls_addr = match &listener.tls {
        Some(l) => Some(l.local_addr().map_err(|e| e.to_string())?),
        None => None,
    };
    if let (Some((cfg, prepared)), Some(spec)) = (raft, r.speculation.clone()) {
        // The restart after a lost leadership keeps the port this start bound; a TLS-only
        // member keeps `--port 0` (no plain port).
        let port = addr.map_or(0, |a| a.port());
        start_raft_member(r, &shared, cfg, prepared, spec, port).await?;
    }
    // A single node begins its history on its first start (a member's leader does, in
    // the group's log), durably before any tool can read the id.
    if r.speculation.is_none() && engine.history().is_none() {
        let lsn = engine.begin_history(&stockgate_server::engine::new_history_id());
        stockgate_server::session::Durability::wait(r.durability.as_ref(), lsn)
            .await
            .map_err(|e| format!("writing the history id: {e}"))?;
    }
    {
        let mut out = std::io::stdout().lock();
        if let Some(addr) = addr {
            let _ = writeln!(out, "listening on {addr}");
        }
        if let Some(t) = tls_addr {
            let _ = writeln!(out, "listening on {t} (tls)");
        }
        let _ = out.flush();
    }
    let tls_watch = shared
        .tls
        .get()
        .map(|t| tokio::spawn(t.clone().watch(stockgate_server::tls::RELOAD_CHECK)));
    let snapshotter = r
        .speculation
        .is_none()
        .then(|| spawn_snapshotter(engine.clone(), r.durability.clone(), a.snapshot_records));
    let sampler = tokio::spawn(stockgate_server::report::http::sample_loop(
        engine.clone(),
        shared.clone(),
    ));
    let metrics_http = match &a.metrics_addr {
        Some(m) => Some(spawn_metrics_http(m, engine, &shared, a.tls.metrics_tls()?).await?),
        None => None,
    };
    let leaders = shared
        .cluster
        .get()
        .map(|c| tokio::spawn(stockgate_server::cluster::leaders::watch(c.clone())));
    let result = serve(listener, extra, engine.clone(), shared, shutdown_signal())
        .await
        .map_err(|e| e.to_string());
    if let Some(s) = snapshotter {
        s.abort();
    }
    sampler.abort();
    if let Some(w) = tls_watch {
        w.abort();
    }
    if let Some(l) = leaders {
        l.abort();
    }
    if let Some(h) = metrics_http {
        h.abort();
    }
    result
}

/// Starts this process's Raft member, which re-executes itself when deposed, holds
/// snapshots back for the consumer groups, and publishes what its log says.
async fn start_raft_member(
    r: &Recovered,
    shared: &Arc<Shared>,
    cfg: RaftNodeConfig,
    prepared: raft::node::Prepared,
    spec: Arc<raft::speculation::Speculation>,
    port: u16,
) -> Result<(), String> {
    let argv = cfg.restart_argv.clone();
    let data_dir = cfg.data_dir.clone();
    spec.set_depose_hook(RaftNode::restart_hook(argv, port, r.durability.clone()));
    // Consumer groups hold snapshots back: nothing they may still read is covered.
    let feed = shared.feed.get().cloned();
    let hold = Box::new(move || feed.as_ref().and_then(|f| f.groups.oldest_needed()));
    let cluster = shared.cluster.get().cloned();
    let compact_slots = Box::new(move |recs| match &cluster {
        Some(c) => c.compact_slot_records(recs),
        None => recs,
    });
    let hooks = raft::snapshot::SnapshotHooks {
        hold,
        compact_slots,
    };
    let node = RaftNode::start(
        cfg,
        prepared,
        r.engine.clone(),
        r.durability.clone(),
        spec,
        hooks,
    )
    .await?;
    // A failed disk (the Raft log's, the WAL's) or a stopped Raft core ends the process
    // with its own status, for the supervisor to restart it from its durable state:
    // serving on would leave a member that answers but can no longer promise anything.
    tokio::spawn(raft::storage_fault::watch(
        node.raft.clone(),
        r.durability.clone(),
        data_dir,
    ));
    let hub = shared.clone();
    node.set_publisher(Box::new(move |ch, msg| {
        hub.pubsub.publish(ch, msg);
    }));
    let _ = shared.repl.set(node);
    Ok(())
}

/// Binds `--metrics-addr` and serves the metrics and the status page there.
async fn spawn_metrics_http(
    addr: &str,
    engine: &Arc<stockgate_server::engine::Engine>,
    shared: &Arc<Shared>,
    https: bool,
) -> Result<tokio::task::JoinHandle<()>, String> {
    let l = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("bind --metrics-addr {addr}: {e}"))?;
    let local = l.local_addr().map_err(|e| e.to_string())?;
    let scheme = if https { "https" } else { "http" };
    tracing::info!("metrics on {scheme}://{local}/metrics, status page {scheme}://{local}/");
    eprintln!("stockgate: metrics on {scheme}://{local}/");
    let tls = if https {
        shared.tls.get().cloned()
    } else {
        None
    };
    Ok(tokio::spawn(stockgate_server::report::http::serve(
        l,
        engine.clone(),
        shared.clone(),
        tls,
    )))
}

// ---- TLS ----

/// The TLS port and its loaded certificate, when `--tls-port` is given; a file that is
/// missing or does not parse stops the start, named.
fn tls_from(a: &ServeArgs) -> Result<Option<(u16, Arc<stockgate_server::tls::Tls>)>, String> {
    a.tls.metrics_tls()?;
    let Some((port, files)) = a.tls.files()? else {
        return Ok(None);
    };
    let tls = stockgate_server::tls::Tls::load(files).map_err(|e| e.to_string())?;
    Ok(Some((port, Arc::new(tls))))
}

/// `--tls-replication yes`: the Raft member's links over TLS with the loaded files.
fn replication_tls(
    a: &ServeArgs,
    tls: Option<&(u16, Arc<stockgate_server::tls::Tls>)>,
    raft: Option<&mut RaftNodeConfig>,
) -> Result<(), String> {
    if !a.tls.replication_tls()? {
        return Ok(());
    }
    let (Some((_, t)), Some(cfg)) = (tls, raft) else {
        return Err(
            "--tls-replication yes needs --raft-id (it secures a Raft member's links)".into(),
        );
    };
    cfg.tls = Some(t.clone());
    Ok(())
}

/// `--tls-cluster yes`: the links to the cluster's other nodes (`ROLE` probes,
/// `SALE.MIGRATE`) over TLS with the loaded files.
fn cluster_tls(
    a: &ServeArgs,
    tls: Option<&(u16, Arc<stockgate_server::tls::Tls>)>,
    cluster: Option<stockgate_server::cluster::Cluster>,
) -> Result<Option<stockgate_server::cluster::Cluster>, String> {
    let on = a.tls.cluster_tls()?;
    let Some(c) = cluster else {
        return match on {
            true => Err("--tls-cluster yes needs --cluster-enabled yes (it secures the links between the cluster's nodes)".into()),
            false => Ok(None),
        };
    };
    if !on {
        if tls_only(a.port, a.tls.tls_port) {
            tracing::warn!("this node serves TLS only and --tls-cluster is no: it calls the other nodes of the cluster over plain TCP, which nodes serving TLS only refuse (docs/cluster.md, \"TLS between nodes\")");
        }
        return Ok(Some(c));
    }
    Ok(Some(c.with_peer_tls(tls.map(|(_, t)| t.clone()))))
}

/// Redis's `port 0`: no plain port, TLS only. Only with a fixed `--tls-port`: `--port 0
/// --tls-port 0` keeps picking a free port for each (tests and tools start servers so).
fn tls_only(port: u16, tls_port: Option<u16>) -> bool {
    port == 0 && tls_port.is_some_and(|t| t != 0)
}

/// The port this node serves clients on: the plain one, or the TLS one when TLS only.
fn client_port(a: &ServeArgs) -> u16 {
    match a.tls.tls_port {
        Some(t) if tls_only(a.port, Some(t)) => t,
        _ => a.port,
    }
}

/// The plain port's listeners and, with TLS, the TLS port's, one of each per event loop.
fn bind_ports(
    a: &ServeArgs,
    tls_port: Option<u16>,
    threads: usize,
) -> Result<
    (
        Ports<std::net::TcpListener>,
        Vec<Ports<std::net::TcpListener>>,
    ),
    String,
> {
    let backlog = a.tcp_backlog as i32;
    if tls_only(a.port, tls_port) {
        let port = tls_port.unwrap_or(0);
        let (tls, tls_extra) = bind_listeners(&a.bind, port, threads, backlog)?;
        let extra = tls_extra.into_iter().map(|tls| Ports {
            plain: None,
            tls: Some(tls),
        });
        return Ok((
            Ports {
                plain: None,
                tls: Some(tls),
            },
            extra.collect(),
        ));
    }
    let (plain, plain_extra) = bind_listeners(&a.bind, a.port, threads, backlog)?;
    let Some(port) = tls_port else {
        let extra = plain_extra.into_iter().map(|plain| Ports {
            plain: Some(plain),
            tls: None,
        });
        return Ok((
            Ports {
                plain: Some(plain),
                tls: None,
            },
            extra.collect(),
        ));
    };
    let (tls, tls_extra) = bind_listeners(&a.bind, port, threads, backlog)?;
    let extra = plain_extra
        .into_iter()
        .zip(tls_extra)
        .map(|(plain, tls)| Ports {
            plain: Some(plain),
            tls: Some(tls),
        });
    Ok((
        Ports {
            plain: Some(plain),
            tls: Some(tls),
        },
        extra.collect(),
    ))
}

// ---- end TLS ----

/// The listening sockets of `threads` event loops on one address. One loop: a plain
/// socket. More: `SO_REUSEPORT` on each, so the kernel spreads connections over them.
/// `SO_REUSEPORT` would also let a second server of the same user bind the same port and
/// silently take half the connections, so the port is first claimed by a plain socket:
/// if anything holds it, that bind fails as it would with one loop.
fn bind_listeners(
    host: &str,
    port: u16,
    threads: usize,
    backlog: i32,
) -> Result<(std::net::TcpListener, Vec<std::net::TcpListener>), String> {
    use socket2::{Domain, Socket, Type};
    use std::net::ToSocketAddrs;
    let what = |e: std::io::Error| format!("bind {host}:{port}: {e}");
    let addr = (host, port)
        .to_socket_addrs()
        .map_err(what)?
        .next()
        .ok_or_else(|| format!("bind {host}:{port}: no address"))?;
    // As tokio's `TcpListener::bind`: SO_REUSEADDR (restart while old connections are in
    // TIME_WAIT); the backlog is `--tcp-backlog`.
    let listen = |addr: std::net::SocketAddr, reuse_port: bool| {
        let s = Socket::new(Domain::for_address(addr), Type::STREAM, None).map_err(what)?;
        s.set_reuse_address(true).map_err(what)?;
        if reuse_port {
            s.set_reuse_port(true).map_err(what)?;
        }
        s.bind(&addr.into()).map_err(what)?;
        s.listen(backlog).map_err(what)?;
        Ok::<_, String>(std::net::TcpListener::from(s))
    };
    let plain = listen(addr, false)?;
    if threads <= 1 {
        return Ok((plain, Vec::new()));
    }
    let addr = plain.local_addr().map_err(what)?;
    drop(plain);
    let mut all = Vec::with_capacity(threads);
    for _ in 0..threads {
        all.push(listen(addr, true)?);
    }
    let first = all.remove(0);
    Ok((first, all))
}

/// Snapshots once enough log has accumulated, so restarts replay a bounded tail and old
/// segments can be deleted.
fn spawn_snapshotter(
    engine: Arc<stockgate_server::engine::Engine>,
    d: Arc<WalDurability>,
    every: u64,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut iv = tokio::time::interval(Duration::from_secs(1));
        loop {
            iv.tick().await;
            if d.records_since_snapshot() >= every.max(1) {
                let (e, d2) = (engine.clone(), d.clone());
                let r = tokio::task::spawn_blocking(move || d2.snapshot(&e)).await;
                if let Ok(Err(err)) = r {
                    tracing::error!("snapshot failed: {err}");
                }
            }
        }
    })
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => {},
            _ = tokio::signal::ctrl_c() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    let _ = Path::new("");
}

/// The Raft member settings, when `--raft-id` is given (checked here, in words).
fn raft_config(a: &ServeArgs) -> Result<Option<RaftNodeConfig>, String> {
    let Some(id) = a.raft_id else {
        return Ok(None);
    };
    if id == 0 {
        return Err("--raft-id: node ids start at 1".into());
    }
    let listen = a
        .raft_listen
        .clone()
        .ok_or("--raft-id needs --raft-listen HOST:PORT (where the peers reach this member)")?;
    let mut bootstrap = std::collections::BTreeMap::new();
    for p in &a.raft_peers {
        let (pid, info) = raft::parse_peer(p)?;
        if bootstrap.insert(pid, info).is_some() {
            return Err(format!("--raft-peers lists node {pid} twice"));
        }
    }
    let mut routes = std::collections::HashMap::new();
    for r in &a.raft_route {
        let (rid, addr) = r
            .split_once('=')
            .and_then(|(i, addr)| Some((i.parse::<u64>().ok()?, addr.to_owned())))
            .ok_or_else(|| format!("--raft-route {r}: expected ID=HOST:PORT"))?;
        routes.insert(rid, addr);
    }
    if a.raft_heartbeat_ms == 0 || a.raft_election_min_ms <= a.raft_heartbeat_ms {
        return Err(
            "--raft-election-min-ms must be larger than --raft-heartbeat-ms (and both above 0)"
                .into(),
        );
    }
    if a.raft_election_max_ms <= a.raft_election_min_ms {
        return Err("--raft-election-max-ms must be larger than --raft-election-min-ms".into());
    }
    Ok(Some(RaftNodeConfig {
        id,
        listen,
        bootstrap,
        form_group: a.raft_bootstrap,
        routes,
        group_name: a.group_name.clone(),
        heartbeat_ms: a.raft_heartbeat_ms,
        election_min_ms: a.raft_election_min_ms,
        election_max_ms: a.raft_election_max_ms,
        rejoin_empty: a.rejoin_empty,
        restart_argv: std::env::args_os().collect(),
        data_dir: a.data_dir.clone(),
        snapshot_records: a.snapshot_records.max(1),
        tls: None,
    }))
}
