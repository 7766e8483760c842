//! `stockgate-materializer`: consumes the order feed and writes the orders into the
//! Postgres ledger exactly once (see `stockgate_ledger::materialize`), from one server
//! (`--server`) or from the primary of a Sentinel-managed group (`--sentinel`,
//! `--master-name`), followed across failovers.

use std::process::ExitCode;

use clap::Parser;
use stockgate_client::ServerTarget;
use stockgate_ledger::ledger::pg_schema;
use stockgate_ledger::ledger::postgres::{PgLedger, PgLedgerOptions};
use stockgate_ledger::materialize::{
    FeedReader, MaterializeError, Materializer, MaterializerConfig, ALL_EVENTS,
};

// `hide_env_values` on every environment-backed value that can carry a credential (a
// Postgres URL, a redis:// URL with a password, a password): `--help` would print it.
#[derive(Parser)]
#[command(
    name = "stockgate-materializer",
    version,
    about = "Reads the stockgate order feed (XREAD) and writes PENDING/COMMITTED/CANCELLED orders \
             into the Postgres ledger exactly once (orders and position in one transaction)",
    after_help = "Reads from one server (--server) or from the leader of a replicated group: \
                  --sentinel lists the group's members (each answers the Sentinel discovery \
                  commands; real redis-sentinel processes work too), e.g. --sentinel \
                  127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003 --master-name stockgate. It \
                  follows failovers: on a connection error, -READONLY or -LOADING it asks \
                  again and resends the read (up to 40 attempts, 50-500 ms apart, about 19 s; \
                  after that the error is logged and the materializer retries). Its position \
                  is a log position, the same on every member, plus a fingerprint of the \
                  entry there: on every node it reads from it first checks that the feed \
                  holds that entry, and refuses a feed from another history. \
                  Exit codes: 0 done (--drain), 1 error, 2 position trimmed from the feed, \
                  3 the feed is another history than the ledger's position. \
                  --server and --sentinel are mutually exclusive. --tls (or a rediss:// \
                  --server) reads over TLS, verified with --cacert, with --cert/--key for a \
                  server that requires client certificates; not with --sentinel."
)]
struct Cli {
    /// Postgres URL of the ledger.
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    database_url: String,
    /// Postgres schema the ledger lives in (created if missing; a plain lowercase name).
    /// A ledger of an older version found only in `public` is refused: move it with
    /// `stockgate-sweeper migrate --schema <name>`.
    #[arg(
        long,
        env = pg_schema::SCHEMA_ENV,
        default_value = pg_schema::DEFAULT_SCHEMA,
        value_parser = pg_schema::parse_schema
    )]
    schema: String,
    /// stockgate server (host:port or redis://user:pass@host:port; role sweeper or admin).
    /// Not with --sentinel.
    #[arg(
        long,
        env = "STOCKGATE_ADDR",
        hide_env_values = true,
        default_value = "127.0.0.1:7379",
        conflicts_with = "sentinel"
    )]
    server: String,
    /// Redis Sentinel addresses (host:port[,host:port...], or redis:// URLs for Sentinels
    /// with a password): read the feed of the primary they name for --master-name, and
    /// follow failovers. Not with --server.
    #[arg(
        long,
        env = "STOCKGATE_SENTINELS",
        requires = "master_name",
        hide_env_values = true
    )]
    sentinel: Option<String>,
    /// The group's name in the Sentinels' `sentinel monitor <name> ...` (with --sentinel).
    #[arg(long, env = "STOCKGATE_MASTER_NAME", requires = "sentinel")]
    master_name: Option<String>,
    /// User for the nodes Sentinel names, if the group has users (role sweeper or admin;
    /// with --sentinel).
    #[arg(long, env = "STOCKGATE_NODE_USER", requires = "sentinel")]
    node_user: Option<String>,
    /// Password for the nodes Sentinel names (with --sentinel).
    #[arg(
        long,
        env = "STOCKGATE_NODE_PASSWORD",
        hide_env_values = true,
        requires = "sentinel"
    )]
    node_password: Option<String>,
    /// Stream to consume.
    #[arg(long, default_value = ALL_EVENTS)]
    stream: String,
    /// This consumer's name in `feed_position`.
    #[arg(long, default_value = "materializer")]
    consumer: String,
    /// Entries per XREAD and per SQL transaction (at most 10000).
    #[arg(long, default_value_t = 2000, allow_negative_numbers = true,
          value_parser = stockgate_server::cli::int_in::<usize>(1, 10_000))]
    batch: usize,
    /// Exit once the feed has nothing new (after one empty BLOCK).
    #[arg(long)]
    drain: bool,
    #[command(flatten)]
    tls: stockgate_client::TlsArgs,
    #[command(flatten)]
    log: stockgate_server::metrics::logging::LogArgs,
}

#[tokio::main]
async fn main() -> ExitCode {
    // The same log flags and rules as the server (`metrics::logging`).
    let cli = Cli::parse();
    cli.log.init();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ MaterializeError::Trimmed(_)) => {
            eprintln!("stockgate-materializer: {e}");
            ExitCode::from(2)
        }
        Err(
            e @ (MaterializeError::History(_)
            | MaterializeError::Identity(stockgate_ledger::identity::IdentityError::Mismatch {
                ..
            })),
        ) => {
            eprintln!("stockgate-materializer: {e}");
            ExitCode::from(3)
        }
        Err(e) => {
            eprintln!("stockgate-materializer: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), MaterializeError> {
    // The TLS files first: a bad one is reported before the ledger is touched.
    let tls = cli
        .tls
        .load(&cli.server)
        .map_err(|e| MaterializeError::Feed(format!("invalid argument: {e}")))?;
    let ledger = PgLedger::connect_with(
        &cli.database_url,
        PgLedgerOptions {
            schema: cli.schema.clone(),
            ..PgLedgerOptions::default()
        },
    )
    .await?;
    ledger.migrate().await?;
    let target = ServerTarget::from_flags(
        &cli.server,
        cli.sentinel.as_deref(),
        cli.master_name.as_deref(),
        cli.node_user.as_deref(),
        cli.node_password.as_deref(),
    )
    .and_then(|t| t.with_tls(tls))
    .map_err(|e| MaterializeError::Feed(format!("invalid argument: {e}")))?;
    let reader = FeedReader::connect_target(&target, &cli.stream).await?;
    tracing::info!(server = %target, stream = %cli.stream, "reading the feed");
    let m = Materializer::new(
        &ledger,
        reader,
        MaterializerConfig {
            consumer: cli.consumer,
            stream: cli.stream,
            batch: cli.batch.clamp(1, 10_000),
            block_ms: if cli.drain { 200 } else { 1000 },
        },
    );
    if cli.drain {
        let pos = m.pump(true).await?;
        println!("position {pos}");
        return Ok(());
    }
    m.run(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
}
