//! One Postgres ledger for several groups (docs/ledger.md, "A ledger and its server
//! histories"), with the real `stockgate-sweeper` and `stockgate-materializer` against
//! two single-node groups in cluster mode:
//!
//! - the ledger binds to the first group on first contact; the second group's server is
//!   refused by every tool until `bind` names its history (a wrong id is refused);
//!   `rebind` is refused once two are bound;
//! - sales on both groups and a split parent's parts on both record their group's
//!   history; one materializer per group writes both groups' orders into the one
//!   ledger, each with its own position (one of them `kill -9`ed mid-way and restarted):
//!   one order and one audit row per reservation, each position at its own feed's end;
//! - one sweeper per group, without `--sku`, releases exactly its own group's expired
//!   holds, and both succeed; a rebuild per group works, and a rebuild of one group's
//!   sale through the other group's node is refused naming both histories; a sale with
//!   no recorded history is skipped, refused, then recorded by a `--sku` pass;
//! - a ledger created at migration 0008, with its binding, a sale and a feed position,
//!   is upgraded in place and the tools keep working on it; a second server bound later
//!   leaves its sales alone.
//! - on the ledger itself: two first contacts at once bind one history; `bind` records
//!   unrecorded sales on the binding in place first; `rebind` is refused with two
//!   bindings and, with one, takes that history's sales and positions along.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::cluster::Cluster;
use crate::common::ha::{Keys, Node};
use crate::common::{now_ms, runtime};
use sqlx::Row;
use stockgate_ledger::materialize::{FeedReader, ALL_EVENTS};
use stockgate_ledger::PgLedger;
use stockgate_testkit::pgtemp::TempPostgres;
use stockgate_testkit::{sibling_binary, KillOnDrop};

const TTL: &str = "2000";

/// A tool run to its end, bounded by `timeout`.
fn tool(name: &str, pg: &TempPostgres, port: u16, args: &[&str]) -> Output {
    Command::new("timeout")
        .arg("60")
        .arg(sibling_binary(name))
        .arg("--database-url")
        .arg(pg.url())
        .arg("--server")
        .arg(format!("127.0.0.1:{port}"))
        .args(args)
        .env("STOCKGATE_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run a tool")
}

