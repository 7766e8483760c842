//! Sentinel-aware clients against a Raft group: each lists the three members' client
//! ports as its "sentinels" and the master name `stockgate`, in its default settings,
//! and reserves while the leader is `kill -9`ed. The client follows to the new leader
//! without being rebuilt or re-pointed, and every reservation it was told about is on
//! the new leader, once.
//!
//! - the client crate's Sentinel connection (`StockgateClient::connect_sentinel`), also
//!   through a `SENTINEL FAILOVER` of the live leader after the kill;
//! - ioredis (`sentinels:`) and node-redis (`createSentinel`), `tests/node/raft_clients.js`,
//!   on the newest majors (`tests/node`) and on the oldest ones supported (`tests/node-oldest`);
//! - redis-py `Sentinel`, `tests/py/raft_clients.py`.
//!
//! redis-rs 0.27 has a Sentinel client behind its `sentinel` feature, which this
//! workspace does not enable; the client crate is what Rust callers use.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stockgate_testkit::KillOnDrop;

use crate::common::node::Clients;
use crate::common::now_ms;
use crate::common::raft::*;
use stockgate_client::types::ReserveOutcome;
use stockgate_client::{SentinelConfig, StockgateClient};

const TOTAL: i64 = 1_000_000;

/// Every token is a distinct reservation on `port`, and the sale holds exactly one unit
/// per token: nothing acknowledged is missing, nothing was reserved twice for a user.
fn check_exactly(port: u16, sku: &str, tokens: &[String], what: &str) {
    let uniq: HashSet<&String> = tokens.iter().collect();
    assert_eq!(uniq.len(), tokens.len(), "{what}: a token handed out twice");
    let lost: Vec<&String> = tokens
        .iter()
        .zip(states(port, tokens))
        .filter(|(_, s)| s.as_deref() != Some("RESERVED"))
        .map(|(t, _)| t)
        .collect();
    assert!(
        lost.is_empty(),
        "{what}: {} acknowledged reservations missing on the leader, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    let (total, avail, reserved, committed) = sale_info(port, sku);
    assert_eq!(
        (reserved, avail + reserved + committed),
        (tokens.len() as i64, total),
        "{what}: one unit per acknowledged reservation, and the counters add up"
    );
}

fn member_ports(g: &Group) -> Vec<u16> {
    [1, 2, 3].iter().map(|i| g.port(*i)).collect()
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

// --- the client crate's Sentinel connection ---------------------------------------------

#[test]
fn raft_client_crate_sentinel_connection_follows_a_kill_and_a_switchover() {
    let _one = crate::alone();
    const SKU: &str = "RC-CLIENT";
    let mut g = Group::start(false);
    let old = g.leader(None, Duration::from_secs(10));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let list = member_ports(&g)
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let client = rt
        .block_on(StockgateClient::connect_sentinel(SentinelConfig::new(
            SentinelConfig::parse_list(&list),
            "stockgate",
        )))
        .expect("connect through the members");
    assert_eq!(
        client.primary_addr(),
        Some(format!("127.0.0.1:{}", g.port(old)))
    );
    rt.block_on(client.sale_create(SKU, TOTAL as u64, None, None, None))
        .expect("SALE.CREATE through the members");

    let keyring = Arc::new(g.keys.keyring());
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::<(String, bool)>::new()));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let killed = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (client, keyring, stop, acked, errors, killed) = (
                client.clone(),
                keyring.clone(),
                stop.clone(),
                acked.clone(),
                errors.clone(),
                killed.clone(),
            );
            rt.spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let user = format!("w{w}-{i}");
                    let adm = keyring.mint(SKU, &user, now_ms() + 600_000);
                    let after = killed.load(Ordering::Relaxed);
                    // One call per user: the client's own retries are under test; an
                    // error here is a failover the caller saw.
                    match client
                        .reserve(SKU, &user, &adm, &format!("req-{user}"), 1)
                        .await
                    {
                        Ok(ReserveOutcome::Reserved { token, .. })
                        | Ok(ReserveOutcome::Replay { token, .. }) => acked
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push((token, after)),
                        Ok(other) => errors
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(format!("{user}: {other:?}")),
                        Err(e) => errors
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(format!("{user}: {e}")),
                    }
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        })
        .collect();
    let n_acked = || acked.lock().unwrap_or_else(|e| e.into_inner()).len();
    let n_after = || {
        acked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, a)| *a)
            .count()
    };
    wait_for(
        "reservations before the kill",
        Duration::from_secs(30),
        || n_acked() >= 100,
    );
    g.member(old).kill9();
    killed.store(true, Ordering::Relaxed);
    let t = Instant::now();
    wait_for(
        "a reservation acknowledged after the kill",
        Duration::from_secs(30),
        || n_after() >= 1,
    );
    let first_after = t.elapsed();
    let new = g.leader(Some(old), Duration::from_secs(10));
    wait_for(
        "reservations after the kill",
        Duration::from_secs(30),
        || n_after() >= 100,
    );
    assert_eq!(
        client.primary_addr(),
        Some(format!("127.0.0.1:{}", g.port(new))),
        "the client follows to the new leader"
    );

    // The killed member back, then a switchover of the live leader: the client follows
    // again. The new leader must be past its lease (it refuses votes for that long).
    g.member(old).spawn();
    g.converge(Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(700));
    let third = {
        let mut third = None;
        for _ in 0..5 {
            let l = g.leader(None, Duration::from_secs(10));
            let r: String = redis::cmd("SENTINEL")
                .arg("FAILOVER")
                .arg("stockgate")
                .query(&mut conn(g.port(l)))
                .expect("SENTINEL FAILOVER");
            assert_eq!(r, "OK");
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(3) {
                let n = g.leader(None, Duration::from_secs(10));
                if n != l {
                    third = Some(n);
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if third.is_some() {
                break;
            }
        }
        third.expect("SENTINEL FAILOVER moved the leadership")
    };
    let at_switch = n_acked();
    wait_for(
        "reservations after the switchover",
        Duration::from_secs(30),
        || n_acked() >= at_switch + 100,
    );
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        rt.block_on(w).expect("worker");
    }
    assert_eq!(
        client.primary_addr(),
        Some(format!("127.0.0.1:{}", g.port(third))),
        "the client follows the switchover"
    );
    let errors = errors.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert!(
        errors.is_empty(),
        "{} calls failed through the failovers, e.g. {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    let acked = acked.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let tokens: Vec<String> = acked.iter().map(|(t, _)| t.clone()).collect();
    check_exactly(g.port(third), SKU, &tokens, "client crate");
    println!(
        "client crate through the members: {} reservations, {} after the kill; kill -> first acknowledged RESERVE {} ms; 0 errors",
        tokens.len(),
        n_after(),
        first_after.as_millis()
    );
}

// --- client processes: ioredis, node-redis, redis-py ------------------------------------

/// What a client script reported so far.
#[derive(Default)]
struct Seen {
    /// `(request id, token, word)` per acknowledged RESERVE.
    acks: Vec<(String, String, String)>,
    /// `(acks before it, port)` per `AT` line.
    at: Vec<(usize, u16)>,
    done: Option<u64>,
    other: Vec<String>,
}

impl Seen {
    fn take(&mut self, rx: &Receiver<String>) {
        while let Ok(line) = rx.try_recv() {
            let mut w = line.split_whitespace();
            match (w.next(), w.next(), w.next(), w.next()) {
                (Some("ACK"), Some(rid), Some(tok), Some(word)) => {
                    self.acks.push((rid.into(), tok.into(), word.into()))
                }
                (Some("AT"), Some(p), None, None) => {
                    self.at.push((self.acks.len(), p.parse().unwrap_or(0)))
                }
                (Some("DONE"), Some(n), None, None) => self.done = n.parse().ok(),
                // A client library's own log line on stdout.
                _ => self.other.push(line),
            }
        }
    }

    fn port(&self) -> Option<u16> {
        self.at.last().map(|(_, p)| *p)
    }
}

/// Runs a client script (`cmd` plus `PORTS NAME SECRET_FILE SKU`) against a fresh group,
/// `kill -9`s the leader once it has reserved a while, lets it reserve on the new
/// leader, stops it, and checks what it was told against the new leader.
/// What happens to the leader while a client reserves through the members.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    /// `kill -9`.
    Kill,
    /// Every link to and from it cut (it keeps running, first in the client's list).
    Isolate,
}

