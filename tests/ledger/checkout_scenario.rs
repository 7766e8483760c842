//! The checkout scenarios through the Rust checkout (`stockgate_ledger::Checkout` over
//! `PgLedger`), against a real server, a real Postgres ledger and a real
//! `stockgate-sweeper run` process:
//!
//! - `the_whole_sale_through_the_rust_checkout`: the package tests' sale (3,000 buyers for
//!   1,000 units over 128 connections, 1.5 s holds, paid / paid twice / cancelled / paid
//!   late / abandoned, then a second wave), with the exact ledger figures;
//! - `the_same_scenario_through_rust_python_and_node_gives_the_same_ledger`: below.
//!
//! One scenario definition, `tests/scenario/checkout.json`: fixed buyers with fixed
//! quantities and fixed actions (pay, pay twice, cancel, pay late with money moved,
//! authorize late, abandon), and buyers who find the sale sold out. Against one real
//! server, one real Postgres ledger and a real `stockgate-sweeper run` process, each
//! language runs it on a fresh sale: the Rust checkout (`stockgate_ledger::Checkout` over
//! `PgLedger`) here, the Python package by `tests/scenario/run_python.py` and the Node
//! package by `tests/scenario/run_node.mjs`, each as a process. Each prints its summary
//! (payment outcomes, the ledger's orders of its sale by status with their units, the
//! server's SALE.INFO); the three must equal each other and the outcome the scenario file
//! implies.
//!
//! Needs `python3` with the package installed (`pip install ./clients/python`) and
//! `clients/node/node_modules` (`npm ci --prefix clients/node`, run here when it does not
//! hold what the lock file pins); `scripts/test-all.sh` does both.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stockgate_testkit::{sibling_binary as bin, KillOnDrop};

use serde_json::{json, Value};
use stockgate_client::types::now_ms;
use stockgate_client::StockgateClient;
use stockgate_ledger::checkout::{CheckoutError, Hold, PayOutcome};
use stockgate_ledger::ledger::postgres::PgLedgerOptions;
use stockgate_ledger::{Checkout, OrderStatus, PgLedger};
use stockgate_server::engine::Keyring;
use stockgate_testkit::pgtemp::TempPostgres;

use crate::common::Server;

const RUNNER_LIMIT: Duration = Duration::from_secs(150);

#[derive(Clone, Debug, serde::Deserialize)]
struct Buyer {
    user: String,
    qty: u32,
    action: String,
}

