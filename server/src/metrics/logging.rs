//! Logs through `tracing`: plain text (colour only when stderr is a terminal, so files and
//! journald get no escape codes) or JSON lines for log shippers; the level from a flag or
//! the environment. Also the one-line-per-lifecycle-event log of sale administration.

use std::io::IsTerminal as _;

/// How log lines are written on stderr (`--log-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines, coloured only when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// `--log-format` and `--log-level`: the same on every binary (the server, the sweeper,
/// the materializer), flattened into each one's command line.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct LogArgs {
    /// Log format on stderr: text (colour only on a terminal) or json (one object per
    /// line, for log shippers).
    #[arg(long, value_enum, default_value = "text", global = true)]
    pub log_format: LogFormat,
    /// Log filter, e.g. `info`, `warn` or `stockgate_server=debug` (default:
    /// $STOCKGATE_LOG, then $RUST_LOG, then info).
    #[arg(long, global = true)]
    pub log_level: Option<String>,
}

impl LogArgs {
    /// Installs the global subscriber these flags describe.
    pub fn init(&self) {
        init(self.log_format, self.log_level.as_deref(), "STOCKGATE_LOG");
    }
}

/// The filter when neither `--log-level` nor the environment sets one. Postgres NOTICEs
/// are routine (`relation "_sqlx_migrations" already exists, skipping` on every start of
/// a ledger tool) but sqlx logs them at INFO: shown from WARN up only.
pub const DEFAULT_FILTER: &str = "info,sqlx::postgres::notice=warn";

/// `filter` with openraft's own lines turned off, unless it names openraft itself or asks
/// for debug or trace everywhere. openraft logs each failed call to a peer (one per
/// heartbeat, at ERROR) and dumps its state at INFO: thousands of lines while a group
/// starts, members coming up one after another. A member logs what matters itself, once
/// per change: a peer unreachable or back (`raft::network`), leadership won or lost
/// (`raft::node`). `info,openraft=info` brings openraft's lines back.
pub fn quiet_openraft(filter: &str) -> String {
    let verbose = filter.split(',').any(|d| {
        let d = d.trim().to_ascii_lowercase();
        d.contains("openraft") || d == "debug" || d == "trace"
    });
    if verbose {
        filter.to_string()
    } else {
        format!("{filter},openraft=off")
    }
}

/// Installs the global subscriber. `level` (a filter such as `info` or
/// `stockgate=debug`) wins over the environment variable `env_var`, then `RUST_LOG`,
/// then [`DEFAULT_FILTER`]. The filter can be replaced later ([`set_filter`]).
pub fn init(format: LogFormat, level: Option<&str>, env_var: &str) {
    use tracing_subscriber::EnvFilter;
    let env = |name: &str| {
        std::env::var(name)
            .ok()
            .filter(|v| EnvFilter::try_new(v).is_ok())
    };
    let text = level
        .filter(|l| EnvFilter::try_new(l).is_ok())
        .map(str::to_string)
        .or_else(|| env(env_var))
        .or_else(|| env("RUST_LOG"))
        .unwrap_or_else(|| DEFAULT_FILTER.to_string());
    let filter = EnvFilter::try_new(quiet_openraft(&text))
        .unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let b = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    // A subscriber already installed (tests, embedding) keeps working, and keeps its
    // filter: `set_filter` then refuses.
    let reload: Option<Reloader> = match format {
        LogFormat::Text => {
            let b = b
                .with_ansi(std::io::stderr().is_terminal())
                .with_filter_reloading();
            let h = b.reload_handle();
            b.try_init()
                .ok()
                .map(|()| Box::new(move |f| h.reload(f).map_err(|e| e.to_string())) as Reloader)
        }
        LogFormat::Json => {
            let b = b.json().with_ansi(false).with_filter_reloading();
            let h = b.reload_handle();
            b.try_init()
                .ok()
                .map(|()| Box::new(move |f| h.reload(f).map_err(|e| e.to_string())) as Reloader)
        }
    };
    if let Some(r) = reload {
        let _ = RELOAD.set(r);
        *CURRENT.lock() = text;
    }
}

