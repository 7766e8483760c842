//! The same checkout scenario through Rust, Python and Node gives the same ledger outcome.
//!
//! One scenario definition, `tests/scenario/checkout.json`: fixed buyers with fixed
//! quantities and fixed actions (pay, pay twice, cancel, pay late with money moved,
//! authorize late, abandon), and buyers who find the sale sold out. Against one real
//! server, one real Postgres ledger and a real `stockgate-sweeper run` process, each
//! language runs it on a fresh sale: the Rust checkout (`stockgate_client::Checkout` over
//! `PgLedger`) here, the Python package by `tests/scenario/run_python.py` and the Node
//! package by `tests/scenario/run_node.mjs`, each as a process. Each prints its summary
//! (payment outcomes, the ledger's orders of its sale by status with their units, the
//! server's SALE.INFO); the three must equal each other and the outcome the scenario file
//! implies.
//!
//! Needs `python3` with the package installed (`pip install ./clients/python`) and
//! `clients/node/node_modules` (`npm ci --prefix clients/node`); `scripts/test-all.sh`
//! does both.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stockgate_client::checkout::{CheckoutError, Hold, PayOutcome};
use stockgate_client::ledger::postgres::PgLedgerOptions;
use stockgate_client::types::now_ms;
use stockgate_client::{Checkout, PgLedger, StockgateClient};
use stockgate_server::engine::Keyring;
use stockgate_testkit::pgtemp::TempPostgres;

use common::Server;

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

fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test exe path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    let b = dir.join(name);
    assert!(
        b.exists(),
        "{} missing: run `cargo build --workspace --bins` before the tests",
        b.display()
    );
    b
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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
    let dir = common::TempDir::new("scenario-runner");
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
    assert!(
        repo().join("clients/node/node_modules/pg").exists(),
        "clients/node has no node_modules: run `npm ci --prefix clients/node`"
    );
    let rt = common::runtime();
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
