//! The materializer on a Raft group: `stockgate-materializer --sentinel <members>
//! --master-name stockgate` (a real Postgres) running while a writer reserves (and
//! commits or releases some) through `StockgateClient::connect_sentinel` pointed at the
//! members, and the leader is `kill -9`ed twice, each killed member restarted.
//!
//! After each kill, *before* the killed member comes back, the materializer must have
//! consumed what the writer got acknowledged by the new leader. At the end, the
//! materializer's position equals the final leader's feed end and: every acknowledged
//! reservation has exactly one order row, in the status its acknowledged COMMIT /
//! RELEASE implies (PENDING otherwise); every row is a reservation of the final leader's
//! feed, in the status that feed implies; no token has two rows or two `materializer`
//! PENDING audit rows; the materializer never exited (stopped with SIGINT, exit 0).
//!
//! Alongside, a consumer-group worker (`GroupReader::connect_sentinel`, XREADGROUP /
//! XACK, its own pending entries re-read after any error) runs through the same
//! failovers: it must have been handed every reservation of the final feed, and nothing
//! may be left pending.

use crate::common::runtime;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::raft::*;
use crate::common::{now_ms, TempDir};
use sqlx::Row;
use stockgate_client::types::ReserveOutcome;
use stockgate_client::{SentinelConfig, StockgateClient};
use stockgate_ledger::group::GroupReader;
use stockgate_ledger::materialize::{FeedReader, ALL_EVENTS};
use stockgate_ledger::PgLedger;
use stockgate_testkit::pgtemp::TempPostgres;

const SKU: &str = "RAFT-FEED";
const KILLS: usize = 2;

/// The materializer binary next to this test's executable (`target/<profile>/`), or
/// `$STOCKGATE_MATERIALIZER_BIN`. Build it first: `cargo build --workspace --bins`.
fn materializer_bin() -> PathBuf {
    if let Ok(p) = std::env::var("STOCKGATE_MATERIALIZER_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test exe path");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .join("stockgate-materializer");
    assert!(
        bin.exists(),
        "{} missing: run `cargo build --workspace --bins` before the tests",
        bin.display()
    );
    bin
}

/// The materializer process this test started: SIGKILLed on drop if still running.
struct MaterializerProc {
    child: Child,
    log: PathBuf,
}

impl MaterializerProc {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Panics if the process has exited (it runs until told to stop).
    fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("the materializer exited ({status}):\n{}", self.log());
        }
    }

    /// SIGINT (its graceful stop), then its exit status within 15 s.
    fn stop(&mut self) -> std::process::ExitStatus {
        // SAFETY: signalling a child process we spawned and have not reaped.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGINT);
        }
        let t = Instant::now();
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) => return s,
                Ok(None) if t.elapsed() < Duration::from_secs(15) => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => panic!("the materializer did not stop on SIGINT:\n{}", self.log()),
            }
        }
    }
}

