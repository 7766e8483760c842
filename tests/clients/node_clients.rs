//! ioredis and node-redis (`tests/node/`) drive `multi()` against the real server,
//! unmodified and in their default modes (node-redis also in RESP3). The npm packages are
//! pinned by `tests/node/package-lock.json`; `npm ci` installs them when
//! `tests/node/node_modules` is missing (scripts/test-all.sh does it first).

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// Runs a command with a deadline, so a hung install or script fails the test. Output is
/// drained on threads so a chatty child never blocks on a full pipe.
fn run_bounded(cmd: &mut Command, limit: Duration) -> (bool, String, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn (node and npm must be installed)");
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = r.read_to_end(&mut s);
            String::from_utf8_lossy(&s).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("stdout")));
    let err = drain(Box::new(child.stderr.take().expect("stderr")));
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break Some(st);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, err) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    match status {
        Some(st) => (st.success(), out, err),
        None => panic!("{cmd:?} still running after {limit:?}:\n{out}\n{err}"),
    }
}

fn node_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/node"))
}

fn ensure_packages() {
    let dir = node_dir();
    if dir.join("node_modules/ioredis").exists() && dir.join("node_modules/redis").exists() {
        return;
    }
    let (ok, _, err) = run_bounded(
        Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--prefix"])
            .arg(dir),
        Duration::from_secs(300),
    );
    assert!(ok, "npm ci --prefix tests/node failed:\n{err}");
}

#[test]
fn ioredis_and_node_redis_multi() {
    let _shared = crate::shared();
    ensure_packages();
    let srv = Server::start(&[]);
    let (ok, out, err) = run_bounded(
        Command::new("node")
            .arg(node_dir().join("multi.js"))
            .arg(srv.port.to_string())
            .arg(&srv.data_dir),
        Duration::from_secs(60),
    );
    assert!(
        ok && out.contains("node clients ok"),
        "node clients failed:\n{out}\n{err}"
    );
}
