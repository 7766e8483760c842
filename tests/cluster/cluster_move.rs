//! Moving slots between groups while a sale runs (docs/cluster.md, "Moving slots"): two
//! single-node groups, four sales on group A's slots; two buyers reserve and commit
//! through redis-rs's async cluster client while `stockgate-sweeper move-slots` moves
//! the sales' slots to group B. Every acknowledged token is on B afterwards in its
//! state, no token is handed out twice, no sale hands out more than its units, holds
//! taken on A before the move commit on B, a refreshed client is not redirected, and a
//! restart of both nodes keeps the slots on B (the logged map). A slot change on a Raft
//! group survives its snapshots and a restart of every member. redis-py's `RedisCluster`,
//! ioredis's `Cluster` and node-redis's `createCluster` (`tests/py/cluster_move.py`,
//! `tests/node/cluster_move.js`) buy through a move with the same checks, and what each
//! Node client does with one `-ASK` and one `-TRYAGAIN` is shown by a probe; the Node
//! clients on their newest majors (`tests/node`) and on the oldest ones supported
//! (`tests/node-oldest`).

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::cluster::{node_id, slots_master, Cluster, RaftBesideSingle};
use crate::common::ha::{wait_for, Node};
use crate::common::node::Clients;
use crate::common::now_ms;
use crate::common::raft::{
    conn as raft_conn, create_sale, info_field, reserve_on_leader, sale_info, state_of,
};
use redis::cluster::ClusterClientBuilder;
use redis::Value;
use stockgate_server::cluster::key_slot;
use stockgate_server::engine::Keyring;

const TOTAL: i64 = 100_000;

fn sweeper() -> std::path::PathBuf {
    stockgate_testkit::sibling_binary("stockgate-sweeper")
}

/// `stockgate-sweeper move-slots --from --to --slots`, which must succeed.
fn move_slots(from: &str, to: &str, slots: &str) -> std::process::Output {
    let out = Command::new(sweeper())
        .args(["move-slots", "--from", from, "--to", to, "--slots", slots])
        .output()
        .expect("run move-slots");
    assert!(
        out.status.success(),
        "move-slots failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn reserve(n: &Node, keyring: &Keyring, sku: &str, user: &str, rid: &str) -> String {
    let adm = keyring.mint(sku, user, now_ms() + 120_000);
    let v: Vec<Value> = redis::cmd("RESERVE")
        .arg(sku)
        .arg(user)
        .arg(adm)
        .arg(rid)
        .query(&mut n.conn())
        .expect("reserve");
    crate::common::as_str(&v[1])
}

fn counter(n: &Node, name: &str) -> u64 {
    n.info("cluster")
        .get(name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("INFO has no {name}"))
}

fn redirections(c: &Cluster) -> u64 {
    c.nodes
        .iter()
        .map(|n| counter(n, "cluster_redirections_moved") + counter(n, "cluster_redirections_ask"))
        .sum()
}

/// Reserves one unit for a new user at a time, round robin over `skus`, committing
/// every other hold, until `stop`; a failed request is sent again with the same id.
/// Returns every acknowledged token with whether its COMMIT was acknowledged.
fn buyer(
    urls: Vec<String>,
    keyring: Keyring,
    skus: Vec<String>,
    tag: &'static str,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<(String, bool)>> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let client = ClusterClientBuilder::new(urls).build().expect("client");
            let mut c = client.get_async_connection().await.expect("connection");
            let mut acked = Vec::new();
            let mut n = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let sku = &skus[n % skus.len()];
                let user = format!("{tag}{n}");
                let adm = keyring.mint(sku, &user, now_ms() + 120_000);
                let token = loop {
                    let r: redis::RedisResult<Vec<Value>> = redis::cmd("RESERVE")
                        .arg(sku)
                        .arg(&user)
                        .arg(&adm)
                        .arg(format!("q{n}"))
                        .query_async(&mut c)
                        .await;
                    match r {
                        Ok(v) if v.len() > 1 => break Some(crate::common::as_str(&v[1])),
                        Ok(_) => break None,
                        Err(e) if e.to_string().contains("SOLDOUT") => break None,
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                };
                let Some(token) = token else {
                    n += 1;
                    continue;
                };
                let mut committed = false;
                if n.is_multiple_of(2) {
                    for _ in 0..500 {
                        let r: redis::RedisResult<i64> =
                            redis::cmd("COMMIT").arg(&token).query_async(&mut c).await;
                        if r.is_ok() {
                            committed = true;
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                acked.push((token, committed));
                n += 1;
            }
            acked
        })
    })
}

