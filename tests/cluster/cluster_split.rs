//! A hot sku split over three single-node groups (docs/cluster.md, "A split sale"),
//! with a real Postgres ledger and the real `stockgate-sweeper`:
//!
//! - `split` puts part i on group i and records it; re-running it changes nothing, other
//!   values are refused, and the database refuses a part allocation beyond the parent's;
//! - a storm of buyer threads through [`reserve_split`] sells exactly the parent's
//!   allocation, no token twice, no user past the limit on any part, and a final
//!   SOLDOUT tried three parts;
//! - with one part sold out, a buyer homed there is served by the next part, and
//!   `rebalance --once` withdraws units from the fullest part and gives them to the
//!   sold-out one, after which buyers get them there; the parts' totals still add up to
//!   the parent's allocation on the servers and in the ledger;
//! - two transactions raising two parts at once by the parent's spare units: the second
//!   waits for the first and is refused (`SG005`).
//! - two groups' sweepers in loop mode with `--rebalance`: nothing moves while the test
//!   holds the parent's advisory lock; then a drained part is refilled by the loops,
//!   twice, one pass at a time (the adjustments alternate withdrawal, gift);
//! - a split of 2 parts grown to 3 (then 4): the new part starts empty, the old ones keep
//!   their units, a re-run is a no-op, fewer parts are refused, `rebalance --once` fills
//!   the new part and buyers of every home are served.

use std::collections::{HashMap, HashSet};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::cluster::{Cluster, THREE};
use crate::common::{now_ms, runtime};
use crate::operator::sweeper_bin;
use stockgate_client::types::ReserveOutcome;
use stockgate_client::StockgateClient;
use stockgate_testkit::pgtemp::TempPostgres;
use stockgate_tools::split::{home_part, reserve_split};

const TTL: &str = "600000";

