//! What an operator meets first, over the real binary: a second server on a data dir in
//! use names the process holding it (and offers no `--repair`), a three-member group
//! started as the README starts it logs a screenful and no ERROR, and a syntax error
//! gives the command's usage.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::ha::free_port;
use crate::common::*;

#[test]
fn a_second_server_on_a_data_dir_in_use_names_the_holder() {
    let first = Server::start(&[]);
    let pid = first.child.as_ref().expect("running").id();
    let refused = match try_start_in(&first.data_dir, &[]) {
        Ok(_) => panic!("a second server started on a data dir in use"),
        Err(f) => f,
    };
    assert!(
        matches!(refused.code, Some(c) if c != 0),
        "{:?}",
        refused.code
    );
    let err = refused.stderr;
    assert!(err.contains("is locked by another process"), "{err}");
    assert!(
        err.contains(&format!("pid {pid}")),
        "names the holder: {err}"
    );
    assert!(err.contains("stop that process"), "{err}");
    assert!(!err.contains("--repair"), "a lock is no damage: {err}");
}

/// A member of the README's group: `stockgate --port P --data-dir nI ... 2> nI.log`,
/// with no log filter of its own (the default is what a user gets).
fn member(dir: &Path, i: usize, port: u16, raft_port: u16, peers: &str) -> Child {
    let log = std::fs::File::create(dir.join(format!("n{i}.log"))).expect("log file");
    // The README's first member forms the group.
    let bootstrap: &[&str] = if i == 1 { &["--raft-bootstrap"] } else { &[] };
    Command::new(server_bin())
        .current_dir(dir)
        .args(["--port", &port.to_string(), "--data-dir", &format!("n{i}")])
        .args(["--secret-file", "secret", "--reservation-key-file"])
        .args(["reservation.key", "--create-keys", "--fsync", "always"])
        .args(["--raft-id", &i.to_string()])
        .args(["--raft-listen", &format!("127.0.0.1:{raft_port}")])
        .args(["--raft-peers", peers])
        .args(bootstrap)
        .env_remove("STOCKGATE_LOG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn member")
}

fn answers_ping(port: u16) -> bool {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
        .is_ok()
}

fn leader_known(port: u16) -> bool {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
        .and_then(|mut c| {
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg("stockgate")
                .query::<Vec<String>>(&mut c)
        })
        .is_ok_and(|v| v.len() == 2)
}

/// Members started one after another: the first ones cannot reach the later ones for a
/// while. That is a state, logged once per peer, not an error per heartbeat. Bound: a
/// member logs its start (about 5 lines), one line per peer state change (a few per
/// peer) and per leadership change; 60 leaves room for an election or two more, while
/// openraft's per-call errors alone were hundreds a second.
#[test]
fn a_three_member_start_logs_a_screenful_and_no_error() {
    let dir = TempDir::new("group-logs");
    let secret: String = (0..32)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect();
    std::fs::write(dir.path().join("secret"), format!("k1 {secret}\n")).expect("secret");
    let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
    let peers = ports
        .iter()
        .enumerate()
        .map(|(i, (p, r))| format!("{}=127.0.0.1:{p}/127.0.0.1:{r}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let mut members = Vec::new();
    for (i, &(port, raft_port)) in ports.iter().enumerate() {
        members.push(member(dir.path(), i + 1, port, raft_port, &peers));
        let t = Instant::now();
        while !answers_ping(port) {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "member {} never answered",
                i + 1
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let t = Instant::now();
    while !leader_known(ports[0].0) {
        assert!(t.elapsed() < Duration::from_secs(30), "no leader elected");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(5));
    for m in &mut members {
        unsafe {
            libc::kill(m.id() as i32, libc::SIGTERM);
        }
        let _ = m.wait();
    }
    for i in 1..=3 {
        let log = std::fs::read_to_string(dir.path().join(format!("n{i}.log"))).expect("log");
        let lines = log.lines().count();
        let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
        assert!(
            errors.is_empty(),
            "member {i} logged errors:\n{}",
            errors.join("\n")
        );
        assert!(lines < 60, "member {i} logged {lines} lines:\n{log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_syntax_error_gives_the_usage() {
    let srv = Server::start(&[]);
    let mut c = srv.conn().await;
    let text = |r: redis::RedisResult<redis::Value>| match r {
        Err(e) => e.to_string(),
        Ok(v) => panic!("accepted: {v:?}"),
    };
    let e = text(cmd(&mut c, &["EXPIRED", "shoe"]).await);
    assert!(
        e.contains("syntax error: EXPIRED [COUNT n] [SKU sku]"),
        "{e}"
    );
    let e = text(cmd(&mut c, &["SALE.CREATE", "shoe", "10", "FAST"]).await);
    assert!(e.contains("syntax error: SALE.CREATE <sku> <total>"), "{e}");
    let e = text(
        cmd(
            &mut c,
            &["XRANGE", "stockgate:events", "-", "+", "LIMIT", "1"],
        )
        .await,
    );
    assert!(
        e.contains("syntax error: XRANGE <key> <start> <end>"),
        "{e}"
    );
    // redis-cli shows it as a user reads it.
    if have("redis-cli") {
        let out = Command::new("redis-cli")
            .args(["-p", &srv.port.to_string(), "EXPIRED", "SKU-shoe"])
            .output()
            .expect("redis-cli");
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(
            shown.contains("ERR syntax error: EXPIRED [COUNT n] [SKU sku]"),
            "{shown}"
        );
    }
}