#[test]
fn cluster_move_slots_while_buyers_reserve_and_commit() {
    let mut c = Cluster::start(&[(0, 8191), (8192, 16383)]);
    let keyring = c.keys.keyring();
    let skus: Vec<String> = c.skus("MV", 4).remove(0);
    let slots: Vec<u16> = skus.iter().map(|s| key_slot(s.as_bytes())).collect();
    let slot_list: Vec<String> = slots.iter().map(u16::to_string).collect();
    for s in &skus {
        let _: () = redis::cmd("SALE.CREATE")
            .arg(s)
            .arg(TOTAL)
            .arg("TTL")
            .arg(600_000)
            .query(&mut c.nodes[0].conn())
            .expect("create");
    }
    // Holds taken on A before the move: committed on B after it.
    let early: Vec<String> = skus
        .iter()
        .map(|s| reserve(&c.nodes[0], &keyring, s, "early", "e1"))
        .collect();

    let urls: Vec<String> = c
        .nodes
        .iter()
        .map(|n| format!("redis://{}", n.addr()))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let buyers: Vec<_> = ["x", "y"]
        .into_iter()
        .map(|tag| {
            buyer(
                urls.clone(),
                keyring.clone(),
                skus.clone(),
                tag,
                stop.clone(),
            )
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let out = move_slots(&c.nodes[0].addr(), &c.nodes[1].addr(), &slot_list.join(","));
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(said.contains("4 sale(s) handed over"), "{said}");
    std::thread::sleep(Duration::from_millis(500));
    // Re-running a finished move changes nothing.
    let again = move_slots(&c.nodes[0].addr(), &c.nodes[1].addr(), &slot_list.join(","));
    assert!(String::from_utf8_lossy(&again.stdout).contains("0 sale(s)"));

    // Refreshed clients: no redirection per request any more.
    let before = redirections(&c);
    std::thread::sleep(Duration::from_millis(700));
    let after = redirections(&c);
    stop.store(true, Ordering::SeqCst);
    let acked: Vec<(String, bool)> = buyers
        .into_iter()
        .flat_map(|b| b.join().expect("buyer"))
        .collect();
    assert!(acked.len() > 20, "buyers sold only {}", acked.len());
    assert!(after - before <= 2, "still redirected: {before} -> {after}");
    eprintln!(
        "sold {} holds; redirections {before}; ASK {} TRYAGAIN {}",
        acked.len(),
        counter(&c.nodes[0], "cluster_redirections_ask"),
        counter(&c.nodes[0], "cluster_tryagain")
    );

    let b = c.nodes[1].port;
    let tokens: HashSet<&String> = acked.iter().map(|(t, _)| t).collect();
    assert_eq!(tokens.len(), acked.len(), "a token handed out twice");
    let mut per_sku: HashMap<String, i64> = HashMap::new();
    for (token, committed) in &acked {
        let want = if *committed { "COMMITTED" } else { "RESERVED" };
        assert_eq!(state_of(b, token).as_deref(), Some(want), "{token} on B");
        let sku = &token[1..token.find('}').expect("tag")];
        *per_sku.entry(sku.to_string()).or_default() += 1;
    }
    for s in &skus {
        let (total, available, reserved, committed) = sale_info(b, s);
        assert_eq!(total, TOTAL);
        assert!(reserved + committed <= total);
        assert_eq!(available + reserved + committed, total);
        // The buyers' holds and the early one: nothing else took units.
        assert_eq!(
            reserved + committed,
            per_sku.get(s).copied().unwrap_or(0) + 1
        );
        let gone: redis::RedisResult<Value> =
            redis::cmd("SALE.INFO").arg(s).query(&mut c.nodes[0].conn());
        assert!(gone.is_err(), "{s} still answered on A");
    }
    for t in &early {
        let r: i64 = redis::cmd("COMMIT")
            .arg(t)
            .query(&mut c.nodes[1].conn())
            .unwrap();
        assert_eq!(r, 1, "the early hold {t} commits on B");
    }

    // Both nodes restarted: the slots stay on B, and B still has the sales.
    for n in &mut c.nodes {
        n.kill9();
        n.restart();
    }
    for n in &c.nodes {
        wait_for("node up", Duration::from_secs(20), || {
            n.try_info("cluster").is_some()
        });
        let r: redis::RedisResult<Value> =
            redis::cmd("SALE.INFO").arg(&skus[0]).query(&mut n.conn());
        match r {
            Ok(_) => assert_eq!(n.port, b, "SALE.INFO answered on A after the restart"),
            Err(e) => assert!(
                e.kind() == redis::ErrorKind::Moved
                    && e.to_string()
                        .contains(&format!("{} 127.0.0.1:{b}", slots[0]))
                    && n.port != b,
                "{e}"
            ),
        }
    }
    assert_eq!(state_of(b, &early[0]).as_deref(), Some("COMMITTED"));
}

/// A slot change logged on a Raft group survives the group's snapshots (which compact
/// the log that held it) and a restart of every member: each member's `CLUSTER SLOTS`
/// still names the new owner.
#[test]
fn cluster_move_slot_changes_survive_a_raft_snapshot_and_a_restart() {
    let mut c = RaftBesideSingle::start();
    for m in &mut c.a.members {
        m.kill9();
        m.args
            .extend(["--snapshot-records", "20"].map(String::from));
        m.spawn();
    }
    let leader = c.a.leader(None, Duration::from_secs(20));
    let lp = c.a.port(leader);
    let slot = 5u16;
    let _: () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("NODE")
        .arg(node_id(9))
        .query(&mut raft_conn(lp))
        .expect("setslot");
    assert_eq!(slots_master(lp, slot), Some(c.b.port));
    // A follower refuses it, like every write.
    let follower =
        c.a.members
            .iter()
            .find(|m| m.id != leader)
            .expect("a follower");
    let refused: redis::RedisResult<()> = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("STABLE")
        .query(&mut raft_conn(follower.port));
    assert!(refused.is_err());
    // A slot moved away and back many times: the snapshot's state file carries its
    // owner, not its history.
    let flips = 150;
    for i in 0..flips {
        let owner = if i % 2 == 0 { 9 } else { 1 };
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot + 1)
            .arg("NODE")
            .arg(node_id(owner))
            .query(&mut raft_conn(lp))
            .expect("setslot");
    }
    // Enough records behind the change for snapshots that cover it.
    let sku = (0..)
        .map(|i| format!("RS-{i}"))
        .find(|s| key_slot(s.as_bytes()) < 8192 && key_slot(s.as_bytes()) != slot)
        .expect("a sku of group a");
    create_sale(lp, &sku, 1000);
    for i in 0..80 {
        reserve_on_leader(&c.a, &sku, &format!("u{i}"), "r", Duration::from_secs(20));
    }
    c.a.converge(Duration::from_secs(10));
    for m in &c.a.members {
        let port = m.port;
        wait_for(
            "a snapshot past the change",
            Duration::from_secs(15),
            || info_field(port, "raft_snapshot_lsn") >= 200,
        );
        // Each SETSLOT is a record of at least 14 bytes (its 5-byte body and the
        // record's header): 150 of them kept would be over 2,000 bytes.
        let state = newest_state_file(&m.dir.join("wal"));
        let len = std::fs::metadata(&state).expect("state file").len();
        assert!(
            len < 300,
            "{} holds {len} bytes after {flips} SETSLOTs",
            state.display()
        );
    }
    for m in &mut c.a.members {
        m.kill9();
    }
    for m in &mut c.a.members {
        m.spawn();
    }
    c.a.leader(None, Duration::from_secs(20));
    for m in &c.a.members {
        let port = m.port;
        wait_for("the moved slot on b", Duration::from_secs(15), || {
            slots_master(port, slot) == Some(c.b.port)
        });
        // The slot next to it is a's again after its moves.
        assert_ne!(slots_master(port, slot + 1), Some(c.b.port));
    }
}

/// The newest consumer-group state file of a WAL dir (`groups-<lsn>.state`).
fn newest_state_file(wal: &std::path::Path) -> std::path::PathBuf {
    std::fs::read_dir(wal)
        .expect("wal dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("groups-") && n.ends_with(".state"))
        })
        .max()
        .unwrap_or_else(|| panic!("no state file in {}", wal.display()))
}

