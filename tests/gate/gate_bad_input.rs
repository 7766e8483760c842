//! Hostile bytes never crash the server or disturb other clients: garbage, a 2 GB bulk
//! length, a 100,000-element array, a half frame then a disconnect.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::common::*;

fn raw(addr: &str, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    s.write_all(bytes).unwrap();
    let mut out = Vec::new();
    // The server answers and closes: read to EOF.
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn ping(addr: &str) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"+PONG\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bytes() {
    let srv = Server::start(&[]);
    let addr = srv.addr.clone();
    // A well-behaved client stays connected through all of it.
    let mut good = srv.conn().await;
    cmd(&mut good, &["SALE.CREATE", "S", "10"]).await.unwrap();

    let r = raw(&addr, b"*2\r\n$3\r\nfoo\r\n:12\r\n");
    assert!(r.starts_with("-ERR Protocol error"), "{r}");
    let r = raw(&addr, b"*1\r\n$2147483648\r\n");
    assert!(
        r.starts_with("-ERR Protocol error: invalid bulk length"),
        "{r}"
    );
    let r = raw(&addr, b"*100000\r\n");
    assert!(
        r.starts_with("-ERR Protocol error: invalid multibulk length"),
        "{r}"
    );
    let r = raw(&addr, b"*-5\r\n*3\r\n$1\r\n");
    assert!(r.is_empty() || r.starts_with("-ERR"), "{r}");
    let r = raw(&addr, &[0xff, 0xfe, 0x00, 0x13, b'\n']);
    assert!(r.contains("unknown command"), "{r}");
    let r = raw(&addr, b"*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nP");
    assert!(r.starts_with("+PONG"), "{r}");
    // A half frame, then the client vanishes.
    {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.write_all(b"*3\r\n$7\r\nRESERVE\r\n$1\r\nS\r\n$100\r\nabc")
            .unwrap();
    }
    // Random garbage of many shapes.
    for seed in 0..200u64 {
        let len = (seed * 7919 % 300) as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|i| {
                ((seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add((i as u64).wrapping_mul(1442695040888963407)))
                    >> 33) as u8
            })
            .collect();
        let mut s = TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let _ = s.write_all(&bytes);
        let mut sink = [0u8; 4096];
        let _ = s.read(&mut sink);
    }
    // Wrong arity and types: errors, nothing changes.
    let r = raw(
        &addr,
        b"*2\r\n$7\r\nRESERVE\r\n$1\r\nS\r\n*1\r\n$4\r\nQUIT\r\n",
    );
    assert!(r.contains("wrong number of arguments"), "{r}");
    let r = raw(&addr, b"SALE.ADJUST S notanumber\r\nQUIT\r\n");
    assert!(r.contains("not an integer"), "{r}");

    ping(&addr);
    assert_eq!(as_int(&cmd(&mut good, &["STOCK", "S"]).await.unwrap()), 10);
    let mut srv = srv;
    assert!(srv.is_running());
}

#[test]
fn sigterm_exits_cleanly() {
    let mut srv = Server::start(&[]);
    ping(&srv.addr.clone());
    assert_eq!(srv.terminate(), Some(0));
}

/// Redis-style replication is not spoken: each of its commands is refused in plain
/// words naming what replaces it, and `--replicaof` refuses to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_replication_is_refused_in_plain_words() {
    let srv = Server::start(&[]);
    let mut c = srv.conn().await;
    for args in [
        &["REPLICAOF", "127.0.0.1", "7000"][..],
        &["SLAVEOF", "NO", "ONE"],
        &["PSYNC", "?", "-1"],
        &["SYNC"],
        &["REPLCONF", "listening-port", "7000"],
    ] {
        let e = cmd(&mut c, args).await.expect_err("refused");
        let msg = e.to_string();
        assert!(
            msg.contains("is not supported") && msg.contains("Raft group"),
            "{args:?}: {msg}"
        );
    }
    let dir = TempDir::new("replicaof");
    let out = std::process::Command::new(server_bin())
        .args(["--port", "0", "--data-dir"])
        .arg(dir.path())
        .args(["--replicaof", "127.0.0.1:7000"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--replicaof and --min-replicas-ack were removed")
            && err.contains("--raft-id"),
        "{err}"
    );
}
