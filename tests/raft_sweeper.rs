//! `stockgate-sweeper --sentinel <members> --master-name stockgate` across a `kill -9`
//! of a Raft group's leader (`tests/ha_clients.rs`'s sweeper test, on the group): `run`
//! releases every expired reservation exactly once — expired before the kill, expired
//! while the old leader was dying, reserved on the new leader — checked against the
//! ledger, the new leader and the sweeper's own counters. Then `adjust`, `rebuild` and
//! `run --once` through the members.

mod common;
mod operator;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::ha::free_port;
use common::raft::*;
use common::{field, now_ms, TempDir};
use operator::sweeper_bin;
use redis::Value;
use stockgate_client::pgtemp::TempPostgres;
use stockgate_client::{
    Checkout, Hold, Ledger, OrderStatus, PgLedger, SentinelConfig, StockgateClient,
};
use stockgate_server::engine::Keyring;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        other => format!("{other:?}"),
    }
}

fn int_field(v: &Value, name: &str) -> i64 {
    field(v, name)
        .map(|f| text(&f).parse().unwrap_or(-1))
        .unwrap_or(-1)
}

/// `RESERVATION token` on `node`: its state, None if unknown.
fn state_on(c: &mut redis::Connection, token: &str) -> Option<String> {
    let v: Value = redis::cmd("RESERVATION")
        .arg(token)
        .query(c)
        .expect("RESERVATION");
    field(&v, "state").map(|s| text(&s))
}

fn sale_info_of(port: u16, sku: &str) -> Value {
    redis::cmd("SALE.INFO")
        .arg(sku)
        .query(&mut conn(port))
        .expect("SALE.INFO")
}

/// The members' client addresses, as a Sentinel list.
fn members(g: &Group) -> String {
    [1, 2, 3]
        .map(|i| format!("127.0.0.1:{}", g.port(i)))
        .join(",")
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

// --- the sweeper across a failover ------------------------------------------------------

/// A counter from the sweeper's Prometheus endpoint (None while it does not answer).
fn metric(port: u16, name: &str) -> Option<u64> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("stockgate_sweeper_{name} ")))
        .and_then(|v| v.trim().parse().ok())
}

/// `stockgate-sweeper --database-url .. --sentinel .. --master-name stockgate ARGS`, bounded.
fn sweeper_cli(pg: &TempPostgres, g: &Group, args: &[&str]) -> (bool, String, String) {
    let mut child = Command::new(sweeper_bin())
        .arg("--database-url")
        .arg(pg.url())
        .arg("--sentinel")
        .arg(members(g))
        .arg("--master-name")
        .arg("stockgate")
        // Sentinel mode must not depend on the plain address: point it nowhere.
        .arg("--server")
        .arg("127.0.0.1:1")
        .args(args)
        .env("STOCKGATE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn stockgate-sweeper");
    let t = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("stockgate-sweeper {args:?} did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `n` materialized holds (PENDING orders) by users `<tag>-<i>`, through the members.
async fn reserve_orders(
    checkout: &Checkout<PgLedger, StockgateClient>,
    keyring: &Keyring,
    sku: &str,
    tag: &str,
    n: usize,
) -> Vec<Hold> {
    let mut out = Vec::with_capacity(n);
    let idx: Vec<usize> = (0..n).collect();
    for chunk in idx.chunks(20) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|i| {
                let user = format!("{tag}-{i}");
                let adm = keyring.mint(sku, &user, now_ms() + 600_000);
                let (checkout, sku) = (checkout.clone(), sku.to_string());
                tokio::spawn(async move {
                    checkout
                        .start(&sku, &user, &adm, &format!("req-{user}"), 1)
                        .await
                })
            })
            .collect();
        for t in tasks {
            out.push(
                t.await
                    .expect("task")
                    .expect("checkout start through the members"),
            );
        }
    }
    out
}

/// Stops the sweeper process this test started (SIGTERM, then SIGKILL after 10 s).
struct SweeperProc(Child);