/// A Raft group as the source: `move-slots` from its leader to a single node hands over
/// two sales with their holds (the freeze and the drop committed by the group's Raft
/// log); every member then names the single node for the slots, and the holds commit
/// there.
#[test]
fn cluster_move_slots_from_a_raft_group() {
    let c = RaftBesideSingle::start();
    let leader = c.a.leader(None, Duration::from_secs(20));
    let lp = c.a.port(leader);
    let skus: Vec<String> = (0..)
        .map(|i| format!("RM-{i}"))
        .filter(|s| key_slot(s.as_bytes()) < 8192)
        .take(2)
        .collect();
    let mut tokens = Vec::new();
    for s in &skus {
        create_sale(lp, s, 50);
        for i in 0..6 {
            tokens.push(reserve_on_leader(
                &c.a,
                s,
                &format!("u{i}"),
                "r",
                Duration::from_secs(20),
            ));
        }
    }
    for t in tokens.iter().step_by(3) {
        let r: i64 = redis::cmd("COMMIT")
            .arg(t)
            .query(&mut raft_conn(lp))
            .expect("commit");
        assert_eq!(r, 1);
    }
    let before: Vec<_> = skus.iter().map(|s| sale_info(lp, s)).collect();
    let states: Vec<Option<String>> = tokens.iter().map(|t| state_of(lp, t)).collect();
    let slots: Vec<String> = skus
        .iter()
        .map(|s| key_slot(s.as_bytes()).to_string())
        .collect();
    move_slots(&format!("127.0.0.1:{lp}"), &c.b.addr(), &slots.join(","));
    let b = c.b.port;
    for (s, want) in skus.iter().zip(&before) {
        assert_eq!(&sale_info(b, s), want, "{s} on the single node");
    }
    for (t, want) in tokens.iter().zip(&states) {
        assert_eq!(&state_of(b, t), want, "{t}");
    }
    for m in &c.a.members {
        let port = m.port;
        for s in &slots {
            let slot: u16 = s.parse().expect("slot");
            wait_for("every member names b", Duration::from_secs(15), || {
                slots_master(port, slot) == Some(b)
            });
        }
    }
    let gone: redis::RedisResult<Value> = redis::cmd("SALE.INFO")
        .arg(&skus[0])
        .query(&mut raft_conn(lp));
    assert_eq!(
        gone.map_err(|e| e.kind()).err(),
        Some(redis::ErrorKind::Moved)
    );
    for (t, was) in tokens.iter().zip(&states) {
        if was.as_deref() == Some("RESERVED") {
            let r: i64 = redis::cmd("COMMIT")
                .arg(t)
                .query(&mut c.b.conn())
                .expect("commit");
            assert_eq!(r, 1, "{t} commits on the single node");
        }
    }
}

