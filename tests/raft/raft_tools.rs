//! The client crate and the operator tools follow a Raft group's leader through the
//! members' Sentinel interface, unchanged (`--sentinel` lists the members, master name
//! `stockgate`): `StockgateClient::connect_sentinel` and the checkout reserve,
//! `stockgate-sweeper run` releases every expired reservation exactly once across a
//! `kill -9` of the leader, then `create-sale`, `adjust`, `rebuild` and `run --once` go
//! to the new leader. Checked against the ledger, the new leader and the sweeper's
//! counters.

use crate::common::runtime;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::ha::{free_port, wait_for};
use crate::common::raft::{sale_info, state_of, Group};
use crate::common::{now_ms, TempDir};
use crate::operator::sweeper_bin;
use stockgate_client::sentinel::SentinelConfig;
use stockgate_client::StockgateClient;
use stockgate_ledger::{Checkout, Hold, Ledger, OrderStatus, PgLedger};
use stockgate_server::engine::Keyring;
use stockgate_testkit::pgtemp::TempPostgres;

const SKU: &str = "RAFT-SWEEP";
const TOTAL: i64 = 300;
const TTL_MS: u64 = 1500;

fn members(g: &Group) -> String {
    g.members
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.port))
        .collect::<Vec<_>>()
        .join(",")
}

/// `stockgate-sweeper --database-url .. --sentinel <members> --master-name stockgate ARGS`.
fn sweeper_cli(pg: &TempPostgres, g: &Group, args: &[&str]) -> (bool, String, String) {
    let mut child = Command::new(sweeper_bin())
        .arg("--database-url")
        .arg(pg.url())
        .arg("--sentinel")
        .arg(members(g))
        .arg("--master-name")
        .arg("stockgate")
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

/// `n` materialized holds (PENDING orders) by users `<tag>-<i>`.
async fn reserve_orders(
    checkout: &Checkout<PgLedger, StockgateClient>,
    keyring: &Keyring,
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
                let adm = keyring.mint(SKU, &user, now_ms() + 600_000);
                let checkout = checkout.clone();
                tokio::spawn(async move {
                    checkout
                        .start(SKU, &user, &adm, &format!("req-{user}"), 1)
                        .await
                })
            })
            .collect();
        for t in tasks {
            out.push(t.await.expect("task").expect("checkout start"));
        }
    }
    out
}

fn metric(port: u16, name: &str) -> Option<u64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("stockgate_sweeper_{name} ")))
        .and_then(|v| v.trim().parse().ok())
}

/// The sweeper process this test started: SIGTERM, then SIGKILL after 10 s.
struct SweeperProc(Child);

impl Drop for SweeperProc {
    fn drop(&mut self) {
        // SAFETY: signalling a child process we spawned and have not reaped.
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
fn raft_the_sweeper_and_the_tools_follow_the_leader_across_a_kill9() {
    let mut g = Group::start(false);
    let rt = runtime();
    let pg = rt.block_on(TempPostgres::start()).expect("postgres");
    let ledger = rt.block_on(PgLedger::connect(pg.url())).expect("ledger");
    rt.block_on(ledger.migrate()).expect("migrate");
    g.leader(None, Duration::from_secs(10));
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

    let cfg = SentinelConfig::new(SentinelConfig::parse_list(&members(&g)), "stockgate");
    let client = rt
        .block_on(StockgateClient::connect_sentinel(cfg))
        .expect("connect through the members");
    let checkout = Checkout::new(ledger.clone(), client.clone());
    let keyring = g.keys.keyring();
    // a expires first (the sweeper is on it when the leader dies), b 0.7 s later.
    let a = rt.block_on(reserve_orders(&checkout, &keyring, "a", 80));
    std::thread::sleep(Duration::from_millis(700));
    let b = rt.block_on(reserve_orders(&checkout, &keyring, "b", 80));

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

    // Kill the leader once the sweeper has released part of batch a.
    let old = g.leader(None, Duration::from_secs(5));
    let t = Instant::now();
    let mut at_kill = sale_info(g.port(old), SKU).2;
    while at_kill >= 160 && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(2));
        at_kill = sale_info(g.port(old), SKU).2;
    }
    assert!(
        at_kill < 160,
        "the sweeper released nothing within 20 s:\n{}",
        log_text()
    );
    g.member(old).kill9();
    let new = g.leader(Some(old), Duration::from_secs(10));
    // Batch c straight to the new leader: what the sweeper does with it depends on its
    // own connection through the members alone.
    let direct = rt
        .block_on(StockgateClient::connect(&format!(
            "127.0.0.1:{}",
            g.port(new)
        )))
        .expect("connect to the new leader");
    let c = rt.block_on(reserve_orders(
        &Checkout::new(ledger.clone(), direct),
        &keyring,
        "c",
        40,
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
        || sale_info(g.port(new), SKU).2 == 0,
    );
    // Exactly once: each order cancelled once (materialized, cancelled), each
    // reservation RELEASED on the new leader, every unit back.
    for h in &all {
        let o = rt
            .block_on(ledger.order(&h.token))
            .expect("order")
            .expect("known order");
        assert_eq!(o.status, OrderStatus::CancelledBySweeper, "{}", h.token);
        let evs = rt.block_on(ledger.events(&h.token)).expect("events");
        assert_eq!(evs.len(), 2, "{}: {evs:?}", h.token);
        assert_eq!(
            state_of(g.port(new), &h.token).as_deref(),
            Some("RELEASED"),
            "{}",
            h.token
        );
    }
    assert_eq!(sale_info(g.port(new), SKU), (TOTAL, TOTAL, 0, 0));
    let released = metric(metrics_port, "released_total").expect("metrics");
    let noop = metric(metrics_port, "release_noop_total").expect("metrics");
    assert!(
        released <= n && released + noop >= n,
        "released {released}, no-op {noop}, of {n}"
    );
    drop(sweeper);

    // The other tools, on the new leader.
    let (ok, out, err) = sweeper_cli(
        &pg,
        &g,
        &[
            "adjust",
            "--sku",
            SKU,
            "--delta",
            "10",
            "--id",
            "raft-adj-1",
        ],
    );
    assert!(ok && out.contains("applied"), "adjust: {out}\n{err}");
    assert_eq!(sale_info(g.port(new), SKU).0, TOTAL + 10);
    let (ok, out, err) = sweeper_cli(&pg, &g, &["rebuild", "--sku", SKU, "--fence"]);
    assert!(ok, "rebuild: {out}\n{err}");
    assert_eq!(sale_info(g.port(new), SKU).1, TOTAL + 10, "rebuilt: {out}");
    let (ok, out, err) = sweeper_cli(&pg, &g, &["run", "--once", "--sku", SKU]);
    assert!(ok, "run --once: {out}\n{err}");
    drop(client);
}
