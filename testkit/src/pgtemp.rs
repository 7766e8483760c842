//! A throwaway PostgreSQL for tests and benchmarks.
//!
//! Two modes:
//! - `STOCKGATE_TEST_DATABASE_URL` set (CI with a service container): every
//!   [`TempPostgres`] creates its own fresh database on that server, so tests running in
//!   parallel never see each other's rows, and drops it again on `Drop`.
//! - otherwise: `initdb` a cluster in a temp dir with the PostgreSQL 15 binaries, start
//!   `postgres` on a free port, and stop it (SIGINT = fast shutdown) and delete the dir
//!   on `Drop`. Postgres refuses to run as root, so when we are root the dir is chowned
//!   to the `postgres` user and the binaries run under its uid/gid.
//!
//! Tests default to `fsync=off` (speed, the data is thrown away); benchmarks that compare
//! against a durable SQL row must keep the default durability ([`PgOptions::durable`]).

// Signals to the Postgres it started and the effective uid (libc kill, geteuid).
#![allow(unsafe_code)]

use std::fs::{self, File};
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnection;
use sqlx::Connection;

/// Environment variable naming an existing server to create per-test databases on.
pub const DATABASE_URL_ENV: &str = "STOCKGATE_TEST_DATABASE_URL";
/// Environment variable overriding where the PostgreSQL binaries live.
pub const PG_BIN_ENV: &str = "STOCKGATE_PG_BIN";
const DEFAULT_PG_BIN: &str = "/usr/lib/postgresql/15/bin";

static COUNTER: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, thiserror::Error)]
pub enum PgTempError {
    #[error("io error while {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} failed ({status}): {output}")]
    Command {
        program: String,
        status: String,
        output: String,
    },
    #[error("user `postgres` not found in /etc/passwd (needed to run postgres as root)")]
    NoPostgresUser,
    #[error("postgres did not become ready within {0:?}; log tail: {1}")]
    NotReady(Duration, String),
    #[error("postgres exited during start-up ({0}); log tail: {1}")]
    Exited(String, String),
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> PgTempError {
    let what = what.into();
    move |source| PgTempError::Io { what, source }
}

/// How to run a throwaway cluster.
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// Keep PostgreSQL's default durability (fsync, synchronous_commit, full_page_writes
    /// on). Off by default: tests throw the data away and want speed.
    pub durable: bool,
    /// Extra `-c name=value` settings.
    pub settings: Vec<(String, String)>,
    /// How long to wait for the server to accept connections.
    pub start_timeout: Duration,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            durable: false,
            // Racing sweepers, checkout pools and the test's own pool add up.
            settings: vec![("max_connections".into(), "300".into())],
            start_timeout: Duration::from_secs(30),
        }
    }
}

impl PgOptions {
    pub fn durable() -> Self {
        PgOptions {
            durable: true,
            ..Default::default()
        }
    }
}

enum Backing {
    /// A cluster we started: we own the process and the directory.
    Owned {
        child: Option<Child>,
        dir: PathBuf,
        port: u16,
    },
    /// A database we created on an external server.
    External { admin_url: String, dbname: String },
}

/// A running throwaway PostgreSQL database. Stopped and removed on drop.
pub struct TempPostgres {
    url: String,
    backing: Backing,
}

impl std::fmt::Debug for TempPostgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TempPostgres")
            .field("url", &self.url)
            .finish()
    }
}

impl TempPostgres {
    /// Start with test defaults (fsync off).
    pub async fn start() -> Result<Self, PgTempError> {
        Self::start_with(PgOptions::default()).await
    }

    /// Start with explicit options. Honors `STOCKGATE_TEST_DATABASE_URL`.
    pub async fn start_with(opts: PgOptions) -> Result<Self, PgTempError> {
        match std::env::var(DATABASE_URL_ENV) {
            Ok(url) if !url.trim().is_empty() => Self::external(url.trim().to_string()).await,
            _ => Self::owned(opts).await,
        }
    }

    /// Connection URL (`postgres://postgres@127.0.0.1:<port>/postgres` for an owned cluster).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Port of an owned cluster (None when using an external server).
    pub fn port(&self) -> Option<u16> {
        match &self.backing {
            Backing::Owned { port, .. } => Some(*port),
            Backing::External { .. } => None,
        }
    }

    /// Whether the server process we own is running (always true for external servers).
    pub fn is_running(&mut self) -> bool {
        match &mut self.backing {
            Backing::Owned { child, .. } => match child {
                Some(c) => matches!(c.try_wait(), Ok(None)),
                None => false,
            },
            Backing::External { .. } => true,
        }
    }

    /// Stop an owned server (fast shutdown), keeping its data dir so [`Self::restart`]
    /// can bring the same data back. Used by fault tests ("Postgres stopped mid-pass").
    pub fn stop(&mut self) -> Result<(), PgTempError> {
        if let Backing::Owned { child, .. } = &mut self.backing {
            if let Some(mut c) = child.take() {
                stop_child(&mut c);
            }
        }
        Ok(())
    }