/// redis-py's `RedisCluster` buys while the slots move: every acknowledged hold is on
/// the destination in its state, none twice, and the sales' counters are exactly the
/// acknowledged holds.
#[test]
fn cluster_move_slots_under_redis_py() {
    let c = Cluster::start(&[(0, 8191), (8192, 16383)]);
    let skus: Vec<String> = c.skus("PM", 3).remove(0);
    let slots: Vec<String> = skus
        .iter()
        .map(|s| key_slot(s.as_bytes()).to_string())
        .collect();
    for s in &skus {
        let _: () = redis::cmd("SALE.CREATE")
            .arg(s)
            .arg(TOTAL)
            .query(&mut c.nodes[0].conn())
            .expect("create");
    }
    let buyer = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/py/cluster_move.py"
        ))
        .arg(c.nodes[0].port.to_string())
        .arg(c.keys.secret_path())
        .arg(skus.join(","))
        .arg("4")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let mut buyer = stockgate_testkit::KillOnDrop(buyer);
    let mut pipe = buyer.0.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        std::io::Read::read_to_string(&mut pipe, &mut out).expect("read stdout");
        out
    });
    std::thread::sleep(Duration::from_millis(1500));
    move_slots(&c.nodes[0].addr(), &c.nodes[1].addr(), &slots.join(","));
    let status = buyer.0.wait().expect("python3 exit");
    let said = reader.join().expect("reader");
    let mut err = String::new();
    if let Some(mut e) = buyer.0.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    assert!(
        status.success() && said.contains("buyer ok"),
        "{said}\n{err}"
    );
    let acked: Vec<(&str, bool)> = said
        .lines()
        .filter_map(|l| l.strip_prefix("ACK "))
        .filter_map(|l| l.split_once(' '))
        .map(|(t, c)| (t, c == "1"))
        .collect();
    assert!(acked.len() > 20, "redis-py sold only {}", acked.len());
    let b = c.nodes[1].port;
    let unique: HashSet<&str> = acked.iter().map(|(t, _)| *t).collect();
    assert_eq!(unique.len(), acked.len(), "a token handed out twice");
    let mut per_sku: HashMap<String, i64> = HashMap::new();
    for (token, committed) in &acked {
        let want = if *committed { "COMMITTED" } else { "RESERVED" };
        assert_eq!(state_of(b, token).as_deref(), Some(want), "{token} on B");
        let sku = &token[1..token.find('}').expect("tag")];
        *per_sku.entry(sku.to_string()).or_default() += 1;
    }
    for s in &skus {
        let (total, _, reserved, committed) = sale_info(b, s);
        assert_eq!(total, TOTAL);
        assert_eq!(
            reserved + committed,
            per_sku.get(s).copied().unwrap_or(0),
            "{s}"
        );
    }
    eprintln!(
        "redis-py: {} holds, {}",
        acked.len(),
        said.lines()
            .find(|l| l.starts_with("RETRIED"))
            .unwrap_or("")
    );
}

/// A handover that cannot reach its destination, or that the destination refuses (made
/// under another reservation key), leaves the sale open on the source with every hold.
#[test]
fn cluster_move_a_failed_handover_leaves_the_sale_selling_on_the_source() {
    let c = Cluster::start(&[(0, 8191), (8192, 16383)]);
    let keyring = c.keys.keyring();
    let sku = c.skus("FM", 1).remove(0).remove(0);
    let a = &c.nodes[0];
    // One shard: a buyer's home shard always has the units left.
    let _: () = redis::cmd("SALE.CREATE")
        .arg(&sku)
        .arg(10)
        .arg("SHARDS")
        .arg(1)
        .query(&mut a.conn())
        .expect("create");
    let held = reserve(a, &keyring, &sku, "u1", "r1");
    let nobody = crate::common::ha::free_port();
    let other = Node::start(&crate::common::ha::Keys::new(), &[]);
    for (i, port) in [nobody, other.port].into_iter().enumerate() {
        let r: redis::RedisResult<()> = redis::cmd("SALE.MIGRATE")
            .arg("127.0.0.1")
            .arg(port)
            .arg(&sku)
            .query(&mut a.conn());
        let e = r.expect_err("the handover must fail");
        assert!(e.to_string().contains("the sale stays here"), "{e}");
        let (_, available, reserved, _) = sale_info(a.port, &sku);
        let holds = 1 + i as i64;
        assert_eq!((available, reserved), (10 - holds, holds));
        let again = reserve(a, &keyring, &sku, &format!("v{port}"), "r");
        assert!(again.starts_with(&format!("{{{sku}}}")));
    }
    let r: i64 = redis::cmd("COMMIT")
        .arg(&held)
        .query(&mut a.conn())
        .expect("commit");
    assert_eq!(r, 1);
    let absent: redis::RedisResult<Value> =
        redis::cmd("SALE.INFO").arg(&sku).query(&mut other.conn());
    assert!(absent.is_err(), "the refused import left a sale behind");
}

/// A Raft group as the destination: the import is acknowledged once the group committed
/// it, so every member holds the sale, and the moved holds commit on its leader.
#[test]
fn cluster_move_slots_to_a_raft_group() {
    let c = RaftBesideSingle::start();
    let leader = c.a.leader(None, Duration::from_secs(20));
    let lp = c.a.port(leader);
    let keyring = c.a.keys.keyring();
    let sku = (0..)
        .map(|i| format!("RD-{i}"))
        .find(|s| key_slot(s.as_bytes()) >= 8192)
        .expect("a sku of group b");
    let _: () = redis::cmd("SALE.CREATE")
        .arg(&sku)
        .arg(20)
        .arg("SHARDS")
        .arg(1)
        .query(&mut c.b.conn())
        .expect("create");
    let held: Vec<String> = (0..4)
        .map(|i| reserve(&c.b, &keyring, &sku, &format!("u{i}"), "r"))
        .collect();
    let before = sale_info(c.b.port, &sku);
    let slot = key_slot(sku.as_bytes()).to_string();
    move_slots(&c.b.addr(), &format!("127.0.0.1:{lp}"), &slot);
    assert_eq!(sale_info(lp, &sku), before);
    for m in &c.a.members {
        let port = m.port;
        wait_for(
            "every member holds the sale",
            Duration::from_secs(15),
            || {
                held.iter()
                    .all(|t| state_of(port, t).as_deref() == Some("RESERVED"))
            },
        );
    }
    for t in &held {
        let r: i64 = redis::cmd("COMMIT")
            .arg(t)
            .query(&mut raft_conn(lp))
            .expect("commit");
        assert_eq!(r, 1);
    }
    let gone: redis::RedisResult<Value> = redis::cmd("SALE.INFO").arg(&sku).query(&mut c.b.conn());
    assert_eq!(
        gone.map_err(|e| e.kind()).err(),
        Some(redis::ErrorKind::Moved)
    );
}