#[derive(Clone, Debug, serde::Deserialize)]
struct Scenario {
    ttl_ms: u64,
    shards: u16,
    total: u64,
    buyers: Vec<Buyer>,
    sold_out: Vec<String>,
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn scenario_file() -> PathBuf {
    repo().join("tests/scenario/checkout.json")
}

/// What the scenario file implies, in the runners' summary shape.
fn expected(s: &Scenario) -> Value {
    let of = |actions: &[&str]| {
        let b: Vec<&Buyer> = s
            .buyers
            .iter()
            .filter(|b| actions.contains(&b.action.as_str()))
            .collect();
        (
            b.len() as u64,
            b.iter().map(|b| u64::from(b.qty)).sum::<u64>(),
        )
    };
    let (paid, paid_units) = of(&["pay", "pay_twice"]);
    let (twice, _) = of(&["pay_twice"]);
    let (cancel, cancel_units) = of(&["cancel"]);
    let (late, late_units) = of(&["pay_late"]);
    let (swept, swept_units) = of(&["abandon", "authorize_late"]);
    let (authorized, _) = of(&["authorize_late"]);
    let mut outcomes = BTreeMap::new();
    for (k, v) in [
        ("hold", s.buyers.len() as u64),
        ("sold_out", s.sold_out.len() as u64),
        ("committed", paid),
        ("already_committed", twice),
        ("refused", authorized),
        ("refund_required", late),
        ("cancelled", cancel),
    ] {
        if v > 0 {
            outcomes.insert(k, v);
        }
    }
    let mut orders = BTreeMap::new();
    for (k, n, u) in [
        ("COMMITTED", paid, paid_units),
        ("CANCELLED", cancel, cancel_units),
        ("REFUND_REQUIRED", late, late_units),
        ("CANCELLED_BY_SWEEPER", swept, swept_units),
    ] {
        if n > 0 {
            orders.insert(k, json!([n, u]));
        }
    }
    json!({
        "outcomes": outcomes,
        "orders": orders,
        "server": { "committed": paid_units, "reserved": 0, "available": s.total - paid_units },
    })
}

struct Env {
    addr: String,
    secret: PathBuf,
    url: String,
}

impl Env {
    fn vars(&self, sku: &str) -> Vec<(&'static str, String)> {
        vec![
            ("STOCKGATE_ADDR", self.addr.clone()),
            ("STOCKGATE_SECRET_FILE", self.secret.display().to_string()),
            ("STOCKGATE_DATABASE_URL", self.url.clone()),
            ("STOCKGATE_LEDGER_SCHEMA", "stockgate".to_string()),
            ("SCENARIO_FILE", scenario_file().display().to_string()),
            ("SCENARIO_SKU", sku.to_string()),
        ]
    }
}

/// Runs a language's runner as a process and returns its `SUMMARY` line's JSON.
fn run_runner(program: &str, script: &str, env: &Env, sku: &str) -> Value {
    let dir = crate::common::TempDir::new("scenario-runner");
    let out = dir.path().join("out.log");
    let log = std::fs::File::create(&out).expect("runner log");
    let err = log.try_clone().expect("runner log");
    let mut child = KillOnDrop(
        Command::new(program)
            .arg(repo().join(script))
            .current_dir(repo())
            .envs(env.vars(sku))
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("run {program} {script}: {e}")),
    );
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.0.try_wait().expect("wait runner") {
            break st;
        }
        assert!(
            t.elapsed() < RUNNER_LIMIT,
            "{script} still running after {RUNNER_LIMIT:?}:\n{}",
            std::fs::read_to_string(&out).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&out).expect("runner output");
    println!("{script}:\n{text}");
    assert!(status.success(), "{script} failed ({status}):\n{text}");
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("SUMMARY "))
        .unwrap_or_else(|| panic!("{script} printed no SUMMARY line:\n{text}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{script}'s summary: {e}: {line}"))
}

type Co = Checkout<PgLedger, StockgateClient>;

/// Reserve and record; a SOLDOUT while STOCK is still positive (units on shards no probe
/// reached) is asked again with the same request id.
async fn reserve(
    co: Co,
    keys: Arc<Keyring>,
    sku: String,
    user: String,
    qty: u32,
) -> Result<Hold, CheckoutError> {
    loop {
        let adm = keys.mint(&sku, &user, u64::try_from(now_ms()).unwrap_or(0) + 600_000);
        match co
            .start(&sku, &user, &adm, &format!("req-{user}"), qty)
            .await
        {
            Err(CheckoutError::SoldOut) if co.gate().stock(&sku).await.expect("STOCK") > 0 => {}
            other => return other,
        }
    }
}

fn outcome_name(p: &PayOutcome) -> &'static str {
    match p {
        PayOutcome::Committed { .. } => "committed",
        PayOutcome::AlreadyCommitted => "already_committed",
        PayOutcome::Refused { .. } => "refused",
        PayOutcome::Limit => "limit",
        PayOutcome::RefundRequired { .. } => "refund_required",
    }
}

async fn act(co: Co, b: Buyer, h: Hold) -> Vec<&'static str> {
    let pay = |money: bool, prefix: &'static str| {
        let (co, token) = (co.clone(), h.token.clone());
        let r = format!("{prefix}-{}", b.user);
        async move { co.pay(&token, &r, money).await.expect("pay") }
    };
    match b.action.as_str() {
        "pay" => vec![outcome_name(&pay(true, "pay").await)],
        "pay_twice" => vec![
            outcome_name(&pay(true, "pay").await),
            outcome_name(&pay(true, "pay").await),
        ],
        "cancel" if co.cancel(&h.token).await.expect("cancel") => vec!["cancelled"],
        _ => vec![],
    }
}