    /// Start an owned server again on the same port and data dir after [`Self::stop`].
    pub async fn restart(&mut self, opts: PgOptions) -> Result<(), PgTempError> {
        if let Backing::Owned { child, dir, port } = &mut self.backing {
            if child.is_none() {
                let owner = if is_root() {
                    Some(postgres_ids()?)
                } else {
                    None
                };
                let c = spawn_postgres(dir, *port, owner, &opts)?;
                *child = Some(c);
                let url = self.url.clone();
                wait_ready(&url, child, dir, opts.start_timeout).await?;
            }
        }
        Ok(())
    }

    async fn external(url: String) -> Result<Self, PgTempError> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nonce: u32 = rand::random();
        let dbname = format!("stockgate_t_{}_{}_{:08x}", std::process::id(), n, nonce);
        let mut conn = PgConnection::connect(&url).await?;
        // The name is ours (digits, letters, underscores): safe to splice in.
        sqlx::query(&format!("CREATE DATABASE {dbname}"))
            .execute(&mut conn)
            .await?;
        let _ = conn.close().await;
        let db_url = replace_database(&url, &dbname);
        Ok(TempPostgres {
            url: db_url,
            backing: Backing::External {
                admin_url: url,
                dbname,
            },
        })
    }

    async fn owned(opts: PgOptions) -> Result<Self, PgTempError> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nonce: u32 = rand::random();
        // Short path: the unix socket lives in here and sun_path is limited to ~107 bytes.
        let dir = std::env::temp_dir().join(format!(
            "sgpg-{}-{}-{:06x}",
            std::process::id(),
            n,
            nonce & 0xff_ffff
        ));
        fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        // From here on a failure must clean the dir up: build the value first so Drop does it.
        let mut pg = TempPostgres {
            url: String::new(),
            backing: Backing::Owned {
                child: None,
                dir: dir.clone(),
                port: 0,
            },
        };
        let owner = if is_root() {
            let ids = postgres_ids()?;
            std::os::unix::fs::chown(&dir, Some(ids.0), Some(ids.1))
                .map_err(io(format!("chown {}", dir.display())))?;
            Some(ids)
        } else {
            None
        };
        run_initdb(&dir, owner)?;

        // A free port can be taken by someone else between our probe and postgres's bind:
        // retry a few times with a new port.
        let mut last_err = None;
        for _ in 0..5 {
            let port = free_port()?;
            let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
            let mut child = Some(spawn_postgres(&dir, port, owner, &opts)?);
            match wait_ready(&url, &mut child, &dir, opts.start_timeout).await {
                Ok(()) => {
                    pg.url = url;
                    pg.backing = Backing::Owned {
                        child,
                        dir: dir.clone(),
                        port,
                    };
                    return Ok(pg);
                }
                Err(e) => {
                    if let Some(mut c) = child.take() {
                        stop_child(&mut c);
                    }
                    last_err = Some(e);
                }
            }
        }
        Err(last_err
            .unwrap_or_else(|| PgTempError::NotReady(opts.start_timeout, "no attempt made".into())))
    }
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        match &mut self.backing {
            Backing::Owned { child, dir, .. } => {
                if let Some(mut c) = child.take() {
                    stop_child(&mut c);
                }
                let _ = fs::remove_dir_all(&*dir);
            }
            Backing::External { admin_url, dbname } => {
                // Drop may run inside a tokio runtime, where blocking on a future is not
                // allowed: do the cleanup on a separate thread with its own runtime.
                let admin_url = admin_url.clone();
                let dbname = dbname.clone();
                let h = std::thread::spawn(move || {
                    let rt = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(_) => return,
                    };
                    rt.block_on(async move {
                        if let Ok(mut conn) = PgConnection::connect(&admin_url).await {
                            let _ = sqlx::query(&format!(
                                "DROP DATABASE IF EXISTS {dbname} WITH (FORCE)"
                            ))
                            .execute(&mut conn)
                            .await;
                            let _ = conn.close().await;
                        }
                    });
                });
                let _ = h.join();
            }
        }
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// uid and gid of the `postgres` user, from /etc/passwd.
fn postgres_ids() -> Result<(u32, u32), PgTempError> {
    let passwd = fs::read_to_string("/etc/passwd").map_err(io("reading /etc/passwd"))?;
    parse_passwd_ids(&passwd, "postgres").ok_or(PgTempError::NoPostgresUser)
}

fn parse_passwd_ids(passwd: &str, user: &str) -> Option<(u32, u32)> {
    passwd.lines().find_map(|line| {
        let mut f = line.split(':');
        if f.next()? != user {
            return None;
        }
        let _pw = f.next()?;
        let uid = f.next()?.parse().ok()?;
        let gid = f.next()?.parse().ok()?;
        Some((uid, gid))
    })
}

fn pg_bin(name: &str) -> PathBuf {
    let base = std::env::var(PG_BIN_ENV).unwrap_or_else(|_| DEFAULT_PG_BIN.to_string());
    Path::new(&base).join(name)
}