/// A link that breaks after the export left: the sale stays frozen on the source (the
/// destination may hold it), through a `kill -9` and a restart; `move-slots` then
/// finishes the move and the hold is on the destination.
#[test]
fn cluster_move_a_broken_link_keeps_the_sale_frozen_until_the_move_is_finished() {
    let mut c = Cluster::start(&[(0, 8191), (8192, 16383)]);
    let keyring = c.keys.keyring();
    let sku = c.skus("BL", 1).remove(0).remove(0);
    let _: () = redis::cmd("SALE.CREATE")
        .arg(&sku)
        .arg(10)
        .arg("SHARDS")
        .arg(1)
        .query(&mut c.nodes[0].conn())
        .expect("create");
    let held = reserve(&c.nodes[0], &keyring, &sku, "u1", "r1");
    // Takes the export, then hangs up without answering.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let lport = listener.local_addr().expect("addr").port();
    let sink = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut buf = [0u8; 64];
        let _ = std::io::Read::read(&mut s, &mut buf);
    });
    let r: redis::RedisResult<()> = redis::cmd("SALE.MIGRATE")
        .arg("127.0.0.1")
        .arg(lport)
        .arg(&sku)
        .query(&mut c.nodes[0].conn());
    sink.join().expect("listener");
    let e = r.expect_err("the link broke");
    assert!(e.to_string().contains("stays frozen"), "{e}");
    let frozen = |n: &Node| {
        let v: Value = redis::cmd("SALE.INFO")
            .arg(&sku)
            .query(&mut n.conn())
            .expect("info");
        crate::common::as_str(&crate::common::field(&v, "state").expect("state"))
    };
    assert_eq!(frozen(&c.nodes[0]), "MOVING");
    let adm = keyring.mint(&sku, "u2", now_ms() + 60_000);
    let refused: redis::RedisResult<Value> = redis::cmd("RESERVE")
        .arg(&sku)
        .arg("u2")
        .arg(adm)
        .arg("r2")
        .query(&mut c.nodes[0].conn());
    assert_eq!(
        refused.map_err(|e| e.kind()).err(),
        Some(redis::ErrorKind::TryAgain)
    );
    c.nodes[0].kill9();
    c.nodes[0].restart();
    assert_eq!(frozen(&c.nodes[0]), "MOVING", "the freeze is in the log");
    let slot = key_slot(sku.as_bytes()).to_string();
    move_slots(&c.nodes[0].addr(), &c.nodes[1].addr(), &slot);
    let b = c.nodes[1].port;
    assert_eq!(state_of(b, &held).as_deref(), Some("RESERVED"));
    assert_eq!(frozen(&c.nodes[1]), "OPEN");
    let (_, available, reserved, _) = sale_info(b, &sku);
    assert_eq!((available, reserved), (9, 1));
}

/// On a single node, a snapshot (`SAVE`) taken after a slot change re-logs the change
/// before it deletes the record that made it: after a restart the slot is still moved.
#[test]
fn cluster_move_slot_changes_survive_a_single_nodes_snapshot() {
    let mut c = Cluster::start(&[(0, 8191), (8192, 16383)]);
    let slot = 7u16;
    let b = c.nodes[1].port;
    for n in &c.nodes {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("NODE")
            .arg(node_id(1))
            .query(&mut n.conn())
            .expect("setslot");
    }
    let _: () = redis::cmd("SAVE")
        .query(&mut c.nodes[0].conn())
        .expect("save");
    c.nodes[0].kill9();
    c.nodes[0].restart();
    assert_eq!(slots_master(c.nodes[0].port, slot), Some(b));
    assert_eq!(
        slots_master(c.nodes[0].port, slot + 1),
        Some(c.nodes[0].port)
    );
    // A second snapshot after the restart still carries it.
    let _: () = redis::cmd("SAVE")
        .query(&mut c.nodes[0].conn())
        .expect("save");
    c.nodes[0].kill9();
    c.nodes[0].restart();
    assert_eq!(slots_master(c.nodes[0].port, slot), Some(b));
}

/// Two Node processes (servers and a client) on two cores: one Node test at a time.
static ONE_NODE_TEST: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `tests/node/cluster_move.js` started with `args` on the clients of `clients`, its stdout
/// read line by line on a thread.
struct NodeScript {
    child: stockgate_testkit::KillOnDrop,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl NodeScript {
    fn start(
        which: &str,
        clients: Clients,
        port: u16,
        secret: &std::path::Path,
        args: &[&str],
    ) -> NodeScript {
        let mut child = clients
            .script("cluster_move.js")
            .arg(which)
            .arg(port.to_string())
            .arg(secret)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("node");
        let pipe = child.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufRead::lines(std::io::BufReader::new(pipe)) {
                let Ok(l) = l else { return };
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        NodeScript {
            child: stockgate_testkit::KillOnDrop(child),
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits (bounded) for a line containing `what`.
    fn wait_line(&mut self, what: &str, limit: Duration) {
        let deadline = std::time::Instant::now() + limit;
        while !self.seen.iter().any(|l| l.contains(what)) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => self.seen.push(l),
                Err(_) => panic!("no line with {what} from the node script: {:?}", self.seen),
            }
        }
    }

    /// Waits (bounded) for the script to finish; its JSON lines, which must end with
    /// `{"done": true}`.
    fn finish(mut self, limit: Duration) -> Vec<serde_json::Value> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => self.seen.push(l),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                Err(e) => panic!("the node script still runs: {e}"),
            }
        }
        let _ = self.child.0.wait();
        let mut err = String::new();
        if let Some(mut e) = self.child.0.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        let lines: Vec<serde_json::Value> = self
            .seen
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}\n{err}")))
            .collect();
        assert!(
            lines.last().and_then(|l| l.get("done")).is_some(),
            "the node script failed:\n{:?}\n{err}",
            self.seen
        );
        lines
    }
}