fn sweeper(pg: &TempPostgres, port: u16, args: &[&str]) -> (bool, String, String) {
    let o = tool("stockgate-sweeper", pg, port, args);
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn ok(pg: &TempPostgres, port: u16, args: &[&str]) -> String {
    let (ok, out, err) = sweeper(pg, port, args);
    assert!(ok, "stockgate-sweeper {args:?} failed:\n{out}\n{err}");
    out
}

fn refused(pg: &TempPostgres, port: u16, args: &[&str]) -> String {
    let (ok, out, err) = sweeper(pg, port, args);
    assert!(!ok, "stockgate-sweeper {args:?} should be refused:\n{out}");
    err
}

fn drain(pg: &TempPostgres, port: u16) -> Output {
    tool(
        "stockgate-materializer",
        pg,
        port,
        &["--drain", "--batch", "10"],
    )
}

fn history(node: &Node) -> String {
    node.info("server")
        .get("stockgate_history")
        .cloned()
        .filter(|h| !h.is_empty())
        .expect("a history id")
}

fn reserve(node: &Node, keys: &Keys, sku: &str, user: &str) -> String {
    let mut c = node.conn();
    let tok = keys.keyring().mint(sku, user, now_ms() + 600_000);
    let v: Vec<redis::Value> = redis::cmd("RESERVE")
        .arg(sku)
        .arg(user)
        .arg(tok)
        .arg(format!("req-{user}"))
        .query(&mut c)
        .expect("reserve");
    assert_eq!(crate::common::as_str(&v[0]), "RESERVED", "{v:?}");
    crate::common::as_str(&v[1])
}

fn commit(node: &Node, token: &str) {
    let r: redis::Value = redis::cmd("COMMIT")
        .arg(token)
        .query(&mut node.conn())
        .expect("commit");
    assert!(!matches!(r, redis::Value::ServerError(_)), "{r:?}");
}

/// The number after `word ` in a tool's output line.
fn number_after(out: &str, word: &str) -> u64 {
    out.split(&format!("{word} "))
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no `{word} N` in {out}"))
}

async fn feed_end(port: u16) -> u64 {
    FeedReader::connect(&format!("127.0.0.1:{port}"), ALL_EVENTS)
        .await
        .expect("feed")
        .end()
        .await
        .expect("feed end")
}

/// Orders by sku and status.
async fn statuses(pool: &sqlx::PgPool) -> BTreeMap<(String, String), i64> {
    sqlx::query("SELECT sku, status, count(*) FROM stockgate.orders GROUP BY 1, 2")
        .fetch_all(pool)
        .await
        .expect("orders")
        .iter()
        .map(|r| ((r.get(0), r.get(1)), r.get(2)))
        .collect()
}

fn count(m: &BTreeMap<(String, String), i64>, sku: &str, status: &str) -> i64 {
    m.get(&(sku.to_string(), status.to_string()))
        .copied()
        .unwrap_or(0)
}

#[test]
fn two_groups_share_one_ledger() {
    let rt = runtime();
    let pg = rt.block_on(TempPostgres::start()).expect("postgres");
    let cluster = Cluster::start(&[(0, 8191), (8192, 16383)]);
    let (n0, n1) = (&cluster.nodes[0], &cluster.nodes[1]);
    let (p0, p1) = (n0.port, n1.port);
    let (h0, h1) = (history(n0), history(n1));
    assert_ne!(h0, h1, "each group has its own history");
    let skus = cluster.skus("LEDG", 1);
    let (a, b) = (skus[0][0].clone(), skus[1][0].clone());

    // --- bindings: the first group on first contact, the second deliberately ---
    ok(
        &pg,
        p0,
        &[
            "create-sale",
            "--sku",
            &a,
            "--total",
            "500",
            "--ttl-ms",
            TTL,
        ],
    );
    let err = refused(
        &pg,
        p1,
        &[
            "create-sale",
            "--sku",
            &b,
            "--total",
            "500",
            "--ttl-ms",
            TTL,
        ],
    );
    assert!(
        err.contains(&format!("describes server history {h0}"))
            && err.contains(&format!("reports history {h1}"))
            && err.contains(&format!("stockgate-sweeper bind --history {h1}")),
        "{err}"
    );
    let listed: Vec<String> = redis::cmd("SALE.LIST")
        .query(&mut n1.conn())
        .expect("sale.list");
    assert!(
        listed.is_empty(),
        "nothing was created on the refused group"
    );
    refused(&pg, p1, &["run", "--once"]);
    assert_eq!(
        drain(&pg, p1).status.code(),
        Some(3),
        "materializer refused"
    );
    let err = refused(&pg, p1, &["bind", "--history", "0123"]);
    assert!(
        err.contains(&format!("reports history {h1}, not 0123")),
        "{err}"
    );
    let out = ok(&pg, p1, &["bind", "--history", &h1, "--group", "g1"]);
    assert!(
        out.contains(&format!("ledger now bound to history {h1}")),
        "{out}"
    );
    let out = ok(&pg, p1, &["bind", "--history", &h1]);
    assert!(out.contains("already bound"), "{out}");
    let err = refused(&pg, p1, &["rebind", "--history", &h1]);
    assert!(
        err.contains("bound to histories") && err.contains("bind") && err.contains("unbind"),
        "{err}"
    );

    ok(
        &pg,
        p1,
        &[
            "create-sale",
            "--sku",
            &b,
            "--total",
            "500",
            "--ttl-ms",
            TTL,
        ],
    );
    let out = ok(
        &pg,
        p0,
        &[
            "split", "--parent", "HOT", "--parts", "2", "--total", "40", "--ttl-ms", TTL,
        ],
    );
    let parts: Vec<String> = out
        .lines()
        .filter_map(|l| l.strip_prefix("part "))
        .map(|l| l.split_whitespace().nth(1).expect("sku").to_string())
        .collect();
    assert_eq!(parts.len(), 2, "{out}");
    assert_eq!((cluster.owner(&parts[0]), cluster.owner(&parts[1])), (0, 1));

    let pool = rt.block_on(sqlx::PgPool::connect(pg.url())).expect("pool");
    let recorded: HashMap<String, String> = rt
        .block_on(sqlx::query("SELECT sku, history_id FROM stockgate.sales").fetch_all(&pool))
        .expect("sales")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let want: HashMap<String, String> = [
        (a.clone(), h0.clone()),
        (b.clone(), h1.clone()),
        (parts[0].clone(), h0.clone()),
        (parts[1].clone(), h1.clone()),
    ]
    .into_iter()
    .collect();
    assert_eq!(recorded, want, "every sale records its group's history");

    // --- reservations on both groups; 5 paid on each plain sale ---
    const N: usize = 150;
    const PART: usize = 10;
    let mut tokens: Vec<String> = Vec::new();
    for (node, sku) in [(n0, &a), (n1, &b)] {
        for i in 0..N {
            let t = reserve(node, &cluster.keys, sku, &format!("{sku}-u{i}"));
            // Paid at once, well within the hold's 2 s whatever the machine's load.
            if i < 5 {
                commit(node, &t);
            }
            tokens.push(t);
        }
    }
    for (node, sku) in [(n0, &parts[0]), (n1, &parts[1])] {
        for i in 0..PART {
            tokens.push(reserve(node, &cluster.keys, sku, &format!("{sku}-u{i}")));
        }
    }
    let reserved_at = Instant::now();

    // --- one materializer per group; group 1's killed mid-way and restarted ---
    let spawn = |port: u16| {
        KillOnDrop(
            Command::new(sibling_binary("stockgate-materializer"))
                .arg("--database-url")
                .arg(pg.url())
                .arg("--server")
                .arg(format!("127.0.0.1:{port}"))
                .args(["--batch", "10"])
                .env("STOCKGATE_LOG", "warn")
                .stdin(Stdio::null())
                .spawn()
                .expect("spawn stockgate-materializer"),
        )
    };
    let _m0 = spawn(p0);
    let mut m1 = spawn(p1);
    let t = Instant::now();
    let seen_before_kill = loop {
        let n: i64 = rt
            .block_on(
                sqlx::query_scalar("SELECT count(*) FROM stockgate.orders WHERE sku = $1")
                    .bind(&b)
                    .fetch_one(&pool),
            )
            .unwrap_or(0);
        if n > 0 || t.elapsed() > Duration::from_secs(30) {
            break n;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    m1.0.kill().expect("kill -9 the materializer of group 1");
    let _ = m1.0.wait();
    eprintln!("group 1's materializer killed with {seen_before_kill} of {N} orders of {b}");
    assert!(seen_before_kill > 0, "group 1's materializer wrote nothing");
    for port in [p1, p0] {
        let o = drain(&pg, port);
        assert!(o.status.success(), "drain of {port}: {o:?}");
    }

    let st = rt.block_on(statuses(&pool));
    for sku in [&a, &b] {
        assert_eq!(count(&st, sku, "PENDING"), (N - 5) as i64, "{sku}: {st:?}");
        assert_eq!(count(&st, sku, "COMMITTED"), 5, "{sku}: {st:?}");
    }
    for sku in &parts {
        assert_eq!(count(&st, sku, "PENDING"), PART as i64, "{sku}: {st:?}");
    }
    let orders: Vec<String> = rt
        .block_on(
            sqlx::query_scalar("SELECT reservation_token FROM stockgate.orders ORDER BY 1")
                .fetch_all(&pool),
        )
        .expect("orders");
    let mut want_tokens = tokens.clone();
    want_tokens.sort();
    assert_eq!(orders, want_tokens, "one order per reservation, no other");
    let created_twice: i64 = rt
        .block_on(
            sqlx::query_scalar(
                "SELECT count(*) FROM (SELECT reservation_token FROM stockgate.order_events \
                 WHERE actor = 'materializer' GROUP BY reservation_token, to_status \
                 HAVING count(*) > 1) x",
            )
            .fetch_one(&pool),
        )
        .expect("events");
    assert_eq!(created_twice, 0, "nothing applied twice");
    let events: i64 = rt
        .block_on(
            sqlx::query_scalar(
                "SELECT count(*) FROM stockgate.order_events WHERE actor = 'materializer'",
            )
            .fetch_one(&pool),
        )
        .expect("events");
    assert_eq!(
        events as usize,
        tokens.len() + 10,
        "one row per order and per commit"
    );
    let positions: HashMap<String, i64> = rt
        .block_on(
            sqlx::query(
                "SELECT history_id, last_lsn FROM stockgate.feed_position \
                 WHERE consumer = 'materializer'",
            )
            .fetch_all(&pool),
        )
        .expect("positions")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let ends: HashMap<String, i64> = [
        (h0.clone(), rt.block_on(feed_end(p0)) as i64),
        (h1.clone(), rt.block_on(feed_end(p1)) as i64),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        positions, ends,
        "one position per group, each at its feed's end"
    );
    let several = rt.block_on(
        sqlx::query("SELECT stockgate.feed_set_position('materializer', 1, NULL)").execute(&pool),
    );
    let msg = format!("{:?}", several.expect_err("which group's position?"));
    assert!(
        msg.contains("SG004") || msg.contains("name the history"),
        "{msg}"
    );

    // --- one sweeper per group, no --sku: each releases its own group's holds ---
    let ttl = Duration::from_millis(TTL.parse().expect("ttl")) + Duration::from_millis(500);
    if let Some(left) = ttl.checked_sub(reserved_at.elapsed()) {
        std::thread::sleep(left);
    }
    let expired_per_group = (N - 5 + PART) as u64;
    let out = ok(&pg, p0, &["run", "--once"]);
    assert_eq!(number_after(&out, "released"), expired_per_group, "{out}");
    let st = rt.block_on(statuses(&pool));
    assert_eq!(count(&st, &a, "CANCELLED_BY_SWEEPER"), (N - 5) as i64);
    assert_eq!(count(&st, &parts[0], "CANCELLED_BY_SWEEPER"), PART as i64);
    assert_eq!(
        count(&st, &b, "PENDING"),
        (N - 5) as i64,
        "group 1 untouched"
    );
    assert_eq!(count(&st, &parts[1], "PENDING"), PART as i64);
    let out = ok(&pg, p1, &["run", "--once"]);
    assert_eq!(number_after(&out, "released"), expired_per_group, "{out}");
    let st = rt.block_on(statuses(&pool));
    assert_eq!(count(&st, &b, "CANCELLED_BY_SWEEPER"), (N - 5) as i64);
    assert_eq!(count(&st, &parts[1], "CANCELLED_BY_SWEEPER"), PART as i64);
    for sku in [&a, &b] {
        assert_eq!(count(&st, sku, "COMMITTED"), 5, "paid orders stay paid");
    }

    // --- a rebuild per group; another group's sale is refused by name ---
    let err = refused(&pg, p0, &["rebuild", "--sku", &b, "--fence"]);
    assert!(
        err.contains(&format!("sale {b} lives on server history {h1}"))
            && err.contains(&format!("reports history {h0}")),
        "{err}"
    );
    for (port, sku) in [(p0, &a), (p1, &b)] {
        let out = ok(&pg, port, &["rebuild", "--sku", sku, "--fence"]);
        assert!(
            out.contains(&format!("rebuilt {sku}: total 500 committed 5")),
            "{out}"
        );
        assert_eq!(number_after(&out, "available"), 495, "{out}");
    }
    // Both sweepers still pass after the rebuilds.
    ok(&pg, p0, &["run", "--once"]);
    ok(&pg, p1, &["run", "--once"]);
    // A sale with no recorded history, on a ledger bound to two: nobody can tell whose
    // it is. A pass without --sku skips it and says so, a rebuild refuses it saying how
    // to set it, and a pass naming it on the group that has it records it there.
    let unset = |sku: &str| {
        rt.block_on(
            sqlx::query("UPDATE stockgate.sales SET history_id = NULL WHERE sku = $1")
                .bind(sku)
                .execute(&pool),
        )
        .expect("unset");
    };
    unset(&b);
    let out = ok(&pg, p1, &["run", "--once"]);
    assert!(
        out.contains(&format!("no recorded server history (not swept): {b}")),
        "{out}"
    );
    let err = refused(&pg, p1, &["rebuild", "--sku", &b, "--fence"]);
    assert!(
        err.contains(&format!("sale {b} has no recorded server history"))
            && err.contains(&format!("run --once --sku {b}")),
        "{err}"
    );
    ok(&pg, p1, &["run", "--once", "--sku", &b]);
    let again: Option<String> = rt
        .block_on(
            sqlx::query_scalar("SELECT history_id FROM stockgate.sales WHERE sku = $1")
                .bind(&b)
                .fetch_one(&pool),
        )
        .expect("sale");
    assert_eq!(again, Some(h1.clone()), "the --sku pass recorded it");
    // Unbinding a group shuts its tools out again.
    let out = ok(&pg, p1, &["unbind", "--history", &h1]);
    assert!(out.contains("no longer bound"), "{out}");
    refused(&pg, p1, &["run", "--once"]);
}

#[test]
fn a_ledger_created_at_0008_is_upgraded_in_place() {
    let rt = runtime();
    let pg = rt.block_on(TempPostgres::start()).expect("postgres");
    let keys = Keys::new();
    let node = Node::start(&keys, &[]);
    let h = history(&node);
    let ledger = rt.block_on(PgLedger::connect(pg.url())).expect("ledger");
    rt.block_on(ledger.ensure_schema()).expect("schema");
    let mut old = stockgate_ledger::ledger::migrations::migrator();
    old.migrations = Cow::Owned(
        old.migrations
            .iter()
            .filter(|m| m.version <= 8)
            .cloned()
            .collect(),
    );
    rt.block_on(old.run(ledger.pool()))
        .expect("migrate to 0008");
    let pool = ledger.pool().clone();
    let exec = |sql: &str| {
        rt.block_on(sqlx::query(sql).execute(&pool))
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    };

    // What the previous version left: its one binding, a sale, a feed position.
    let r: String = redis::cmd("SALE.CREATE")
        .arg("UP")
        .arg(100)
        .arg("SHARDS")
        .arg(1)
        .query(&mut node.conn())
        .expect("sale.create");
    assert_eq!(r, "OK");
    exec(&format!(
        "INSERT INTO server_binding (history_id) VALUES ('{h}')"
    ));
    exec("INSERT INTO sales (sku, initial_allocation, allocation) VALUES ('UP', 100, 100)");
    let first: Vec<String> = (0..4)
        .map(|i| reserve(&node, &keys, "UP", &format!("u{i}")))
        .collect();
    let o = drain(&pg, node.port);
    assert!(
        o.status.success(),
        "the new materializer on the old ledger: {o:?}"
    );
    let version: i64 = rt
        .block_on(sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations").fetch_one(&pool))
        .expect("version");
    assert_eq!(version, 10, "the tools upgrade the ledger");

    // Upgraded with its data: the binding, the sale's history, the position's.
    let bindings: Vec<String> = rt
        .block_on(sqlx::query_scalar("SELECT history_id FROM server_bindings").fetch_all(&pool))
        .expect("bindings");
    assert_eq!(bindings, vec![h.clone()]);
    let old_view: Option<String> = rt
        .block_on(
            sqlx::query_scalar("SELECT history_id FROM server_binding WHERE singleton")
                .fetch_optional(&pool),
        )
        .expect("server_binding");
    assert_eq!(old_view, Some(h.clone()), "the old name stays readable");
    let sale_history: Option<String> = rt
        .block_on(
            sqlx::query_scalar("SELECT history_id FROM sales WHERE sku = 'UP'").fetch_one(&pool),
        )
        .expect("sale");
    assert_eq!(sale_history, Some(h.clone()));

    // The tools keep working: more orders, the sweeper, a rebuild.
    let more: Vec<String> = (4..7)
        .map(|i| reserve(&node, &keys, "UP", &format!("u{i}")))
        .collect();
    let o = drain(&pg, node.port);
    assert!(o.status.success(), "{o:?}");
    let orders: i64 = rt
        .block_on(
            sqlx::query_scalar("SELECT count(*) FROM orders WHERE sku = 'UP'").fetch_one(&pool),
        )
        .expect("orders");
    assert_eq!(orders as usize, first.len() + more.len());
    let (lsn, pos_history): (i64, String) = rt
        .block_on(
            sqlx::query_as(
                "SELECT last_lsn, history_id FROM feed_position WHERE consumer = 'materializer'",
            )
            .fetch_one(&pool),
        )
        .expect("position");
    assert_eq!(pos_history, h);
    assert_eq!(lsn as u64, rt.block_on(feed_end(node.port)));
    // The three-argument function other languages call still moves the one position.
    exec(&format!(
        "SELECT feed_set_position('materializer', {lsn}, (SELECT last_fingerprint FROM feed_position))"
    ));
    let out = ok(&pg, node.port, &["run", "--once"]);
    assert!(out.contains("sweeper pass"), "{out}");
    let out = ok(&pg, node.port, &["rebuild", "--sku", "UP", "--fence"]);
    assert!(out.contains("restored 7 pending"), "{out}");
    let o = drain(&pg, node.port);
    assert!(o.status.success(), "{o:?}");

    // A sale registered without a history (by an older tool), then a second server
    // bound: the sale is recorded on the first binding before the second is added, and
    // the second server's sweeper leaves the first's sales alone (it would otherwise
    // fence them there as lost).
    exec("INSERT INTO sales (sku, initial_allocation, allocation) VALUES ('LATE', 5, 5)");
    let other = Node::start(&keys, &[]);
    let h2 = history(&other);
    ok(&pg, other.port, &["bind", "--history", &h2]);
    let late: Option<String> = rt
        .block_on(
            sqlx::query_scalar("SELECT history_id FROM sales WHERE sku = 'LATE'").fetch_one(&pool),
        )
        .expect("sale");
    assert_eq!(late, Some(h.clone()));
    let out = ok(&pg, other.port, &["run", "--once"]);
    assert!(out.contains("lost by the server (fenced): none"), "{out}");
    let listed: Vec<String> = redis::cmd("SALE.LIST")
        .query(&mut other.conn())
        .expect("sale.list");
    assert!(
        listed.is_empty(),
        "nothing fenced on the other server: {listed:?}"
    );
    let viewed: Option<String> = rt
        .block_on(sqlx::query_scalar("SELECT history_id FROM server_binding").fetch_optional(&pool))
        .expect("view");
    assert_eq!(
        viewed, None,
        "the old name shows no single binding any more"
    );
}

/// The binding rules on the Postgres ledger itself: two first contacts at once agree on
/// one binding; a second history only by `bind` (which first records unrecorded sales
/// on the one in place); `rebind` refused with two, and with one it takes that
/// history's sales and feed positions along.
#[test]
fn bindings_are_added_deliberately_and_rebind_takes_a_history_along() {
    use stockgate_ledger::identity::{self, IdentityError};
    use stockgate_ledger::ledger::{Ledger, SaleRecord};
    let rt = runtime();
    let pg = rt.block_on(TempPostgres::start()).expect("postgres");
    rt.block_on(async {
        let l = PgLedger::connect(pg.url()).await.expect("ledger");
        l.migrate().await.expect("migrate");
        let (a, b, c) = ("a".repeat(32), "b".repeat(32), "c".repeat(32));
        let (x, y) = tokio::join!(
            identity::ensure_bound(&l, Some(a.clone())),
            identity::ensure_bound(&l, Some(b.clone()))
        );
        let won = match (x, y) {
            (Ok(h), Err(IdentityError::Mismatch { .. }))
            | (Err(IdentityError::Mismatch { .. }), Ok(h)) => h,
            other => panic!("two first contacts must agree on one: {other:?}"),
        };
        let lost = if won == a { b.clone() } else { a.clone() };
        assert_eq!(l.bound_history().await.unwrap(), Some(won.clone()));

        l.register_sale(&SaleRecord::new("OLD", 5)).await.unwrap();
        let sql = |q: &'static str| sqlx::query(q).execute(l.pool());
        sql("UPDATE sales SET history_id = NULL WHERE sku = 'OLD'")
            .await
            .unwrap();
        sql(
            "INSERT INTO feed_position (consumer, history_id, stream, last_lsn) \
             VALUES ('m', '', 's', 7)",
        )
        .await
        .unwrap();
        assert!(identity::bind(&l, Some(lost.clone()), &lost, Some("g1"))
            .await
            .expect("bind"));
        assert!(!identity::bind(&l, Some(lost.clone()), &lost, None)
            .await
            .expect("again"));
        let recorded = l.sale_histories().await.unwrap();
        assert_eq!(recorded, vec![("OLD".to_string(), Some(won.clone()))]);
        assert!(identity::ensure_bound(&l, Some(lost.clone())).await.is_ok());
        let err = identity::ensure_bound(&l, Some(c.clone()))
            .await
            .expect_err("not bound");
        assert!(
            err.to_string().contains("describes server histories"),
            "{err}"
        );
        assert!(matches!(
            identity::rebind(&l, Some(c.clone()), &c).await,
            Err(IdentityError::SeveralBound { .. })
        ));

        // One binding left: rebind moves its sale and the unclaimed position along.
        assert!(l.remove_binding(&lost).await.unwrap());
        assert!(!l.remove_binding(&lost).await.unwrap());
        assert_eq!(
            identity::rebind(&l, Some(c.clone()), &c)
                .await
                .expect("rebind"),
            Some(won.clone())
        );
        let recorded = l.sale_histories().await.unwrap();
        assert_eq!(recorded, vec![("OLD".to_string(), Some(c.clone()))]);
        let moved: String =
            sqlx::query_scalar("SELECT history_id FROM feed_position WHERE consumer = 'm'")
                .fetch_one(l.pool())
                .await
                .unwrap();
        assert_eq!(moved, c);
        assert!(identity::ensure_bound(&l, Some(won.clone())).await.is_err());
    });
}

/// A sale whose slot moves to another group (`move-slots --follow-ledger`) is recorded
/// on the destination's history, so the destination's sweeper releases its expired
/// holds and the source's no longer takes it. The follow is refused while the
/// destination is not bound, and re-running the move after `bind` finishes it.
#[test]
fn a_moved_sale_follows_its_slot_to_the_destinations_history() {
    let rt = runtime();
    let pg = rt.block_on(TempPostgres::start()).expect("postgres");
    let cluster = Cluster::start(&[(0, 8191), (8192, 16383)]);
    let (n0, n1) = (&cluster.nodes[0], &cluster.nodes[1]);
    let (p0, p1) = (n0.port, n1.port);
    let h1 = history(n1);
    let a = cluster.skus("MOVL", 1)[0][0].clone();
    ok(
        &pg,
        p0,
        &["create-sale", "--sku", &a, "--total", "50", "--ttl-ms", TTL],
    );
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(&a)
        .query(&mut n0.conn())
        .expect("keyslot");
    let token = reserve(n0, &cluster.keys, &a, "mover");
    let (from, to) = (format!("127.0.0.1:{p0}"), format!("127.0.0.1:{p1}"));
    let slots = slot.to_string();
    let move_args = [
        "move-slots",
        "--from",
        &from,
        "--to",
        &to,
        "--slots",
        &slots,
        "--follow-ledger",
    ];
    let err = refused(&pg, p0, &move_args);
    assert!(
        err.contains(&format!("not bound to the destination's history {h1}"))
            && err.contains("bind --history"),
        "{err}"
    );
    ok(&pg, p1, &["bind", "--history", &h1, "--group", "g1"]);
    let out = ok(&pg, p0, &move_args);
    assert!(
        out.contains("ledger: 1 sale(s) recorded on the destination's history"),
        "{out}"
    );
    let pool = rt.block_on(sqlx::PgPool::connect(pg.url())).expect("pool");
    let recorded: Option<String> = rt
        .block_on(
            sqlx::query_scalar("SELECT history_id FROM stockgate.sales WHERE sku = $1")
                .bind(&a)
                .fetch_one(&pool),
        )
        .expect("sale");
    assert_eq!(recorded, Some(h1.clone()));
    // The hold taken on the source expires on the destination, whose sweeper releases
    // it; the source's sweeper leaves the sale alone (it would be sent away).
    std::thread::sleep(Duration::from_millis(2_500));
    let out = ok(&pg, p1, &["run", "--once"]);
    assert_eq!(number_after(&out, "released"), 1, "{out}");
    ok(&pg, p0, &["run", "--once"]);
    let r: Vec<redis::Value> = redis::cmd("RESERVATION")
        .arg(&token)
        .query(&mut n1.conn())
        .expect("reservation on the destination");
    assert!(
        format!("{r:?}").contains("RELEASED"),
        "the moved hold was released on the destination: {r:?}"
    );
}

/// The two materializers across a move, the destination's drained first: every token
/// has one order in the state its last acknowledged step gave it, whether the step was
/// taken on the source before the move (and read there or not yet) or on the
/// destination after it.
#[test]
fn both_materializers_across_a_move_write_each_order_once() {
    let rt = runtime();
    let pg = rt.block_on(TempPostgres::start()).expect("postgres");
    let cluster = Cluster::start(&[(0, 8191), (8192, 16383)]);
    let (n0, n1) = (&cluster.nodes[0], &cluster.nodes[1]);
    let (p0, p1) = (n0.port, n1.port);
    let a = cluster.skus("MATM", 1)[0][0].clone();
    ok(
        &pg,
        p0,
        &[
            "create-sale",
            "--sku",
            &a,
            "--total",
            "50",
            "--ttl-ms",
            "600000",
        ],
    );
    ok(&pg, p1, &["bind", "--history", &history(n1)]);
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(&a)
        .query(&mut n0.conn())
        .expect("keyslot");
    // On the source: t1 paid there, t2 and t3 held; all three read by its materializer.
    let t: Vec<String> = (1..=3)
        .map(|i| reserve(n0, &cluster.keys, &a, &format!("m{i}")))
        .collect();
    commit(n0, &t[0]);
    assert!(drain(&pg, p0).status.success());
    // t4 held on the source and not yet read by its materializer when the sale leaves.
    let t4 = reserve(n0, &cluster.keys, &a, "m4");
    let (from, to) = (format!("127.0.0.1:{p0}"), format!("127.0.0.1:{p1}"));
    let slots = slot.to_string();
    ok(
        &pg,
        p0,
        &[
            "move-slots",
            "--from",
            &from,
            "--to",
            &to,
            "--slots",
            &slots,
            "--follow-ledger",
        ],
    );
    // On the destination: t2 and t4 paid, t3 released, t5 a new hold.
    commit(n1, &t[1]);
    commit(n1, &t4);
    let r: redis::Value = redis::cmd("RELEASE")
        .arg(&t[2])
        .query(&mut n1.conn())
        .expect("release");
    assert!(!matches!(r, redis::Value::ServerError(_)), "{r:?}");
    let t5 = reserve(n1, &cluster.keys, &a, "m5");
    for port in [p1, p0, p1] {
        let o = drain(&pg, port);
        assert!(
            o.status.success(),
            "materializer of {port}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let pool = rt.block_on(sqlx::PgPool::connect(pg.url())).expect("pool");
    let rows: Vec<(String, String)> = rt
        .block_on(
            sqlx::query_as(
                "SELECT reservation_token, status FROM stockgate.orders WHERE sku = $1 \
                 ORDER BY reservation_token",
            )
            .bind(&a)
            .fetch_all(&pool),
        )
        .expect("orders");
    let got: BTreeMap<String, String> = rows.iter().cloned().collect();
    assert_eq!(got.len(), rows.len(), "one order per token: {rows:?}");
    let want: BTreeMap<String, String> = [
        (&t[0], "COMMITTED"),
        (&t[1], "COMMITTED"),
        (&t[2], "CANCELLED"),
        (&t4, "COMMITTED"),
        (&t5, "PENDING"),
    ]
    .into_iter()
    .map(|(k, v)| (k.clone(), v.to_string()))
    .collect();
    assert_eq!(got, want);
}