fn as_owner(cmd: &mut Command, dir: &Path, owner: Option<(u32, u32)>) {
    cmd.current_dir(dir).env("HOME", dir);
    if let Some((uid, gid)) = owner {
        cmd.uid(uid).gid(gid);
    }
}

fn run_initdb(dir: &Path, owner: Option<(u32, u32)>) -> Result<(), PgTempError> {
    let prog = pg_bin("initdb");
    let mut cmd = Command::new(&prog);
    cmd.arg("-D")
        .arg(dir.join("data"))
        .args([
            "-N",
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
        ])
        .stdin(Stdio::null());
    as_owner(&mut cmd, dir, owner);
    let out = cmd
        .output()
        .map_err(io(format!("running {}", prog.display())))?;
    if !out.status.success() {
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        return Err(PgTempError::Command {
            program: prog.display().to_string(),
            status: out.status.to_string(),
            output: text,
        });
    }
    Ok(())
}

fn spawn_postgres(
    dir: &Path,
    port: u16,
    owner: Option<(u32, u32)>,
    opts: &PgOptions,
) -> Result<Child, PgTempError> {
    let prog = pg_bin("postgres");
    let log_path = dir.join("postgres.log");
    let log = File::options()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(io(format!("opening {}", log_path.display())))?;
    let log2 = log.try_clone().map_err(io("cloning log handle"))?;
    let mut cmd = Command::new(&prog);
    cmd.arg("-D")
        .arg(dir.join("data"))
        .arg("-p")
        .arg(port.to_string())
        .args(["-c", "listen_addresses=127.0.0.1"])
        .arg("-c")
        .arg(format!("unix_socket_directories={}", dir.display()));
    if !opts.durable {
        cmd.args([
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
        ]);
    }
    for (k, v) in &opts.settings {
        cmd.arg("-c").arg(format!("{k}={v}"));
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log2));
    as_owner(&mut cmd, dir, owner);
    cmd.spawn()
        .map_err(io(format!("spawning {}", prog.display())))
}

async fn wait_ready(
    url: &str,
    child: &mut Option<Child>,
    dir: &Path,
    timeout: Duration,
) -> Result<(), PgTempError> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(c) = child.as_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                return Err(PgTempError::Exited(status.to_string(), log_tail(dir)));
            }
        }
        // Postgres accepts TCP before it is ready ("the database system is starting up"):
        // only a full connection proves readiness.
        if let Ok(conn) = PgConnection::connect(url).await {
            let _ = conn.close().await;
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(PgTempError::NotReady(timeout, log_tail(dir)));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn log_tail(dir: &Path) -> String {
    let mut s = String::new();
    if let Ok(mut f) = File::open(dir.join("postgres.log")) {
        let _ = f.read_to_string(&mut s);
    }
    let start = s.len().saturating_sub(2000);
    // Stay on a char boundary.
    let start = (start..s.len())
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(s.len());
    s[start..].to_string()
}

fn stop_child(c: &mut Child) {
    if let Ok(None) = c.try_wait() {
        // SIGINT = "fast shutdown": postgres disconnects clients, checkpoints and exits.
        // SAFETY: plain kill(2) on a pid we spawned and have not reaped yet.
        unsafe {
            libc::kill(c.id() as libc::pid_t, libc::SIGINT);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match c.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if Instant::now() >= deadline => {
                    let _ = c.kill();
                    let _ = c.wait();
                    return;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    } else {
        let _ = c.wait();
    }
}

fn free_port() -> Result<u16, PgTempError> {
    crate::ports::reserve().map_err(io("finding a free port"))
}

/// Swap the database name in a `postgres://` URL, keeping query parameters.
fn replace_database(url: &str, dbname: &str) -> String {
    let (base, query) = match url.find('?') {
        Some(i) => (&url[..i], &url[i..]),
        None => (url, ""),
    };
    // The path starts at the first '/' after "scheme://authority".
    let after_scheme = base.find("://").map(|i| i + 3).unwrap_or(0);
    let host_part_end = base[after_scheme..]
        .find('/')
        .map(|i| after_scheme + i)
        .unwrap_or(base.len());
    format!("{}/{}{}", &base[..host_part_end], dbname, query)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwd_parse() {
        let p = "root:x:0:0:root:/root:/bin/bash\npostgres:x:101:104:PG,,,:/var/lib/postgresql:/bin/bash\n";
        assert_eq!(parse_passwd_ids(p, "postgres"), Some((101, 104)));
        assert_eq!(parse_passwd_ids(p, "nobody"), None);
    }

    #[test]
    fn url_database_swap() {
        assert_eq!(
            replace_database("postgres://u:p@h:5432/db?sslmode=disable", "x"),
            "postgres://u:p@h:5432/x?sslmode=disable"
        );
        assert_eq!(replace_database("postgres://h", "x"), "postgres://h/x");
        assert_eq!(replace_database("postgres://h:1/", "x"), "postgres://h:1/x");
    }
}