/// The scenario through the Rust checkout (the steps of tests/scenario/run_python.py).
async fn run_rust(env: &Env, s: &Scenario, sku: &str) -> Value {
    let client = StockgateClient::connect(&env.addr).await.expect("connect");
    let ledger = PgLedger::connect_with(&env.url, PgLedgerOptions::default())
        .await
        .expect("ledger");
    let co = Checkout::new(ledger.clone(), client.clone());
    client
        .sale_create(sku, s.total, Some(s.shards), Some(s.ttl_ms), None)
        .await
        .expect("SALE.CREATE");
    let mut counts: BTreeMap<&'static str, u64> = BTreeMap::new();
    let started = now_ms();
    let keys = Arc::new(
        Keyring::parse(&std::fs::read_to_string(&env.secret).expect("secret")).expect("keyring"),
    );
    let reserving = s.buyers.iter().map(|b| {
        reserve(
            co.clone(),
            keys.clone(),
            sku.to_string(),
            b.user.clone(),
            b.qty,
        )
    });
    let holds: Vec<Hold> = spawn_all(reserving)
        .await
        .into_iter()
        .zip(&s.buyers)
        .map(|(h, b)| h.unwrap_or_else(|e| panic!("{}: {e}", b.user)))
        .collect();
    *counts.entry("hold").or_default() += holds.len() as u64;
    println!("rust: {} holds in {} ms", holds.len(), now_ms() - started);
    for user in &s.sold_out {
        match reserve(co.clone(), keys.clone(), sku.to_string(), user.clone(), 1).await {
            Err(CheckoutError::SoldOut) => *counts.entry("sold_out").or_default() += 1,
            other => panic!("{user}: {other:?}"),
        }
    }
    let acting = s
        .buyers
        .iter()
        .zip(&holds)
        .map(|(b, h)| act(co.clone(), b.clone(), h.clone()));
    for name in spawn_all(acting).await.into_iter().flatten() {
        *counts.entry(name).or_default() += 1;
    }
    let deadline = holds.iter().map(|h| h.expires_at_ms).max().unwrap_or(0);
    while now_ms() <= deadline + 20 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let late = s
        .buyers
        .iter()
        .zip(&holds)
        .filter(|(b, _)| b.action == "pay_late" || b.action == "authorize_late")
        .map(|(b, h)| {
            let (co, token) = (co.clone(), h.token.clone());
            let (r, money) = (format!("late-{}", b.user), b.action == "pay_late");
            async move { co.pay(&token, &r, money).await.expect("late pay") }
        });
    let outs = spawn_all(late).await;
    for o in &outs {
        *counts.entry(outcome_name(o)).or_default() += 1;
    }
    let paid: u64 = s
        .buyers
        .iter()
        .filter(|b| b.action == "pay" || b.action == "pay_twice")
        .map(|b| u64::from(b.qty))
        .sum();
    let want = i64::try_from(s.total - paid).expect("units");
    let t = Instant::now();
    while client.sale_info(sku).await.expect("SALE.INFO").available != want {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the sweeper did not give the unpaid units back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let info = client.sale_info(sku).await.expect("SALE.INFO");
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT status, count(*), sum(qty)::bigint FROM stockgate.orders WHERE sku = $1 GROUP BY status",
    )
    .bind(sku)
    .fetch_all(ledger.pool())
    .await
    .expect("orders");
    let orders: BTreeMap<String, Value> = rows
        .into_iter()
        .map(|(s, n, u)| (s, json!([n, u])))
        .collect();
    json!({
        "outcomes": counts,
        "orders": orders,
        "server": { "committed": info.committed, "reserved": info.reserved, "available": info.available },
    })
}

/// Runs the futures as tasks (on the runtime's threads); results in input order.
async fn spawn_all<F>(futs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("a scenario task panicked"));
    }
    out
}

