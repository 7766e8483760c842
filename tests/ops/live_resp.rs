//! A sale's live counts over RESP, against the real binary: `SUBSCRIBE sale:<sku>:live`
//! sends the counts at once and then their changes, coalesced to at most ~10 messages a
//! second however busy the sale; RESP2 and RESP3 clients alike (redis-rs, redis-py); the
//! queue length moves with ROOM.JOIN; clients cannot PUBLISH on the channel; a
//! subscriber that never reads is disconnected without hurting anyone else.

use super::live_common::{join, q, reserve_all, rss_kb, users};
use crate::common::Server;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// A redis-rs subscriber read by a thread: each message's arrival time and JSON.
struct Sub {
    rx: mpsc::Receiver<(Instant, serde_json::Value)>,
}

fn subscribe(s: &Server, channel: &str) -> Sub {
    let mut con = s.client().get_connection().expect("connect");
    let channel = channel.to_string();
    let (tx, rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut ps = con.as_pubsub();
        ps.subscribe(&channel).expect("subscribe");
        ps.set_read_timeout(Some(Duration::from_millis(500)))
            .expect("timeout");
        let _ = ready_tx.send(());
        loop {
            let m = match ps.get_message() {
                Ok(m) => m,
                Err(e) if e.is_timeout() => {
                    // The test dropped its end: stop.
                    if tx.send((Instant::now(), serde_json::Value::Null)).is_err() {
                        return;
                    }
                    continue;
                }
                Err(_) => return,
            };
            assert_eq!(m.get_channel_name(), channel);
            let body: String = m.get_payload().expect("payload");
            let v = serde_json::from_str(&body).expect("message JSON");
            if tx.send((Instant::now(), v)).is_err() {
                return;
            }
        }
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("subscribed");
    Sub { rx }
}

impl Sub {
    /// The next message within `within` (the reader's idle ticks skipped).
    fn next(&self, within: Duration) -> Option<(Instant, serde_json::Value)> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok((_, serde_json::Value::Null)) => continue,
                Ok(m) => return Some(m),
                Err(_) => return None,
            }
        }
    }

    /// Messages until one has `field == want` (within `within`): all of them.
    fn until(&self, field: &str, want: i64, within: Duration) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + within;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some((_, v)) = self.next(left) else {
                panic!("no message with {field}={want} within {within:?}; saw {seen:?}");
            };
            let done = v[field] == want;
            seen.push(v);
            if done {
                return seen;
            }
        }
    }

    /// Every message until `within` passes without one.
    fn drain(&self, within: Duration) -> Vec<serde_json::Value> {
        std::iter::from_fn(|| self.next(within).map(|m| m.1)).collect()
    }
}

/// The counts at once on SUBSCRIBE; a RESERVE shows within seconds; 3 s of RESERVEs as
/// fast as one connection sends them arrive as at most ~10 messages a second, the last
/// one the sale's final counts.
#[test]
fn counts_at_once_then_changes_coalesced() {
    let s = Server::start(&[]);
    let mut c = s.client().get_connection().expect("connect");
    q(&mut c, &["SALE.CREATE", "LIVE", "1000000"]);

    let t0 = Instant::now();
    let w = subscribe(&s, "sale:LIVE:live");
    let (at, first) = w.next(Duration::from_secs(5)).expect("a first message");
    // Loose bound: the machine may be busy compiling.
    assert!(
        at - t0 < Duration::from_secs(3),
        "first after {:?}",
        at - t0
    );
    assert_eq!(first["sku"], "LIVE");
    assert_eq!(first["available"], 1_000_000);
    assert_eq!(first["held"], 0);
    assert_eq!(first["sold"], 0);
    assert_eq!(first["state"], "OPEN");
    assert_eq!(first["room"], false);

    let t1 = Instant::now();
    reserve_all(&s, &mut c, "LIVE", &users(0, 1));
    w.until("held", 1, Duration::from_secs(2));
    assert!(t1.elapsed() < Duration::from_secs(3));
    assert!(
        w.drain(Duration::from_millis(500)).is_empty(),
        "no change, no message"
    );

    // 3 s of continuous RESERVEs.
    let busy = Instant::now();
    let mut n = 1;
    while busy.elapsed() < Duration::from_secs(3) {
        reserve_all(&s, &mut c, "LIVE", &users(n, 50));
        n += 50;
    }
    let held = i64::try_from(n).unwrap();
    let seen = w.until("held", held, Duration::from_secs(3));
    let rest = w.drain(Duration::from_millis(500));
    assert!(rest.is_empty(), "nothing after the final counts: {rest:?}");
    assert!(
        (3..=35).contains(&seen.len()),
        "{} messages for {n} RESERVEs in 3 s (~10/s at most)",
        seen.len()
    );
    let last = &seen[seen.len() - 1];
    assert_eq!(last["available"], 1_000_000 - held);
    for pair in seen.windows(2) {
        assert_ne!(pair[0], pair[1], "only changes are sent");
    }
}

