//! `stockgate-ops`: the sweeper daemon and the operator's commands: the ledger migrations,
//! sale registration, adjustments, the rebuild of a fenced sale, bindings, splits and slot
//! moves. `stockgate-sweeper` (`stockgate-sweeper.rs`) is the same program under its old
//! name; the synopsis below holds for either.
//!
//! ```text
//! stockgate-ops [--database-url URL] [--schema stockgate]
//!               [--server ADDR | --sentinel H:P,... --master-name N]
//!               [--tls [--cacert FILE] [--cert FILE --key FILE]]
//!               [run] [--interval-secs 30] [--once]
//!                     [--rebalance [--rebalance-threshold N] [--rebalance-seed ADDR]]
//! stockgate-ops migrate
//! stockgate-ops create-sale --sku SKU --total N [--shards N] [--ttl-ms MS] [--limit N]
//! stockgate-ops adjust --sku SKU --delta N [--id ADJ-ID]
//! stockgate-ops rebuild --sku SKU [--fence]
//! stockgate-ops rebind --history ID
//! stockgate-ops bind --history ID [--group NAME]
//! stockgate-ops unbind --history ID
//! stockgate-ops split --parent P --parts N --total T [--limit L] [--shards N] [--ttl-ms MS]
//!               (more --parts than recorded: grow the split by empty parts)
//! stockgate-ops rebalance --parent P [--threshold N] [--interval-secs S] [--once]
//! ```

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use stockgate_client::{ServerTarget, StockgateClient};
use stockgate_core::engine::{MAX_SHARDS, MAX_TOTAL, MAX_TTL_MS};
use stockgate_ledger::adjust::{adjust_sale, AdjustResult};
use stockgate_ledger::ledger::pg_schema;
use stockgate_ledger::ledger::postgres::{PgLedger, PgLedgerOptions};
use stockgate_ledger::ledger::{Ledger, SaleRecord};
use stockgate_ledger::rebuild::{rebuild_sale, RebuildOptions};
use stockgate_ledger::{Sweeper, SweeperConfig};
use stockgate_server::cli::{int_in, number_in};
use stockgate_tools::split::{LockedPass, RebalanceStep};
use tracing::{error, info, warn};

