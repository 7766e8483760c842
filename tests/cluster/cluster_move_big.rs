//! Moving a hot sale (docs/cluster.md, "Moving slots"): a sale with tens of thousands of
//! holds, whose export is larger than one log record, moves with `stockgate-sweeper
//! move-slots` and every hold keeps its state on the destination; and a move the
//! destination refuses mid-transfer rolls back: the sale sells on the source again, its
//! slot is the source's again on both nodes (a new sale on it is created there, no
//! `-ASK`), and the destination holds nothing of it.
//!
//! `SG_BIG_HOLDS=1000000 cargo test --release --test cluster cluster_move_big::a_sale_with --
//! --nocapture` measures a larger sale (time of the move, bytes logged).

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use crate::common::cluster::{node_id, Cluster};
use crate::common::ha::{free_port, Keys, Node};
use crate::common::now_ms;
use crate::common::raft::sale_info;
use redis::Value;
use stockgate_server::cluster::key_slot;
use stockgate_server::engine::Keyring;

fn sweeper() -> std::path::PathBuf {
    stockgate_testkit::sibling_binary("stockgate-sweeper")
}

fn move_slots(from: &str, to: &str, slot: u16) -> std::process::Output {
    Command::new(sweeper())
        .args(["move-slots", "--from", from, "--to", to, "--slots"])
        .arg(slot.to_string())
        .output()
        .expect("run move-slots")
}