impl Drop for MaterializerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the writer was told about one reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Told {
    Reserved,
    Committed,
    Released,
    /// COMMIT or RELEASE failed: either outcome, or none, is possible.
    Unsure,
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `f` (an async check) until it holds, or panics with `what` after `limit`;
/// `alive` runs between polls (the materializer must not have exited).
fn wait_async<F, Fut>(
    rt: &tokio::runtime::Runtime,
    what: &str,
    limit: Duration,
    mut alive: impl FnMut(),
    mut f: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let t = Instant::now();
    while !rt.block_on(f()) {
        alive();
        assert!(t.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

async fn position(pool: &sqlx::PgPool) -> u64 {
    sqlx::query("SELECT last_lsn FROM feed_position WHERE consumer = 'materializer'")
        .fetch_optional(pool)
        .await
        .ok()
        .flatten()
        .and_then(|r| r.try_get::<i64, _>(0).ok())
        .map_or(0, |v| v.max(0) as u64)
}

/// The feed end of the node on `port` (None while it cannot answer).
async fn feed_end(port: u16) -> Option<u64> {
    let r = FeedReader::connect(&format!("127.0.0.1:{port}"), ALL_EVENTS)
        .await
        .ok()?;
    r.end().await.ok()
}

#[test]
fn raft_materializer_through_the_members_follows_leader_kills_exactly_once() {
    let mut g = Group::start(false);
    let members = [1, 2, 3]
        .map(|i| format!("127.0.0.1:{}", g.port(i)))
        .join(",");
    let sentinel_config = || SentinelConfig::new(SentinelConfig::parse_list(&members), "stockgate");
    let leader_port = |g: &Group| g.port(g.leader(None, Duration::from_secs(15)));
    let rt = runtime();
    let pg = rt.block_on(TempPostgres::start()).expect("postgres");
    let ledger = rt.block_on(PgLedger::connect(pg.url())).expect("ledger");
    rt.block_on(ledger.migrate()).expect("migrate");
    let pool = ledger.pool().clone();

    let client = rt
        .block_on(StockgateClient::connect_sentinel(sentinel_config()))
        .expect("connect through the members");
    rt.block_on(client.sale_create(SKU, 1_000_000, None, Some(600_000), None))
        .expect("SALE.CREATE through the members");

    let logs = TempDir::new("materializer-log");
    let log = logs.path().join("materializer.log");
    let mut cmd = Command::new(materializer_bin());
    cmd.arg("--database-url")
        .arg(pg.url())
        .args(["--batch", "200"]);
    cmd.arg("--sentinel")
        .arg(&members)
        .arg("--master-name")
        .arg("stockgate");
    let child = cmd
        .env("RUST_LOG", "info")
        .env_remove("STOCKGATE_ADDR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("spawn stockgate-materializer");
    let mat = Arc::new(Mutex::new(MaterializerProc {
        child,
        log: log.clone(),
    }));
    let alive = || {
        mat.lock()
            .unwrap_or_else(|e| e.into_inner())
            .assert_running()
    };

    // The group worker: new entries, and after any error its own pending entries first
    // (what a lost `>` reply or a failed XACK left with it).
    let group = rt
        .block_on(GroupReader::connect_sentinel(
            sentinel_config(),
            ALL_EVENTS,
            "orders",
            "w1",
        ))
        .expect("group reader through the members");
    rt.block_on(group.create("0")).expect("XGROUP CREATE");
    let gstop = Arc::new(AtomicBool::new(false));
    let handed = Arc::new(Mutex::new(HashSet::<String>::new()));
    let gerrors = Arc::new(AtomicUsize::new(0));
    let gworker = {
        let (group, gstop, handed, gerrors) = (
            group.clone(),
            gstop.clone(),
            handed.clone(),
            gerrors.clone(),
        );
        rt.spawn(async move {
            let mut own_first = false;
            while !gstop.load(Ordering::Relaxed) {
                let r = if own_first {
                    group.pending_own(500).await
                } else {
                    group.read(500, 200).await
                };
                let batch = match r {
                    Ok(b) => b,
                    Err(_) => {
                        gerrors.fetch_add(1, Ordering::Relaxed);
                        own_first = true;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                if own_first && batch.is_empty() {
                    own_first = false;
                    continue;
                }
                {
                    let mut h = handed.lock().unwrap_or_else(|e| e.into_inner());
                    for e in batch.iter().filter(|e| e.kind() == "reserved") {
                        if let Some(t) = e.get("token") {
                            h.insert(t.to_owned());
                        }
                    }
                }
                let ids: Vec<u64> = batch.iter().map(|e| e.lsn).collect();
                if group.ack(&ids).await.is_err() {
                    gerrors.fetch_add(1, Ordering::Relaxed);
                    own_first = true;
                }
            }
        })
    };

    // The writer: three tasks reserving through the members; every tenth reservation is
    // committed, every tenth (offset 5) released, right after it is acknowledged.
    let keyring = Arc::new(g.keys.keyring());
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicUsize::new(0));
    let told = Arc::new(Mutex::new(HashMap::<String, Told>::new()));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut workers = Vec::new();
    for w in 0..3 {
        let (client, keyring, stop, acked, told, errors) = (
            client.clone(),
            keyring.clone(),
            stop.clone(),
            acked.clone(),
            told.clone(),
            errors.clone(),
        );
        workers.push(rt.spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let user = format!("w{w}-{i}");
                let rid = format!("req-{user}");
                let adm = keyring.mint(SKU, &user, now_ms() + 600_000);
                let token = match client.reserve(SKU, &user, &adm, &rid, 1).await {
                    Ok(ReserveOutcome::Reserved { token, .. })
                    | Ok(ReserveOutcome::Replay { token, .. }) => token,
                    other => {
                        let why = match other {
                            Ok(o) => format!("{o:?}"),
                            Err(e) => e.to_string(),
                        };
                        errors
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(format!("{rid}: {why}"));
                        i += 1;
                        continue;
                    }
                };
                let mut state = Told::Reserved;
                if i.is_multiple_of(10) {
                    state = match client.commit(&token).await {
                        Ok(_) => Told::Committed,
                        Err(_) => Told::Unsure,
                    };
                } else if i % 10 == 5 {
                    state = match client.release(&token).await {
                        // false: a resend whose first send released it.
                        Ok(_) => Told::Released,
                        Err(_) => Told::Unsure,
                    };
                }
                told.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(token, state);
                acked.fetch_add(1, Ordering::Relaxed);
                i += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    let n_acked = || acked.load(Ordering::Relaxed);
    let wait_acked = |what: &str, n: usize| {
        wait_for(what, Duration::from_secs(60), || {
            alive();
            n_acked() >= n
        })
    };
    wait_acked("reservations before the first kill", 150);
    wait_async(
        &rt,
        "the materializer to start consuming",
        Duration::from_secs(30),
        alive,
        || async { position(&pool).await > 0 },
    );

    let mut kill_to_caught_up = Vec::new();
    for k in 1..=KILLS {
        let old = g.leader(None, Duration::from_secs(15));
        g.member(old).kill9();
        let t = Instant::now();
        let new = g.port(g.leader(Some(old), Duration::from_secs(15)));
        let at_failover = n_acked();
        wait_acked("reservations on the new leader", at_failover + 100);
        // Consumed on the new leader while the killed member is still down.
        let end = rt
            .block_on(feed_end(new))
            .expect("the new leader's feed end");
        wait_async(
            &rt,
            &format!("the materializer to follow failover {k} (feed end {end} on :{new})"),
            Duration::from_secs(45),
            alive,
            || async { position(&pool).await >= end },
        );
        kill_to_caught_up.push(t.elapsed());
        g.member(old).spawn();
        let n = n_acked();
        wait_acked("reservations after the rejoin", n + 50);
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        rt.block_on(w).expect("writer task");
    }

    // Caught up: the position is the final leader's feed end.
    let last = leader_port(&g);
    let end = rt.block_on(feed_end(last)).expect("final feed end");
    wait_async(
        &rt,
        &format!("the materializer's position to reach the final feed end {end}"),
        Duration::from_secs(60),
        alive,
        || async { position(&pool).await == end },
    );
    let status = mat.lock().unwrap_or_else(|e| e.into_inner()).stop();
    let mat_log = mat.lock().unwrap_or_else(|e| e.into_inner()).log();
    assert!(status.success(), "materializer exit {status}:\n{mat_log}");

    // The final leader's feed: what each of its reservations implies.
    let reader = rt
        .block_on(FeedReader::connect(
            &format!("127.0.0.1:{last}"),
            ALL_EVENTS,
        ))
        .expect("feed of the final leader");
    let mut implied: HashMap<String, &str> = HashMap::new();
    let mut after = 0;
    loop {
        let page = rt
            .block_on(reader.range_after(after, 5000))
            .expect("XRANGE");
        let Some(l) = page.last() else { break };
        after = l.lsn;
        for e in &page {
            if e.get("sku").is_some_and(|s| s != SKU) {
                continue;
            }
            let Some(tok) = e.get("token") else { continue };
            match e.kind() {
                "reserved" => {
                    implied.insert(tok.to_owned(), "PENDING");
                }
                "committed" => {
                    implied.insert(tok.to_owned(), "COMMITTED");
                }
                "released" => {
                    implied.insert(tok.to_owned(), "CANCELLED");
                }
                _ => {}
            }
        }
    }

    // The group worker was handed every reservation, and acknowledged everything.
    let pending = |port: u16| -> i64 {
        let mut c = conn(port);
        let v: redis::Value = redis::cmd("XPENDING")
            .arg(ALL_EVENTS)
            .arg("orders")
            .query(&mut c)
            .expect("XPENDING");
        match v {
            redis::Value::Array(a) => match a.first() {
                Some(redis::Value::Int(n)) => *n,
                other => panic!("XPENDING count {other:?}"),
            },
            other => panic!("XPENDING {other:?}"),
        }
    };
    wait_for(
        "the group worker to be handed every reservation and acknowledge it",
        Duration::from_secs(60),
        || {
            let h = handed.lock().unwrap_or_else(|e| e.into_inner());
            implied.keys().all(|t| h.contains(t)) && pending(last) == 0
        },
    );
    gstop.store(true, Ordering::Relaxed);
    rt.block_on(gworker).expect("group worker");
    assert_eq!(
        group.primary_addr(),
        Some(format!("127.0.0.1:{last}")),
        "the group reader follows to the final leader"
    );

    let rows: Vec<(String, String)> = rt
        .block_on(
            sqlx::query("SELECT reservation_token, status FROM orders WHERE sku = $1")
                .bind(SKU)
                .fetch_all(&pool),
        )
        .expect("orders")
        .iter()
        .map(|r| {
            (
                r.try_get::<String, _>(0).expect("token"),
                r.try_get::<String, _>(1).expect("status"),
            )
        })
        .collect();
    let orders: HashMap<&str, &str> = rows.iter().map(|(t, s)| (t.as_str(), s.as_str())).collect();
    assert_eq!(orders.len(), rows.len(), "a token with two order rows");
    let twice: i64 = rt
        .block_on(
            sqlx::query(
                "SELECT count(*) FROM (SELECT reservation_token FROM order_events \
                 WHERE actor = 'materializer' AND to_status = 'PENDING' \
                 GROUP BY 1 HAVING count(*) <> 1) x",
            )
            .fetch_one(&pool),
        )
        .expect("order_events")
        .try_get(0)
        .expect("count");
    assert_eq!(twice, 0, "orders materialized more than once");

    let told = std::mem::take(&mut *told.lock().unwrap_or_else(|e| e.into_inner()));
    let mut wrong = Vec::new();
    for (tok, t) in &told {
        let got = orders.get(tok.as_str()).copied();
        let ok = match t {
            Told::Reserved => got == Some("PENDING"),
            Told::Committed => got == Some("COMMITTED"),
            Told::Released => got == Some("CANCELLED"),
            Told::Unsure => got.is_some(),
        };
        if !ok {
            wrong.push(format!("{tok}: told {t:?}, order {got:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} acknowledged reservations without their order, e.g. {:?}\nmaterializer log:\n{mat_log}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
    // A row whose token the writer was never told about is allowed only if it is a
    // reservation of the final leader: a RESERVE can take effect and be replicated
    // while its reply is lost to the kill, and if the client's retries (same request
    // id, answered REPLAY) ran out the caller saw an error, yet the reservation is in
    // the feed, durable, and so rightly an order.
    let mut stray = Vec::new();
    for (tok, st) in &orders {
        match implied.get(*tok) {
            Some(want) if want == st => {}
            other => stray.push(format!("{tok}: order {st}, final feed {other:?}")),
        }
    }
    assert!(
        stray.is_empty(),
        "{} orders that the final leader's feed does not imply, e.g. {:?}",
        stray.len(),
        &stray[..stray.len().min(5)]
    );
    let missing: Vec<&String> = implied
        .keys()
        .filter(|t| !orders.contains_key(t.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "{} reservations of the final feed without an order, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    let told_tokens: HashSet<&str> = told.keys().map(String::as_str).collect();
    let unacked = orders.keys().filter(|t| !told_tokens.contains(*t)).count();
    let errors = errors.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let discoveries = mat_log
        .matches("connected to the primary named by Sentinel")
        .count();
    println!(
        "materializer through the members: {} acknowledged reservations ({} orders, {unacked} of them for a RESERVE the writer saw fail), {KILLS} kill -9 failovers, kill -> materializer caught up on the new leader {:?} ms, {discoveries} discoveries of the leader; position = final feed end {end}; writer errors {}{}",
        told.len(),
        orders.len(),
        kill_to_caught_up
            .iter()
            .map(|d| d.as_millis())
            .collect::<Vec<_>>(),
        errors.len(),
        errors
            .first()
            .map(|e| format!(" (e.g. {e})"))
            .unwrap_or_default()
    );
    println!(
        "group worker through the members: handed all {} reservations, 0 pending at the end; {} calls failed during the switches (then re-read its own pending entries)",
        implied.len(),
        gerrors.load(Ordering::Relaxed)
    );
    drop(client);
}
