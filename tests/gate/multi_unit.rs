//! RESERVE of several units against the real server: a sale of 16 units over 16 shards
//! (one unit each) sells all of them two at a time, the units gathered from several
//! shards by a logged move; the counters survive a restart (WAL replay) and, in a Raft
//! group, a follower promoted after the leader is killed (replication by replay).

use std::time::{Duration, Instant};

use crate::common::raft::{conn, Group};
use crate::common::{as_int, as_str, field, Server, TempDir};
use redis::Value;
use stockgate_server::engine::Keyring;

const SKU: &str = "PAIRS";

/// SALE.INFO as `(total, available, reserved, committed, shard_available)`, checking that
/// no shard is negative and the units add up. Retried for a while: a member just elected
/// or restarted may still be loading.
fn info(port: u16) -> (i64, i64, i64, i64, Vec<i64>) {
    let deadline = Instant::now() + Duration::from_secs(15);
    let v: Value = loop {
        match redis::cmd("SALE.INFO").arg(SKU).query(&mut conn(port)) {
            Ok(v) => break v,
            Err(e) => assert!(Instant::now() < deadline, "SALE.INFO on {port}: {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let f = |n: &str| as_int(&field(&v, n).unwrap_or_else(|| panic!("no {n} in {v:?}")));
    let shards = match field(&v, "shard_available") {
        Some(Value::Array(items)) => items.iter().map(as_int).collect::<Vec<_>>(),
        other => panic!("shard_available: {other:?}"),
    };
    let counts = (
        f("total"),
        f("available"),
        f("reserved"),
        f("committed"),
        shards,
    );
    assert!(counts.4.iter().all(|&a| a >= 0), "{counts:?}");
    assert_eq!(counts.4.iter().sum::<i64>(), counts.1, "{counts:?}");
    assert_eq!(counts.1 + counts.2 + counts.3, counts.0, "{counts:?}");
    counts
}

fn create(port: u16) {
    let r: String = redis::cmd("SALE.CREATE")
        .arg(SKU)
        .arg(16)
        .arg("SHARDS")
        .arg(16)
        .query(&mut conn(port))
        .expect("SALE.CREATE");
    assert_eq!(r, "OK");
}

/// `RESERVE PAIRS user <admission> req QTY qty`: the reply's first word and, for a hold,
/// its token.
fn reserve(port: u16, keys: &Keyring, user: &str, qty: u32) -> (String, Option<String>) {
    let adm = keys.mint(SKU, user, crate::common::now_ms() + 600_000);
    let v: Value = redis::cmd("RESERVE")
        .arg(SKU)
        .arg(user)
        .arg(adm)
        .arg("req-1")
        .arg("QTY")
        .arg(qty)
        .query(&mut conn(port))
        .expect("RESERVE");
    match v {
        Value::Array(items) if !items.is_empty() => (as_str(&items[0]), items.get(1).map(as_str)),
        other => panic!("unexpected reply {other:?}"),
    }
}

fn stock(port: u16) -> i64 {
    redis::cmd("STOCK")
        .arg(SKU)
        .query(&mut conn(port))
        .expect("STOCK")
}

/// Eight pairs sold out of sixteen single units, then SOLDOUT; returns the tokens.
fn sell_in_pairs(port: u16, keys: &Keyring) -> Vec<String> {
    let mut tokens = Vec::new();
    for i in 0..8 {
        let (word, token) = reserve(port, keys, &format!("buyer{i}"), 2);
        assert_eq!(word, "RESERVED", "pair {i}");
        tokens.push(token.expect("token"));
    }
    assert_eq!(reserve(port, keys, "buyer8", 2).0, "SOLDOUT");
    assert_eq!(reserve(port, keys, "buyer9", 1).0, "SOLDOUT");
    assert_eq!(stock(port), 0);
    let (total, available, reserved, committed, shards) = info(port);
    assert_eq!((total, available, reserved, committed), (16, 0, 16, 0));
    assert_eq!(shards, vec![0; 16]);
    tokens
}

#[test]
fn pairs_sell_from_single_unit_shards_and_survive_a_restart() {
    let dir = TempDir::new("multi-unit");
    let mut srv = Server::start_in(dir.path(), &["--fsync", "always"]);
    let keys = srv.keyring();
    create(srv.port);
    let tokens = sell_in_pairs(srv.port, &keys);
    // Two units back to the shard they were gathered into, two sold.
    let released: i64 = redis::cmd("RELEASE")
        .arg(&tokens[0])
        .query(&mut conn(srv.port))
        .expect("RELEASE");
    assert_eq!(released, 1);
    let _: Value = redis::cmd("COMMIT")
        .arg(&tokens[1])
        .query(&mut conn(srv.port))
        .expect("COMMIT");
    let before = info(srv.port);
    assert_eq!((before.0, before.1, before.2, before.3), (16, 2, 12, 2));

    // Killed and restarted on the same data dir: the log replays to the same counters.
    srv.kill9();
    let srv = Server::start_in(dir.path(), &["--fsync", "always"]);
    assert_eq!(info(srv.port), before);
    let (word, _) = reserve(srv.port, &keys, "late", 2);
    assert_eq!(word, "RESERVED");
    assert_eq!(reserve(srv.port, &keys, "later", 1).0, "SOLDOUT");
    assert_eq!(info(srv.port).1, 0);
}

#[test]
fn raft_pairs_sell_and_a_promoted_follower_keeps_the_counters() {
    let mut g = Group::start(false);
    let l = g.leader(None, Duration::from_secs(10));
    let keys = g.keys.keyring();
    create(g.port(l));
    let tokens = sell_in_pairs(g.port(l), &keys);
    let released: i64 = redis::cmd("RELEASE")
        .arg(&tokens[0])
        .query(&mut conn(g.port(l)))
        .expect("RELEASE");
    assert_eq!(released, 1);
    let before = info(g.port(l));
    // Every member applies the same records, the moves then the holds, and reaches the
    // leader's counters (a follower learns of the last commit a moment later).
    for id in [1, 2, 3] {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let seen = info(g.port(id));
            if seen == before {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "member {id}: {seen:?}, not {before:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    g.member(l).kill9();
    let new = g.leader(Some(l), Duration::from_secs(20));
    assert_eq!(info(g.port(new)), before);
    // The promoted member sells the released pair and nothing more.
    assert_eq!(reserve(g.port(new), &keys, "late", 2).0, "RESERVED");
    assert_eq!(reserve(g.port(new), &keys, "later", 1).0, "SOLDOUT");
    assert_eq!(info(g.port(new)).1, 0);
}