// `hide_env_values` on every environment-backed value that can carry a credential (a
// Postgres URL, a redis:// URL with a password, a password): `--help` would print it.
#[derive(Parser)]
#[command(
    name = "stockgate-ops",
    version,
    about = "Reconciles expired stockgate reservations with the Postgres ledger (ledger first), \
             applies the ledger schema, and rebuilds fenced sales from the ledger",
    after_help = "Every command talks to one server (--server) or to the leader of a Raft \
                  group through its members' Sentinel interface, e.g. --sentinel \
                  127.0.0.1:7381,127.0.0.1:7382,127.0.0.1:7383 --master-name stockgate \
                  (run, run --once, create-sale, adjust, rebuild, rebind and bind alike). \
                  --tls (or a rediss:// --server) connects over TLS, verified with --cacert, \
                  with --cert/--key for a server that requires client certificates; not with \
                  --sentinel."
)]
struct Cli {
    /// Postgres URL of the ledger.
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        global = true,
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    database_url: String,
    /// Postgres schema the ledger lives in (created if missing; a plain lowercase name).
    /// A ledger of an older version found only in `public` is refused; `migrate` moves it.
    #[arg(
        long,
        env = pg_schema::SCHEMA_ENV,
        global = true,
        default_value = pg_schema::DEFAULT_SCHEMA,
        value_parser = pg_schema::parse_schema
    )]
    schema: String,
    /// stockgate server address (host:port or redis:// URL with credentials). Ignored
    /// with --sentinel.
    #[arg(
        long,
        env = "STOCKGATE_ADDR",
        hide_env_values = true,
        global = true,
        default_value = "127.0.0.1:7379"
    )]
    server: String,
    /// Sentinel addresses (host:port[,host:port...], or redis:// URLs): a Raft group's
    /// members. Talk to the leader they name for --master-name instead of --server, and
    /// follow failovers (commands refused with -READONLY, and idempotent ones whose reply
    /// was lost, are retried on the new leader).
    #[arg(
        long,
        env = "STOCKGATE_SENTINELS",
        global = true,
        hide_env_values = true
    )]
    sentinel: Option<String>,
    /// The group's name in the Sentinels' `sentinel monitor <name> ...` (with --sentinel).
    #[arg(long, env = "STOCKGATE_MASTER_NAME", global = true)]
    master_name: Option<String>,
    /// User for the nodes Sentinel names, if the group has users (with --sentinel).
    #[arg(long, env = "STOCKGATE_NODE_USER", global = true)]
    node_user: Option<String>,
    /// Password for the nodes Sentinel names (with --sentinel).
    #[arg(
        long,
        env = "STOCKGATE_NODE_PASSWORD",
        global = true,
        hide_env_values = true
    )]
    node_password: Option<String>,
    #[command(flatten)]
    tls: stockgate_client::TlsArgs,
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
    #[command(flatten)]
    log: stockgate_server::metrics::logging::LogArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Sweep every interval (the default).
    Run(RunArgs),
    /// Apply the ledger schema (migrations/) in --schema and exit. A ledger of an older
    /// version (in `public`, where they kept it) is first moved into --schema (one
    /// transaction).
    Migrate,
    /// Create a sale on the server and record it (allocation, key fingerprint) in the ledger.
    CreateSale(CreateSaleArgs),
    /// Change a sale's allocation: the ledger first, then SALE.ADJUST on the server.
    /// Re-run with the same --id after any failure: it is applied exactly once.
    Adjust(AdjustArgs),
    /// Rebuild a fenced (or lost) sale from the ledger: restore pending, paid and
    /// cancelled orders, set available = allocation − committed − pending, reopen.
    Rebuild(RebuildArgs),
    /// Bind the ledger to the history the server reports now (`INFO server`'s
    /// `stockgate_history`), replacing the one it was bound to. Every tool refuses a
    /// server of another history; do this only when the ledger is to follow this
    /// server from now on (a server rebuilt after it lost its data). For a ledger of
    /// one group: with several bound, use bind and unbind.
    Rebind(RebindArgs),
    /// Add the history the server reports now (another group of the cluster) to the
    /// ledger's bindings: that group's sweeper, rebuild and materializer may then use
    /// this ledger, each on its own group's sales.
    Bind(BindArgs),
    /// Remove a history from the ledger's bindings (a group taken out of the cluster);
    /// its tools are refused from then on. Talks to no server.
    Unbind(UnbindArgs),
    /// Split a sale over the cluster's groups: --parts sales `P.p<i>-<k>`, part i on the
    /// i-th group by lowest slot (--server is any node of the cluster), recorded in the
    /// ledger as parts of --parent. Re-run with the same arguments after any failure.
    /// Given more --parts than recorded (every other value the same), it grows the split:
    /// the new parts start with 0 units and `rebalance` fills them; fewer parts are
    /// refused.
    Split(SplitArgs),
    /// Move unsold units of a split sale from its fullest part to a sold-out one, through
    /// the ledger (withdrawal first); every --interval-secs, or once with --once. Each
    /// pass holds the parent's advisory lock: a pass another rebalancer (a sweeper's
    /// `run --rebalance`) is running is skipped. `run --rebalance` does the same inside
    /// the sweeper's loop.
    Rebalance(RebalanceArgs),
    /// Move hash slots (and every sale on them) from one group's node to another's while
    /// they sell (docs/cluster.md, "Moving slots"). Needs no ledger unless
    /// --follow-ledger. Re-run the same command after any failure: it finishes the move.
    MoveSlots(MoveSlotsArgs),
}