const PY_WATCHERS: &str = r#"
import json, sys, time, redis
port = int(sys.argv[1])

def watcher(proto):
    r = redis.Redis(port=port, protocol=proto, decode_responses=True)
    p = r.pubsub()
    p.subscribe("sale:Q:live")
    return r, p

def next_json(p, within=5.0):
    end = time.time() + within
    while time.time() < end:
        m = p.get_message(timeout=0.2)
        if m and m["type"] == "message":
            assert m["channel"] == "sale:Q:live", m
            return json.loads(m["data"])
    raise AssertionError("no message within %ss" % within)

def until(p, field, want):
    end = time.time() + 5
    while time.time() < end:
        v = next_json(p)
        if v[field] == want:
            return v
    raise AssertionError("no %s=%s" % (field, want))

admin = redis.Redis(port=port, decode_responses=True)
watchers = [watcher(2), watcher(3)]
for _, p in watchers:
    first = next_json(p)
    assert first["sku"] == "Q" and first["room"] is True, first
    assert first["waiting"] == 0 and first["available"] == 100, first

admin.execute_command("ROOM.JOIN", "Q", "alice")
admin.execute_command("ROOM.JOIN", "Q", "bob")
for _, p in watchers:
    assert until(p, "waiting", 2)["available"] == 100

admin.execute_command("SALE.ADJUST", "Q", "-10")
for _, p in watchers:
    assert until(p, "available", 90)["waiting"] == 2

try:
    admin.publish("sale:Q:live", '{"available":0}')
    raise AssertionError("PUBLISH on a live channel was taken")
except redis.ResponseError as e:
    assert "published by the server" in str(e), e

# An unknown sale is refused in place of the confirmation.
_, p = watchers[0]
p.subscribe("sale:NOPE:live")
try:
    for _ in range(20):
        p.get_message(timeout=0.2)
    raise AssertionError("SUBSCRIBE to an unknown sale was taken")
except redis.ResponseError as e:
    assert "NOSALE" in str(e), e

for r, p in watchers:
    p.unsubscribe()
    p.close()
    assert r.ping()
print("redis-py live watchers ok")
"#;

/// redis-py over RESP2 and RESP3: the first message at once, the queue length after two
/// ROOM.JOINs, a stock change; PUBLISH on the channel refused; an unknown sale refused.
#[test]
fn redis_py_watchers_see_the_queue_and_the_stock() {
    let s = Server::start(&[]);
    let mut c = s.client().get_connection().expect("connect");
    q(&mut c, &["SALE.CREATE", "Q", "100"]);
    // Opening in an hour: joins wait in the pre-queue, so `waiting` counts them.
    let opens = (crate::common::now_ms() + 3_600_000).to_string();
    q(&mut c, &["ROOM.OPEN", "Q", "OPENS-AT", &opens]);
    let venv = concat!(env!("CARGO_MANIFEST_DIR"), "/target/py/newest/bin");
    let path = format!("{venv}:{}", std::env::var("PATH").unwrap_or_default());
    let out = Command::new("python3")
        .env("PATH", path)
        .args(["-c", PY_WATCHERS, &s.port.to_string()])
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("redis-py live watchers ok"),
        "needs redis-py (tests/py/requirements.txt):\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `CLIENT LIST` lines of subscriber-mode connections.
fn subscribers(c: &mut redis::Connection) -> Vec<String> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(c).expect("list");
    list.lines()
        .filter(|l| l.contains(" flags=P "))
        .map(str::to_string)
        .collect()
}