type Reloader =
    Box<dyn Fn(tracing_subscriber::EnvFilter) -> Result<(), String> + Send + Sync + 'static>;

/// Replaces the installed filter (`CONFIG SET log-level`).
static RELOAD: std::sync::OnceLock<Reloader> = std::sync::OnceLock::new();
/// The filter in force, as it was written.
static CURRENT: parking_lot::Mutex<String> = parking_lot::Mutex::new(String::new());

/// The log filter in force (`CONFIG GET log-level`).
pub fn filter() -> String {
    CURRENT.lock().clone()
}

/// Replaces the log filter of the subscriber `init` installed. Refused, in words, for a
/// filter that does not parse or when `init` installed none.
pub fn set_filter(text: &str) -> Result<(), String> {
    let f = tracing_subscriber::EnvFilter::try_new(quiet_openraft(text))
        .map_err(|e| format!("not a log filter (e.g. info, warn, stockgate_server=debug): {e}"))?;
    let reload = RELOAD
        .get()
        .ok_or("this process's log subscriber was not installed by stockgate")?;
    reload(f)?;
    *CURRENT.lock() = text.to_string();
    Ok(())
}

/// How a sale-administration command ended, as the log line needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Refused: nothing is logged.
    Refused,
    /// Done, with the integer the command answered, if it answered one.
    Done(Option<i64>),
}

/// One info line per successful sale-administration command (never per request).
pub fn lifecycle(cmd: &str, argv: &[&[u8]], ended: Ended) {
    let what = match cmd {
        "sale.create" => "created",
        "sale.pause" => "paused",
        "sale.resume" => "resumed",
        "sale.adjust" => "adjusted",
        "sale.fence" => "fenced",
        "sale.rebuild" => "rebuilt",
        _ => return,
    };
    let Ended::Done(result) = ended else {
        return;
    };
    let sku = argv
        .get(1)
        .map(|s| {
            String::from_utf8_lossy(s)
                .chars()
                .take(64)
                .collect::<String>()
        })
        .unwrap_or_default();
    let detail: Vec<String> = argv
        .iter()
        .skip(2)
        .take(10)
        .map(|a| String::from_utf8_lossy(a).chars().take(64).collect())
        .collect();
    match result {
        Some(n) => {
            tracing::info!(sku = %sku, args = %detail.join(" "), result = n, "sale {what}")
        }
        None => tracing::info!(sku = %sku, args = %detail.join(" "), "sale {what}"),
    }
}

#[cfg(test)]
mod filter_tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::{Context, SubscriberExt};
    use tracing_subscriber::{EnvFilter, Layer};

    /// Records the target of every event that passed the filter.
    struct Targets(Arc<Mutex<Vec<String>>>);

    impl<S: tracing::Subscriber> Layer<S> for Targets {
        fn on_event(&self, e: &tracing::Event<'_>, _: Context<'_, S>) {
            if let Ok(mut v) = self.0.lock() {
                v.push(e.metadata().target().to_string());
            }
        }
    }

    #[test]
    fn default_filter_keeps_info_and_drops_postgres_notices() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sub = tracing_subscriber::registry()
            .with(Targets(seen.clone()).with_filter(EnvFilter::new(super::DEFAULT_FILTER)));
        tracing::subscriber::with_default(sub, || {
            tracing::info!(target: "sqlx::postgres::notice", "relation already exists, skipping");
            tracing::warn!(target: "sqlx::postgres::notice", "a real warning");
            tracing::info!(target: "stockgate_sweeper", "sweeper pass");
        });
        let seen = seen.lock().map(|v| v.clone()).unwrap_or_default();
        assert_eq!(seen, ["sqlx::postgres::notice", "stockgate_sweeper"]);
    }
}
