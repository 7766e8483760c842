//! The storm: 10,000 distinct users over 1,000 concurrent connections race for 1,000
//! units in 16 shards against the real server. Exactly 1,000 win, no token twice, no
//! shard below zero; releasing 100 lets exactly 100 more through. And a race of 8
//! connections releasing the same expired token yields exactly one `:1`.

use std::collections::HashSet;
use std::sync::Arc;

use crate::common::*;
use redis::Value;

async fn reserve(
    c: &mut redis::aio::MultiplexedConnection,
    sku: &str,
    user: &str,
    tok: &str,
    rid: &str,
) -> Vec<Value> {
    match cmd(c, &["RESERVE", sku, user, tok, rid])
        .await
        .expect("reserve")
    {
        Value::Array(v) => v,
        other => panic!("unexpected {other:?}"),
    }
}

async fn wave(
    srv: &Server,
    keys: &Arc<stockgate_server::engine::Keyring>,
    sku: &str,
    users: Vec<String>,
    conns: usize,
) -> (Vec<String>, usize) {
    let exp = now_ms() + 600_000;
    let chunks: Vec<Vec<String>> = users
        .chunks(users.len().div_ceil(conns))
        .map(|c| c.to_vec())
        .collect();
    // Open every connection before anyone reserves, so the race really is concurrent.
    let mut cs = Vec::new();
    for _ in 0..chunks.len() {
        cs.push(srv.conn().await);
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(chunks.len()));
    let mut tasks = Vec::new();
    for (users, mut c) in chunks.into_iter().zip(cs) {
        let (keys, barrier, sku) = (keys.clone(), barrier.clone(), sku.to_string());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut won = Vec::new();
            let mut soldout = 0;
            for u in users {
                let tok = keys.mint(&sku, &u, exp);
                let r = reserve(&mut c, &sku, &u, &tok, "req-1").await;
                match as_str(&r[0]).as_str() {
                    "RESERVED" => won.push(as_str(&r[1])),
                    "SOLDOUT" => soldout += 1,
                    other => panic!("unexpected outcome {other}"),
                }
            }
            (won, soldout)
        }));
    }
    let mut won = Vec::new();
    let mut soldout = 0;
    for t in tasks {
        let (w, s) = t.await.expect("task");
        won.extend(w);
        soldout += s;
    }
    (won, soldout)
}

async fn check_sale(c: &mut redis::aio::MultiplexedConnection, sku: &str) -> (i64, i64, i64, i64) {
    let info = cmd(c, &["SALE.INFO", sku]).await.unwrap();
    let shards = match field(&info, "shard_available").unwrap() {
        Value::Array(v) => v.iter().map(as_int).collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    assert!(
        shards.iter().all(|&s| s >= 0),
        "a shard went negative: {shards:?}"
    );
    let total = as_int(&field(&info, "total").unwrap());
    let available = as_int(&field(&info, "available").unwrap());
    let reserved = as_int(&field(&info, "reserved").unwrap());
    let committed = as_int(&field(&info, "committed").unwrap());
    assert_eq!(shards.iter().sum::<i64>(), available);
    assert_eq!(available + reserved + committed, total, "units conserved");
    (total, available, reserved, committed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn storm_sells_exactly_the_stock() {
    let srv = Server::start(&["--fsync", "everysec"]);
    let keys = Arc::new(srv.keyring());
    let mut admin = srv.conn().await;
    cmd(&mut admin, &["SALE.CREATE", "HOT", "1000", "SHARDS", "16"])
        .await
        .unwrap();

    let users: Vec<String> = (0..10_000).map(|i| format!("buyer{i}")).collect();
    let (won, soldout) = wave(&srv, &keys, "HOT", users, 1000).await;
    assert_eq!(won.len(), 1000, "exactly the stock is sold");
    assert_eq!(soldout, 9000);
    let distinct: HashSet<&String> = won.iter().collect();
    assert_eq!(distinct.len(), 1000, "no token handed out twice");
    assert!(won
        .iter()
        .all(|t| t.starts_with("{HOT}") && t.len() == 5 + 26));
    assert_eq!(
        as_int(&cmd(&mut admin, &["STOCK", "HOT"]).await.unwrap()),
        0
    );
    assert_eq!(check_sale(&mut admin, "HOT").await, (1000, 0, 1000, 0));

    // Release 100: exactly 100 more buyers get through, and only 100.
    for t in won.iter().take(100) {
        assert_eq!(as_int(&cmd(&mut admin, &["RELEASE", t]).await.unwrap()), 1);
    }
    assert_eq!(
        as_int(&cmd(&mut admin, &["STOCK", "HOT"]).await.unwrap()),
        100
    );
    let late: Vec<String> = (0..2000).map(|i| format!("late{i}")).collect();
    let (won2, _) = wave(&srv, &keys, "HOT", late, 200).await;
    assert_eq!(won2.len(), 100);
    let all: HashSet<&String> = won.iter().chain(won2.iter()).collect();
    assert_eq!(all.len(), 1100, "new tokens are new");
    assert_eq!(check_sale(&mut admin, "HOT").await, (1000, 0, 1000, 0));
    // Replays of every winner take nothing.
    let t = keys.mint("HOT", "buyer1", now_ms() + 60_000);
    let r = reserve(&mut admin, "HOT", "buyer1", &t, "req-1").await;
    assert!(matches!(as_str(&r[0]).as_str(), "REPLAY" | "SOLDOUT"));
    assert_eq!(
        as_int(&cmd(&mut admin, &["STOCK", "HOT"]).await.unwrap()),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_releases_of_an_expired_token_win_once() {
    let srv = Server::start(&[]);
    let keys = srv.keyring();
    let mut admin = srv.conn().await;
    cmd(
        &mut admin,
        &["SALE.CREATE", "RACE", "50", "SHARDS", "1", "TTL", "50"],
    )
    .await
    .unwrap();
    let mut tokens = Vec::new();
    for i in 0..50 {
        let u = format!("u{i}");
        let t = keys.mint("RACE", &u, now_ms() + 60_000);
        let r = reserve(&mut admin, "RACE", &u, &t, "r").await;
        assert_eq!(as_str(&r[0]), "RESERVED");
        tokens.push(as_str(&r[1]));
    }
    // Wait until all are listed as expired.
    for _ in 0..100 {
        let v = cmd(&mut admin, &["EXPIRED", "COUNT", "1000"])
            .await
            .unwrap();
        if matches!(&v, Value::Array(a) if a.len() == 50) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let mut conns = Vec::new();
    for _ in 0..8 {
        conns.push(srv.conn().await);
    }
    for t in &tokens {
        let barrier = Arc::new(tokio::sync::Barrier::new(8));
        let mut tasks = Vec::new();
        for c in conns.iter() {
            let (mut c, t, b) = (c.clone(), t.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                b.wait().await;
                as_int(&cmd(&mut c, &["RELEASE", &t]).await.unwrap())
            }));
        }
        let mut ones = 0;
        for task in tasks {
            ones += task.await.unwrap();
        }
        assert_eq!(ones, 1, "exactly one releaser wins for {t}");
    }
    assert_eq!(
        as_int(&cmd(&mut admin, &["STOCK", "RACE"]).await.unwrap()),
        50
    );
    assert_eq!(check_sale(&mut admin, "RACE").await, (50, 50, 0, 0));
    let v = cmd(&mut admin, &["EXPIRED"]).await.unwrap();
    assert_eq!(v, Value::Array(vec![]));
}