#[derive(Args)]
struct MoveSlotsArgs {
    /// The source group's leader, `host:port` or a `redis://user:pass@host:port` URL.
    /// With --tls (--cacert, --cert, --key) every node given is reached over TLS.
    #[arg(long)]
    from: String,
    /// The destination group's leader, as --from. Its host and port are what the source
    /// connects to.
    #[arg(long)]
    to: String,
    /// Slots and inclusive ranges: `100-200,300`.
    #[arg(long)]
    slots: String,
    /// Every other node of the cluster, told the new owner last (comma-separated).
    #[arg(long, value_delimiter = ',')]
    all_nodes: Vec<String>,
    /// After the move, record in the ledger (--database-url) that the moved sales live
    /// on the destination's history, so its group's sweeper and rebuild take them (the
    /// destination must be bound: `bind`).
    #[arg(long)]
    follow_ledger: bool,
}

#[derive(Args)]
struct SplitArgs {
    /// The parent's name (at most 48 characters of a sku).
    #[arg(long)]
    parent: String,
    /// Number of parts (1 to 64). More than an existing parent's adds empty parts;
    /// fewer is refused.
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<usize>(1, 64))]
    parts: usize,
    /// The parent's allocation: what all parts together may ever hold.
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<u64>(0, MAX_TOTAL as i128))]
    total: u64,
    /// Units per user on each part; 0 = no limit (docs/cluster.md: what it bounds).
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<u32>(0, u32::MAX as i128))]
    limit: Option<u32>,
    /// Shard count of each part (default: the server's --shards).
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<u16>(1, MAX_SHARDS as i128))]
    shards: Option<u16>,
    /// Reservation TTL in ms of each part (default: the server's --ttl-ms).
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<u64>(1, MAX_TTL_MS as i128))]
    ttl_ms: Option<u64>,
}

#[derive(Args)]
struct RebalanceArgs {
    #[arg(long)]
    parent: String,
    /// Move only when the fullest part has more than this many units available.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true,
          value_parser = int_in::<u64>(0, MAX_TOTAL as i128))]
    threshold: u64,
    /// Seconds between passes.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true,
          value_parser = number_in(0.001, 86_400.0, "seconds"))]
    interval_secs: f64,
    /// Run one pass and exit.
    #[arg(long)]
    once: bool,
}

#[derive(Args)]
struct RebindArgs {
    /// The history id the server reports, repeated here so a rebind is never pointed at
    /// a server by accident.
    #[arg(long)]
    history: String,
}

#[derive(Args)]
struct BindArgs {
    /// The history id the server reports, repeated here so a binding is never added for
    /// a server by accident.
    #[arg(long)]
    history: String,
    /// A name for the group, kept beside the binding for people reading the ledger.
    #[arg(long)]
    group: Option<String>,
}

#[derive(Args)]
struct UnbindArgs {
    /// The history id to remove.
    #[arg(long)]
    history: String,
}

#[derive(Args, Clone)]
struct RunArgs {
    /// Seconds between passes.
    #[arg(long, default_value_t = 30.0, allow_negative_numbers = true,
          value_parser = number_in(0.001, 86_400.0, "seconds"))]
    interval_secs: f64,
    /// Run one pass and exit (exit code 1 if it failed).
    #[arg(long)]
    once: bool,
    /// EXPIRED batch size (the server answers at most 10000 per call).
    #[arg(long, default_value_t = 500, allow_negative_numbers = true,
          value_parser = int_in::<usize>(1, 10_000))]
    batch: usize,
    /// Only sweep these SKUs (repeatable). Default: every sale known to server or ledger.
    #[arg(long)]
    sku: Vec<String>,
    /// Longest backoff after failures, in seconds.
    #[arg(long, default_value_t = 30.0, allow_negative_numbers = true,
          value_parser = number_in(0.001, 86_400.0, "seconds"))]
    max_backoff_secs: f64,
    /// Serve the sweeper's Prometheus metrics here, e.g. 127.0.0.1:9380: a loopback
    /// address, or any with HTTPS and client certificates (the three --metrics-tls-*).
    #[arg(long)]
    metrics_addr: Option<String>,
    /// With --metrics-addr: serve HTTPS with this certificate chain (PEM).
    #[arg(long, requires = "metrics_tls_key_file", requires = "metrics_addr")]
    metrics_tls_cert_file: Option<std::path::PathBuf>,
    /// With --metrics-tls-cert-file: its private key (PEM).
    #[arg(long, requires = "metrics_tls_cert_file")]
    metrics_tls_key_file: Option<std::path::PathBuf>,
    /// With the two above: require every scraper to present a certificate from this CA
    /// (PEM); then --metrics-addr may be a non-loopback address.
    #[arg(long, requires = "metrics_tls_cert_file")]
    metrics_tls_ca_cert_file: Option<std::path::PathBuf>,
    /// With --metrics-addr: the `feed_position` consumer whose lag behind the order feed
    /// is exported (`stockgate_sweeper_materializer_lag_*`; nothing until it has run).
    #[arg(long, default_value = "materializer")]
    materializer_consumer: String,
    /// After each pass, one rebalance pass (as `rebalance --once`) of every split sale
    /// with a part on this server's group. Each parent's pass runs under its Postgres
    /// advisory lock: with every group's sweeper running --rebalance, a parent is
    /// rebalanced by one of them at a time; a parent another rebalancer is busy with is
    /// skipped until the next pass.
    #[arg(long)]
    rebalance: bool,
    /// With --rebalance: move only when the fullest part has more than this many units
    /// available (as `rebalance --threshold`).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true,
          value_parser = int_in::<u64>(0, MAX_TOTAL as i128))]
    rebalance_threshold: u64,
    /// With --rebalance: a node of the cluster whose `CLUSTER SLOTS` finds each part's
    /// group, `host:port` or a `redis://user:pass@` URL (default: --server; give it with
    /// --sentinel).
    #[arg(long, env = "STOCKGATE_REBALANCE_SEED", hide_env_values = true)]
    rebalance_seed: Option<String>,
}