fn client_follows_a_leader_kill(what: &str, cmd: Command, sku: &str) {
    client_follows(what, cmd, sku, Fault::Kill)
}

fn client_follows(what: &str, mut cmd: Command, sku: &str, fault: Fault) {
    let _one = crate::alone();
    let mut g = Group::start(fault == Fault::Isolate);
    let old = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(old), sku, TOTAL as u64);
    // The leader first: the member every client asks first.
    let mut order = vec![g.port(old)];
    order.extend(member_ports(&g).into_iter().filter(|p| *p != g.port(old)));
    let ports = order
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut child = KillOnDrop(
        cmd.arg(&ports)
            .arg("stockgate")
            .arg(g.keys.secret_path())
            .arg(sku)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{what}: spawn: {e}")),
    );
    let err_text = Arc::new(Mutex::new(String::new()));
    let sink = err_text.clone();
    let stderr = child.0.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let mut s = sink.lock().unwrap_or_else(|e| e.into_inner());
            s.push_str(&line);
            s.push('\n');
        }
    });
    let stderr_now = || err_text.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let (tx, rx) = channel::<String>();
    let stdout = child.0.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut seen = Seen::default();
    let wait = |seen: &mut Seen, why: &str, f: &dyn Fn(&Seen) -> bool, child: &mut Child| {
        let t = Instant::now();
        loop {
            seen.take(&rx);
            if f(seen) {
                return;
            }
            if let Ok(Some(st)) = child.try_wait() {
                seen.take(&rx);
                if f(seen) {
                    return;
                }
                panic!(
                    "{what}: exited ({st}) waiting for {why}\nstderr:\n{}",
                    stderr_now()
                );
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "{what}: no {why} within 60 s ({} acks, at {:?})\nother output: {:?}\nstderr:\n{}",
                seen.acks.len(),
                seen.at,
                seen.other,
                stderr_now()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    wait(
        &mut seen,
        "reservations before the kill",
        &|s| s.acks.len() >= 40,
        &mut child.0,
    );
    assert_eq!(
        seen.port(),
        Some(g.port(old)),
        "{what} started on the leader"
    );
    match fault {
        Fault::Kill => g.member(old).kill9(),
        Fault::Isolate => g.cut(old, true),
    }
    let at_kill = seen.acks.len();
    let killed_at = Instant::now();
    let new = g.leader(Some(old), Duration::from_secs(10));
    let new_port = g.port(new);
    wait(
        &mut seen,
        "reservations on the new leader",
        &|s| {
            s.at.iter().any(|(n, p)| *n >= at_kill && *p == new_port)
                && s.acks.len() >= at_kill + 40
        },
        &mut child.0,
    );
    let followed_in = killed_at.elapsed();
    let mut stdin = child.0.stdin.take().expect("stdin");
    stdin
        .write_all(b"stop\n")
        .expect("write to the client script");
    drop(stdin);
    wait(&mut seen, "DONE", &|s| s.done.is_some(), &mut child.0);
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.0.try_wait().expect("wait") {
            break st;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "{what} did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{what} failed:\n{}", stderr_now());
    seen.take(&rx);
    assert_eq!(
        seen.port(),
        Some(new_port),
        "{what} followed to the new leader"
    );
    let tokens: Vec<String> = seen.acks.iter().map(|(_, t, _)| t.clone()).collect();
    let rids: HashSet<&String> = seen.acks.iter().map(|(r, _, _)| r).collect();
    assert_eq!(
        rids.len(),
        seen.acks.len(),
        "{what}: a request acknowledged twice"
    );
    check_exactly(new_port, sku, &tokens, what);
    let replays = seen.acks.iter().filter(|(_, _, w)| w == "REPLAY").count();
    println!(
        "{what} through the members: {} reservations ({at_kill} before the kill of node {old}), {replays} answered REPLAY, {} calls retried; on node {new} {} ms after the kill",
        seen.acks.len(),
        seen.done.unwrap_or(0),
        followed_in.as_millis()
    );
}

/// `tests/node/raft_clients.js` with `client` (ioredis or node-redis) from `clients`.
fn node_client(clients: Clients, client: &str) -> Command {
    let mut cmd = clients.script("raft_clients.js");
    cmd.arg(client);
    cmd
}

#[test]
fn raft_ioredis_sentinel_follows_an_isolated_leader() {
    client_follows(
        "ioredis, leader isolated",
        node_client(Clients::Newest, "ioredis"),
        "RC-IOREDIS-ISO",
        Fault::Isolate,
    );
}

#[test]
fn raft_node_redis_sentinel_follows_an_isolated_leader() {
    client_follows(
        "node-redis, leader isolated",
        node_client(Clients::Newest, "node-redis"),
        "RC-NODEREDIS-ISO",
        Fault::Isolate,
    );
}

#[test]
fn raft_ioredis_sentinel_follows_a_leader_kill() {
    client_follows_a_leader_kill(
        "ioredis",
        node_client(Clients::Newest, "ioredis"),
        "RC-IOREDIS",
    );
}

/// node-redis's `createSentinel` `PSUBSCRIBE`s on its sentinel connection
/// (`switch-master`, `[-+]sdown`, ...): the members answer it (`pubsub`), and it follows
/// the kill to the new leader.
#[test]
fn raft_node_redis_sentinel_follows_a_leader_kill() {
    client_follows_a_leader_kill(
        "node-redis",
        node_client(Clients::Newest, "node-redis"),
        "RC-NODEREDIS",
    );
}

// The same four on the oldest majors the project supports (`tests/node-oldest`).

#[test]
fn raft_ioredis_oldest_sentinel_follows_an_isolated_leader() {
    client_follows(
        "oldest ioredis, leader isolated",
        node_client(Clients::Oldest, "ioredis"),
        "RC-IOREDIS-OLD-ISO",
        Fault::Isolate,
    );
}

#[test]
fn raft_node_redis_oldest_sentinel_follows_an_isolated_leader() {
    client_follows(
        "oldest node-redis, leader isolated",
        node_client(Clients::Oldest, "node-redis"),
        "RC-NODEREDIS-OLD-ISO",
        Fault::Isolate,
    );
}

#[test]
fn raft_ioredis_oldest_sentinel_follows_a_leader_kill() {
    client_follows_a_leader_kill(
        "oldest ioredis",
        node_client(Clients::Oldest, "ioredis"),
        "RC-IOREDIS-OLD",
    );
}

#[test]
fn raft_node_redis_oldest_sentinel_follows_a_leader_kill() {
    client_follows_a_leader_kill(
        "oldest node-redis",
        node_client(Clients::Oldest, "node-redis"),
        "RC-NODEREDIS-OLD",
    );
}

#[test]
fn raft_redis_py_sentinel_follows_a_leader_kill() {
    let mut cmd = Command::new("python3");
    cmd.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/py/raft_clients.py"
    ));
    client_follows_a_leader_kill("redis-py", cmd, "RC-PY");
}