/// A subscriber of a busy sale (and of a flooded ordinary channel) that never reads: its
/// socket fills, the server keeps answering everyone else and a reading watcher keeps
/// getting the counts, and the never-reader is disconnected after `--write-timeout-ms`;
/// the server's memory stays flat.
#[test]
fn a_subscriber_that_never_reads_is_bounded_and_dropped() {
    let s = Server::start(&["--write-timeout-ms", "1500"]);
    let pid = s.child.as_ref().expect("child").id();
    let mut c = s.client().get_connection().expect("connect");
    q(&mut c, &["SALE.CREATE", "BUSY", "1000000"]);
    let reader = subscribe(&s, "sale:BUSY:live");
    reader.next(Duration::from_secs(5)).expect("first message");
    let rss0 = rss_kb(pid);

    let mut lazy = TcpStream::connect(&s.addr).expect("connect");
    lazy.write_all(b"SUBSCRIBE sale:BUSY:live flood\r\n")
        .expect("subscribe");
    let lazy_port = lazy.local_addr().expect("addr").port();
    let deadline = Instant::now() + Duration::from_secs(5);
    while subscribers(&mut c).len() < 2 {
        assert!(Instant::now() < deadline, "never subscribed");
        std::thread::sleep(Duration::from_millis(20));
    }

    // The sale keeps changing while the ordinary channel floods the never-reader.
    let stop = Arc::new(AtomicBool::new(false));
    let busy = {
        let (stop, url) = (stop.clone(), s.url());
        let keys = s.keyring();
        std::thread::spawn(move || {
            let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let exp = crate::common::now_ms() + 600_000;
                let mut p = redis::pipe();
                for u in users(n, 20) {
                    p.cmd("RESERVE")
                        .arg("BUSY")
                        .arg(&u)
                        .arg(keys.mint("BUSY", &u, exp))
                        .arg("r");
                }
                let _: Vec<redis::Value> = p.query(&mut c).expect("reserve");
                n += 20;
            }
        })
    };
    let chunk = "x".repeat(16 * 1024);
    for _ in 0..1000 {
        let _: i64 = redis::cmd("PUBLISH")
            .arg("flood")
            .arg(&chunk)
            .query(&mut c)
            .expect("publish");
    }
    // Everyone else is answered promptly meanwhile, and the reading watcher is fed.
    let t = Instant::now();
    let pong: String = redis::cmd("PING").query(&mut c).expect("ping");
    assert_eq!(pong, "PONG");
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "PING took {:?}",
        t.elapsed()
    );
    let mark = Instant::now();
    let fed = std::iter::from_fn(|| reader.next(Duration::from_secs(3))).find(|(at, _)| *at > mark);
    assert!(fed.is_some(), "the reading watcher still gets counts");

    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let subs = subscribers(&mut c);
        let me = format!(" addr=127.0.0.1:{lazy_port} ");
        let lazy_there = subs.iter().any(|l| l.contains(&me));
        if !lazy_there {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the never-reader is still connected: {subs:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(subscribers(&mut c).len(), 1, "the reading watcher stays");
    stop.store(true, Ordering::Relaxed);
    busy.join().expect("busy loop");
    let rss1 = rss_kb(pid);
    assert!(
        rss1 < rss0 + 64 * 1024,
        "RSS grew from {rss0} kB to {rss1} kB"
    );
    // What the never-reader was sent before it was cut off, then the end.
    lazy.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut sink = Vec::new();
    let _ = lazy.read_to_end(&mut sink);
    assert!(
        String::from_utf8_lossy(&sink[..sink.len().min(4096)]).contains("\"sku\":\"BUSY\""),
        "the never-reader was sent the counts first"
    );
}

/// A buyer's channel, `place:<ticket>`: the counts with the buyer's own place in every
/// message, pushed as the line moves ahead of it; a ticket that does not hold (forged,
/// malformed, of no sale) is refused in the subscription's place.
#[test]
fn a_buyers_channel_carries_its_own_place() {
    let s = Server::start(&[]);
    let mut c = s.client().get_connection().expect("connect");
    q(&mut c, &["SALE.CREATE", "P", "1"]);
    q(&mut c, &["ROOM.OPEN", "P", "RATE", "1000", "WINDOW", "0"]);
    let tickets: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|u| join(&mut c, "P", u))
        .collect();
    let sub = subscribe(&s, &format!("place:{}", tickets[2]));
    let (_, first) = sub.next(Duration::from_secs(5)).expect("first message");
    assert_eq!(first["you"]["status"], "WAITING", "{first}");
    assert_eq!(first["you"]["position"], 2, "{first}");
    assert_eq!(first["waiting"], 2, "{first}");
    q(&mut c, &["ROOM.LEAVE", "P", "a"]);
    let seen = sub.until("waiting", 1, Duration::from_secs(5));
    let last = seen.last().expect("a message");
    assert_eq!(last["you"]["position"], 1, "{last}");
    q(&mut c, &["ROOM.LEAVE", "P", "b"]);
    let seen = sub.until("waiting", 0, Duration::from_secs(5));
    let last = seen.last().expect("a message");
    assert_eq!(last["you"]["status"], "ADMITTED", "{last}");

    // Refusals come in the subscription's place, as for an unknown sale.
    let forged = tickets[1].replace("|b|", "|c|");
    for (channel, code) in [
        (format!("place:{forged}"), "BADTICKET"),
        ("place:garbage".to_string(), "BADTICKET"),
        (
            format!("place:{}", tickets[0].replace("|P|", "|NONE|")),
            "NOROOM",
        ),
    ] {
        let mut raw = TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
        let cmd = format!(
            "*2\r\n$9\r\nSUBSCRIBE\r\n${}\r\n{channel}\r\n",
            channel.len()
        );
        raw.write_all(cmd.as_bytes()).expect("write");
        raw.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut buf = [0u8; 512];
        let n = raw.read(&mut buf).expect("reply");
        let reply = String::from_utf8_lossy(&buf[..n]);
        assert!(reply.starts_with(&format!("-{code}")), "{channel}: {reply}");
    }
    // PUBLISH on a buyer's channel is the server's alone.
    let r: redis::RedisResult<i64> = redis::cmd("PUBLISH")
        .arg(format!("place:{}", tickets[2]))
        .arg("x")
        .query(&mut c);
    assert!(r.is_err(), "{r:?}");
}
