//! Cluster mode with a Raft group as one of the groups (docs/cluster.md, "Groups of
//! several members"): group `a` is three Raft members, group `b` one node. A follower
//! of `a` answers what it would refuse (a write) with `-MOVED` to the leader Raft
//! elected, so a client sent to a stale leader pays one redirection and the write runs
//! only on the leader; reads a follower serves stay there. The single node learns who
//! leads `a` by asking its members `ROLE`, and names that member in `-MOVED` and
//! `CLUSTER SLOTS`. redis-rs's cluster client reserves on both groups through it.

use std::time::Duration;

use crate::common::cluster::{slots_master, RaftBesideSingle};
use crate::common::ha::wait_for;
use crate::common::now_ms;
use crate::common::raft::sale_info;
use redis::Value;
use stockgate_server::cluster::key_slot;

/// A sku whose slot is in `lo..=hi`.
fn sku_in(prefix: &str, lo: u16, hi: u16) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|s| (lo..=hi).contains(&key_slot(s.as_bytes())))
        .unwrap()
}

fn error_of(port: u16, args: &[&str]) -> String {
    let mut c = crate::common::raft::conn(port);
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    match cmd.query::<Value>(&mut c) {
        Err(e) => format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or("")),
        Ok(v) => panic!("{args:?} on {port} answered {v:?}"),
    }
}

#[test]
fn a_follower_redirects_writes_to_its_leader_and_clients_follow() {
    let rc = RaftBesideSingle::start();
    let (g, b) = (&rc.a, &rc.b);
    let leader = g.leader(None, Duration::from_secs(20));
    let lport = g.port(leader);
    let sku_a = sku_in("RA", 0, 8191);
    let sku_b = sku_in("RB", 8192, 16383);
    let slot_a = key_slot(sku_a.as_bytes());

    // A follower sends a write to the leader; the other group sends it to the member
    // of `a` that answers ROLE as master, once it has asked (every 250 ms).
    for f in g.members.iter().filter(|m| m.id != leader) {
        assert_eq!(
            error_of(f.port, &["SALE.CREATE", &sku_a, "1000"]),
            format!("MOVED {slot_a} 127.0.0.1:{lport}")
        );
    }
    wait_for("b to name a's leader", Duration::from_secs(5), || {
        error_of(b.port, &["SALE.CREATE", &sku_a, "1000"])
            == format!("MOVED {slot_a} 127.0.0.1:{lport}")
    });
    for port in g.members.iter().map(|m| m.port).chain([b.port]) {
        assert_eq!(
            slots_master(port, slot_a),
            Some(lport),
            "CLUSTER SLOTS on {port}"
        );
    }

    // redis-rs's cluster client, given every node, creates and reserves on both groups.
    let client = redis::cluster::ClusterClient::new(rc.urls()).unwrap();
    let mut c = client.get_connection().unwrap();
    let keyring = g.keys.keyring();
    for sku in [&sku_a, &sku_b] {
        let ok: String = redis::cmd("SALE.CREATE")
            .arg(sku)
            .arg(1000)
            .query(&mut c)
            .unwrap();
        assert_eq!(ok, "OK");
        for u in 0..20 {
            let user = format!("u{u}");
            let adm = keyring.mint(sku, &user, now_ms() + 60_000);
            let r: Vec<Value> = redis::cmd("RESERVE")
                .arg(sku)
                .arg(&user)
                .arg(&adm)
                .arg(format!("r{u}"))
                .query(&mut c)
                .unwrap();
            assert_eq!(
                r[0],
                Value::BulkString(b"RESERVED".to_vec()),
                "{sku} {user}"
            );
        }
    }
    // Every write of `a` ran on its leader, once; `b`'s on `b`.
    let (total, avail, reserved, _) = sale_info(lport, &sku_a);
    assert_eq!((total, avail, reserved), (1000, 980, 20));
    let (total, avail, reserved, _) = sale_info(b.port, &sku_b);
    assert_eq!((total, avail, reserved), (1000, 980, 20));
    // A follower serves the reads it may serve (its committed state) without redirecting.
    let f = g.members.iter().find(|m| m.id != leader).unwrap();
    let t = std::time::Instant::now();
    loop {
        let mut fc = crate::common::raft::conn(f.port);
        let n: Result<i64, _> = redis::cmd("STOCK").arg(&sku_a).query(&mut fc);
        match n {
            Ok(980) => break,
            other => assert!(
                t.elapsed() < Duration::from_secs(10),
                "follower STOCK: {other:?}"
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
