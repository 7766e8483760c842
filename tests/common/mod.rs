//! Shared helpers for end-to-end tests: start the real `stockgate` binary on a free port
//! with its own data dir, mint admission tokens, kill it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use stockgate_server::engine::Keyring;

pub mod cluster;
pub mod ha;
pub mod nemesis;
pub mod node;
pub mod raft;
pub mod tls;

/// The server binary next to this test's executable (`target/<profile>/stockgate`).
/// Build it first: `cargo build --workspace --bins` (the README's test command does).
pub fn server_bin() -> PathBuf {
    if let Ok(p) = std::env::var("STOCKGATE_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test exe path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    let bin = profile_dir.join("stockgate");
    assert!(
        bin.exists(),
        "{} missing: run `cargo build --workspace --bins` before the tests",
        bin.display()
    );
    bin
}

/// The load generator next to this test's executable (`target/<profile>/stockgate-bench`):
/// a binary of its own package (benches/loadgen), so cargo does not build it for this
/// one's tests. Build it first: `cargo build --workspace --bins`.
pub fn bench_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    let bin = profile_dir.join("stockgate-bench");
    assert!(
        bin.exists(),
        "{} missing: run `cargo build --workspace --bins` before the tests",
        bin.display()
    );
    bin
}

/// A temp directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "stockgate-{tag}-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn raise_nofile() {
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max.min(65536);
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

pub struct Server {
    pub child: Option<Child>,
    pub addr: String,
    pub port: u16,
    pub data_dir: PathBuf,
    pub args: Vec<String>,
    _own_dir: Option<TempDir>,
}

impl Server {
    /// Starts a server with a fresh data dir and extra flags.
    pub fn start(extra: &[&str]) -> Server {
        let dir = TempDir::new("srv");
        let data = dir.path().to_path_buf();
        let mut s = Server::start_in(&data, extra);
        s._own_dir = Some(dir);
        s
    }

    /// Starts a server on an existing data dir (restart after a kill).
    pub fn start_in(data_dir: &Path, extra: &[&str]) -> Server {
        Server::start_in_env(data_dir, extra, &[])
    }

    /// Like [`Server::start_in`], with extra environment variables (fault injection).
    pub fn start_in_env(data_dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        raise_nofile();
        let mut cmd = Command::new(server_bin());
        cmd.arg("--port")
            .arg("0")
            .arg("--data-dir")
            .arg(data_dir)
            .args(extra)
            .envs(env.iter().copied())
            .env("STOCKGATE_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().expect("spawn stockgate");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read first line");
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        let port = addr
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("port");
        Server {
            child: Some(child),
            addr,
            port,
            data_dir: data_dir.to_path_buf(),
            args: extra.iter().map(|s| s.to_string()).collect(),
            _own_dir: None,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("client")
    }

    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_tokio_connection()
            .await
            .expect("connect")
    }

    pub fn keyring(&self) -> Keyring {
        let text = std::fs::read_to_string(self.data_dir.join("secret")).expect("secret");
        Keyring::parse(&text).expect("keyring")
    }

