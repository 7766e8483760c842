//! ioredis and node-redis (`tests/node/multi.js`) drive `multi()` against the real server,
//! unmodified and in their default modes (node-redis also in RESP3), on the newest majors
//! (`tests/node`) and on the oldest ones the project supports (`tests/node-oldest`); each
//! install is pinned by its `package-lock.json` (tests/common/node.rs).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::node::Clients;
use crate::common::*;

/// Runs a command with a deadline, so a hung script fails the test. Output is
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

#[test]
fn ioredis_and_node_redis_multi() {
    multi_on(Clients::Newest);
}

#[test]
fn ioredis_and_node_redis_multi_on_the_oldest_majors() {
    multi_on(Clients::Oldest);
}

fn multi_on(clients: Clients) {
    let _shared = crate::shared();
    let mut cmd = clients.script("multi.js");
    let srv = Server::start(&[]);
    let (ok, out, err) = run_bounded(
        cmd.arg(srv.port.to_string()).arg(&srv.data_dir),
        Duration::from_secs(60),
    );
    assert!(
        ok && out.contains("node clients ok"),
        "node clients ({}) failed:\n{out}\n{err}",
        clients.versions()
    );
}
