//! A hostile-client suite over real TCP. After each attack: the server is alive, another
//! client is served promptly, and the sale's invariants hold.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::*;
use redis::Value;

async fn healthy(srv: &Server, good: &mut redis::aio::MultiplexedConnection) {
    let t = Instant::now();
    assert_eq!(
        cmd(good, &["PING"]).await.unwrap(),
        Value::SimpleString("PONG".into())
    );
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "served slowly: {:?}",
        t.elapsed()
    );
    let info = cmd(good, &["SALE.INFO", "S"]).await.unwrap();
    let g = |k| as_int(&field(&info, k).unwrap());
    assert_eq!(g("available") + g("reserved") + g("committed"), g("total"));
    let fresh = srv.conn().await;
    drop(fresh);
}

fn send(addr: &str, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let _ = s.write_all(bytes);
    s
}

fn read_all(mut s: TcpStream) -> String {
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients() {
    raise_nofile();
    let srv = Server::start(&[
        "--maxclients",
        "2100",
        "--max-query-buffer",
        "65536",
        "--max-output-buffer",
        "1048576",
        "--write-timeout-ms",
        "1000",
    ]);
    let addr = srv.addr.clone();
    let keys = srv.keyring();
    let mut good = srv.conn().await;
    cmd(&mut good, &["SALE.CREATE", "S", "100", "SHARDS", "4"])
        .await
        .unwrap();
    cmd(&mut good, &["SALE.CREATE", "OTHER", "100"])
        .await
        .unwrap();
    let t = keys.mint("S", "alice", now_ms() + 60_000);
    let r = cmd(&mut good, &["RESERVE", "S", "alice", &t, "r1"])
        .await
        .unwrap();
    let alice_token = match r {
        Value::Array(v) => as_str(&v[1]),
        o => panic!("{o:?}"),
    };

    // Valid frames with wrong types: integers and nested arrays where bulks belong.
    let r = read_all(send(&addr, b"*2\r\n:1\r\n:2\r\n"));
    assert!(r.starts_with("-ERR Protocol error"), "{r}");
    let nested = b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n$4\r\nPING\r\n".repeat(1000);
    let r = read_all(send(&addr, &nested));
    assert!(r.starts_with("-ERR Protocol error"), "{r}");
    // Negative and huge lengths.
    for frame in [
        &b"*1\r\n$-2\r\n"[..],
        b"*1\r\n$99999999999999999999\r\n",
        b"*-99\r\n*1\r\n$4\r\nPING\r\n",
    ] {
        let r = read_all(send(&addr, frame));
        assert!(
            r.starts_with("-ERR Protocol error") || r.starts_with("+PONG"),
            "{r}"
        );
    }
    healthy(&srv, &mut good).await;

    // 10,000 arguments: refused (limit 1024), connection closed.
    let mut big = b"*10000\r\n".to_vec();
    for _ in 0..10_000 {
        big.extend_from_slice(b"$1\r\nx\r\n");
    }
    let r = read_all(send(&addr, &big));
    assert!(r.contains("invalid multibulk length"), "{r}");
    healthy(&srv, &mut good).await;

    // Slowloris: a half frame that keeps growing past the query buffer cap.
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"*2\r\n$4\r\nECHO\r\n$1000000\r\n").unwrap();
    let chunk = vec![b'a'; 16 * 1024];
    let mut cut = false;
    for _ in 0..10 {
        if s.write_all(&chunk).is_err() {
            cut = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let r = read_all(s);
    assert!(cut || r.contains("query buffer limit"), "{r}");
    // A half frame left open does not block anyone.
    let _half = send(&addr, b"*3\r\n$7\r\nRESERVE\r\n$1\r\nS");
    healthy(&srv, &mut good).await;

    // 2,000 idle connections.
    let idle: Vec<TcpStream> = (0..2000)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    healthy(&srv, &mut good).await;
    // Past maxclients: refused with an error.
    let extra: Vec<TcpStream> = (0..200)
        .filter_map(|_| TcpStream::connect(&addr).ok())
        .collect();
    let mut refused = 0;
    for mut s in extra {
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut buf = [0u8; 64];
        if let Ok(n) = s.read(&mut buf) {
            if String::from_utf8_lossy(&buf[..n]).contains("max number of clients") {
                refused += 1;
            }
        }
    }
    assert!(refused > 0, "maxclients enforced");
    drop(idle);
    tokio::time::sleep(Duration::from_millis(300)).await;
    healthy(&srv, &mut good).await;

    // A client that pipelines without ever reading its replies is cut off.
    let mut hog = TcpStream::connect(&addr).unwrap();
    hog.set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let req = b"*3\r\n$7\r\nEXPIRED\r\n$5\r\nCOUNT\r\n$5\r\n10000\r\n*2\r\n$4\r\nECHO\r\n$4000\r\n";
    let mut payload = req.to_vec();
    payload.extend_from_slice(&vec![b'z'; 4000]);
    payload.extend_from_slice(b"\r\n");
    let started = Instant::now();
    let mut dropped = false;
    while started.elapsed() < Duration::from_secs(20) {
        if hog.write_all(&payload).is_err() {
            dropped = true;
            break;
        }
    }
    assert!(dropped, "a non-reading client must be disconnected");
    healthy(&srv, &mut good).await;

    // Forged, expired and misbound admission tokens.
    let forged = format!("{}x", &t[..t.len() - 1]);
    for (user, tok) in [
        ("alice", forged.as_str()),
        ("alice", "bm90LWEtdG9rZW4.c2ln"),
        ("alice", &keys.mint("S", "alice", now_ms() - 1)),
        ("bob", &t),
        ("alice", &keys.mint("OTHER", "alice", now_ms() + 60_000)),
    ] {
        let r = cmd(&mut good, &["RESERVE", "S", user, tok, "attack"]).await;
        assert!(
            matches!(&r, Err(e) if e.code() == Some("DENIED")),
            "{user} {tok}: {r:?}"
        );
    }
    // A reservation token of another SKU, or a made-up one, changes nothing.
    let foreign = alice_token.replacen("{S}", "{OTHER}", 1);
    assert_eq!(
        as_int(&cmd(&mut good, &["RELEASE", &foreign]).await.unwrap()),
        0
    );
    assert!(cmd(&mut good, &["COMMIT", &foreign]).await.is_err());
    assert_eq!(as_int(&cmd(&mut good, &["STOCK", "S"]).await.unwrap()), 99);
    assert_eq!(
        as_int(&cmd(&mut good, &["STOCK", "OTHER"]).await.unwrap()),
        100
    );
    healthy(&srv, &mut good).await;

    let info = as_str(&cmd(&mut good, &["INFO", "stats"]).await.unwrap());
    for k in [
        "rejected_connections:",
        "protocol_errors:",
        "query_buffer_limit_disconnects:",
        "output_buffer_limit_disconnects:",
    ] {
        let v: u64 = info
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        assert!(v > 0, "{k} counted: {info}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_timeout_disconnects() {
    let srv = Server::start(&["--idle-timeout-ms", "300"]);
    let mut s = TcpStream::connect(&srv.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 16];
    let n = s.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "closed by the server");
    assert!(t.elapsed() >= Duration::from_millis(250));
    let mut good = srv.conn().await;
    let info = as_str(&cmd(&mut good, &["INFO", "stats"]).await.unwrap());
    assert!(info.contains("idle_timeout_disconnects:1"), "{info}");
}

/// Sends `prefix`, reads its `answer`, then leaves an unfinished command one byte over
/// `limit` (all of it written before the server may close, so no reset can eat the
/// reply). Returns what the server sent afterwards and whether it closed the connection
/// (end of file, not the read timeout).
fn overflow_after(addr: &str, prefix: &[u8], answer: &[u8], limit: usize) -> (String, bool) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(prefix).unwrap();
    let mut got = vec![0u8; answer.len()];
    s.read_exact(&mut got).unwrap();
    assert_eq!(got, answer, "{}", String::from_utf8_lossy(&got));
    let mut half = b"*2\r\n$4\r\nECHO\r\n$1000000\r\n".to_vec();
    half.resize(limit + 1, b'a');
    for chunk in half.chunks(16 * 1024) {
        s.write_all(chunk).unwrap();
    }
    let mut out = Vec::new();
    let closed = s.read_to_end(&mut out).is_ok();
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

/// A connection in SUBSCRIBE or PSUBSCRIBE mode is held to `--max-query-buffer` and to
/// the framing rules as any other: the same error, then the connection closes, counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_are_held_to_the_query_buffer_limit() {
    const LIMIT: usize = 65536;
    const CONFIRM: &[u8] = b"*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n";
    let srv = Server::start(&["--max-query-buffer", &LIMIT.to_string()]);
    let refused = "-ERR Protocol error: query buffer limit exceeded\r\n";
    let normal = overflow_after(&srv.addr, b"PING\r\n", b"+PONG\r\n", LIMIT);
    assert_eq!(normal, (refused.to_string(), true));
    let sub = overflow_after(
        &srv.addr,
        b"*2\r\n$9\r\nSUBSCRIBE\r\n$2\r\nch\r\n",
        CONFIRM,
        LIMIT,
    );
    assert_eq!(sub, normal, "SUBSCRIBE mode");
    let psub = overflow_after(
        &srv.addr,
        b"*2\r\n$10\r\nPSUBSCRIBE\r\n$2\r\nc*\r\n",
        b"*3\r\n$10\r\npsubscribe\r\n$2\r\nc*\r\n:1\r\n",
        LIMIT,
    );
    assert_eq!(psub, normal, "PSUBSCRIBE mode");

    // Malformed framing: the normal connection's answer, also in subscriber mode.
    let bad = b"*1\r\n$-2\r\n";
    let normal = read_all(send(&srv.addr, bad));
    assert!(normal.starts_with("-ERR Protocol error"), "{normal}");
    let mut s = send(&srv.addr, b"*2\r\n$9\r\nSUBSCRIBE\r\n$2\r\nch\r\n");
    let mut confirm = [0u8; CONFIRM.len()];
    s.read_exact(&mut confirm).unwrap();
    assert_eq!(&confirm, CONFIRM);
    s.write_all(bad).unwrap();
    assert_eq!(read_all(s), normal, "SUBSCRIBE mode");

    let mut good = srv.conn().await;
    let info = as_str(&cmd(&mut good, &["INFO", "stats"]).await.unwrap());
    for want in [
        "query_buffer_limit_disconnects:3\r\n",
        "protocol_errors:2\r\n",
    ] {
        assert!(info.contains(want), "no {want:?} in {info}");
    }
    // The subscriptions went with their connections.
    assert_eq!(
        cmd(&mut good, &["PUBLISH", "ch", "x"]).await.unwrap(),
        Value::Int(0)
    );
}

/// Commands pipelined behind the last UNSUBSCRIBE (one packet) are answered at once, as
/// Redis does: the bytes the subscriber mode hands back are not left waiting for more.
#[test]
fn commands_behind_the_last_unsubscribe_are_answered_without_more_input() {
    let srv = Server::start(&[]);
    let mut s = TcpStream::connect(&srv.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    s.write_all(b"*2\r\n$9\r\nSUBSCRIBE\r\n$2\r\nch\r\n")
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let mut got = String::new();
    while !got.contains(":1\r\n") {
        let n = s.read(&mut buf).expect("the SUBSCRIBE confirmation");
        assert!(n > 0, "closed: {got:?}");
        got.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    s.write_all(b"*1\r\n$11\r\nUNSUBSCRIBE\r\n*1\r\n$4\r\nPING\r\n")
        .unwrap();
    let mut got = String::new();
    let deadline = Instant::now() + Duration::from_secs(3);
    while !got.contains("+PONG\r\n") && Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.push_str(&String::from_utf8_lossy(&buf[..n])),
        }
    }
    assert!(got.contains("unsubscribe"), "{got:?}");
    assert!(
        got.contains("+PONG\r\n"),
        "PING behind UNSUBSCRIBE not answered: {got:?}"
    );
}
