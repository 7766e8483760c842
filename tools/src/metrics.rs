//! The sweeper's own metrics (`stockgate-sweeper run --metrics-addr 127.0.0.1:9380`):
//! passes, what they did, errors by side (ledger/Postgres vs server), and the lag of the
//! oldest expired reservation still waiting after a pass. Prometheus text on `/metrics`,
//! served by the server crate's small HTTP server.
//!
//! [`run`] drives the sweeper pass by pass exactly like `Sweeper::run` (same interval,
//! same backoff), recording each pass's report.
//!
//! It also watches the materializer (`stockgate-materializer`, [`crate::materialize`]):
//! after each pass it compares the feed's end with the materializer's committed position
//! in `feed_position`. The sweeper does it, not the materializer, because the lag matters
//! most when the materializer is down, and a stopped process exports nothing.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::client::StockgateClient;
use crate::gate::ReservationGate;
use crate::ledger::Ledger;
use crate::materialize::{FeedReader, Lag, MaterializeError};
use crate::sentinel::ServerTarget;
use crate::sweeper::{PassReport, SweepError, Sweeper};

/// Counters of the sweeper process, shared between the sweep loop and the `/metrics` endpoint;
/// totals since start unless a field says otherwise.
#[derive(Default)]
pub struct SweeperMetrics {
    /// Passes that completed.
    pub passes: AtomicU64,
    /// Passes that stopped on an error.
    pub passes_failed: AtomicU64,
    /// Expired reservations the passes examined.
    pub seen: AtomicU64,
    /// `RELEASE`s that returned units to stock.
    pub released: AtomicU64,
    /// `RELEASE`s that found the hold already released by someone else.
    pub release_noop: AtomicU64,
    /// PENDING orders this sweeper cancelled because they expired.
    pub cancelled: AtomicU64,
    /// Orders found already cancelled or refunded whose hold was still on the server, released now.
    pub recovered: AtomicU64,
    /// COMMITTED orders whose hold was then committed on the server.
    pub commit_cleanup: AtomicU64,
    /// Holds with no order in the ledger, tombstoned and released.
    pub tombstones: AtomicU64,
    /// Holds left for a later pass (not yet expired by the ledger's clock, or busy).
    pub skipped: AtomicU64,
    /// Sales the server held fenced at the last pass (a gauge).
    pub fenced_sales: AtomicU64,
    /// Sales found missing on the server (lost state) and fenced.
    pub lost_sales: AtomicU64,
    /// Failed passes whose error came from the ledger (Postgres or sled).
    pub ledger_errors: AtomicU64,
    /// Failed passes whose error came from the server.
    pub server_errors: AtomicU64,
    /// Failed passes with any other error.
    pub other_errors: AtomicU64,
    /// Age of the oldest reservation `EXPIRED` still lists after the last pass (ms).
    pub lag_ms: AtomicU64,
    /// When the last pass ended, in ms since the Unix epoch (0: none yet).
    pub last_pass_unix_ms: AtomicU64,
    /// How long the last pass took, in ms.
    pub last_pass_ms: AtomicU64,
    /// The materializer's lag at the last probe: (consumer, lag); `None` until a probe
    /// found its `feed_position` row (no materializer has run yet).
    pub materializer: std::sync::Mutex<Option<(String, Lag)>>,
    /// Lag probes of the materializer that failed.
    pub materializer_probe_errors: AtomicU64,
    started: std::sync::OnceLock<Instant>,
}

/// Reads the materializer's lag for [`run`]: the position from the ledger's
/// `feed_position`, the feed's end from the server. Connects to the feed lazily, so a
/// server that is down when the sweeper starts only costs a probe error.
pub struct MaterializerProbe {
    pool: sqlx::PgPool,
    server: ServerTarget,
    stream: String,
    consumer: String,
    reader: tokio::sync::Mutex<Option<FeedReader>>,
}

/// Attempts of a Sentinel-mode probe's calls: a probe runs between sweeper passes, so it
/// gives up a failover in well under a second (one probe error) instead of holding the
/// next pass for the ~19 s a command may wait; the next probe finds the new primary.
const PROBE_SENTINEL_ATTEMPTS: u32 = 3;

impl MaterializerProbe {
    /// A probe of the materializer that reads `consumer`'s position on `stream` from the ledger in
    /// `pool` and the feed's end from the server at `server`.
    pub fn new(pool: sqlx::PgPool, server: &str, stream: &str, consumer: &str) -> Self {
        MaterializerProbe::with_target(
            pool,
            ServerTarget::Addr(server.to_owned()),
            stream,
            consumer,
        )
    }