fn sweeper(pg: &TempPostgres, seed: u16, args: &[&str]) -> (bool, String, String) {
    let mut child = Command::new(sweeper_bin())
        .arg("--database-url")
        .arg(pg.url())
        .arg("--server")
        .arg(format!("127.0.0.1:{seed}"))
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

/// `split` and the part skus it printed, in index order.
fn split(pg: &TempPostgres, seed: u16, args: &[&str]) -> Vec<String> {
    let mut all = vec!["split"];
    all.extend_from_slice(args);
    let (ok, out, err) = sweeper(pg, seed, &all);
    assert!(ok, "split {args:?} failed:\n{out}\n{err}");
    out.lines()
        .filter_map(|l| l.strip_prefix("part "))
        .map(|l| l.split_whitespace().nth(1).expect("sku").to_string())
        .collect()
}

async fn gates(cluster: &Cluster, parts: &[String]) -> Vec<StockgateClient> {
    let mut out = Vec::new();
    for p in parts {
        let port = cluster.nodes[cluster.owner(p)].port;
        out.push(
            StockgateClient::connect(&format!("127.0.0.1:{port}"))
                .await
                .expect("connect"),
        );
    }
    out
}

#[test]
fn split_sale_storm_and_rebalance() {
    let rt = runtime();
    let pg = rt.block_on(TempPostgres::start()).expect("postgres");
    let cluster = Cluster::start(&THREE);
    let seed = cluster.nodes[0].port;
    let keyring = cluster.keys.keyring();

    // --- split: placement, idempotence, refusals ---
    let hot_args = [
        "--parent", "HOT", "--parts", "3", "--total", "300", "--limit", "2", "--ttl-ms", TTL,
    ];
    let parts = split(&pg, seed, &hot_args);
    assert_eq!(parts.len(), 3, "{parts:?}");
    for (i, p) in parts.iter().enumerate() {
        assert!(p.starts_with(&format!("HOT.p{i}-")), "{p}");
        assert_eq!(cluster.owner(p), i, "part {i} ({p}) is on group {i}");
    }
    assert_eq!(
        split(&pg, seed, &hot_args),
        parts,
        "a re-run changes nothing"
    );
    let (ok, _, err) = sweeper(
        &pg,
        seed,
        &[
            "split", "--parent", "HOT", "--parts", "3", "--total", "301", "--limit", "2",
        ],
    );
    assert!(!ok && err.contains("allocation 300"), "{err}");

    let pool = rt.block_on(sqlx::PgPool::connect(pg.url())).expect("pool");
    let raise = rt.block_on(
        sqlx::query("UPDATE stockgate.sales SET allocation = allocation + 1 WHERE sku = $1")
            .bind(&parts[0])
            .execute(&pool),
    );
    let msg = format!(
        "{:?}",
        raise.expect_err("the database refuses a part beyond the parent")
    );
    assert!(
        msg.contains("SG005") || msg.contains("more than the parent"),
        "{msg}"
    );

    // --- storm ---
    const THREADS: usize = 8;
    const USERS: usize = 320;
    let results: Vec<Vec<(String, usize, String)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let parts = parts.clone();
                let cluster = &cluster;
                let keyring = keyring.clone();
                s.spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("rt");
                    rt.block_on(async {
                        let gates = gates(cluster, &parts).await;
                        let mut got = Vec::new();
                        for u in (t..USERS).step_by(THREADS) {
                            let user = format!("buyer-{u}");
                            for attempt in 0..3 {
                                let r = reserve_split(
                                    &gates,
                                    &parts,
                                    &user,
                                    1,
                                    |sku| keyring.mint(sku, &user, now_ms() + 600_000),
                                    &format!("r{attempt}"),
                                )
                                .await
                                .expect("reserve_split");
                                assert_eq!(r.tried[0], home_part(&user, 3));
                                match r.outcome {
                                    ReserveOutcome::Reserved { token, .. } => {
                                        got.push((user.clone(), r.part, token))
                                    }
                                    ReserveOutcome::SoldOut => {
                                        assert_eq!(r.tried.len(), 3, "a final SOLDOUT tried all");
                                        break;
                                    }
                                    ReserveOutcome::Limit { .. } => break,
                                    other => panic!("unexpected {other:?}"),
                                }
                            }
                        }
                        got
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("buyer thread"))
            .collect()
    });
    let all: Vec<_> = results.into_iter().flatten().collect();
    assert_eq!(all.len(), 300, "exactly the parent's allocation is sold");
    let tokens: HashSet<&str> = all.iter().map(|(_, _, t)| t.as_str()).collect();
    assert_eq!(tokens.len(), all.len(), "no token twice");
    let mut per_user_part: HashMap<(&str, usize), u32> = HashMap::new();
    for (u, p, t) in &all {
        assert!(
            t.starts_with(&format!("{{{}}}", parts[*p])),
            "{t} is of part {p}"
        );
        *per_user_part.entry((u.as_str(), *p)).or_default() += 1;
    }
    assert!(
        per_user_part.values().all(|&n| n <= 2),
        "the per-user limit holds on every part"
    );
    rt.block_on(async {
        let g = gates(&cluster, &parts).await;
        for (p, c) in parts.iter().zip(&g) {
            let info = c.sale_info(p).await.expect("info");
            assert_eq!((info.available, info.reserved), (0, 100), "{p}: {info:?}");
        }
    });

    // --- fall-over and rebalance ---
    let cold = split(
        &pg,
        seed,
        &[
            "--parent", "COLD", "--parts", "3", "--total", "30", "--shards", "1", "--ttl-ms", TTL,
        ],
    );
    rt.block_on(async {
        let g = gates(&cluster, &cold).await;
        let mint = |sku: &str, user: &str| keyring.mint(sku, user, now_ms() + 600_000);
        let out = g[0]
            .reserve(&cold[0], "whale", &mint(&cold[0], "whale"), "w1", 10)
            .await
            .expect("reserve");
        assert!(matches!(out, ReserveOutcome::Reserved { .. }), "{out:?}");
        // "user-7" is homed on part 0 of 3 (the shared vectors).
        assert_eq!(home_part("user-7", 3), 0);
        let r = reserve_split(&g, &cold, "user-7", 1, |s| mint(s, "user-7"), "a")
            .await
            .expect("reserve_split");
        assert_eq!((r.part, r.tried.clone()), (1, vec![0, 1]), "{r:?}");
        assert!(matches!(r.outcome, ReserveOutcome::Reserved { .. }));
    });
    let (ok, out, err) = sweeper(
        &pg,
        seed,
        &[
            "rebalance",
            "--parent",
            "COLD",
            "--threshold",
            "2",
            "--once",
        ],
    );
    assert!(ok, "rebalance failed:\n{out}\n{err}");
    assert!(
        out.contains("withdrew 5 from part 2") && out.contains("gave 5 to part 0"),
        "{out}"
    );
    rt.block_on(async {
        let g = gates(&cluster, &cold).await;
        let mut totals = Vec::new();
        for (p, c) in cold.iter().zip(&g) {
            totals.push(c.sale_info(p).await.expect("info").total);
        }
        assert_eq!(totals, vec![15, 10, 5], "moved, none created");
        let alloc: i64 = sqlx::query_scalar(
            "SELECT sum(s.allocation)::bigint FROM stockgate.split_parts sp \
             JOIN stockgate.sales s ON s.sku = sp.sku WHERE sp.parent = 'COLD'",
        )
        .fetch_one(&pool)
        .await
        .expect("sum");
        assert_eq!(alloc, 30, "the ledger's parts add up to the parent");
        let r = reserve_split(
            &g,
            &cold,
            "user-7",
            1,
            |s| keyring.mint(s, "user-7", now_ms() + 600_000),
            "b",
        )
        .await
        .expect("reserve_split");
        assert_eq!(r.part, 0, "the refilled home serves: {r:?}");
        assert!(matches!(r.outcome, ReserveOutcome::Reserved { .. }));
    });
    let (ok, out, _) = sweeper(&pg, seed, &["rebalance", "--parent", "COLD", "--once"]);
    assert!(ok && out.contains("nothing to move"), "{out}");

    // --- the database bound under concurrency (SQL by hand, last: it leaves the ledger
    // apart from the servers) ---
    rt.block_on(async {
        let set = |delta: i64, sku: &str| {
            sqlx::query("UPDATE stockgate.sales SET allocation = allocation + $1 WHERE sku = $2")
                .bind(delta)
                .bind(sku.to_string())
        };
        set(-2, &cold[1])
            .execute(&pool)
            .await
            .expect("a decrease is always allowed");
        // Two transactions each raising another part by the 2 spare units: the first
        // holds the parent's lock; the second waits for it, then sees the first's raise.
        let mut t1 = pool.begin().await.expect("begin");
        set(2, &cold[0])
            .execute(&mut *t1)
            .await
            .expect("first raise fits");
        let pool2 = pool.clone();
        let sku2 = cold[2].clone();
        let second = tokio::spawn(async move {
            let mut t2 = pool2.begin().await.expect("begin");
            let r = sqlx::query(
                "UPDATE stockgate.sales SET allocation = allocation + 2 WHERE sku = $1",
            )
            .bind(sku2)
            .execute(&mut *t2)
            .await;
            r.map(|_| ())
        });
        let t = Instant::now();
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND query LIKE 'UPDATE stockgate.sales%'",
            )
            .fetch_one(&pool)
            .await
            .expect("activity");
            if waiting > 0 {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "second raise never waited"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        t1.commit().await.expect("commit");
        let err = second
            .await
            .expect("task")
            .expect_err("the second raise would exceed the parent");
        assert!(format!("{err:?}").contains("SG005"), "{err:?}");
    });
}

