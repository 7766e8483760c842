//! Server-side repairs, over the real binary:
//! - a paid (or cancelled) request whose record retention purged still REPLAYs with its
//!   token and never takes stock again, also after a restart from the log and from a
//!   snapshot, and its units still count towards the per-user limit;
//! - a missing reservation key is never silently re-created over existing state, and a
//!   named key file is created only with `--create-keys`;
//! - `SALE.ADJUST` refuses deltas beyond any total, `i64::MIN` included;
//! - `SALE.INFO` is never torn under concurrent RESERVE / RELEASE / COMMIT.

use std::time::Duration;

use crate::common::*;
use redis::aio::MultiplexedConnection;
use redis::Value;

async fn reserve(
    c: &mut MultiplexedConnection,
    s: &Server,
    sku: &str,
    user: &str,
    rid: &str,
) -> Vec<Value> {
    let adm = s.keyring().mint(sku, user, now_ms() + 600_000);
    match cmd(c, &["RESERVE", sku, user, &adm, rid]).await.unwrap() {
        Value::Array(items) => items,
        other => panic!("{other:?}"),
    }
}

async fn info_int(c: &mut MultiplexedConnection, sku: &str, f: &str) -> i64 {
    let info = cmd(c, &["SALE.INFO", sku]).await.unwrap();
    as_int(&field(&info, f).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purged_requests_replay_and_keep_counting_towards_the_limit() {
    let dir = TempDir::new("tomb");
    let flags = ["--retention-ms", "300"];
    let mut s = Server::start_in(dir.path(), &flags);
    let mut c = s.conn().await;
    cmd(&mut c, &["SALE.CREATE", "S", "10", "LIMIT", "1"])
        .await
        .unwrap();
    let paid = reserve(&mut c, &s, "S", "alice", "order-1").await;
    assert_eq!(as_str(&paid[0]), "RESERVED");
    let token = as_str(&paid[1]);
    assert_eq!(
        cmd(&mut c, &["COMMIT", &token]).await.unwrap(),
        Value::Int(1)
    );
    let cancelled = reserve(&mut c, &s, "S", "bob", "order-2").await;
    let ctoken = as_str(&cancelled[1]);
    assert_eq!(
        cmd(&mut c, &["RELEASE", &ctoken]).await.unwrap(),
        Value::Int(1)
    );
    // Retention (300 ms, housekeeping once a second) purges both records.
    let t0 = std::time::Instant::now();
    while cmd(&mut c, &["RESERVATION", &token]).await.unwrap() != Value::Nil {
        assert!(t0.elapsed() < Duration::from_secs(10), "never purged");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    while cmd(&mut c, &["RESERVATION", &ctoken]).await.unwrap() != Value::Nil {
        assert!(t0.elapsed() < Duration::from_secs(10), "never purged");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    async fn check(c: &mut MultiplexedConnection, s: &Server, token: &str, ctoken: &str) {
        let again = reserve(c, s, "S", "alice", "order-1").await;
        assert_eq!(
            as_str(&again[0]),
            "REPLAY",
            "a paid request took stock again"
        );
        assert_eq!(as_str(&again[1]), token);
        let other = reserve(c, s, "S", "alice", "order-3").await;
        assert_eq!(as_str(&other[0]), "LIMIT", "the paid unit no longer counts");
        let bob = reserve(c, s, "S", "bob", "order-2").await;
        assert_eq!(as_str(&bob[0]), "REPLAY");
        assert_eq!(as_str(&bob[1]), ctoken);
        // The sweeper's view of a purged token: COMMIT says how it ended.
        assert_eq!(cmd(c, &["COMMIT", token]).await.unwrap(), Value::Int(0));
        let err = cmd(c, &["COMMIT", ctoken]).await.unwrap_err();
        assert_eq!(err.code(), Some("RELEASED"));
        assert_eq!(info_int(c, "S", "available").await, 9);
        assert_eq!(info_int(c, "S", "committed").await, 1);
    }
    check(&mut c, &s, &token, &ctoken).await;
    // Restart: the tombstones come back from the log.
    assert_eq!(s.terminate(), Some(0));
    let mut s = Server::start_in(dir.path(), &flags);
    let mut c = s.conn().await;
    check(&mut c, &s, &token, &ctoken).await;
    // And from a snapshot (SAVE, then kill -9: recovery loads the snapshot).
    assert_eq!(cmd(&mut c, &["SAVE"]).await.unwrap(), Value::Okay);
    s.kill9();
    let s = Server::start_in(dir.path(), &flags);
    let mut c = s.conn().await;
    check(&mut c, &s, &token, &ctoken).await;
}

#[test]
fn a_missing_reservation_key_is_never_recreated_over_state() {
    let dir = TempDir::new("rkey");
    let fp = {
        let mut s = Server::start_in(dir.path(), &[]);
        let rt = tokio::runtime::Runtime::new().unwrap();
        let fp = rt.block_on(async {
            let mut c = s.conn().await;
            cmd(&mut c, &["SALE.CREATE", "S", "10"]).await.unwrap();
            reserve(&mut c, &s, "S", "alice", "r1").await;
            let info = cmd(&mut c, &["SALE.INFO", "S"]).await.unwrap();
            as_str(&field(&info, "key_fingerprint").unwrap())
        });
        assert_eq!(s.terminate(), Some(0));
        fp
    };
    let key = dir.path().join("reservation.key");
    let saved = std::fs::read(&key).unwrap();
    std::fs::remove_file(&key).unwrap();
    let err = match try_start_in(dir.path(), &[]) {
        Ok(_) => panic!("started with a new reservation key over existing state"),
        Err(e) => e,
    };
    assert_ne!(err.code, Some(0));
    assert!(err.stderr.contains("reservation.key"), "{}", err.stderr);
    assert!(
        err.stderr.contains(&fp),
        "names the expected fingerprint: {}",
        err.stderr
    );
    assert!(!key.exists(), "no key file was created");
    // A different key is refused too.
    std::fs::write(&key, [7u8; 32]).unwrap();
    let err = match try_start_in(dir.path(), &[]) {
        Ok(_) => panic!("started with another reservation key"),
        Err(e) => e,
    };
    assert!(err.stderr.contains(&fp), "{}", err.stderr);
    // The right key: starts, and the reservation's retry replays.
    std::fs::write(&key, &saved).unwrap();
    let s = try_start_in(dir.path(), &[]).unwrap_or_else(|e| panic!("{}", e.stderr));
    drop(s);

    // A key file named on the command line is never created unless asked to...
    let fresh = TempDir::new("rkey-named");
    let named = fresh.path().join("keys").join("rkey");
    let named_s = named.display().to_string();
    let data = fresh.path().join("data");
    let err = match try_start_in(&data, &["--reservation-key-file", &named_s]) {
        Ok(_) => panic!("created a named key file without --create-keys"),
        Err(e) => e,
    };
    assert!(err.stderr.contains("--create-keys"), "{}", err.stderr);
    assert!(!named.exists());
    // ...and with --create-keys, only for a data dir with no state.
    let s = try_start_in(
        &data,
        &["--reservation-key-file", &named_s, "--create-keys"],
    )
    .unwrap_or_else(|e| panic!("{}", e.stderr));
    drop(s);
    assert!(named.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adjust_refuses_deltas_beyond_any_total() {
    let dir = TempDir::new("adjust");
    let mut s = Server::start_in(dir.path(), &[]);
    let mut c = s.conn().await;
    cmd(&mut c, &["SALE.CREATE", "S", "100", "SHARDS", "4"])
        .await
        .unwrap();
    for d in [
        "-9223372036854775808",
        "9223372036854775807",
        "-9223372036854775807",
        "1099511627777",
    ] {
        let r = cmd(&mut c, &["SALE.ADJUST", "S", d]).await;
        assert!(r.is_err(), "SALE.ADJUST {d} accepted: {r:?}");
    }
    assert_eq!(
        cmd(&mut c, &["SALE.ADJUST", "S", "-40"]).await.unwrap(),
        Value::Int(60)
    );
    assert_eq!(s.terminate(), Some(0));
    let s = Server::start_in(dir.path(), &[]);
    let mut c = s.conn().await;
    assert_eq!(info_int(&mut c, "S", "total").await, 60);
    assert_eq!(info_int(&mut c, "S", "available").await, 60);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sale_info_is_never_torn_under_load() {
    let s = Server::start(&["--fsync", "no", "--threads", "2"]);
    let mut c = s.conn().await;
    cmd(&mut c, &["SALE.CREATE", "S", "100000", "SHARDS", "4"])
        .await
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..3 {
        let mut wc = s.conn().await;
        let keys = s.keyring();
        // Tokens are derived by the server's reservation key; RELEASE/COMMIT need them.
        let rkey = reservation_key(&s.data_dir);
        let stop = stop.clone();
        workers.push(tokio::spawn(async move {
            let mut round = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Pipelines of RESERVEs, then of their RELEASE/COMMIT: both server threads
                // are always mid-transition while SALE.INFO reads.
                let mut p = redis::pipe();
                let mut tokens = Vec::new();
                for i in 0..64u64 {
                    let user = format!("u{w}-{i}");
                    let adm = keys.mint("S", &user, now_ms() + 600_000);
                    let rid = format!("r{w}-{round}-{i}");
                    tokens.push(rkey.derive("S", &user, &rid));
                    p.cmd("RESERVE").arg("S").arg(&user).arg(&adm).arg(&rid);
                }
                let _: Vec<Value> = p.query_async(&mut wc).await.unwrap();
                let mut p = redis::pipe();
                for (i, t) in tokens.iter().enumerate() {
                    p.cmd(if i.is_multiple_of(7) {
                        "COMMIT"
                    } else {
                        "RELEASE"
                    })
                    .arg(t);
                }
                let _: Vec<Value> = p.query_async(&mut wc).await.unwrap();
                round += 1;
            }
        }));
    }
    let mut checked = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while checked < 40_000 && std::time::Instant::now() < deadline {
        let mut p = redis::pipe();
        for _ in 0..200 {
            p.cmd("SALE.INFO").arg("S");
        }
        let infos: Vec<Value> = p.query_async(&mut c).await.unwrap();
        for info in infos {
            let get = |f: &str| as_int(&field(&info, f).unwrap());
            assert_eq!(
                get("available") + get("reserved") + get("committed"),
                get("total"),
                "torn SALE.INFO after {checked} consistent reads: {info:?}"
            );
            checked += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    assert!(checked >= 2_000, "only {checked} reads");
}
