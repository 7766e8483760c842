//! `stockgate-materializer`: consumes the order feed and writes the orders into the
//! Postgres ledger exactly once (see `stockgate_client::materialize`).

use std::process::ExitCode;

use clap::Parser;
use stockgate_client::ledger::postgres::PgLedger;
use stockgate_client::materialize::{
    FeedReader, MaterializeError, Materializer, MaterializerConfig, ALL_EVENTS,
};

#[derive(Parser)]
#[command(
    name = "stockgate-materializer",
    version,
    about = "Reads the stockgate order feed (XREAD) and writes PENDING/COMMITTED/CANCELLED orders \
             into the Postgres ledger exactly once (orders and position in one transaction)"
)]
struct Cli {
    /// Postgres URL of the ledger.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    database_url: String,
    /// stockgate server (host:port or redis://user:pass@host:port; role sweeper or admin).
    #[arg(long, env = "STOCKGATE_ADDR", default_value = "127.0.0.1:7379")]
    server: String,
    /// Stream to consume.
    #[arg(long, default_value = ALL_EVENTS)]
    stream: String,
    /// This consumer's name in `feed_position`.
    #[arg(long, default_value = "materializer")]
    consumer: String,
    /// Entries per XREAD and per SQL transaction.
    #[arg(long, default_value_t = 2000)]
    batch: usize,
    /// Exit once the feed has nothing new (after one empty BLOCK).
    #[arg(long)]
    drain: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ MaterializeError::Trimmed(_)) => {
            eprintln!("stockgate-materializer: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("stockgate-materializer: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), MaterializeError> {
    let ledger = PgLedger::connect(&cli.database_url)
        .await
        .map_err(|e| MaterializeError::Feed(format!("ledger: {e}")))?;
    ledger
        .migrate()
        .await
        .map_err(|e| MaterializeError::Feed(format!("migrate: {e}")))?;
    let reader = FeedReader::connect(&cli.server, &cli.stream).await?;
    let m = Materializer::new(
        ledger.pool().clone(),
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