    /// The feed of `server`: a fixed address, or the primary of a Sentinel-managed
    /// group (followed across failovers, with few attempts per call).
    pub fn with_target(
        pool: sqlx::PgPool,
        server: ServerTarget,
        stream: &str,
        consumer: &str,
    ) -> Self {
        let server = match server {
            ServerTarget::Sentinel(mut c) => {
                c.max_attempts = c.max_attempts.min(PROBE_SENTINEL_ATTEMPTS);
                ServerTarget::Sentinel(c)
            }
            addr => addr,
        };
        MaterializerProbe {
            pool,
            server,
            stream: stream.to_owned(),
            consumer: consumer.to_owned(),
            reader: tokio::sync::Mutex::new(None),
        }
    }

    /// The materializer's lag now; `None` while no materializer has recorded a position.
    pub async fn probe(&self) -> Result<Option<Lag>, MaterializeError> {
        let mut slot = self.reader.lock().await;
        let reader = match slot.as_ref() {
            Some(r) => r.clone(),
            None => {
                let r = FeedReader::connect_target(&self.server, &self.stream).await?;
                *slot = Some(r.clone());
                r
            }
        };
        drop(slot);
        crate::materialize::lag(&self.pool, &reader, &self.consumer).await
    }

    /// The consumer name whose position is probed (the metric's label).
    pub fn consumer(&self) -> &str {
        &self.consumer
    }
}

/// A Prometheus label value: backslash, double quote and newline escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn add(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl SweeperMetrics {
    /// Counts one completed pass that took `took`.
    pub fn record_pass(&self, r: &PassReport, took: Duration) {
        add(&self.passes, 1);
        add(&self.seen, r.seen);
        add(&self.released, r.released);
        add(&self.release_noop, r.release_noop);
        add(&self.cancelled, r.cancelled_now);
        add(
            &self.recovered,
            r.recovered_cancelled_by_sweeper + r.recovered_cancelled_by_buyer + r.refund_released,
        );
        add(&self.commit_cleanup, r.commit_cleanup);
        add(&self.tombstones, r.tombstoned);
        add(&self.skipped, r.skipped);
        add(&self.lost_sales, r.lost_skus.len() as u64);
        self.fenced_sales
            .store(r.fenced_skus.len() as u64, Ordering::Relaxed);
        self.last_pass_unix_ms.store(unix_ms(), Ordering::Relaxed);
        self.last_pass_ms
            .store(took.as_millis() as u64, Ordering::Relaxed);
    }

    /// Counts one failed pass by the side its error came from.
    pub fn record_error(&self, e: &SweepError) {
        add(&self.passes_failed, 1);
        match e {
            SweepError::Ledger(_) => add(&self.ledger_errors, 1),
            SweepError::Gate(_) => add(&self.server_errors, 1),
            #[allow(unreachable_patterns)]
            _ => add(&self.other_errors, 1),
        }
    }

    /// Stores a probe's result for `consumer`; a failed probe bumps the error counter and keeps the
    /// last lag.
    pub fn record_materializer(&self, consumer: &str, r: Result<Option<Lag>, MaterializeError>) {
        match r {
            Ok(Some(lag)) => {
                *self
                    .materializer
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) =
                    Some((consumer.to_owned(), lag));
            }
            Ok(None) => {}
            Err(e) => {
                // The last value stays (a scrape sees the error counter move); a stale
                // gauge is flagged by the counter rather than reset to a false 0.
                add(&self.materializer_probe_errors, 1);
                debug!(error = %e, "materializer lag probe failed");
            }
        }
    }

    /// Prometheus text exposition, `stockgate_sweeper_` names.
    pub fn render(&self) -> String {
        let mut o = String::new();
        for (name, kind, help, counter) in PASS_COUNTERS {
            metric(&mut o, name, kind, help, load(counter(self)).to_string());
        }
        self.render_errors(&mut o);
        for (name, help, a) in self.timings() {
            metric(&mut o, name, "gauge", help, ms_as_seconds(a).to_string());
        }
        self.render_materializer(&mut o);
        metric(
            &mut o,
            "uptime_seconds",
            "gauge",
            "Seconds since the sweeper started.",
            self.started
                .get()
                .map_or(0.0, |t| t.elapsed().as_secs_f64())
                .to_string(),
        );
        o
    }

    /// Failed passes, one series per side that failed.
    fn render_errors(&self, o: &mut String) {
        let _ = write!(
            o,
            "# HELP stockgate_sweeper_errors_total Failed passes by the side that failed.\n# TYPE stockgate_sweeper_errors_total counter\nstockgate_sweeper_errors_total{{source=\"ledger\"}} {}\nstockgate_sweeper_errors_total{{source=\"server\"}} {}\nstockgate_sweeper_errors_total{{source=\"other\"}} {}\n",
            load(&self.ledger_errors),
            load(&self.server_errors),
            load(&self.other_errors)
        );
    }

    /// Gauges kept in ms and exported in seconds: `(name, help, value)`.
    fn timings(&self) -> [(&'static str, &'static str, &AtomicU64); 3] {
        [
            (
                "lag_seconds",
                "Age of the oldest expired reservation still unswept after the last pass.",
                &self.lag_ms,
            ),
            (
                "last_pass_timestamp_seconds",
                "When the last pass finished (Unix time).",
                &self.last_pass_unix_ms,
            ),
            (
                "last_pass_duration_seconds",
                "How long the last pass took.",
                &self.last_pass_ms,
            ),
        ]
    }

    /// The materializer's lag, labelled by consumer (absent until a probe found it), and
    /// the probe error counter.
    fn render_materializer(&self, o: &mut String) {
        let mat = self
            .materializer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some((consumer, lag)) = mat {
            let c = label(&consumer);
            for (name, help, v) in [
                (
                    "materializer_lag_records",
                    "Log records between the feed's end and the materializer's committed position.",
                    lag.records.to_string(),
                ),
                (
                    "materializer_lag_seconds",
                    "Age of the oldest feed entry the materializer has not committed (0 when caught up).",
                    lag.seconds.to_string(),
                ),
                (
                    "materializer_position",
                    "The materializer's committed feed position (LSN).",
                    lag.position.to_string(),
                ),
                (
                    "feed_end_position",
                    "LSN of the feed's last durable entry, as the last probe saw it.",
                    lag.end.to_string(),
                ),
            ] {
                let _ = write!(
                    o,
                    "# HELP stockgate_sweeper_{name} {help}\n# TYPE stockgate_sweeper_{name} gauge\nstockgate_sweeper_{name}{{consumer=\"{c}\"}} {v}\n"
                );
            }
        }
        let _ = write!(
            o,
            "# HELP stockgate_sweeper_materializer_probe_errors_total Failed reads of the materializer's lag.\n# TYPE stockgate_sweeper_materializer_probe_errors_total counter\nstockgate_sweeper_materializer_probe_errors_total {}\n",
            load(&self.materializer_probe_errors)
        );
    }
}

