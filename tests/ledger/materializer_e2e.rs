//! The materializer against the real server and a real Postgres: a reservation storm
//! whose application never writes an order (it "dies" right after RESERVE), the
//! materializer SIGKILLed at random points and restarted; at the end every reservation
//! has exactly one order, in the right status, and the position equals the log's end.

use std::collections::{HashMap, HashSet};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::Rng;
use sqlx::Row;
use stockgate_client::types::ReserveOutcome;
use stockgate_testkit::{workspace_root, Harness};

fn materializer(h: &Harness, extra: &[&str]) -> Command {
    let mut c = Command::new(workspace_root().join("target/debug/stockgate-materializer"));
    c.arg("--database-url")
        .arg(h.pg.url())
        .arg("--server")
        .arg(h.server.addr())
        .args(if extra.contains(&"--batch") {
            &[][..]
        } else {
            &["--batch", "500"][..]
        })
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    c
}

fn kill9(child: &mut Child) {
    // SAFETY: signalling a child process we spawned and have not reaped.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGKILL);
    }
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn materializer_exactly_once_across_sigkills() {
    let h = Harness::start().await.expect("harness");
    h.create_sale_sharded("MAT", 100_000, 4, 600_000, None)
        .await
        .unwrap();
    const N: usize = 3000;
    // The storm: RESERVE only (no order written by the app), some COMMIT/RELEASE on the
    // server afterwards.
    let storm = {
        let client = h.client.clone();
        let keys: Vec<String> = (0..N)
            .map(|i| h.keys.admission("MAT", &format!("u{i}"), 600_000))
            .collect();
        tokio::spawn(async move {
            let mut toks = Vec::with_capacity(N);
            for chunk in keys.chunks(50).enumerate() {
                let (c, adms) = chunk;
                let mut futs = Vec::new();
                for (j, adm) in adms.iter().enumerate() {
                    let i = c * 50 + j;
                    let client = client.clone();
                    let adm = adm.clone();
                    futs.push(tokio::spawn(async move {
                        client
                            .reserve("MAT", &format!("u{i}"), &adm, &format!("r{i}"), 1)
                            .await
                    }));
                }
                for f in futs {
                    match f.await.unwrap().expect("reserve") {
                        ReserveOutcome::Reserved { token, .. } => toks.push(token),
                        other => panic!("{other:?}"),
                    }
                }
            }
            let mut committed = HashSet::new();
            let mut released = HashSet::new();
            for (i, t) in toks.iter().enumerate() {
                if i % 10 == 0 {
                    client.commit(t).await.expect("commit");
                    committed.insert(t.clone());
                } else if i % 7 == 0 {
                    assert!(client.release(t).await.expect("release"));
                    released.insert(t.clone());
                }
            }
            (toks, committed, released)
        })
    };
    // The materializer, killed at random points while the storm runs.
    let mut rng = rand::thread_rng();
    let mut kills = 0;
    let t0 = Instant::now();
    while !storm.is_finished() || kills < 5 {
        let mut child = materializer(&h, &[]).spawn().expect("spawn materializer");
        std::thread::sleep(Duration::from_millis(rng.gen_range(150..700)));
        kill9(&mut child);
        kills += 1;
        assert!(t0.elapsed() < Duration::from_secs(120), "storm too slow");
    }
    let (toks, committed, released) = storm.await.unwrap();
    // Let it finish: --drain exits once the feed has nothing new.
    let out = materializer(&h, &["--drain"]).output().expect("drain");
    assert!(out.status.success(), "{out:?}");

    let pool = h.ledger.pool();
    let rows = sqlx::query("SELECT reservation_token, status FROM orders WHERE sku = 'MAT'")
        .fetch_all(pool)
        .await
        .unwrap();
    let mut status: HashMap<String, String> = HashMap::new();
    for r in &rows {
        let t: String = r.get(0);
        assert!(status.insert(t, r.get(1)).is_none(), "duplicate order");
    }
    assert_eq!(rows.len(), toks.len(), "one order per reservation");
    for t in &toks {
        let want = if committed.contains(t) {
            "COMMITTED"
        } else if released.contains(t) {
            "CANCELLED"
        } else {
            "PENDING"
        };
        assert_eq!(status.get(t).map(String::as_str), Some(want), "{t}");
    }
    // One PENDING audit row per order: nothing was inserted twice.
    let audits: i64 = sqlx::query(
        "SELECT count(*) FROM order_events WHERE to_status = 'PENDING' AND actor = 'materializer'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
    .get(0);
    assert_eq!(audits as usize, toks.len());
    // The position equals the log's end.
    let pos: i64 =
        sqlx::query("SELECT last_lsn FROM feed_position WHERE consumer = 'materializer'")
            .fetch_one(pool)
            .await
            .unwrap()
            .get(0);
    let mut con = redis::Client::open(format!("redis://{}", h.server.addr()))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let info: HashMap<String, redis::Value> = redis::cmd("XINFO")
        .arg("STREAM")
        .arg("stockgate:events")
        .query_async(&mut con)
        .await
        .unwrap();
    let last = match info.get("last-generated-id") {
        Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        other => panic!("{other:?}"),
    };
    assert_eq!(last, format!("{pos}-0"));
    eprintln!(
        "materializer: {kills} SIGKILLs, {} orders, position {pos}",
        toks.len()
    );

    // Throughput: a backlog of reservations, drained by one materializer.
    const M: usize = 20_000;
    let mut futs = Vec::new();
    for i in 0..M {
        let client = h.client.clone();
        let adm = h.keys.admission("MAT", &format!("b{i}"), 600_000);
        futs.push(tokio::spawn(async move {
            client
                .reserve("MAT", &format!("b{i}"), &adm, "x", 1)
                .await
                .expect("reserve")
        }));
        if futs.len() == 200 {
            for f in std::mem::take(&mut futs) {
                f.await.unwrap();
            }
        }
    }
    for f in futs {
        f.await.unwrap();
    }
    let t = Instant::now();
    let out = materializer(&h, &["--drain", "--batch", "5000"])
        .output()
        .expect("drain");
    assert!(out.status.success(), "{out:?}");
    let secs = t.elapsed().as_secs_f64();
    let n: i64 = sqlx::query("SELECT count(*) FROM orders WHERE sku = 'MAT'")
        .fetch_one(pool)
        .await
        .unwrap()
        .get(0);
    assert_eq!(n as usize, toks.len() + M);
    eprintln!(
        "materializer throughput: {M} orders in {secs:.2}s = {:.0}/s (debug build, incl. process start)",
        M as f64 / secs
    );
}

/// Calls that failed and were retried (the server's kill hit them in flight).
static RETRIED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Retries `f` until it succeeds: the server is `kill -9`ed and restarted under the
/// storm, so a call can fail on a dead connection. Every call here is idempotent (a
/// retried RESERVE with the same request id is a REPLAY of the same token; a repeated
/// COMMIT/RELEASE changes nothing), which is what makes "retry until answered" safe.
async fn until_answered<T, E: std::fmt::Debug, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) => {
                RETRIED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                assert!(
                    Instant::now() < deadline,
                    "{what}: no answer for 60 s: {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The same storm, but the *server* is `kill -9`ed once too (while a materializer runs,
/// between its SIGKILLs) and restarted on its data dir. Every reservation the server
/// acknowledged must end with exactly one order in the right status, and the consumed
/// position must equal the log's end: a materializer that lost its place across the
/// restart (skipped entries) or applied a batch twice (audit rows doubled) fails here.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn materializer_exactly_once_across_server_kill() {
    let mut h = Harness::start().await.expect("harness");
    h.create_sale_sharded("SRV", 100_000, 4, 600_000, None)
        .await
        .unwrap();
    const N: usize = 4000;
    const CHUNK: usize = 50;
    let storm = {
        let client = h.client.clone();
        let keys: Vec<String> = (0..N)
            .map(|i| h.keys.admission("SRV", &format!("u{i}"), 600_000))
            .collect();
        tokio::spawn(async move {
            let mut toks = vec![String::new(); N];
            let (mut committed, mut released) = (HashSet::new(), HashSet::new());
            for c in 0..N / CHUNK {
                let mut futs = Vec::new();
                for (i, adm) in keys.iter().enumerate().skip(c * CHUNK).take(CHUNK) {
                    let client = client.clone();
                    let adm = adm.clone();
                    futs.push(tokio::spawn(async move {
                        let (u, r) = (format!("u{i}"), format!("r{i}"));
                        let out =
                            until_answered("reserve", || client.reserve("SRV", &u, &adm, &r, 1))
                                .await;
                        (i, out)
                    }));
                }
                for f in futs {
                    let (i, out) = f.await.unwrap();
                    // A REPLAY: the first attempt was logged but its reply was lost
                    // with the server; the retry is told the same token.
                    match out {
                        ReserveOutcome::Reserved { token, .. }
                        | ReserveOutcome::Replay { token, .. } => toks[i] = token,
                        other => panic!("u{i}: {other:?}"),
                    }
                }
                // Commits and releases interleave with the reserves, so some of them
                // also straddle the server's kill.
                for (i, t) in toks.iter().enumerate().skip(c * CHUNK).take(CHUNK) {
                    if i % 10 == 0 {
                        until_answered("commit", || client.commit(t)).await;
                        committed.insert(t.clone());
                    } else if i % 7 == 0 {
                        // `false` on a retry whose first attempt was applied: still released.
                        until_answered("release", || client.release(t)).await;
                        released.insert(t.clone());
                    }
                }
                // Paced so the storm outlasts several materializer lives and the restart.
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            (toks, committed, released)
        })
    };
    let mut rng = rand::thread_rng();
    let (mut kills, mut server_killed_mid_storm) = (0, false);
    let addr = h.server.addr().to_owned();
    let t0 = Instant::now();
    while !storm.is_finished() || kills < 12 || !server_killed_mid_storm {
        assert!(
            kills < 15 || !storm.is_finished() || server_killed_mid_storm,
            "the storm ended before the server could be killed in it"
        );
        let mut child = materializer(&h, &[]).spawn().expect("spawn materializer");
        std::thread::sleep(Duration::from_millis(rng.gen_range(50..400)));
        if kills == 2 && !server_killed_mid_storm {
            // The server dies under a running materializer (its XREAD, or a batch it is
            // writing, loses the connection) and under the storm's in-flight requests.
            server_killed_mid_storm = !storm.is_finished();
            h.server.kill();
            std::thread::sleep(Duration::from_millis(rng.gen_range(100..400)));
            h.server.restart().expect("restart server");
            assert_eq!(h.server.addr(), addr, "server came back on another port");
            std::thread::sleep(Duration::from_millis(rng.gen_range(150..700)));
        }
        kill9(&mut child);
        kills += 1;
        assert!(t0.elapsed() < Duration::from_secs(180), "storm too slow");
    }
    let (toks, committed, released) = storm.await.unwrap();
    let out = materializer(&h, &["--drain"]).output().expect("drain");
    assert!(out.status.success(), "{out:?}");

    let pool = h.ledger.pool();
    let rows = sqlx::query("SELECT reservation_token, status FROM orders WHERE sku = 'SRV'")
        .fetch_all(pool)
        .await
        .unwrap();
    let mut status: HashMap<String, String> = HashMap::new();
    for r in &rows {
        let t: String = r.get(0);
        assert!(status.insert(t, r.get(1)).is_none(), "duplicate order");
    }
    let distinct: HashSet<&String> = toks.iter().collect();
    assert_eq!(distinct.len(), N, "a token handed out twice");
    let missing = toks.iter().filter(|t| !status.contains_key(*t)).count();
    assert_eq!(missing, 0, "acknowledged reservations with no order");
    assert_eq!(rows.len(), N, "orders for reservations never acknowledged");
    for t in &toks {
        let want = if committed.contains(t) {
            "COMMITTED"
        } else if released.contains(t) {
            "CANCELLED"
        } else {
            "PENDING"
        };
        assert_eq!(status.get(t).map(String::as_str), Some(want), "{t}");
    }
    // Each transition was applied once: one audit row per order and per status change.
    let audits: Vec<(String, i64)> = sqlx::query(
        "SELECT e.to_status, count(*) FROM order_events e JOIN orders o USING (reservation_token) \
         WHERE o.sku = 'SRV' AND e.actor = 'materializer' GROUP BY e.to_status",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect();
    let audit = |s: &str| audits.iter().find(|(k, _)| k == s).map_or(0, |(_, n)| *n) as usize;
    assert_eq!(audit("PENDING"), N, "{audits:?}");
    assert_eq!(audit("COMMITTED"), committed.len(), "{audits:?}");
    assert_eq!(audit("CANCELLED"), released.len(), "{audits:?}");
    let pos: i64 =
        sqlx::query("SELECT last_lsn FROM feed_position WHERE consumer = 'materializer'")
            .fetch_one(pool)
            .await
            .unwrap()
            .get(0);
    let mut con = redis::Client::open(format!("redis://{}", h.server.addr()))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let info: HashMap<String, redis::Value> = redis::cmd("XINFO")
        .arg("STREAM")
        .arg("stockgate:events")
        .query_async(&mut con)
        .await
        .unwrap();
    let last = match info.get("last-generated-id") {
        Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        other => panic!("{other:?}"),
    };
    assert_eq!(last, format!("{pos}-0"));
    eprintln!(
        "materializer: {kills} SIGKILLs, 1 server SIGKILL mid-storm ({} calls retried), \
         {N} orders ({} committed, {} cancelled), position {pos}",
        RETRIED.load(std::sync::atomic::Ordering::Relaxed),
        committed.len(),
        released.len()
    );
}

/// `INFO errorstats` as (error code, count) pairs: what the dashboards' error panels show.
async fn errorstats(con: &mut redis::aio::MultiplexedConnection) -> Vec<(String, i64)> {
    let text: String = redis::cmd("INFO")
        .arg("errorstats")
        .query_async(con)
        .await
        .expect("INFO errorstats");
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("errorstat_"))
        .filter_map(|l| {
            let (code, n) = l.split_once(":count=")?;
            Some((code.to_string(), n.parse().ok()?))
        })
        .collect()
}

/// A materializer's first start against a server and a ledger that never saw one (no
/// position row, no feed hold) sends no command the server answers with an error: an
/// operator's error panel stays empty. Its second start neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn first_start_leaves_no_error_replies() {
    let h = Harness::start().await.expect("harness");
    h.create_sale("CLEAN", 10, 600_000, None).await.unwrap();
    let adm = h.keys.admission("CLEAN", "u1", 600_000);
    h.client
        .reserve("CLEAN", "u1", &adm, "r1", 1)
        .await
        .expect("reserve");
    let mut con = redis::Client::open(format!("redis://{}", h.server.addr()))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let before = errorstats(&mut con).await;
    for start in ["first", "second"] {
        // A running materializer (the service), then a drain: between them every step of
        // a start and of a batch ran at least once.
        let mut child = materializer(&h, &[]).spawn().expect("spawn materializer");
        let pool = h.ledger.pool();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let orders: i64 = sqlx::query("SELECT count(*) FROM orders WHERE sku = 'CLEAN'")
                .fetch_one(pool)
                .await
                .unwrap()
                .get(0);
            if orders == 1 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{start} start: no order materialized"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        kill9(&mut child);
        let out = materializer(&h, &["--drain"]).output().expect("drain");
        assert!(out.status.success(), "{start} start: {out:?}");
        assert_eq!(
            errorstats(&mut con).await,
            before,
            "{start} start: the materializer's commands were answered with errors"
        );
    }
    let total: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(
        total.lines().any(|l| l.trim() == "total_error_replies:0"),
        "error replies counted:\n{total}"
    );
}