    /// SIGKILL: the process gets no chance to flush anything.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for a clean exit; returns the exit status code.
    pub fn terminate(&mut self) -> Option<i32> {
        let mut c = self.child.take()?;
        unsafe {
            libc::kill(c.id() as i32, libc::SIGTERM);
        }
        for _ in 0..200 {
            if let Ok(Some(st)) = c.try_wait() {
                return st.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
        None
    }

    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Sends a raw command with the redis crate and returns the value.
pub async fn cmd(
    c: &mut redis::aio::MultiplexedConnection,
    args: &[&str],
) -> redis::RedisResult<redis::Value> {
    let mut k = redis::cmd(args[0]);
    for a in &args[1..] {
        k.arg(*a);
    }
    k.query_async(c).await
}

/// The field of a RESP2 flat map reply (SALE.INFO, RESERVATION).
pub fn field(v: &redis::Value, name: &str) -> Option<redis::Value> {
    let items = match v {
        redis::Value::Array(items) => items.clone(),
        redis::Value::Map(pairs) => pairs
            .iter()
            .flat_map(|(k, v)| [k.clone(), v.clone()])
            .collect(),
        _ => return None,
    };
    items.chunks(2).find_map(|p| match &p[0] {
        redis::Value::BulkString(b) if b == name.as_bytes() => Some(p[1].clone()),
        redis::Value::SimpleString(s) if s == name => Some(p[1].clone()),
        _ => None,
    })
}

pub fn as_int(v: &redis::Value) -> i64 {
    match v {
        redis::Value::Int(i) => *i,
        other => panic!("not an integer: {other:?}"),
    }
}

pub fn as_str(v: &redis::Value) -> String {
    match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        other => panic!("not a string: {other:?}"),
    }
}

/// The reservation key the server created in `data_dir` (to derive tokens the way it does).
pub fn reservation_key(data_dir: &Path) -> stockgate_server::engine::ReservationKey {
    let bytes = std::fs::read(data_dir.join("reservation.key")).expect("reservation.key");
    stockgate_server::engine::ReservationKey::from_file_bytes(&bytes).expect("reservation key")
}

/// Copies a directory tree (data dirs are small and flat: `wal/`, `secret`, the key).
pub fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).expect("create copy dir");
    for e in std::fs::read_dir(src).expect("read dir") {
        let e = e.expect("dir entry");
        let to = dst.join(e.file_name());
        if e.file_type().expect("file type").is_dir() {
            copy_dir(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), &to).expect("copy file");
        }
    }
}

/// Outcome of [`try_start_in`] when the server did not come up.
#[derive(Debug)]
pub struct StartFailure {
    /// Exit code (None: killed by a signal).
    pub code: Option<i32>,
    pub stderr: String,
}

/// Like [`Server::start_in`] but for starts that may be refused (corrupt WAL): stderr is
/// captured; returns the running server once it prints `listening on`, or its exit code
/// and stderr if it exits first. A start that neither listens nor exits within 60 s fails.
pub fn try_start_in(data_dir: &Path, extra: &[&str]) -> Result<Server, StartFailure> {
    use std::io::Read;
    raise_nofile();
    let mut child = Command::new(server_bin())
        .arg("--port")
        .arg("0")
        .arg("--data-dir")
        .arg(data_dir)
        .args(extra)
        .env("STOCKGATE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn stockgate");
    // Drain stderr on a thread so a chatty server never blocks on a full pipe.
    let stderr_buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut err_pipe = child.stderr.take().expect("stderr");
    let sink = stderr_buf.clone();
    let drain = std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = err_pipe.read(&mut chunk) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&chunk[..n]);
        }
    });
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(l) => l,
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("stockgate neither listened nor exited within 60 s");
        }
    };
    if let Some(addr) = line.trim().strip_prefix("listening on ") {
        let port = addr
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("port");
        return Ok(Server {
            child: Some(child),
            addr: addr.to_string(),
            port,
            data_dir: data_dir.to_path_buf(),
            args: extra.iter().map(|s| s.to_string()).collect(),
            _own_dir: None,
        });
    }
    let status = child.wait().expect("wait stockgate");
    let _ = drain.join();
    let stderr = String::from_utf8_lossy(&stderr_buf.lock().unwrap()).into_owned();
    Err(StartFailure {
        code: status.code(),
        stderr,
    })
}

/// The WAL segment files of a data dir (`wal/wal-<lsn>.log`), oldest first.
pub fn wal_segments(data_dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(data_dir.join("wal"))
        .expect("wal dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with("wal-") && n.ends_with(".log")
        })
        .collect();
    v.sort();
    v
}

/// Byte ranges `[start, end)` of the whole records in a segment, read from the framing
/// alone (16-byte segment header, then `len u32 LE | crc u32 | payload[len]` per record).
pub fn record_spans(segment: &[u8]) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut off = 16;
    while off + 8 <= segment.len() {
        let len = u32::from_le_bytes(segment[off..off + 4].try_into().unwrap()) as usize;
        let end = off + 8 + len;
        if len == 0 || end > segment.len() {
            break;
        }
        spans.push((off, end));
        off = end;
    }
    spans
}

/// Whether `needle` occurs in `hay` (tokens are stored verbatim in record payloads).
pub fn contains_bytes(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A two-worker tokio runtime for a synchronous test that drives async clients.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Whether a command is on the PATH (tests that need a Debian package say which when not).
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}