/// The probe's answer: its first line other than the `sending` marker.
fn answer(lines: &[serde_json::Value]) -> serde_json::Value {
    lines
        .iter()
        .find(|l| l.get("sending").is_none())
        .cloned()
        .expect("an answer")
}

fn create_on(n: &Node, sku: &str, total: i64) {
    let _: () = redis::cmd("SALE.CREATE")
        .arg(sku)
        .arg(total)
        .arg("SHARDS")
        .arg(1)
        .query(&mut n.conn())
        .expect("create");
}

/// ioredis `Cluster` or node-redis `createCluster` buying (two buyers, reserve and commit
/// every other hold) while `move-slots` moves three sales' slots from A to B: no token
/// twice, every acknowledged token on B in the state the client last saw, each sale's
/// reserved + committed exactly the acknowledged holds, and holds acknowledged after the
/// move finished (so served by B). Returns what the caller had to send again.
fn node_buys_through_a_move(which: &str, clients: Clients) -> serde_json::Value {
    let _one = ONE_NODE_TEST.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::start(&[(0, 8191), (8192, 16383)]);
    let skus: Vec<String> = c.skus(&format!("N{}", &which[..2]), 3).remove(0);
    let slots: Vec<String> = skus
        .iter()
        .map(|s| key_slot(s.as_bytes()).to_string())
        .collect();
    for s in &skus {
        create_on(&c.nodes[0], s, TOTAL);
    }
    let script = NodeScript::start(
        which,
        clients,
        c.nodes[0].port,
        &c.keys.secret_path(),
        &["load", &skus.join(","), "5"],
    );
    std::thread::sleep(Duration::from_millis(1500));
    move_slots(&c.nodes[0].addr(), &c.nodes[1].addr(), &slots.join(","));
    let moved_at = now_ms() as i64;
    let lines = script.finish(Duration::from_secs(60));
    let acked: Vec<(String, String, i64)> = lines
        .iter()
        .filter_map(|l| {
            Some((
                l.get("token")?.as_str()?.to_string(),
                l.get("state")?.as_str()?.to_string(),
                l.get("at")?.as_i64()?,
            ))
        })
        .collect();
    let which = format!("{which} ({})", clients.versions());
    assert!(acked.len() > 20, "{which} sold only {}", acked.len());
    let after = acked.iter().filter(|(_, _, at)| *at > moved_at).count();
    assert!(after > 5, "{which}: only {after} holds after the move");
    let b = c.nodes[1].port;
    let unique: HashSet<&String> = acked.iter().map(|(t, _, _)| t).collect();
    assert_eq!(unique.len(), acked.len(), "a token handed out twice");
    let mut per_sku: HashMap<String, i64> = HashMap::new();
    for (token, state, _) in &acked {
        assert_eq!(
            state_of(b, token).as_deref(),
            Some(state.as_str()),
            "{token}"
        );
        let sku = &token[1..token.find('}').expect("tag")];
        *per_sku.entry(sku.to_string()).or_default() += 1;
    }
    for s in &skus {
        let (total, available, reserved, committed) = sale_info(b, s);
        assert_eq!(total, TOTAL);
        assert_eq!(available + reserved + committed, total);
        assert_eq!(reserved + committed, per_sku[s], "{s}");
        let gone: redis::RedisResult<Value> =
            redis::cmd("SALE.INFO").arg(s).query(&mut c.nodes[0].conn());
        assert!(gone.is_err(), "{s} still answered on A");
    }
    let retried = lines
        .iter()
        .find_map(|l| l.get("retried").cloned())
        .expect("retried");
    eprintln!(
        "{which}: {} holds ({after} after the move); A sent ASK {} TRYAGAIN {}; caller retried {retried}",
        acked.len(),
        counter(&c.nodes[0], "cluster_redirections_ask"),
        counter(&c.nodes[0], "cluster_tryagain")
    );
    retried
}

#[test]
fn cluster_move_slots_under_ioredis_cluster() {
    ioredis_buys_through_a_move(Clients::Newest);
}

#[test]
fn cluster_move_slots_under_the_oldest_ioredis_cluster() {
    ioredis_buys_through_a_move(Clients::Oldest);
}

fn ioredis_buys_through_a_move(clients: Clients) {
    let retried = node_buys_through_a_move("ioredis", clients);
    // ioredis follows -ASK and retries -TRYAGAIN itself: the caller sends nothing again.
    assert_eq!(
        retried,
        serde_json::json!({}),
        "ioredis gave up on requests"
    );
}

#[test]
fn cluster_move_slots_under_node_redis_create_cluster() {
    node_redis_buys_through_a_move(Clients::Newest);
}

#[test]
fn cluster_move_slots_under_the_oldest_node_redis_create_cluster() {
    node_redis_buys_through_a_move(Clients::Oldest);
}