impl Drop for SweeperProc {
    fn drop(&mut self) {
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGTERM);
        }
        let t = Instant::now();
        while matches!(self.0.try_wait(), Ok(None)) && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn raft_sweeper_through_the_members_releases_expired_reservations_once_across_a_leader_kill() {
    const SKU: &str = "RAFT-SWEEP";
    const TOTAL: i64 = 400;
    const TTL_MS: u64 = 1500;
    let mut g = Group::start(false);
    let rt = runtime();
    let pg = rt.block_on(TempPostgres::start()).expect("postgres");
    let ledger = rt.block_on(PgLedger::connect(pg.url())).expect("ledger");
    rt.block_on(ledger.migrate()).expect("migrate");

    // The sale, created through the members by the tool (server first, then the ledger).
    let (ok, out, err) = sweeper_cli(
        &pg,
        &g,
        &[
            "create-sale",
            "--sku",
            SKU,
            "--total",
            &TOTAL.to_string(),
            "--shards",
            "1",
            "--ttl-ms",
            &TTL_MS.to_string(),
        ],
    );
    assert!(ok, "create-sale through the members: {out}\n{err}");

    let client = rt
        .block_on(StockgateClient::connect_sentinel(SentinelConfig::new(
            SentinelConfig::parse_list(&members(&g)),
            "stockgate",
        )))
        .expect("connect through the members");
    let checkout = Checkout::new(ledger.clone(), client.clone());
    let keyring = g.keys.keyring();
    // a: expires first, the sweeper works on it when the leader is killed; b: expires
    // 0.7 s later, while the old leader is dying; c: reserved on the new leader.
    let a = rt.block_on(reserve_orders(&checkout, &keyring, SKU, "a", 100));
    std::thread::sleep(Duration::from_millis(700));
    let b = rt.block_on(reserve_orders(&checkout, &keyring, SKU, "b", 100));

    let logs = TempDir::new("sweeper-log");
    let log = logs.path().join("sweeper.log");
    let metrics_port = free_port();
    let sweeper = SweeperProc(
        Command::new(sweeper_bin())
            .arg("--database-url")
            .arg(pg.url())
            .arg("--sentinel")
            .arg(members(&g))
            .arg("--master-name")
            .arg("stockgate")
            .arg("--server")
            .arg("127.0.0.1:1")
            .args([
                "run",
                "--interval-secs",
                "0.2",
                "--batch",
                "5",
                "--sku",
                SKU,
                "--max-backoff-secs",
                "0.5",
                "--metrics-addr",
                &format!("127.0.0.1:{metrics_port}"),
            ])
            .env("STOCKGATE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn stockgate-sweeper run"),
    );
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    // Kill the leader as soon as the sweeper has released part of batch a.
    let old = g.leader(None, Duration::from_secs(10));
    let old_port = g.port(old);
    let reserved_on_old = || {
        redis::Client::open(format!("redis://127.0.0.1:{old_port}/"))
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
            .ok()
            .and_then(|mut c| redis::cmd("SALE.INFO").arg(SKU).query::<Value>(&mut c).ok())
            .map(|v| int_field(&v, "reserved"))
            .unwrap_or(-1)
    };
    let t = Instant::now();
    let mut at_kill = reserved_on_old();
    while at_kill >= 200 && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(2));
        at_kill = reserved_on_old();
    }
    assert!(
        at_kill < 200,
        "the sweeper released nothing of batch a within 20 s:\n{}",
        log_text()
    );
    g.member(old).kill9();
    let new = g.port(g.leader(Some(old), Duration::from_secs(15)));
    // Batch c by a plain connection to the new leader: what the sweeper does with it
    // depends on the sweeper's Sentinel connection alone.
    let direct = rt
        .block_on(StockgateClient::connect(&format!("127.0.0.1:{new}")))
        .expect("connect to the new leader");
    let c = rt.block_on(reserve_orders(
        &Checkout::new(ledger.clone(), direct),
        &keyring,
        SKU,
        "c",
        50,
    ));

    let all: Vec<&Hold> = a.iter().chain(&b).chain(&c).collect();
    let n = all.len() as u64;
    wait_for(
        "every order cancelled by the sweeper",
        Duration::from_secs(60),
        || {
            rt.block_on(ledger.totals(SKU))
                .is_ok_and(|t| t.cancelled_by_sweeper_orders == n)
        },
    );
    wait_for(
        "every unit back in stock on the new leader",
        Duration::from_secs(30),
        || int_field(&sale_info_of(new, SKU), "reserved") == 0,
    );
    assert!(
        matches!(metric(metrics_port, "passes_total"), Some(p) if p > 0),
        "the sweeper kept running:\n{}",
        log_text()
    );

    // Exactly once: each order cancelled once (two events: materialized, cancelled), each
    // reservation RELEASED on the new leader, every unit back, none twice.
    let mut conn = conn(new);
    for h in &all {
        let o = rt
            .block_on(ledger.order(&h.token))
            .expect("order")
            .expect("known order");
        assert_eq!(o.status, OrderStatus::CancelledBySweeper, "{}", h.token);
        let evs = rt.block_on(ledger.events(&h.token)).expect("events");
        assert_eq!(evs.len(), 2, "{}: {evs:?}", h.token);
        assert_eq!(
            state_on(&mut conn, &h.token).as_deref(),
            Some("RELEASED"),
            "{}",
            h.token
        );
    }
    let info = sale_info_of(new, SKU);
    assert_eq!(
        (
            int_field(&info, "total"),
            int_field(&info, "available"),
            int_field(&info, "reserved"),
            int_field(&info, "committed")
        ),
        (TOTAL, TOTAL, 0, 0),
        "{info:?}"
    );
    let released = metric(metrics_port, "released_total").expect("metrics");
    let noop = metric(metrics_port, "release_noop_total").expect("metrics");
    assert!(
        released <= n && released + noop >= n,
        "released {released}, no-op {noop}, of {n}"
    );
    let failed = metric(metrics_port, "passes_failed_total").unwrap_or(0);
    drop(sweeper);
    println!(
        "sweeper through the members: {n} expired reservations released once across the failover (killed with {at_kill} of 200 still reserved); RELEASE answered 1 {released} times, 0 {noop} times; {failed} passes failed during the switch"
    );

    // The other tools through the members, on the new leader.
    let (ok, out, err) = sweeper_cli(
        &pg,
        &g,
        &["adjust", "--sku", SKU, "--delta", "10", "--id", "ha-adj-1"],
    );
    assert!(ok && out.contains("applied"), "adjust: {out}\n{err}");
    assert_eq!(int_field(&sale_info_of(new, SKU), "total"), TOTAL + 10);
    let (ok, out, err) = sweeper_cli(&pg, &g, &["rebuild", "--sku", SKU, "--fence"]);
    assert!(ok, "rebuild: {out}\n{err}");
    let info = sale_info_of(new, SKU);
    assert_eq!(
        (
            field(&info, "state").map(|s| text(&s)),
            int_field(&info, "available")
        ),
        (Some("OPEN".to_string()), TOTAL + 10),
        "rebuilt through the members: {out} {info:?}"
    );
    let (ok, out, err) = sweeper_cli(&pg, &g, &["run", "--once", "--sku", SKU]);
    assert!(ok, "run --once: {out}\n{err}");
    drop(client);
}