/// A loop sweeper (`run --rebalance`) on the group of `port`, killed on drop.
fn loop_sweeper(pg: &TempPostgres, port: u16) -> stockgate_testkit::KillOnDrop {
    let child = Command::new(sweeper_bin())
        .arg("--database-url")
        .arg(pg.url())
        .arg("--server")
        .arg(format!("127.0.0.1:{port}"))
        .args(["run", "--interval-secs", "0.2", "--rebalance"])
        .env("STOCKGATE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn stockgate-sweeper");
    stockgate_testkit::KillOnDrop(child)
}

/// The parent's rebalance lock as `split::rebalance_locked` takes it.
const LOCK: &str =
    "SELECT pg_advisory_lock(hashtextextended('stockgate.rebalance:stockgate:LOOP', 0))";
const UNLOCK: &str =
    "SELECT pg_advisory_unlock(hashtextextended('stockgate.rebalance:stockgate:LOOP', 0))";

/// The parts' adjustments in the order they were recorded: (id, delta, status).
async fn adjustments(pool: &sqlx::PgPool, parts: &[String]) -> Vec<(String, i64, String)> {
    sqlx::query_as(
        "SELECT adjustment_id, delta, status FROM stockgate.sale_adjustments \
         WHERE sku = ANY($1) ORDER BY created_at, adjustment_id",
    )
    .bind(parts)
    .fetch_all(pool)
    .await
    .expect("adjustments")
}