#[derive(Args)]
struct CreateSaleArgs {
    #[arg(long)]
    sku: String,
    /// Units on sale.
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<u64>(0, MAX_TOTAL as i128))]
    total: u64,
    /// Shard count (default: the server's --shards).
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<u16>(1, MAX_SHARDS as i128))]
    shards: Option<u16>,
    /// Reservation TTL in ms (default: the server's --ttl-ms).
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<u64>(1, MAX_TTL_MS as i128))]
    ttl_ms: Option<u64>,
    /// Units per user; 0 = no limit.
    #[arg(long, allow_negative_numbers = true, value_parser = int_in::<u32>(0, u32::MAX as i128))]
    limit: Option<u32>,
}

#[derive(Args)]
struct AdjustArgs {
    #[arg(long)]
    sku: String,
    /// Units to add (restock) or, negative, to withdraw (at most what is available).
    #[arg(long, allow_hyphen_values = true,
          value_parser = int_in::<i64>(-(MAX_TOTAL as i128), MAX_TOTAL as i128))]
    delta: i64,
    /// Idempotency key of this adjustment. Default: a new random id, printed, so that a
    /// failed run can be retried with it.
    #[arg(long)]
    id: Option<String>,
}

#[derive(Args)]
struct RebuildArgs {
    #[arg(long)]
    sku: String,
    /// Fence the sale first if it is open (operator-initiated rebuild).
    #[arg(long)]
    fence: bool,
}

/// Why `create-sale` refuses a sale the server already has and the ledger has no record
/// of: recording it would make the ledger describe a sale it cannot account for.
#[derive(Debug, thiserror::Error)]
enum ExistingSale {
    #[error(
        "sale {sku} already exists on the server with total {server}, not --total {asked}, \
         and the ledger has no record of it; nothing was recorded. If it was created with \
         that total, run create-sale again with --total {server} to adopt it; a total \
         changed by hand (SALE.ADJUST) cannot be adopted: create the sale under another \
         --sku"
    )]
    OtherTotal {
        sku: String,
        server: i64,
        asked: u64,
    },
    #[error(
        "sale {sku} already exists on the server with {committed} unit(s) committed (sold), \
         while the ledger has no record of the sale and orders for only {recorded} of them; \
         nothing was recorded: the sweeper would see a consistent sale and never the units \
         sold without an order. To adopt the sale, first bring its orders into this ledger \
         (`stockgate-materializer --drain` against this server writes those its feed still \
         holds), then run create-sale again; otherwise create the sale under another --sku"
    )]
    SoldWithoutOrders {
        sku: String,
        committed: i64,
        recorded: u64,
    },
}

