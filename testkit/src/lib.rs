//! Test and benchmark scaffolding for the workspace, never a dependency of a shipped
//! crate: throwaway PostgreSQL clusters ([`pgtemp`]) and the real `stockgate` binary run
//! as a child process ([`ServerProcess`], [`Harness`]).
//!
//! The binary is found at `$STOCKGATE_BIN`, else `<target>/debug/stockgate` (built with
//! `cargo build -p stockgate-server --bin stockgate` when missing). The server is
//! started with `--port 0`; its first stdout line `listening on <addr>` gives the address.

// A SIGTERM to the server it started (libc kill).
#![allow(unsafe_code)]

pub mod pgtemp;
pub mod ports;

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use stockgate_client::token::mint_admission_token;

static COUNTER: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, thiserror::Error)]
pub enum TestkitError {
    #[error("io error while {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("building the server failed: {0}")]
    Build(String),
    #[error("server did not announce its address: {0}")]
    NoAddress(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> TestkitError {
    let what = what.into();
    move |source| TestkitError::Io { what, source }
}

/// The workspace root (this crate lives in `<root>/testkit`).
pub fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().unwrap_or(here).to_path_buf()
}

/// Path of the `stockgate` binary, building it if needed.
pub fn server_binary() -> Result<PathBuf, TestkitError> {
    if let Ok(p) = std::env::var("STOCKGATE_BIN") {
        return Ok(PathBuf::from(p));
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| workspace_root().join("target"));
    let bin = target.join("debug").join("stockgate");
    if !bin.exists() {
        let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["build", "-p", "stockgate-server", "--bin", "stockgate"])
            .current_dir(workspace_root())
            .output()
            .map_err(io("running cargo build"))?;
        if !out.status.success() {
            return Err(TestkitError::Build(
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ));
        }
    }
    Ok(bin)
}

/// A binary of the workspace next to the running test executable
/// (`target/<profile>/<name>`, beside `deps/`). Panics with the command to run when it is
/// missing: the suite runs after `cargo build --workspace --bins`.
pub fn sibling_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let Some(dir) = exe.parent().and_then(Path::parent) else {
        panic!("no target/<profile> above {}", exe.display());
    };
    let b = dir.join(name);
    assert!(
        b.exists(),
        "{} missing: run `cargo build --workspace --bins` before the tests",
        b.display()
    );
    b
}

/// A child process killed (and reaped) when this is dropped, so a failing test leaves
/// no server behind.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A fresh temp dir, removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> Result<Self, TestkitError> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nonce: u32 = rand::random();
        let p =
            std::env::temp_dir().join(format!("{prefix}-{}-{n}-{nonce:08x}", std::process::id()));
        fs::create_dir_all(&p).map_err(io(format!("creating {}", p.display())))?;
        Ok(TempDir(p))
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Keys that survive a lost data dir: the admission secret and the reservation key live
/// outside it, as a deployment that must rebuild would keep them.
#[derive(Debug)]
pub struct ServerKeys {
    pub dir: TempDir,
    pub secret: Vec<u8>,
    pub kid: String,
}

impl ServerKeys {
    pub fn generate() -> Result<Self, TestkitError> {
        let dir = TempDir::new("sgkeys")?;
        let secret: [u8; 32] = rand::random();
        let rkey: [u8; 32] = rand::random();
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        fs::write(dir.path().join("secret"), format!("k1 {}\n", hex(&secret)))
            .map_err(io("writing secret"))?;
        fs::write(
            dir.path().join("reservation.key"),
            format!("{}\n", hex(&rkey)),
        )
        .map_err(io("writing reservation key"))?;
        Ok(ServerKeys {
            dir,
            secret: secret.to_vec(),
            kid: "k1".into(),
        })
    }

    pub fn secret_file(&self) -> PathBuf {
        self.dir.path().join("secret")
    }

    pub fn reservation_key_file(&self) -> PathBuf {
        self.dir.path().join("reservation.key")
    }

    /// An admission token valid for `ttl_ms`.
    pub fn admission(&self, sku: &str, user: &str, ttl_ms: i64) -> String {
        let exp = stockgate_client::types::now_ms().saturating_add(ttl_ms);
        mint_admission_token(
            &self.secret,
            &self.kid,
            sku,
            user,
            u64::try_from(exp).unwrap_or(0),
        )
    }
}