/// Picks one counter out of the metrics.
type CounterOf = fn(&SweeperMetrics) -> &AtomicU64;

/// What the passes did: `(name, kind, help, counter)`, in exposition order.
const PASS_COUNTERS: [(&str, &str, &str, CounterOf); 12] = [
    ("passes_total", "counter", "Passes completed.", |m| {
        &m.passes
    }),
    (
        "passes_failed_total",
        "counter",
        "Passes that stopped on an error (retried after a backoff).",
        |m| &m.passes_failed,
    ),
    (
        "expired_seen_total",
        "counter",
        "Expired reservations examined.",
        |m| &m.seen,
    ),
    (
        "released_total",
        "counter",
        "Reservations whose units this sweeper returned to stock.",
        |m| &m.released,
    ),
    (
        "release_noop_total",
        "counter",
        "RELEASE calls that found the reservation already finished (another sweeper).",
        |m| &m.release_noop,
    ),
    (
        "cancelled_total",
        "counter",
        "PENDING orders cancelled in the ledger by this sweeper.",
        |m| &m.cancelled,
    ),
    (
        "recovered_total",
        "counter",
        "Releases completing an earlier cancellation (crash recovery, buyer cancel, refund).",
        |m| &m.recovered,
    ),
    (
        "committed_cleanup_total",
        "counter",
        "COMMIT cleanups of reservations the ledger holds as COMMITTED.",
        |m| &m.commit_cleanup,
    ),
    (
        "tombstones_total",
        "counter",
        "Tombstones written for expired reservations with no order.",
        |m| &m.tombstones,
    ),
    ("skipped_total", "counter", "Reservations skipped.", |m| {
        &m.skipped
    }),
    (
        "fenced_sales",
        "gauge",
        "Sales skipped in the last pass because they are fenced.",
        |m| &m.fenced_sales,
    ),
    (
        "lost_sales_total",
        "counter",
        "Sales fenced because the server had lost them.",
        |m| &m.lost_sales,
    ),
];

/// Appends one unlabelled series with its HELP and TYPE lines.
fn metric(o: &mut String, name: &str, kind: &str, help: &str, v: String) {
    let _ = write!(
        o,
        "# HELP stockgate_sweeper_{name} {help}\n# TYPE stockgate_sweeper_{name} {kind}\nstockgate_sweeper_{name} {v}\n"
    );
}

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// A gauge kept in ms, as seconds.
fn ms_as_seconds(a: &AtomicU64) -> f64 {
    load(a) as f64 / 1000.0
}