fn node_redis_buys_through_a_move(clients: Clients) {
    let retried = node_buys_through_a_move("node-redis", clients);
    // node-redis follows -ASK itself and hands -TRYAGAIN to the caller, who sends the
    // same request again; nothing else reaches the caller.
    let words: Vec<&String> = retried.as_object().expect("map").keys().collect();
    assert!(
        words.iter().all(|w| *w == "TRYAGAIN"),
        "node-redis gave up on {retried}"
    );
}

/// What one RESERVE does when the owner answers `-ASK` (the sale already on B, the slot
/// still migrating) and `-TRYAGAIN` (a sale frozen by a handover whose link broke): once
/// while it stays frozen, and once while `move-slots` finishes the move 150 ms after the
/// request was sent. Returns the two answers to the frozen sale.
fn node_probe_ask_and_tryagain(
    which: &str,
    clients: Clients,
) -> (serde_json::Value, serde_json::Value) {
    let _one = ONE_NODE_TEST.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::start(&[(0, 8191), (8192, 16383)]);
    let (a, b) = (&c.nodes[0], &c.nodes[1]);
    let skus: Vec<String> = c.skus(&format!("P{}", &which[..2]), 2).remove(0);
    for s in &skus {
        create_on(a, s, 10);
    }
    let secret = c.keys.secret_path();

    // -ASK: the sale handed over by hand, the slot MIGRATING on A and IMPORTING on B.
    let ask_slot = key_slot(skus[1].as_bytes());
    for (n, state, other) in [(b, "IMPORTING", 0), (a, "MIGRATING", 1)] {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(ask_slot)
            .arg(state)
            .arg(node_id(other))
            .query(&mut n.conn())
            .expect("setslot");
    }
    let _: () = redis::cmd("SALE.MIGRATE")
        .arg("127.0.0.1")
        .arg(b.port)
        .arg(&skus[1])
        .query(&mut a.conn())
        .expect("migrate");
    let asks = counter(a, "cluster_redirections_ask");
    let got = answer(
        &NodeScript::start(which, clients, a.port, &secret, &["probe", &skus[1]])
            .finish(Duration::from_secs(30)),
    );
    let token = got["reply"][1]
        .as_str()
        .unwrap_or_else(|| panic!("{which} did not follow -ASK: {got}"))
        .to_string();
    assert_eq!(got["reply"][0], "RESERVED");
    assert!(
        counter(a, "cluster_redirections_ask") > asks,
        "no -ASK was sent"
    );
    move_slots(&a.addr(), &b.addr(), &ask_slot.to_string());
    assert_eq!(state_of(b.port, &token).as_deref(), Some("RESERVED"));

    // -TRYAGAIN: frozen on A by an export whose link broke after it left.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let lport = listener.local_addr().expect("addr").port();
    let sink = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut buf = [0u8; 64];
        let _ = std::io::Read::read(&mut s, &mut buf);
    });
    let r: redis::RedisResult<()> = redis::cmd("SALE.MIGRATE")
        .arg("127.0.0.1")
        .arg(lport)
        .arg(&skus[0])
        .query(&mut a.conn());
    sink.join().expect("listener");
    assert!(r.is_err(), "the link broke");
    let tryagain = counter(a, "cluster_tryagain");
    let held = answer(
        &NodeScript::start(which, clients, a.port, &secret, &["probe", &skus[0]])
            .finish(Duration::from_secs(30)),
    );
    // The slot is not migrating: the engine refused, and INFO counts that too.
    assert!(
        counter(a, "cluster_tryagain") > tryagain,
        "the frozen sale's -TRYAGAIN is counted"
    );
    let mut probe = NodeScript::start(which, clients, a.port, &secret, &["probe", &skus[0]]);
    probe.wait_line("sending", Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(150));
    let slot = key_slot(skus[0].as_bytes()).to_string();
    move_slots(&a.addr(), &b.addr(), &slot);
    let finished = answer(&probe.finish(Duration::from_secs(30)));
    if let Some(token) = finished["reply"][1].as_str() {
        assert_eq!(state_of(b.port, token).as_deref(), Some("RESERVED"));
    }
    eprintln!(
        "{which} ({}): frozen sale held -> {held}; finished meanwhile -> {finished}",
        clients.versions()
    );
    (held, finished)
}

#[test]
fn ioredis_cluster_follows_ask_and_retries_tryagain_for_about_a_second() {
    ioredis_follows_ask_and_retries_tryagain(Clients::Newest);
}

#[test]
fn ioredis_oldest_cluster_follows_ask_and_retries_tryagain_for_about_a_second() {
    ioredis_follows_ask_and_retries_tryagain(Clients::Oldest);
}

fn ioredis_follows_ask_and_retries_tryagain(clients: Clients) {
    let (held, finished) = node_probe_ask_and_tryagain("ioredis", clients);
    // Each -TRYAGAIN is retried 100 ms later on a random node (a -MOVED back from the
    // other one), within 16 redirections: a sale frozen longer fails the request.
    let e = held["error"].as_str().unwrap_or_else(|| panic!("{held}"));
    assert!(e.starts_with("Too many Cluster redirections"), "{held}");
    assert!(held["ms"].as_i64() >= Some(700), "{held}");
    assert_eq!(finished["reply"][0], "RESERVED", "{finished}");
    assert!(finished["ms"].as_i64() >= Some(150), "{finished}");
}

#[test]
fn node_redis_follows_ask_and_hands_tryagain_to_the_caller() {
    node_redis_hands_tryagain_to_the_caller(Clients::Newest);
}