#[test]
fn the_same_scenario_through_rust_python_and_node_gives_the_same_ledger() {
    let text = std::fs::read_to_string(scenario_file()).expect("scenario file");
    let spec: Scenario = serde_json::from_str(&text).expect("scenario json");
    let want = expected(&spec);
    crate::common::node::package_dir();
    let rt = crate::common::runtime();
    let pg = rt.block_on(TempPostgres::start()).expect("postgres");
    let url = pg.url().to_string();
    let migrate = Command::new(bin("stockgate-sweeper"))
        .args(["--database-url", &url, "migrate"])
        .env("STOCKGATE_LOG", "warn")
        .output()
        .expect("stockgate-sweeper migrate");
    assert!(
        migrate.status.success(),
        "migrate: {}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    let server = Server::start(&[]);
    let mut sweeper = KillOnDrop(
        Command::new(bin("stockgate-sweeper"))
            .args(["--database-url", &url, "--server", &server.addr])
            .args(["run", "--interval-secs", "1"])
            .env("STOCKGATE_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("stockgate-sweeper run"),
    );
    let env = Env {
        addr: server.addr.clone(),
        secret: server.data_dir.join("secret"),
        url,
    };
    let run = format!("{:x}", now_ms());
    let rust = rt.block_on(run_rust(&env, &spec, &format!("SCN-RUST-{run}")));
    println!("rust: {rust}");
    let python = run_runner(
        "python3",
        "tests/scenario/run_python.py",
        &env,
        &format!("SCN-PY-{run}"),
    );
    let node = run_runner(
        "node",
        "tests/scenario/run_node.mjs",
        &env,
        &format!("SCN-NODE-{run}"),
    );
    assert!(
        sweeper.0.try_wait().expect("sweeper").is_none(),
        "the sweeper exited during the runs"
    );
    assert_eq!(rust, want, "Rust's outcome is not the scenario's");
    assert_eq!(python, rust, "Python's outcome differs from Rust's");
    assert_eq!(node, rust, "Node's outcome differs from Rust's");
    println!("all three: {want}");
}

// --- The whole sale through the Rust checkout, with the package tests' figures ----------
//
// The scenario of clients/python/tests/test_scenario.py and clients/node/test/scenario.test.js:
// 3,000 buyers for 1,000 units through 128 connections, 1.5 s holds; hold k's fate by
// k % 10: 0-5 pay at once, 6 pay twice, 7 cancel, 8 pay after the TTL with money moved,
// 9 abandon; the sweeper gives the abandoned units back; a second wave of 300 buys them.

const SALE_TOTAL: u64 = 1_000;
const SALE_TTL_MS: u64 = 1_500;
const WAVE1: usize = 3_000;
const WAVE2: usize = 300;
const CONNECTIONS: usize = 128;

/// The fate of the hold acknowledged `n`-th: the paid fates (0-6) first, the cancelled
/// ones (7) last, so the cancels, which wait for the end of wave 1, have the most of their
/// 1.5 s left.
fn numbering() -> Vec<usize> {
    let rank = |k: &usize| match k % 10 {
        8 => 1,
        9 => 2,
        7 => 3,
        _ => 0,
    };
    let mut v: Vec<usize> = (0..SALE_TOTAL as usize).collect();
    v.sort_by_key(|k| (rank(k), *k));
    v
}

#[derive(Default)]
struct Wave1 {
    holds: Vec<Hold>,
    paid: Vec<(usize, Vec<PayOutcome>)>,
    late: Vec<Hold>,
    to_cancel: Vec<String>,
    sold_out: usize,
}

/// Reserve and record until a hold, or until the sale is empty (`empty` settles it for
/// every later buyer while nothing goes back to stock).
async fn buy(
    co: &Co,
    keys: &Keyring,
    sku: &str,
    user: &str,
    empty: &std::sync::atomic::AtomicBool,
) -> Option<Hold> {
    use std::sync::atomic::Ordering::SeqCst;
    loop {
        let adm = keys.mint(sku, user, u64::try_from(now_ms()).unwrap_or(0) + 600_000);
        match co.start(sku, user, &adm, "r1", 1).await {
            Ok(h) => return Some(h),
            Err(CheckoutError::SoldOut) if empty.load(SeqCst) => return None,
            Err(CheckoutError::SoldOut) => {
                if co.gate().stock(sku).await.expect("STOCK") == 0 {
                    empty.store(true, SeqCst);
                    return None;
                }
            }
            Err(e) => panic!("{user}: {e}"),
        }
    }
}

async fn pay_in_time(co: &Co, h: &Hold, times: usize) -> Vec<PayOutcome> {
    let mut out = Vec::new();
    for _ in 0..times {
        let ref_ = format!("pay-{}", h.token);
        out.push(co.pay(&h.token, &ref_, true).await.expect("pay"));
    }
    out
}

/// Wave 1 on `workers` checkouts (one connection each), one buyer at a time per worker.
async fn wave1(workers: Vec<Co>, keys: Arc<Keyring>, sku: String) -> Wave1 {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    let next = Arc::new(AtomicUsize::new(0));
    let empty = Arc::new(AtomicBool::new(false));
    let state = Arc::new(std::sync::Mutex::new(Wave1::default()));
    let fates = Arc::new(numbering());
    let tasks = workers.into_iter().map(|co| {
        let (next, empty, state, fates) =
            (next.clone(), empty.clone(), state.clone(), fates.clone());
        let (keys, sku) = (keys.clone(), sku.clone());
        async move {
            loop {
                let i = next.fetch_add(1, SeqCst);
                if i >= WAVE1 {
                    return;
                }
                let Some(h) = buy(&co, &keys, &sku, &format!("u{i}"), &empty).await else {
                    state.lock().expect("state").sold_out += 1;
                    continue;
                };
                assert!(!h.replay && !h.already_committed, "{h:?}");
                let k = {
                    let mut st = state.lock().expect("state");
                    st.holds.push(h.clone());
                    fates[st.holds.len() - 1]
                };
                let paid = match k % 10 {
                    0..=5 => pay_in_time(&co, &h, 1).await,
                    6 => pay_in_time(&co, &h, 2).await,
                    7 => {
                        state.lock().expect("state").to_cancel.push(h.token.clone());
                        continue;
                    }
                    8 => {
                        state.lock().expect("state").late.push(h);
                        continue;
                    }
                    _ => continue,
                };
                state.lock().expect("state").paid.push((k, paid));
            }
        }
    });
    spawn_all(tasks).await;
    let mut st = state.lock().expect("state");
    std::mem::take(&mut *st)
}

#[test]
fn the_whole_sale_through_the_rust_checkout() {
    let rt = crate::common::runtime();
    let pg = rt.block_on(TempPostgres::start()).expect("postgres");
    let url = pg.url().to_string();
    let migrate = Command::new(bin("stockgate-sweeper"))
        .args(["--database-url", &url, "migrate"])
        .env("STOCKGATE_LOG", "warn")
        .output()
        .expect("stockgate-sweeper migrate");
    assert!(
        migrate.status.success(),
        "migrate: {}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    let server = Server::start(&[]);
    let mut sweeper = KillOnDrop(
        Command::new(bin("stockgate-sweeper"))
            .args(["--database-url", &url, "--server", &server.addr])
            .args(["run", "--interval-secs", "1"])
            .env("STOCKGATE_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("stockgate-sweeper run"),
    );
    let keys = Arc::new(server.keyring());
    rt.block_on(whole_sale(&server.addr, &url, keys));
    assert!(
        sweeper.0.try_wait().expect("sweeper").is_none(),
        "the sweeper exited during the sale"
    );
}

async fn whole_sale(addr: &str, url: &str, keys: Arc<Keyring>) {
    let sku = "SCEN-rust";
    let ledger = PgLedger::connect_with(
        url,
        PgLedgerOptions {
            max_connections: 24,
            ..PgLedgerOptions::default()
        },
    )
    .await
    .expect("ledger");
    let mut workers = Vec::new();
    for _ in 0..CONNECTIONS {
        let c = StockgateClient::connect(addr).await.expect("connect");
        workers.push(Checkout::new(ledger.clone(), c));
    }
    let co = workers[0].clone();
    co.gate()
        .sale_create(sku, SALE_TOTAL, None, Some(SALE_TTL_MS), None)
        .await
        .expect("SALE.CREATE");
    let started = Instant::now();
    let w = wave1(workers, keys.clone(), sku.to_string()).await;
    let wave1_ms = started.elapsed().as_millis();
    // Cancelled units go back at once: the cancels wait until every wave-1 buyer has its
    // answer, so wave 1 ends with exactly 1,000 holds.
    let cancels = w.to_cancel.iter().map(|t| {
        let (co, t) = (co.clone(), t.clone());
        async move { (co.cancel(&t).await.expect("cancel"), t) }
    });
    for (gave_back, t) in spawn_all(cancels).await {
        assert!(gave_back, "the cancel of {t} gave nothing back");
    }
    assert_eq!(
        w.holds.len(),
        SALE_TOTAL as usize,
        "{} sold out",
        w.sold_out
    );
    assert_eq!(w.sold_out, WAVE1 - SALE_TOTAL as usize);
    let tokens: std::collections::HashSet<&str> =
        w.holds.iter().map(|h| h.token.as_str()).collect();
    assert_eq!(tokens.len(), w.holds.len(), "a token handed out twice");
    assert_eq!(
        (w.to_cancel.len(), w.late.len(), w.paid.len()),
        (100, 100, 700)
    );
    let ok = PayOutcome::Committed {
        server_confirmed: true,
    };
    for (k, outs) in &w.paid {
        let want = if k % 10 == 6 {
            vec![ok.clone(), PayOutcome::AlreadyCommitted]
        } else {
            vec![ok.clone()]
        };
        assert_eq!(outs, &want, "hold {k}");
    }

    // Fate 8: the payment arrives after the TTL, with the money moved.
    let deadline = w.late.iter().map(|h| h.expires_at_ms).max().unwrap_or(0);
    while now_ms() <= deadline + 20 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for h in &w.late {
        match co
            .pay(&h.token, &format!("late-{}", h.token), true)
            .await
            .expect("late pay")
        {
            PayOutcome::RefundRequired { previous } => assert!(
                matches!(
                    previous,
                    OrderStatus::Pending | OrderStatus::CancelledBySweeper
                ),
                "{previous:?}"
            ),
            other => panic!("late payment of {}: {other:?}", h.token),
        }
    }

    // The sweeper gives the abandoned holds' units back.
    let t = Instant::now();
    while co.gate().sale_info(sku).await.expect("SALE.INFO").available != 300 {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the abandoned units did not come back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Wave 2: 300 new buyers reserve and pay, all sold; one more is sold out.
    let empty = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let wave2 = (0..WAVE2).map(|i| {
        let (co, keys, empty) = (co.clone(), keys.clone(), empty.clone());
        async move {
            let h = buy(&co, &keys, sku, &format!("w{i}"), &empty)
                .await
                .expect("a wave-2 hold");
            pay_in_time(&co, &h, 1).await
        }
    });
    for outs in spawn_all(wave2).await {
        assert_eq!(outs, vec![ok.clone()]);
    }
    let no = std::sync::atomic::AtomicBool::new(false);
    assert!(
        buy(&co, &keys, sku, "w300", &no).await.is_none(),
        "w300 got a hold"
    );

    let info = co.gate().sale_info(sku).await.expect("SALE.INFO");
    assert_eq!(
        (info.committed, info.reserved, info.available),
        (1_000, 0, 0),
        "{info:?}"
    );
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT status, count(*), sum(qty)::bigint FROM stockgate.orders WHERE sku = $1 GROUP BY status",
    )
    .bind(sku)
    .fetch_all(ledger.pool())
    .await
    .expect("orders");
    let by: BTreeMap<String, (i64, i64)> = rows.into_iter().map(|(s, n, u)| (s, (n, u))).collect();
    let want: BTreeMap<String, (i64, i64)> = [
        ("COMMITTED", (1_000, 1_000)),
        ("CANCELLED", (100, 100)),
        ("REFUND_REQUIRED", (100, 100)),
        ("CANCELLED_BY_SWEEPER", (100, 100)),
    ]
    .into_iter()
    .map(|(s, v)| (s.to_string(), v))
    .collect();
    assert_eq!(by, want);
    assert_eq!(
        by["COMMITTED"].1, info.committed,
        "units sold = units committed in the ledger"
    );
    println!(
        "rust scenario: wave 1 with its payments in {wave1_ms} ms over {CONNECTIONS} connections"
    );
}