/// Takes every unit part `i` has left, one per new user.
async fn drain(
    g: &StockgateClient,
    sku: &str,
    keyring: &stockgate_server::engine::Keyring,
    tag: &str,
) {
    for u in 0.. {
        let user = format!("{tag}-{u}");
        let adm = keyring.mint(sku, &user, now_ms() + 600_000);
        match g.reserve(sku, &user, &adm, "r", 1).await.expect("reserve") {
            ReserveOutcome::Reserved { .. } => {}
            ReserveOutcome::SoldOut => return,
            other => panic!("unexpected {other:?}"),
        }
    }
}

async fn wait_available(g: &StockgateClient, sku: &str, limit: Duration) -> i64 {
    let t = Instant::now();
    loop {
        let a = g.sale_info(sku).await.expect("info").available;
        if a > 0 {
            return a;
        }
        assert!(t.elapsed() < limit, "{sku} not refilled within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two groups, each with its own sweeper in loop mode with `--rebalance`, over a split
/// sale of two parts. While the test holds the parent's advisory lock, neither loop nor
/// a `run --once --rebalance` touches it (the part stays sold out, no adjustment is
/// recorded); once it is released, a part drained to 0 by buyers is refilled by the
/// loops within seconds, twice. Every withdrawal is followed by its gift before the next
/// withdrawal (no two passes at once), the parts' allocations add up to the parent's,
/// and every server's total is its part's ledger allocation.
#[test]
fn split_rebalanced_by_the_sweepers_loop_one_pass_at_a_time() {
    let rt = runtime();
    // The lock holder's pooled connection is dropped inside the runtime.
    let _in_rt = rt.enter();
    let pg = rt.block_on(TempPostgres::start()).expect("postgres");
    let cluster = Cluster::start(&[(0, 8191), (8192, 16383)]);
    let (a, b) = (cluster.nodes[0].port, cluster.nodes[1].port);
    let keyring = cluster.keys.keyring();
    let parts = split(
        &pg,
        a,
        &[
            "--parent", "LOOP", "--parts", "2", "--total", "40", "--shards", "1", "--ttl-ms", TTL,
        ],
    );
    // Both groups bound: A on first contact, B by name.
    let (ok, out, err) = sweeper(&pg, a, &["run", "--once"]);
    assert!(ok, "{out}\n{err}");
    let hb = rt.block_on(async {
        let c = StockgateClient::connect(&format!("127.0.0.1:{b}"))
            .await
            .expect("connect");
        c.history().await.expect("history").expect("a history")
    });
    let (ok, out, err) = sweeper(&pg, b, &["bind", "--history", &hb]);
    assert!(ok, "{out}\n{err}");

    let pool = rt.block_on(sqlx::PgPool::connect(pg.url())).expect("pool");
    let mut holder = rt.block_on(pool.acquire()).expect("connection");
    rt.block_on(sqlx::query(LOCK).execute(&mut *holder))
        .expect("lock");
    let g = rt.block_on(gates(&cluster, &parts));
    rt.block_on(drain(&g[0], &parts[0], &keyring, "first"));
    let (ok, out, err) = sweeper(&pg, a, &["run", "--once", "--rebalance"]);
    assert!(
        ok && out.contains("LOOP: skipped, another rebalancer is running a pass"),
        "{out}\n{err}"
    );
    let loops = [loop_sweeper(&pg, a), loop_sweeper(&pg, b)];
    std::thread::sleep(Duration::from_millis(1500));
    rt.block_on(async {
        assert_eq!(g[0].sale_info(&parts[0]).await.expect("info").available, 0);
        assert!(
            adjustments(&pool, &parts).await.is_empty(),
            "a pass ran under the lock"
        );
    });
    rt.block_on(sqlx::query(UNLOCK).execute(&mut *holder))
        .expect("unlock");
    rt.block_on(async {
        assert_eq!(
            wait_available(&g[0], &parts[0], Duration::from_secs(15)).await,
            10
        );
        drain(&g[0], &parts[0], &keyring, "second").await;
        assert_eq!(
            wait_available(&g[0], &parts[0], Duration::from_secs(15)).await,
            5
        );
        // A few more passes with nothing to move.
        tokio::time::sleep(Duration::from_millis(600)).await;
    });
    drop(loops);
    rt.block_on(async {
        let adj = adjustments(&pool, &parts).await;
        let deltas: Vec<i64> = adj.iter().map(|(_, d, _)| *d).collect();
        assert_eq!(deltas, vec![-10, 10, -5, 5], "{adj:?}");
        assert!(adj.iter().all(|(_, _, s)| s == "APPLIED"), "{adj:?}");
        for (id, d, _) in &adj {
            let way = if *d < 0 { "-out-" } else { "-in-" };
            assert!(id.starts_with("split-LOOP") && id.contains(way), "{id}");
        }
        let alloc: i64 = sqlx::query_scalar(
            "SELECT sum(s.allocation)::bigint FROM stockgate.split_parts sp \
             JOIN stockgate.sales s ON s.sku = sp.sku WHERE sp.parent = 'LOOP'",
        )
        .fetch_one(&pool)
        .await
        .expect("sum");
        assert_eq!(alloc, 40, "the ledger's parts add up to the parent");
        let mut on_servers = 0;
        for (p, c) in parts.iter().zip(&g) {
            let total = c.sale_info(p).await.expect("info").total;
            let ledger: i64 =
                sqlx::query_scalar("SELECT allocation FROM stockgate.sales WHERE sku = $1")
                    .bind(p)
                    .fetch_one(&pool)
                    .await
                    .expect("allocation");
            assert_eq!(total, ledger, "{p}: server total and ledger allocation");
            on_servers += total;
        }
        assert_eq!(on_servers, 40, "the servers' totals add up to the parent");
    });
}

/// Each part's (server total, ledger allocation), in index order.
async fn totals(pool: &sqlx::PgPool, g: &[StockgateClient], parts: &[String]) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    for (p, c) in parts.iter().zip(g) {
        let total = c.sale_info(p).await.expect("info").total;
        let ledger: i64 =
            sqlx::query_scalar("SELECT allocation FROM stockgate.sales WHERE sku = $1")
                .bind(p)
                .fetch_one(pool)
                .await
                .expect("allocation");
        out.push((total, ledger));
    }
    out
}

/// The parent's recorded part count and parts.
async fn recorded(pool: &sqlx::PgPool, parent: &str) -> (i32, Vec<(i32, String)>) {
    let n: i32 = sqlx::query_scalar("SELECT parts FROM stockgate.split_parents WHERE parent = $1")
        .bind(parent)
        .fetch_one(pool)
        .await
        .expect("parent");
    let parts = sqlx::query_as(
        "SELECT part_index, sku FROM stockgate.split_parts WHERE parent = $1 ORDER BY part_index",
    )
    .bind(parent)
    .fetch_all(pool)
    .await
    .expect("parts");
    (n, parts)
}

/// A split of 2 parts over 2 groups, 3 units sold on part 0, grown to 3 parts: the new
/// part is on group 0 (2 mod 2), starts with 0 units on its server and in the ledger, the
/// old parts keep theirs; a re-run changes nothing; fewer parts or other options are
/// refused; `rebalance --once` refills the empty part from the fullest; buyers through
/// `reserve_split` over the 3 parts are served on each part; the parts' ledger
/// allocations and servers' totals each add up to the parent's. Last, a growth that
/// stopped after making its part's sale on its server, and one refused while a group
/// was down, are each finished by the same command.
#[test]
fn split_grown_by_a_part_and_refilled() {
    let rt = runtime();
    let pg = rt.block_on(TempPostgres::start()).expect("postgres");
    let mut cluster = Cluster::start(&[(0, 8191), (8192, 16383)]);
    let seed = cluster.nodes[0].port;
    let keyring = cluster.keys.keyring();
    let pool = rt.block_on(sqlx::PgPool::connect(pg.url())).expect("pool");
    let args = |parts: &'static str| {
        [
            "--parent", "GROW", "--parts", parts, "--total", "20", "--shards", "1", "--ttl-ms", TTL,
        ]
    };
    let two = split(&pg, seed, &args("2"));
    assert_eq!(two.len(), 2, "{two:?}");
    rt.block_on(async {
        let g = gates(&cluster, &two).await;
        for u in 0..3 {
            let user = format!("early-{u}");
            let adm = keyring.mint(&two[0], &user, now_ms() + 600_000);
            let out = g[0]
                .reserve(&two[0], &user, &adm, "r", 1)
                .await
                .expect("reserve");
            assert!(matches!(out, ReserveOutcome::Reserved { .. }), "{out:?}");
        }
    });

    let three = split(&pg, seed, &args("3"));
    assert_eq!(three.len(), 3, "{three:?}");
    assert_eq!(three[..2], two[..], "the existing parts stay");
    assert!(three[2].starts_with("GROW.p2-"), "{}", three[2]);
    assert_eq!(cluster.owner(&three[2]), 0, "part 2 is on group 2 mod 2");
    let want_rows: Vec<(i32, String)> = (0..).zip(three.iter().cloned()).collect();
    rt.block_on(async {
        assert_eq!(recorded(&pool, "GROW").await, (3, want_rows.clone()));
        let g = gates(&cluster, &three).await;
        assert_eq!(
            totals(&pool, &g, &three).await,
            vec![(10, 10), (10, 10), (0, 0)]
        );
        let avail: Vec<i64> = {
            let mut v = Vec::new();
            for (p, c) in three.iter().zip(&g) {
                v.push(c.sale_info(p).await.expect("info").available);
            }
            v
        };
        assert_eq!(avail, vec![7, 10, 0], "the old parts keep their units");
    });
    assert_eq!(
        split(&pg, seed, &args("3")),
        three,
        "a re-run changes nothing"
    );
    rt.block_on(async {
        assert_eq!(recorded(&pool, "GROW").await, (3, want_rows.clone()));
        assert!(adjustments(&pool, &three).await.is_empty(), "nothing moved");
    });
    let (ok, _, err) = sweeper(&pg, seed, &{
        let mut a = vec!["split"];
        a.extend_from_slice(&args("1"));
        a
    });
    assert!(
        !ok && err.contains("recorded with 3 parts, asked 1") && err.contains("never fewer"),
        "{err}"
    );
    let (ok, _, err) = sweeper(
        &pg,
        seed,
        &[
            "split", "--parent", "GROW", "--parts", "4", "--total", "20", "--shards", "2",
            "--ttl-ms", TTL,
        ],
    );
    assert!(!ok && err.contains("(shards, ttl-ms, limit)"), "{err}");
    rt.block_on(async {
        assert_eq!(
            recorded(&pool, "GROW").await,
            (3, want_rows.clone()),
            "refusals change nothing"
        );
    });

    let (ok, out, err) = sweeper(
        &pg,
        seed,
        &[
            "rebalance",
            "--parent",
            "GROW",
            "--threshold",
            "0",
            "--once",
        ],
    );
    assert!(ok, "rebalance failed:\n{out}\n{err}");
    assert!(
        out.contains("withdrew 5 from part 1") && out.contains("gave 5 to part 2"),
        "the empty new part is refilled from the fullest: {out}"
    );
    rt.block_on(async {
        let g = gates(&cluster, &three).await;
        let t = totals(&pool, &g, &three).await;
        assert_eq!(t, vec![(10, 10), (5, 5), (5, 5)]);
        assert_eq!(
            t.iter().map(|x| x.0).sum::<i64>(),
            20,
            "servers add up to the parent"
        );
        assert_eq!(
            t.iter().map(|x| x.1).sum::<i64>(),
            20,
            "ledger adds up to the parent"
        );
        for home in 0..3 {
            let user = (0..)
                .map(|u| format!("late-{u}"))
                .find(|u| home_part(u, 3) == home)
                .expect("a user of each home");
            let r = reserve_split(
                &g,
                &three,
                &user,
                1,
                |s| keyring.mint(s, &user, now_ms() + 600_000),
                "x",
            )
            .await
            .expect("reserve_split");
            assert_eq!((r.part, r.tried.clone()), (home, vec![home]), "{r:?}");
            match r.outcome {
                ReserveOutcome::Reserved { token, .. } => assert!(
                    token.starts_with(&format!("{{{}}}", three[home])),
                    "{token} is of part {home}"
                ),
                other => panic!("part {home}: {other:?}"),
            }
        }
    });

    // A growth to 4 that stopped before its ledger transaction: part 3's sale made on its
    // group (1) with 0 units, not yet registered nor a part.
    let p3 = stockgate_tools::split::part_sku("GROW", 3, |s| s >= 8192).expect("sku");
    rt.block_on(async {
        let g = gates(&cluster, std::slice::from_ref(&p3)).await;
        g[0].sale_create(&p3, 0, Some(1), Some(600_000), None)
            .await
            .expect("create");
    });
    let four = split(&pg, seed, &args("4"));
    assert_eq!(four[..3], three[..], "{four:?}");
    assert_eq!(four[3], p3);
    rt.block_on(async {
        let (n, rows) = recorded(&pool, "GROW").await;
        assert_eq!((n, rows.len()), (4, 4));
        let g = gates(&cluster, &four).await;
        let t = totals(&pool, &g, &four).await;
        assert_eq!(t, vec![(10, 10), (5, 5), (5, 5), (0, 0)]);
    });

    // A growth to 6 with group 1 down: its recorded parts cannot be checked, the command
    // fails and the split stays of 4 parts; once group 1 is back the same command
    // finishes.
    cluster.nodes[1].kill9();
    let (ok, _, err) = sweeper(&pg, seed, &{
        let mut a = vec!["split"];
        a.extend_from_slice(&args("6"));
        a
    });
    let down = format!("node 127.0.0.1:{} cannot be reached", cluster.nodes[1].port);
    assert!(
        !ok && err.contains(&down),
        "a growth with a group down fails: {err}"
    );
    rt.block_on(async {
        let (n, rows) = recorded(&pool, "GROW").await;
        assert_eq!((n, rows.len()), (4, 4), "nothing recorded: {err}");
    });
    cluster.nodes[1].restart();
    let six = split(&pg, seed, &args("6"));
    assert_eq!(six[..4], four[..], "{six:?}");
    rt.block_on(async {
        let (n, rows) = recorded(&pool, "GROW").await;
        assert_eq!((n, rows.len()), (6, 6));
        let g = gates(&cluster, &six).await;
        let t = totals(&pool, &g, &six).await;
        assert_eq!(t, vec![(10, 10), (5, 5), (5, 5), (0, 0), (0, 0), (0, 0)]);
    });
}

/// A split of 48 units over three parts on the default 16 shards each (one unit a shard)
/// sells every unit two at a time: a part answers `QTY 2` whenever it has two units,
/// wherever its shards hold them, and the buyers after the last pair meet SOLDOUT.
#[test]
fn split_sells_every_unit_two_at_a_time() {
    let rt = runtime();
    let pg = rt.block_on(TempPostgres::start()).expect("postgres");
    let cluster = Cluster::start(&[(0, 8191), (8192, 16383)]);
    let seed = cluster.nodes[0].port;
    let keyring = cluster.keys.keyring();
    let parts = split(
        &pg,
        seed,
        &[
            "--parent", "PAIR", "--parts", "3", "--total", "48", "--ttl-ms", TTL,
        ],
    );
    assert_eq!(parts.len(), 3, "{parts:?}");
    rt.block_on(async {
        let g = gates(&cluster, &parts).await;
        let mut pairs = 0;
        for u in 0..26 {
            let user = format!("pair-{u}");
            let r = reserve_split(
                &g,
                &parts,
                &user,
                2,
                |sku| keyring.mint(sku, &user, now_ms() + 600_000),
                "r",
            )
            .await
            .expect("reserve_split");
            match r.outcome {
                ReserveOutcome::Reserved { .. } => pairs += 1,
                ReserveOutcome::SoldOut => assert!(pairs == 24, "SOLDOUT after {pairs} pairs"),
                other => panic!("{user}: {other:?}"),
            }
        }
        assert_eq!(pairs, 24, "48 units, two at a time");
        for (p, c) in parts.iter().zip(&g) {
            let info = c.sale_info(p).await.expect("info");
            assert_eq!(info.shards, 16, "{p}: one unit a shard at the start");
            assert_eq!((info.available, info.reserved), (0, 16), "{p}");
        }
    });
}