/// The sweeper's metrics endpoint over HTTPS (`--metrics-tls-cert-file` and
/// `--metrics-tls-key-file`; with `--metrics-tls-ca-cert-file` every client must present
/// a certificate from that CA).
#[derive(Clone, Debug)]
pub struct MetricsTls {
    /// The endpoint's certificate chain, PEM.
    pub cert: std::path::PathBuf,
    /// Its private key, PEM.
    pub key: std::path::PathBuf,
    /// The CA scrapers' client certificates must chain to; `None`: no client certificate.
    pub ca: Option<std::path::PathBuf>,
}

impl MetricsTls {
    fn load(&self) -> Result<stockgate_server::tls::Tls, String> {
        use stockgate_server::tls::{AuthClients, Tls, TlsFiles};
        let auth_clients = if self.ca.is_some() {
            AuthClients::Yes
        } else {
            AuthClients::No
        };
        Tls::load(TlsFiles {
            cert: self.cert.clone(),
            key: self.key.clone(),
            ca: self.ca.clone(),
            auth_clients,
        })
        // The loader names the server's flags; these files came from the --metrics-tls-*
        // ones.
        .map_err(|e| format!("the sweeper's metrics TLS (--metrics-tls-*): {e}"))
    }
}

/// Binds `addr` and serves `/metrics`, over HTTPS with `tls`; `None` when no address was
/// given. Only a loopback address is accepted unless scrapers are authenticated (HTTPS
/// with client certificates): the endpoint has no other authentication.
pub async fn serve(
    addr: Option<&str>,
    tls: Option<&MetricsTls>,
) -> Result<Option<Arc<SweeperMetrics>>, String> {
    let Some(addr) = addr else { return Ok(None) };
    let tls = tls
        .map(|t| t.load().map(|l| (Arc::new(l), t.ca.is_some())))
        .transpose()?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("--metrics-addr {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let authenticated = tls.as_ref().is_some_and(|(_, client_certs)| *client_certs);
    if !local.ip().is_loopback() && !authenticated {
        return Err(format!(
            "--metrics-addr {addr}: not a loopback address (the endpoint authenticates nobody;              serve it on another address only with --metrics-tls-cert-file,              --metrics-tls-key-file and --metrics-tls-ca-cert-file, which require client              certificates)"
        ));
    }
    let scheme = if tls.is_some() { "https" } else { "http" };
    let m = Arc::new(SweeperMetrics::default());
    let _ = m.started.set(Instant::now());
    let mm = m.clone();
    tokio::spawn(stockgate_server::report::http::serve_routes(
        listener,
        tls.map(|(t, _)| t),
        Arc::new(move |path: &str| match path {
            "/metrics" => Some((
                stockgate_server::report::http::PROM_TYPE,
                mm.render().into_bytes(),
            )),
            "/healthz" => Some(("text/plain", b"ok\n".to_vec())),
            _ => None,
        }),
    ));
    info!("sweeper metrics on {scheme}://{local}/metrics");
    Ok(Some(m))
}

/// Age of the oldest reservation the server still lists as expired (0 if none).
async fn probe_lag(probe: &StockgateClient) -> Option<u64> {
    let oldest = probe.expired(1, None).await.ok()?;
    Some(oldest.first().map_or(0, |r| {
        unix_ms().saturating_sub(r.expires_at_ms.max(0) as u64)
    }))
}

/// Runs passes until `stop`, like `Sweeper::run`, recording each into `metrics`.
/// Without metrics it is `Sweeper::run` itself.
/// `materializer`: also record the materializer's lag after every pass.
pub async fn run<L: Ledger, G: ReservationGate>(
    sweeper: &Sweeper<L, G>,
    probe: StockgateClient,
    metrics: Option<Arc<SweeperMetrics>>,
    materializer: Option<MaterializerProbe>,
    mut stop: watch::Receiver<bool>,
) {
    let Some(m) = metrics else {
        return sweeper.run(stop).await;
    };
    let cfg = sweeper.config().clone();
    let floor = (cfg.interval / 10).max(Duration::from_millis(50));
    let mut backoff = floor;
    loop {
        if *stop.borrow() {
            return;
        }
        let t = Instant::now();
        let wait = match sweeper.run_pass().await {
            Ok(r) => {
                backoff = floor;
                m.record_pass(&r, t.elapsed());
                if r.seen > 0 || !r.lost_skus.is_empty() {
                    info!("sweeper pass: {r}");
                } else {
                    debug!("sweeper pass: nothing expired");
                }
                cfg.interval
            }
            Err(e) => {
                m.record_error(&e);
                warn!(error = %e, backoff_ms = backoff.as_millis() as u64, "sweeper pass failed; backing off");
                let w = backoff;
                backoff = (backoff * 2).min(cfg.max_backoff.max(floor));
                w
            }
        };
        if let Some(lag) = probe_lag(&probe).await {
            m.lag_ms.store(lag, Ordering::Relaxed);
        }
        if let Some(mp) = &materializer {
            m.record_materializer(mp.consumer(), mp.probe().await);
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => {}
        }
    }
}