#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error(transparent)]
    ExistingSale(#[from] ExistingSale),
    #[error(transparent)]
    Ledger(#[from] stockgate_ledger::LedgerError),
    #[error(transparent)]
    Client(#[from] stockgate_client::ClientError),
    #[error(transparent)]
    Rebuild(#[from] stockgate_ledger::rebuild::RebuildError),
    #[error(transparent)]
    Sweep(#[from] stockgate_ledger::sweeper::SweepError),
    #[error(transparent)]
    Adjust(#[from] stockgate_ledger::adjust::AdjustError),
    #[error(transparent)]
    Identity(#[from] stockgate_ledger::identity::IdentityError),
    #[error(transparent)]
    Split(#[from] stockgate_tools::split::SplitError),
    #[error(transparent)]
    Tls(#[from] stockgate_client::TlsError),
    #[error(transparent)]
    Move(#[from] stockgate_tools::slot_move::MoveError),
    #[error("invalid argument: {0}")]
    Arg(String),
}

fn secs(v: f64, what: &str) -> Result<Duration, CliError> {
    Duration::try_from_secs_f64(v).map_err(|e| CliError::Arg(format!("{what}: {e}")))
}

impl Cli {
    /// The plain address, or the Sentinel group when --sentinel is given; over TLS when
    /// the TLS flags ask (their files are read here, before anything connects).
    fn target(&self) -> Result<ServerTarget, CliError> {
        let tls = self.tls.load(&self.server)?;
        ServerTarget::from_flags(
            &self.server,
            self.sentinel.as_deref(),
            self.master_name.as_deref(),
            self.node_user.as_deref(),
            self.node_password.as_deref(),
        )
        .and_then(|t| t.with_tls(tls))
        .map_err(CliError::Arg)
    }
}

/// Connect to the server, retrying: a sweeper started before the server (or while no
/// Sentinel names a primary) must wait, not die.
async fn connect_server(target: &ServerTarget) -> StockgateClient {
    let mut backoff = Duration::from_millis(200);
    loop {
        match StockgateClient::connect_target(target).await {
            Ok(c) => return c,
            Err(e) => {
                warn!(error = %e, server = %target, "server unreachable; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
}

async fn migrate_with_retry(ledger: &PgLedger, once: bool) -> Result<(), CliError> {
    let mut backoff = Duration::from_millis(200);
    loop {
        match ledger.migrate().await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_transient() && !once => {
                warn!(error = %e, "ledger unreachable; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The ledger of `--database-url` and `--schema`.
async fn open_ledger(cli: &Cli) -> Result<PgLedger, CliError> {
    let options = PgLedgerOptions {
        schema: cli.schema.clone(),
        ..PgLedgerOptions::default()
    };
    Ok(PgLedger::connect_with(&cli.database_url, options).await?)
}

async fn run(cli: Cli) -> Result<(), CliError> {
    if let Some(Cmd::MoveSlots(a)) = &cli.cmd {
        return move_slots_cmd(&cli, a).await;
    }
    let target = cli.target()?;
    let ledger = open_ledger(&cli).await?;
    match cli.cmd {
        Some(Cmd::Migrate) => migrate_cmd(&ledger).await,
        Some(Cmd::CreateSale(a)) => create_sale_cmd(&ledger, &target, a).await,
        Some(Cmd::Adjust(a)) => adjust_cmd(&ledger, &target, a).await,
        Some(Cmd::Rebuild(a)) => rebuild_cmd(&ledger, &target, a).await,
        Some(Cmd::Rebind(a)) => rebind_cmd(&ledger, &target, a).await,
        Some(Cmd::Bind(a)) => bind_cmd(&ledger, &target, a).await,
        Some(Cmd::Unbind(a)) => unbind_cmd(&ledger, a).await,
        Some(Cmd::Split(a)) => split_cmd(&ledger, &cli.server, a).await,
        // Handled before the ledger is opened.
        Some(Cmd::MoveSlots(_)) => Ok(()),
        Some(Cmd::Rebalance(a)) => rebalance_cmd(&ledger, &cli.server, a).await,
        Some(Cmd::Run(args)) => sweep(&target, &cli.server, ledger, args).await,
        None => sweep(&target, &cli.server, ledger, cli.run).await,
    }
}

/// `move-slots`: needs no ledger unless --follow-ledger asks it to record the move.
async fn move_slots_cmd(cli: &Cli, a: &MoveSlotsArgs) -> Result<(), CliError> {
    let slots = stockgate_tools::slot_move::parse_slots(&a.slots)?;
    let tls = cli.tls.load(&a.from)?;
    let m =
        stockgate_tools::slot_move::move_slots(&a.from, &a.to, &slots, &a.all_nodes, tls.as_ref())
            .await?;
    println!(
        "moved {} slot(s) from {} to {}: {} sale(s) handed over",
        m.slots, a.from, a.to, m.sales
    );
    if a.follow_ledger {
        let ledger = open_ledger(cli).await?;
        ledger.migrate().await?;
        let n = stockgate_tools::slot_move::follow_ledger(
            &ledger,
            &a.from,
            &a.to,
            &slots,
            tls.as_ref(),
        )
        .await?;
        println!("ledger: {n} sale(s) recorded on the destination's history");
    }
    Ok(())
}

async fn migrate_cmd(ledger: &PgLedger) -> Result<(), CliError> {
    if let Some(m) = ledger.migrate_moving_old_layout().await? {
        info!(
            "moved the ledger from schema {} to schema {}: {} tables ({}), {} \
             functions, {} orders",
            m.from,
            m.schema,
            m.tables.len(),
            m.tables.join(", "),
            m.functions.len(),
            m.orders
        );
    }
    info!(schema = %ledger.schema(), "ledger schema up to date");
    Ok(())
}

async fn create_sale_cmd(
    ledger: &PgLedger,
    target: &ServerTarget,
    a: CreateSaleArgs,
) -> Result<(), CliError> {
    ledger.migrate().await?;
    let client = StockgateClient::connect_target(target).await?;
    let bound = stockgate_ledger::identity::check_bound(ledger, client.history().await?).await?;
    stockgate_ledger::identity::check_sale(ledger, &bound, &a.sku).await?;
    check_existing_sale(ledger, &client, &a).await?;
    client
        .sale_create(&a.sku, a.total, a.shards, a.ttl_ms, a.limit)
        .await?;
    let info = client.sale_info(&a.sku).await?;
    let mut rec = SaleRecord::new(&a.sku, a.total);
    rec.shards = a.shards;
    rec.ttl_ms = a.ttl_ms;
    rec.per_user_limit = a.limit;
    rec.key_fingerprint = Some(info.key_fingerprint);
    ledger.register_sale(&rec).await?;
    ledger.record_sale_history(&a.sku, &bound.history).await?;
    println!("created {}", a.sku);
    Ok(())
}

async fn adjust_cmd(
    ledger: &PgLedger,
    target: &ServerTarget,
    a: AdjustArgs,
) -> Result<(), CliError> {
    ledger.migrate().await?;
    let id =
        a.id.unwrap_or_else(|| format!("adj-{:016x}", rand::random::<u64>()));
    // On stderr before anything happens: the id is what a retry needs.
    eprintln!("adjustment id {id} (re-run with --id {id} if this fails)");
    let client = StockgateClient::connect_target(target).await?;
    let r = adjust_sale(ledger, &client, &a.sku, &id, a.delta).await?;
    let how = match r.result {
        AdjustResult::Applied => "applied",
        AdjustResult::AlreadyOnServer => "already on the server, confirmed",
        AdjustResult::AlreadyApplied => "already applied",
    };
    println!(
        "adjusted {} by {} (id {}): {how}; allocation {} server total {}",
        a.sku, a.delta, id, r.allocation, r.server_total
    );
    Ok(())
}

async fn rebuild_cmd(
    ledger: &PgLedger,
    target: &ServerTarget,
    a: RebuildArgs,
) -> Result<(), CliError> {
    ledger.migrate().await?;
    let client = StockgateClient::connect_target(target).await?;
    let opts = RebuildOptions {
        fence_if_open: a.fence,
        ..Default::default()
    };
    let r = rebuild_sale(ledger, &client, &a.sku, &opts).await?;
    println!(
        "rebuilt {}: total {} committed {} restored {} pending ({} units), {} paid, {} cancelled; available {}",
        r.sku,
        r.total,
        r.committed_units,
        r.restored,
        r.restored_units,
        r.restored_committed,
        r.restored_released,
        r.available
    );
    Ok(())
}

async fn rebind_cmd(
    ledger: &PgLedger,
    target: &ServerTarget,
    a: RebindArgs,
) -> Result<(), CliError> {
    ledger.migrate().await?;
    let client = StockgateClient::connect_target(target).await?;
    let old =
        stockgate_ledger::identity::rebind(ledger, client.history().await?, &a.history).await?;
    match old {
        Some(old) if old != a.history => {
            println!("ledger bound to history {} (was {old})", a.history)
        }
        Some(_) => println!("ledger already bound to history {}", a.history),
        None => println!("ledger bound to history {}", a.history),
    }
    Ok(())
}

async fn bind_cmd(ledger: &PgLedger, target: &ServerTarget, a: BindArgs) -> Result<(), CliError> {
    ledger.migrate().await?;
    let client = StockgateClient::connect_target(target).await?;
    let added = stockgate_ledger::identity::bind(
        ledger,
        client.history().await?,
        &a.history,
        a.group.as_deref(),
    )
    .await?;
    let verb = if added { "now bound" } else { "already bound" };
    println!("ledger {verb} to history {}", a.history);
    Ok(())
}

async fn unbind_cmd(ledger: &PgLedger, a: UnbindArgs) -> Result<(), CliError> {
    ledger.migrate().await?;
    if ledger.remove_binding(&a.history).await? {
        println!("ledger no longer bound to history {}", a.history);
    } else {
        println!("ledger was not bound to history {}", a.history);
    }
    Ok(())
}

async fn split_cmd(ledger: &PgLedger, server: &str, a: SplitArgs) -> Result<(), CliError> {
    ledger.migrate().await?;
    let spec = stockgate_tools::split::SplitSpec {
        parent: a.parent,
        parts: a.parts,
        total: a.total,
        limit: a.limit,
        shards: a.shards,
        ttl_ms: a.ttl_ms,
    };
    let parts = stockgate_tools::split::create_split(ledger, server, &spec).await?;
    for p in &parts {
        println!("part {} {}", p.index, p.sku);
    }
    println!("split {} over {} parts", spec.parent, parts.len());
    Ok(())
}

/// `rebalance`: a pass every --interval-secs until a signal, or one with --once.
async fn rebalance_cmd(ledger: &PgLedger, server: &str, a: RebalanceArgs) -> Result<(), CliError> {
    ledger.migrate().await?;
    let every = secs(a.interval_secs, "--interval-secs")?;
    loop {
        let pass =
            stockgate_tools::split::rebalance_locked(ledger, server, &a.parent, a.threshold).await;
        match pass {
            Ok(LockedPass::Ran(r)) if a.once => {
                println!("rebalance {}: {r}", a.parent);
                return Ok(());
            }
            Ok(LockedPass::Busy) if a.once => {
                println!(
                    "rebalance {}: skipped, another rebalancer is running a pass",
                    a.parent
                );
                return Ok(());
            }
            Ok(_) => {}
            Err(e) if a.once => return Err(e.into()),
            Err(e) => {
                warn!(error = %e, parent = %a.parent, "rebalance pass failed; retrying")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = wait_for_signal() => return Ok(()),
        }
    }
}

/// Before `create-sale` creates anything: a sale the server has already (a create
/// retried after the ledger failed, or a sale made by hand with `SALE.CREATE`) and the
/// ledger does not is adopted only if the ledger can account for it: the same total and
/// an order for every unit sold. A retried create has sold nothing, so it goes on as a
/// create; `SALE.CREATE` then still refuses other shards, TTL or limit (`-EXISTS`). A
/// sale the ledger records already is a re-run and goes on as before.
async fn check_existing_sale(
    ledger: &PgLedger,
    client: &StockgateClient,
    a: &CreateSaleArgs,
) -> Result<(), CliError> {
    if ledger.sale(&a.sku).await?.is_some() {
        return Ok(());
    }
    let info = match client.sale_info(&a.sku).await {
        Ok(info) => info,
        Err(stockgate_client::ClientError::NoSale) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    if u64::try_from(info.total).ok() != Some(a.total) {
        return Err(ExistingSale::OtherTotal {
            sku: a.sku.clone(),
            server: info.total,
            asked: a.total,
        }
        .into());
    }
    let recorded = ledger.totals(&a.sku).await?.committed_units;
    if u64::try_from(info.committed).map_or(true, |c| c > recorded) {
        return Err(ExistingSale::SoldWithoutOrders {
            sku: a.sku.clone(),
            committed: info.committed,
            recorded,
        }
        .into());
    }
    info!(
        sku = %a.sku,
        committed = info.committed,
        reserved = info.reserved,
        "the server has this sale already; the ledger accounts for it: adopting it"
    );
    Ok(())
}

async fn sweep(
    server: &ServerTarget,
    seed: &str,
    ledger: PgLedger,
    args: RunArgs,
) -> Result<(), CliError> {
    migrate_with_retry(&ledger, args.once).await?;
    let client = if args.once {
        StockgateClient::connect_target(server).await?
    } else {
        connect_server(server).await
    };
    let cfg = SweeperConfig {
        interval: secs(args.interval_secs, "--interval-secs")?,
        batch_size: args.batch.max(1),
        skus: (!args.sku.is_empty()).then_some(args.sku),
        max_backoff: secs(args.max_backoff_secs, "--max-backoff-secs")?,
        ..Default::default()
    };
    let metrics_tls =
        args.metrics_tls_cert_file
            .clone()
            .map(|cert| stockgate_tools::metrics::MetricsTls {
                cert,
                key: args.metrics_tls_key_file.clone().unwrap_or_default(),
                ca: args.metrics_tls_ca_cert_file.clone(),
            });
    let metrics =
        stockgate_tools::metrics::serve(args.metrics_addr.as_deref(), metrics_tls.as_ref())
            .await
            .map_err(CliError::Arg)?;
    let probe = client.clone();
    // The lag probe reads the feed of the same target: through Sentinel, the primary
    // in use (the probe gives up a failover quickly, see `MaterializerProbe`).
    let mat_probe = metrics.as_ref().map(|_| {
        stockgate_tools::metrics::MaterializerProbe::with_target(
            ledger.pool().clone(),
            server.clone(),
            stockgate_ledger::materialize::ALL_EVENTS,
            &args.materializer_consumer,
        )
    });
    let step = args.rebalance.then(|| {
        let seed = args.rebalance_seed.as_deref().unwrap_or(seed);
        std::sync::Arc::new(RebalanceStep::new(
            ledger.clone(),
            seed,
            args.rebalance_threshold,
        )) as std::sync::Arc<dyn stockgate_ledger::sweeper::RebalanceHook>
    });
    let mut sweeper = Sweeper::new(ledger, client, cfg);
    if let Some(step) = step {
        sweeper = sweeper.with_rebalance(step);
    }
    if args.once {
        let r = sweeper.run_pass().await?;
        println!("sweeper pass: {r}");
        return Ok(());
    }
    let (tx, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(async move {
        stockgate_tools::metrics::run(&sweeper, probe, metrics, mat_probe, rx).await
    });
    // Stop between passes on SIGINT/SIGTERM; a pass in flight finishes first.
    wait_for_signal().await;
    info!("stopping after the current pass");
    let _ = tx.send(true);
    let _ = task.await;
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

pub(crate) fn main() -> ExitCode {
    // The same log flags and rules as the server (`metrics::logging`).
    let cli = Cli::parse();
    cli.log.init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            error!(error = %e, "cannot start the runtime");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!(error = %e, "stockgate-ops failed");
            ExitCode::FAILURE
        }
    }
}