fn holds() -> usize {
    std::env::var("SG_BIG_HOLDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

/// Creates `sku` on `n` and takes `count` one-unit holds, pipelined; every third is
/// committed and every fifth (of the others) released. Returns the tokens.
fn hot_sale(n: &Node, keyring: &Keyring, sku: &str, count: usize) -> Vec<String> {
    let mut c = n.conn();
    let _: () = redis::cmd("SALE.CREATE")
        .arg(sku)
        .arg(count * 2)
        .arg("TTL")
        .arg(3_600_000)
        .query(&mut c)
        .expect("create");
    let mut tokens = Vec::with_capacity(count);
    for start in (0..count).step_by(5_000) {
        let mut p = redis::pipe();
        for i in start..count.min(start + 5_000) {
            let user = format!("buyer-{i}");
            let adm = keyring.mint(sku, &user, now_ms() + 3_600_000);
            p.cmd("RESERVE")
                .arg(sku)
                .arg(&user)
                .arg(adm)
                .arg(format!("r{i}"));
        }
        let got: Vec<Vec<Value>> = p.query(&mut c).expect("reserve");
        tokens.extend(got.iter().map(|v| crate::common::as_str(&v[1])));
    }
    let mut p = redis::pipe();
    for (i, t) in tokens.iter().enumerate() {
        if i % 3 == 0 {
            p.cmd("COMMIT").arg(t).ignore();
        } else if i % 5 == 0 {
            p.cmd("RELEASE").arg(t).ignore();
        }
    }
    let _: () = p.query(&mut c).expect("finish");
    tokens
}

/// Every token's state on the node (pipelined `RESERVATION`).
fn states(port: u16, tokens: &[String]) -> Vec<String> {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .expect("client")
        .get_connection()
        .expect("conn");
    let mut out = Vec::with_capacity(tokens.len());
    for chunk in tokens.chunks(5_000) {
        let mut p = redis::pipe();
        for t in chunk {
            p.cmd("RESERVATION").arg(t);
        }
        let got: Vec<Value> = p.query(&mut c).expect("reservation");
        out.extend(got.iter().map(|v| {
            crate::common::field(v, "state")
                .map(|s| crate::common::as_str(&s))
                .unwrap_or_default()
        }));
    }
    out
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|it| {
            it.flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_bytes(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

#[test]
fn a_sale_with_tens_of_thousands_of_holds_moves_whole() {
    let c = Cluster::start(&[(0, 8191), (8192, 16383)]);
    let keyring = c.keys.keyring();
    let sku = c.skus("HOT", 1).remove(0).remove(0);
    let (a, b) = (&c.nodes[0], &c.nodes[1]);
    let n = holds();
    let tokens = hot_sale(a, &keyring, &sku, n);
    let before_states = states(a.port, &tokens);
    let before = sale_info(a.port, &sku);
    let logged_before = dir_bytes(b.data_dir());
    let started = Instant::now();
    let out = move_slots(&a.addr(), &b.addr(), key_slot(sku.as_bytes()));
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "move-slots failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!(
        "moved a sale of {n} holds in {took:?}; the destination's log grew by {} bytes",
        dir_bytes(b.data_dir()) - logged_before
    );
    assert_eq!(
        sale_info(b.port, &sku),
        before,
        "counters on the destination"
    );
    assert_eq!(
        states(b.port, &tokens),
        before_states,
        "every token's state"
    );
    // A live hold commits there; the source no longer has the sale.
    let live = tokens
        .iter()
        .enumerate()
        .find(|(i, _)| i % 3 != 0 && i % 5 != 0);
    let (_, live) = live.expect("a live hold");
    let r: i64 = redis::cmd("COMMIT")
        .arg(live)
        .query(&mut b.conn())
        .expect("commit");
    assert_eq!(r, 1);
    let gone: redis::RedisResult<Value> = redis::cmd("SALE.INFO").arg(&sku).query(&mut a.conn());
    assert_eq!(
        gone.map_err(|e| e.kind()).err(),
        Some(redis::ErrorKind::Moved)
    );
}

/// Two single-node groups whose nodes do not share the reservation key: the destination
/// refuses the import (its tokens would not be the destination's) after every part was
/// sent.
fn two_groups_with_different_keys() -> (Keys, Vec<Node>, crate::common::TempDir) {
    let (ka, kb) = (Keys::new(), Keys::new());
    let dir = crate::common::TempDir::new("cluster-map");
    let ports = [free_port(), free_port()];
    let map = dir.path().join("cluster.map");
    let text = format!(
        "group a 0-8191\nnode {} 127.0.0.1:{}\ngroup b 8192-16383\nnode {} 127.0.0.1:{}\n",
        node_id(0),
        ports[0],
        node_id(1),
        ports[1]
    );
    std::fs::write(&map, text).expect("map");
    let m = map.display().to_string();
    let flags = ["--cluster-enabled", "yes", "--cluster-config", &m];
    let nodes = vec![
        Node::start_on(&ka, ports[0], &flags, &[]),
        Node::start_on(&kb, ports[1], &flags, &[]),
    ];
    (ka, nodes, dir)
}

#[test]
fn a_move_the_destination_refuses_rolls_back_to_the_source() {
    let (keys, nodes, _dir) = two_groups_with_different_keys();
    let keyring = keys.keyring();
    let (a, b) = (&nodes[0], &nodes[1]);
    let sku = (0..)
        .map(|i| format!("RB-{i}"))
        .find(|s| key_slot(s.as_bytes()) < 8192)
        .expect("a sku of group a");
    let slot = key_slot(sku.as_bytes());
    let tokens = hot_sale(a, &keyring, &sku, 20_000);
    let before = sale_info(a.port, &sku);
    let out = move_slots(&a.addr(), &b.addr(), slot);
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "the move must fail");
    assert!(said.contains("reservation key"), "{said}");
    assert!(
        said.contains(&format!("slot {slot}: rolled back")),
        "{said}"
    );
    // The sale sells on the source again, with every hold.
    assert_eq!(sale_info(a.port, &sku), before);
    let adm = keyring.mint(&sku, "late", now_ms() + 60_000);
    let v: Vec<Value> = redis::cmd("RESERVE")
        .arg(&sku)
        .arg("late")
        .arg(adm)
        .arg("r")
        .query(&mut a.conn())
        .expect("sells again");
    assert!(crate::common::as_str(&v[1]).starts_with(&format!("{{{sku}}}")));
    assert_eq!(states(a.port, &tokens[..3])[0], "COMMITTED");
    // The slot is the source's again: a new sale on it is created there, no -ASK.
    let other = (0..)
        .map(|i| format!("NEW-{i}"))
        .find(|s| key_slot(s.as_bytes()) == slot)
        .expect("a sku on the slot");
    let _: () = redis::cmd("SALE.CREATE")
        .arg(&other)
        .arg(5)
        .query(&mut a.conn())
        .expect("SALE.CREATE on the source, no -ASK");
    // The destination holds nothing of it, and sends its clients to the source.
    let n: i64 = redis::cmd("CLUSTER")
        .arg("COUNTKEYSINSLOT")
        .arg(slot)
        .query(&mut b.conn())
        .expect("count");
    assert_eq!(n, 0);
    let mut bc = b.conn();
    let _: () = redis::cmd("ASKING").query(&mut bc).expect("asking");
    let moved: redis::RedisResult<Value> = redis::cmd("SALE.INFO").arg(&sku).query(&mut bc);
    assert_eq!(
        moved.map_err(|e| e.kind()).err(),
        Some(redis::ErrorKind::Moved),
        "the destination no longer imports the slot"
    );
}