/// A running `stockgate` server. Killed on drop.
#[derive(Debug)]
pub struct ServerProcess {
    child: Option<Child>,
    addr: String,
    data_dir: PathBuf,
    args: Vec<String>,
    log: PathBuf,
}

impl ServerProcess {
    /// Start on a free port with `--data-dir data_dir` plus `extra` flags.
    pub fn start(data_dir: &Path, extra: &[String]) -> Result<Self, TestkitError> {
        let log = data_dir.with_extension("log");
        let mut s = ServerProcess {
            child: None,
            addr: String::new(),
            data_dir: data_dir.to_path_buf(),
            args: extra.to_vec(),
            log,
        };
        s.spawn("0")?;
        Ok(s)
    }

    /// Start with the keys kept outside the data dir and `--fsync no` (tests).
    pub fn start_with_keys(data_dir: &Path, keys: &ServerKeys) -> Result<Self, TestkitError> {
        Self::start(
            data_dir,
            &[
                "--secret-file".into(),
                keys.secret_file().display().to_string(),
                "--reservation-key-file".into(),
                keys.reservation_key_file().display().to_string(),
                "--fsync".into(),
                "no".into(),
            ],
        )
    }

    fn spawn(&mut self, port: &str) -> Result<(), TestkitError> {
        let bin = server_binary()?;
        let log = fs::File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(io(format!("opening {}", self.log.display())))?;
        let mut child = Command::new(&bin)
            .arg("--port")
            .arg(port)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(io(format!("spawning {}", bin.display())))?;
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill();
            return Err(TestkitError::NoAddress("no stdout".into()));
        };
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        let n = reader
            .read_line(&mut line)
            .map_err(io("reading the server's first line"))?;
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .map(str::to_string);
        let Some(addr) = addr.filter(|_| n > 0) else {
            let _ = child.kill();
            let _ = child.wait();
            let tail = fs::read_to_string(&self.log).unwrap_or_default();
            return Err(TestkitError::NoAddress(format!(
                "first line {line:?}; log: {tail}"
            )));
        };
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut sink = String::new();
            while reader.read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
                sink.clear();
            }
        });
        self.addr = addr;
        self.child = Some(child);
        Ok(())
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// SIGTERM and wait (graceful: flushes the WAL).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own unreaped child.
            unsafe {
                libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGKILL (a crash).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start again on the same port and data dir (after stop/kill).
    pub fn restart(&mut self) -> Result<(), TestkitError> {
        let port = self.addr.rsplit(':').next().unwrap_or("0").to_string();
        // The old port can linger briefly; fall back to a new one.
        for _ in 0..20 {
            if self.spawn(&port).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.spawn("0")
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Everything an end-to-end test needs: a throwaway Postgres with the ledger schema, a
/// real `stockgate` process (keys outside its data dir), a client, and a sale known to
/// both sides.
pub struct Harness {
    pub pg: crate::pgtemp::TempPostgres,
    pub ledger: stockgate_ledger::PgLedger,
    pub keys: ServerKeys,
    pub data: TempDir,
    pub server: ServerProcess,
    pub client: stockgate_client::StockgateClient,
}

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error(transparent)]
    Pg(#[from] crate::pgtemp::PgTempError),
    #[error(transparent)]
    Ledger(#[from] stockgate_ledger::LedgerError),
    #[error(transparent)]
    Testkit(#[from] TestkitError),
    #[error(transparent)]
    Client(#[from] stockgate_client::ClientError),
    #[error(transparent)]
    Identity(#[from] stockgate_ledger::identity::IdentityError),
}

impl Harness {
    pub async fn start() -> Result<Self, HarnessError> {
        Self::start_with(crate::pgtemp::PgOptions::default()).await
    }

    /// With explicit Postgres options (benchmarks keep fsync on).
    pub async fn start_with(opts: crate::pgtemp::PgOptions) -> Result<Self, HarnessError> {
        let pg = crate::pgtemp::TempPostgres::start_with(opts).await?;
        let ledger = stockgate_ledger::PgLedger::connect_with(
            pg.url(),
            stockgate_ledger::ledger::postgres::PgLedgerOptions {
                max_connections: 32,
                acquire_timeout: Duration::from_secs(3),
                ..Default::default()
            },
        )
        .await?;
        ledger.migrate().await?;
        let keys = ServerKeys::generate()?;
        let data = TempDir::new("sgdata")?;
        let server = ServerProcess::start_with_keys(&data.path().join("d"), &keys)?;
        let client = stockgate_client::StockgateClient::connect(server.addr()).await?;
        Ok(Harness {
            pg,
            ledger,
            keys,
            data,
            server,
            client,
        })
    }

    /// Create a one-shard sale on the server and record it in the ledger. One shard, so
    /// a test that reserves exactly `total` units is not refused by bounded stealing.
    pub async fn create_sale(
        &self,
        sku: &str,
        total: u64,
        ttl_ms: u64,
        limit: Option<u32>,
    ) -> Result<(), HarnessError> {
        self.create_sale_sharded(sku, total, 1, ttl_ms, limit).await
    }

    /// Create a sale with `shards` shards on the server and record it in the ledger.
    pub async fn create_sale_sharded(
        &self,
        sku: &str,
        total: u64,
        shards: u16,
        ttl_ms: u64,
        limit: Option<u32>,
    ) -> Result<(), HarnessError> {
        use stockgate_ledger::Ledger as _;
        // As `stockgate-sweeper create-sale` does: the ledger is bound to this server.
        let history =
            stockgate_ledger::identity::ensure_bound(&self.ledger, self.client.history().await?)
                .await?;
        self.client
            .sale_create(sku, total, Some(shards), Some(ttl_ms), limit)
            .await?;
        let info = self.client.sale_info(sku).await?;
        let mut rec = stockgate_ledger::ledger::SaleRecord::new(sku, total);
        rec.shards = Some(shards);
        rec.ttl_ms = Some(ttl_ms);
        rec.per_user_limit = limit;
        rec.key_fingerprint = Some(info.key_fingerprint);
        self.ledger.register_sale(&rec).await?;
        self.ledger.record_sale_history(sku, &history).await?;
        Ok(())
    }

    /// `n` reservations of one unit by users `<prefix>-<i>`; materialized in the ledger
    /// when `materialize`. Returns the holds (token, user, request id, expiry).
    pub async fn reserve_many(
        &self,
        sku: &str,
        prefix: &str,
        n: usize,
        materialize: bool,
    ) -> Result<Vec<stockgate_ledger::Hold>, HarnessError> {
        let checkout = stockgate_ledger::Checkout::new(self.ledger.clone(), self.client.clone());
        let mut out = Vec::with_capacity(n);
        let idx: Vec<usize> = (0..n).collect();
        for chunk in idx.chunks(100) {
            let futs = chunk.iter().map(|i| {
                let user = format!("{prefix}-{i}");
                let adm = self.keys.admission(sku, &user, 600_000);
                let checkout = checkout.clone();
                let client = self.client.clone();
                async move {
                    let rid = format!("r-{user}");
                    // Bounded stealing may answer SOLDOUT while other shards still have
                    // units: retry (new random probes) as long as the sale has stock.
                    for _ in 0..20 {
                        if materialize {
                            match checkout.start(sku, &user, &adm, &rid, 1).await {
                                Ok(h) => return Ok(h),
                                Err(stockgate_ledger::CheckoutError::SoldOut)
                                    if client.stock(sku).await? > 0 =>
                                {
                                    continue
                                }
                                Err(e) => {
                                    return Err(stockgate_client::ClientError::Protocol {
                                        command: "checkout",
                                        reply: e.to_string(),
                                    })
                                }
                            }
                        }
                        match client.reserve(sku, &user, &adm, &rid, 1).await? {
                            stockgate_client::types::ReserveOutcome::Reserved {
                                token,
                                expires_at_ms,
                                ..
                            } => {
                                return Ok(stockgate_ledger::Hold {
                                    token,
                                    sku: sku.to_string(),
                                    user: user.clone(),
                                    request_id: rid,
                                    qty: 1,
                                    expires_at_ms,
                                    replay: false,
                                    already_committed: false,
                                })
                            }
                            stockgate_client::types::ReserveOutcome::SoldOut
                                if client.stock(sku).await? > 0 =>
                            {
                                continue
                            }
                            other => {
                                return Err(stockgate_client::ClientError::Protocol {
                                    command: "RESERVE",
                                    reply: format!("{other:?}"),
                                })
                            }
                        }
                    }
                    Err(stockgate_client::ClientError::Protocol {
                        command: "RESERVE",
                        reply: "still sold out after retries".into(),
                    })
                }
            });
            for r in futures::future::join_all(futs).await {
                out.push(r?);
            }
        }
        Ok(out)
    }
}
