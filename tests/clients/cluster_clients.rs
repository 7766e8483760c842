//! Redis Cluster clients, unmodified and in their default settings, against three
//! single-node stockgate groups owning 0-5460, 5461-10922 and 10923-16383: each creates
//! sales on skus of every group, then reserves and commits for many users on every
//! sale, sending stockgate commands the way docs/cluster.md says for that client. After
//! warm-up not one request is redirected (every node's `cluster_redirections_moved`),
//! and every sale's counters are on its own group.
//!
//! - redis-py `RedisCluster` (RESP2 and RESP3): `tests/py/cluster.py`;
//! - ioredis `Cluster` and node-redis `createCluster`: `tests/node/cluster.js`, on the newest
//!   majors (`tests/node`) and on the oldest ones supported (`tests/node-oldest`);
//! - redis-rs's cluster client: `tests/cluster/cluster_routing.rs`.

use std::collections::HashMap;
use std::process::{Command, Output};

use crate::common::cluster::{Cluster, THREE};
use crate::common::node::Clients;
use redis::Value;

const USERS: usize = 40;

fn field(out: &str, name: &str) -> Option<u64> {
    out.lines()
        .filter_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .next()
}

fn all_fields(out: &str, name: &str) -> Vec<u64> {
    out.lines()
        .filter_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .collect()
}

fn show(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A sale's counters read from the node that owns it.
fn sale_info(cl: &Cluster, sku: &str) -> HashMap<String, i64> {
    let mut c = cl.nodes[cl.owner(sku)].conn();
    let v: Value = redis::cmd("SALE.INFO").arg(sku).query(&mut c).unwrap();
    let Value::Array(a) = v else { panic!("{v:?}") };
    a.chunks(2)
        .filter_map(|kv| match (&kv[0], &kv[1]) {
            (Value::BulkString(k), Value::Int(i)) => {
                Some((String::from_utf8_lossy(k).into_owned(), *i))
            }
            _ => None,
        })
        .collect()
}

/// Every sale holds exactly what the client was told: half the users committed, half
/// reserved.
fn check_sales(cl: &Cluster, skus: &[String]) {
    for sku in skus {
        let i = sale_info(cl, sku);
        assert_eq!(i["committed"], USERS.div_ceil(2) as i64, "{sku}: {i:?}");
        assert_eq!(i["reserved"], (USERS / 2) as i64, "{sku}: {i:?}");
        assert_eq!(i["available"], 100_000 - USERS as i64, "{sku}: {i:?}");
    }
}

fn skus(cl: &Cluster, prefix: &str) -> Vec<String> {
    cl.skus(prefix, 4).into_iter().flatten().collect()
}

#[test]
fn redis_py_redis_cluster_routes_every_stockgate_command_in_one_hop() {
    let _one = crate::alone();
    let cl = Cluster::start(&THREE);
    let skus = skus(&cl, "PY");
    let ports: Vec<String> = cl.ports().iter().map(u16::to_string).collect();
    let o = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/cluster.py"))
        .arg(ports.join(","))
        .arg(cl.keys.secret_path())
        .arg(skus.join(","))
        .arg(USERS.to_string())
        .output()
        .expect("python3");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success() && out.contains("cluster clients ok"),
        "{}",
        show(&o)
    );
    assert_eq!(all_fields(&out, "MOVED_AFTER_WARMUP"), vec![0, 0], "{out}");
    assert_eq!(
        all_fields(&out, "COMMITTED"),
        vec![(skus.len() * USERS.div_ceil(2)) as u64; 2]
    );
    for p in ["p2", "p3"] {
        let mine: Vec<String> = skus.iter().map(|s| format!("{s}-{p}")).collect();
        check_sales(&cl, &mine);
    }
}

fn run_node(which: &str, clients: Clients) -> (Cluster, Vec<String>, String) {
    let mut cmd = clients.script("cluster.js");
    let cl = Cluster::start(&THREE);
    let skus = skus(&cl, &which.to_uppercase());
    let ports: Vec<String> = cl.ports().iter().map(u16::to_string).collect();
    let o = cmd
        .arg(which)
        .arg(ports.join(","))
        .arg(cl.keys.secret_path())
        .arg(skus.join(","))
        .arg(USERS.to_string())
        .output()
        .expect("node");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success() && out.contains("cluster clients ok"),
        "{} ({}):\n{}",
        which,
        clients.versions(),
        show(&o)
    );
    assert_eq!(field(&out, "MOVED_AFTER_WARMUP"), Some(0), "{out}");
    assert_eq!(
        field(&out, "COMMITTED"),
        Some((skus.len() * USERS.div_ceil(2)) as u64)
    );
    check_sales(&cl, &skus);
    (cl, skus, out)
}

#[test]
fn node_redis_create_cluster_routes_on_the_first_key_it_is_given() {
    let _one = crate::alone();
    run_node("node-redis", Clients::Newest);
}

#[test]
fn node_redis_oldest_create_cluster_routes_on_the_first_key_it_is_given() {
    let _one = crate::alone();
    run_node("node-redis", Clients::Oldest);
}

#[test]
fn ioredis_cluster_routes_a_command_given_its_slot_and_call_follows_moved() {
    ioredis_cluster_routes(Clients::Newest);
}

#[test]
fn ioredis_oldest_cluster_routes_a_command_given_its_slot_and_call_follows_moved() {
    ioredis_cluster_routes(Clients::Oldest);
}

fn ioredis_cluster_routes(clients: Clients) {
    let _one = crate::alone();
    let (_cl, skus, out) = run_node("ioredis", clients);
    // Plain `call()` of a command ioredis does not know goes to a random node and
    // follows `-MOVED`: correct answers (checked by the script), redirected whenever
    // the random node is not the owner. Bounded by one redirection per request.
    let call_moved = field(&out, "CALL_MOVED").expect("CALL_MOVED");
    assert!(call_moved <= skus.len() as u64, "{out}");
}
