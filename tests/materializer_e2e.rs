//! The materializer against the real server and a real Postgres: a reservation storm
//! whose application never writes an order (it "dies" right after RESERVE), the
//! materializer SIGKILLed at random points and restarted; at the end every reservation
//! has exactly one order, in the right status, and the position equals the log's end.

use std::collections::{HashMap, HashSet};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::Rng;
use sqlx::Row;
use stockgate_client::testkit::{workspace_root, Harness};
use stockgate_client::types::ReserveOutcome;

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