#[test]
fn node_redis_oldest_follows_ask_and_hands_tryagain_to_the_caller() {
    node_redis_hands_tryagain_to_the_caller(Clients::Oldest);
}

fn node_redis_hands_tryagain_to_the_caller(clients: Clients) {
    let (held, finished) = node_probe_ask_and_tryagain("node-redis", clients);
    for got in [held, finished] {
        let e = got["error"].as_str().unwrap_or_else(|| panic!("{got}"));
        assert!(e.starts_with("TRYAGAIN"), "{got}");
        assert!(got["ms"].as_i64() < Some(150), "at once: {got}");
    }
}

/// What a `ROOM.STATUS` reply says, without what changes with the clock: the state, and
/// the position of a waiting buyer or the expiry of an admitted one.
fn room_place(n: &Node, sku: &str, user: &str, ticket: &str) -> (String, i64) {
    let v: Vec<Value> = redis::cmd("ROOM.STATUS")
        .arg(sku)
        .arg(user)
        .arg(ticket)
        .query(&mut n.conn())
        .expect("room.status");
    let kind = crate::common::as_str(&v[0]);
    let detail = match (kind.as_str(), v.get(1), v.get(2)) {
        ("WAITING", Some(Value::Int(p)), _) => *p,
        ("ADMITTED", _, Some(Value::Int(until))) => *until,
        _ => 0,
    };
    (kind, detail)
}

/// The admission token `ROOM.STATUS` hands an admitted buyer.
fn room_admission(n: &Node, sku: &str, user: &str, ticket: &str) -> String {
    let v: Vec<Value> = redis::cmd("ROOM.STATUS")
        .arg(sku)
        .arg(user)
        .arg(ticket)
        .query(&mut n.conn())
        .expect("room.status");
    assert_eq!(crate::common::as_str(&v[0]), "ADMITTED");
    crate::common::as_str(&v[1])
}

/// A sale's waiting room moves with its slot: at the destination the room has the same
/// counts, every ticket issued at the source gives the same place, an admitted buyer's
/// admission token reserves there, and a `kill -9` and restart keep the room.
#[test]
fn cluster_move_carries_the_waiting_room() {
    let mut c = Cluster::start(&[(0, 8191), (8192, 16383)]);
    let sku = c.skus("WR", 1).remove(0).remove(0);
    let slot = key_slot(sku.as_bytes()).to_string();
    let _: () = redis::cmd("SALE.CREATE")
        .arg(&sku)
        .arg(5)
        .arg("SHARDS")
        .arg(1)
        .query(&mut c.nodes[0].conn())
        .expect("create");
    // A fast rate: the room admits as many as the stock serves (5), the rest wait.
    let _: () = redis::cmd("ROOM.OPEN")
        .arg(&sku)
        .arg("RATE")
        .arg(1_000_000)
        .arg("ADMIT-TTL")
        .arg(600_000)
        .query(&mut c.nodes[0].conn())
        .expect("room.open");
    let mut tickets = Vec::new();
    for i in 0..12 {
        let user = format!("buyer{i}");
        let v: Vec<Value> = redis::cmd("ROOM.JOIN")
            .arg(&sku)
            .arg(&user)
            .query(&mut c.nodes[0].conn())
            .expect("room.join");
        tickets.push((user, crate::common::as_str(&v[0])));
    }
    let places = |n: &Node| -> Vec<(String, i64)> {
        tickets
            .iter()
            .map(|(u, t)| room_place(n, &sku, u, t))
            .collect()
    };
    let info = |n: &Node| -> Value {
        redis::cmd("ROOM.INFO")
            .arg(&sku)
            .query(&mut n.conn())
            .expect("room.info")
    };
    let before = places(&c.nodes[0]);
    let admitted = before.iter().filter(|p| p.0 == "ADMITTED").count();
    let waiting = before.iter().filter(|p| p.0 == "WAITING").count();
    assert_eq!((admitted, waiting), (5, 7), "{before:?}");
    let info_before = info(&c.nodes[0]);

    move_slots(&c.nodes[0].addr(), &c.nodes[1].addr(), &slot);
    assert_eq!(info(&c.nodes[1]), info_before);
    assert_eq!(places(&c.nodes[1]), before);
    let gone: redis::RedisResult<Value> = redis::cmd("ROOM.INFO")
        .arg(&sku)
        .query(&mut c.nodes[0].conn());
    assert!(gone.is_err(), "the room still answered on A");

    // An admitted buyer reserves at the destination with the admission it is handed there.
    let (user, ticket) = &tickets[before
        .iter()
        .position(|p| p.0 == "ADMITTED")
        .expect("an admitted buyer")];
    let adm = room_admission(&c.nodes[1], &sku, user, ticket);
    let v: Vec<Value> = redis::cmd("RESERVE")
        .arg(&sku)
        .arg(user)
        .arg(&adm)
        .arg("rid-1")
        .query(&mut c.nodes[1].conn())
        .expect("reserve on B");
    assert!(crate::common::as_str(&v[1]).starts_with(&format!("{{{sku}}}")));
    let after = places(&c.nodes[1]);
    let info_reserved = info(&c.nodes[1]);
    assert_eq!(room_place(&c.nodes[1], &sku, user, ticket).0, "RESERVED");

    // The imported room is in B's log: a kill -9 and a restart keep it.
    c.nodes[1].kill9();
    c.nodes[1].restart();
    let b = &c.nodes[1];
    wait_for("B up", Duration::from_secs(20), || {
        b.try_info("cluster").is_some()
    });
    assert_eq!(places(b), after);
    assert_eq!(info(b), info_reserved);
}