// --- a storm of redis-py checkout clients through kills and a switchover ----------------

/// `tests/ha_sentinel.rs` on the group: twelve redis-py checkout clients
/// (`tests/py/raft_storm.py`: RESERVE, then mostly RELEASE, sometimes COMMIT) through the
/// members as their sentinels; the leader is `kill -9`ed five times (and restarted), then
/// moved by `SENTINEL FAILOVER` with the clients writing to it. Every reservation whose
/// reply reached a client is on the final leader in (at least) its last acknowledged
/// state, no token twice, the counters add up, every member holds the same state.
#[test]
fn raft_redis_py_storm_through_five_leader_kills_and_a_switchover() {
    let _one = crate::alone();
    const SKU: &str = "FLASH";
    const STORM_TOTAL: i64 = 5000;
    const KILLS: usize = 5;
    let mut g = Group::start(false);
    let first = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(first), SKU, STORM_TOTAL as u64);
    let out = g.keys.dir.path().join("storm.json");
    let ports = member_ports(&g)
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let py = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py");
    let mut storm = KillOnDrop(
        Command::new("python3")
            .arg(py.join("raft_storm.py"))
            .arg("0")
            .arg(g.keys.dir.path())
            .arg(&ports)
            .arg("stockgate")
            .arg(SKU)
            .arg("600")
            .arg("12")
            .arg(&out)
            .env("PYTHONPATH", &py)
            .stdin(Stdio::null())
            .spawn()
            .expect("python3 tests/py/raft_storm.py"),
    );
    let mut probes = Vec::new();
    let mut failover_ms = Vec::new();
    for round in 0..=KILLS {
        let live = round == KILLS;
        std::thread::sleep(Duration::from_millis(2000));
        let old = g.leader(None, Duration::from_secs(15));
        let t = Instant::now();
        if live {
            let r: String = redis::cmd("SENTINEL")
                .arg("FAILOVER")
                .arg("stockgate")
                .query(&mut conn(g.port(old)))
                .expect("SENTINEL FAILOVER");
            assert_eq!(r, "OK");
        } else {
            g.member(old).kill9();
        }
        // The fault to the first RESERVE acknowledged by another member.
        let probe = loop {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "round {round}: no new leader took a reservation"
            );
            let n = g.leader(Some(old), Duration::from_secs(30));
            let user = format!("probe{round}");
            if let Ok(tok) = reserve(g.port(n), &g, SKU, &user, &user) {
                break tok;
            }
        };
        failover_ms.push(t.elapsed().as_millis());
        probes.push(probe);
        if !live {
            g.member(old).spawn();
        }
    }
    std::fs::write(out.with_extension("json.stop"), b"").expect("stop file");
    let t = Instant::now();
    let status = loop {
        if let Ok(Some(st)) = storm.0.try_wait() {
            break st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the storm did not stop"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "storm failed: {status}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out).expect("storm output")).expect("json");
    g.converge(Duration::from_secs(30));
    let l = g.leader(None, Duration::from_secs(10));
    let (total, avail, reserved, committed) = sale_info(g.port(l), SKU);
    assert_eq!(total, STORM_TOTAL);
    assert_eq!(avail + reserved + committed, total, "counters add up");
    let mut acked: Vec<(String, String, String)> = report["acked"]
        .as_array()
        .expect("acked")
        .iter()
        .map(|e| {
            let s = |i: usize| e[i].as_str().unwrap_or_default().to_owned();
            (s(0), s(1), s(2))
        })
        .collect();
    acked.extend(
        probes
            .into_iter()
            .enumerate()
            .map(|(i, t)| (format!("probe{i}"), t, "RESERVED".to_owned())),
    );
    assert!(acked.len() > 100, "the storm hardly ran: {}", acked.len());
    let tokens: Vec<String> = acked.iter().map(|a| a.1.clone()).collect();
    assert_eq!(
        tokens.iter().collect::<HashSet<_>>().len(),
        tokens.len(),
        "a token was handed out twice"
    );
    let now = states(g.port(l), &tokens);
    let mut lost = Vec::new();
    for ((req, tok, state), now) in acked.iter().zip(&now) {
        assert!(!state.starts_with("ERR"), "{req}: {state}");
        let ok = match (state.as_str(), now.as_deref()) {
            ("RESERVED", Some("RESERVED" | "COMMITTED" | "RELEASED")) => true,
            (s, Some(n)) => s == n,
            (_, None) => false,
        };
        if !ok {
            lost.push(format!("{req} {tok}: acknowledged {state}, now {now:?}"));
        }
    }
    assert!(
        lost.is_empty(),
        "{} acknowledged states lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    let held = now
        .iter()
        .filter(|s| matches!(s.as_deref(), Some("RESERVED" | "COMMITTED")))
        .count() as i64;
    assert!(
        held <= reserved + committed,
        "held units within the counters"
    );
    // Every member holds the same state.
    let sample: Vec<String> = tokens.iter().step_by(7).cloned().collect();
    let want = (states(g.port(l), &sample), sale_info(g.port(l), SKU));
    for id in [1, 2, 3] {
        assert_eq!(
            (states(g.port(id), &sample), sale_info(g.port(id), SKU)),
            want,
            "node {id} diverged"
        );
    }
    println!(
        "redis-py storm through the members: {} reservations acknowledged, {} retries, {held}/{total} units held; fault -> first RESERVE on the new leader: {failover_ms:?} ms (5 kills, then SENTINEL FAILOVER)",
        acked.len(),
        report["retries"]
    );
}
