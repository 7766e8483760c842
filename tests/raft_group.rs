//! A Raft group of three real `stockgate` processes on loopback: a write is acknowledged
//! only once a majority has it, so no `kill -9`, restart, partition or lost log loses an
//! acknowledged reservation. Faults by real means: SIGKILL, a restart on the same data
//! dir, a loopback proxy per directed link that can cut it, a deleted `raft/log`.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::ha::{free_port, Keys};
use common::{now_ms, server_bin, TempDir};

/// A TCP forwarder for one directed link; `cut` drops its connections and refuses new
/// ones until it is healed.
struct Proxy {
    port: u16,
    cut: Arc<AtomicBool>,
}

impl Proxy {
    fn start(target: u16) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = l.local_addr().expect("addr").port();
        let cut = Arc::new(AtomicBool::new(false));
        let c = cut.clone();
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(inbound) = conn else { continue };
                if c.load(Ordering::SeqCst) {
                    continue; // dropped: the link is cut
                }
                let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                for (mut from, mut to) in [
                    (
                        inbound.try_clone().expect("clone"),
                        outbound.try_clone().expect("clone"),
                    ),
                    (outbound, inbound),
                ] {
                    let c = c.clone();
                    std::thread::spawn(move || {
                        let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
                        let mut buf = [0u8; 65536];
                        loop {
                            if c.load(Ordering::SeqCst) {
                                let _ = from.shutdown(std::net::Shutdown::Both);
                                let _ = to.shutdown(std::net::Shutdown::Both);
                                return;
                            }
                            match from.read(&mut buf) {
                                Ok(0) => {
                                    let _ = to.shutdown(std::net::Shutdown::Both);
                                    return;
                                }
                                Ok(n) => {
                                    // Read just as the link was cut: dropped with it.
                                    if c.load(Ordering::SeqCst) || to.write_all(&buf[..n]).is_err()
                                    {
                                        return;
                                    }
                                }
                                Err(e)
                                    if matches!(
                                        e.kind(),
                                        std::io::ErrorKind::WouldBlock
                                            | std::io::ErrorKind::TimedOut
                                    ) => {}
                                Err(_) => {
                                    let _ = to.shutdown(std::net::Shutdown::Both);
                                    return;
                                }
                            }
                        }
                    });
                }
            }
        });
        Proxy { port, cut }
    }
}

struct Member {
    id: u64,
    port: u16,
    raft_port: u16,
    dir: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
}

impl Member {
    fn spawn(&mut self) {
        let child = Command::new(server_bin())
            .args(&self.args)
            // openraft warns at every refused connection to a killed peer: noise here.
            .env("STOCKGATE_LOG", "warn,openraft=error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn stockgate");
        self.child = Some(child);
        wait_ping(self.port);
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill9();
    }
}

struct Group {
    members: Vec<Member>,
    keys: Keys,
    /// `links[(from, to)]`: the proxy `from` reaches `to` through.
    links: Vec<((u64, u64), Proxy)>,
    _dir: TempDir,
}

fn wait_ping(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(mut c) = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
        {
            if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(30));
    }
    panic!("node on port {port} did not answer PING");
}

/// A connection, retried for a while: a deposed leader re-executes itself (its port is
/// closed for the moment of its restart).
fn conn(port: u16) -> redis::Connection {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("client");
    let deadline = Instant::now() + Duration::from_secs(10);
    let c = loop {
        match client.get_connection_with_timeout(Duration::from_secs(2)) {
            Ok(c) => break c,
            Err(e) => assert!(Instant::now() < deadline, "connect to {port}: {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    c.set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    c
}

impl Group {
    /// Three members, every link through its own proxy when `proxied`.
    fn start(proxied: bool) -> Group {
        let dir = TempDir::new("raft");
        let keys = Keys::new();
        let ids = [1u64, 2, 3];
        let ports: Vec<(u16, u16)> = ids.iter().map(|_| (free_port(), free_port())).collect();
        let peers = ids
            .iter()
            .zip(&ports)
            .map(|(i, (p, r))| format!("{i}=127.0.0.1:{p}/127.0.0.1:{r}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut links = Vec::new();
        if proxied {
            for &from in &ids {
                for (&to, &(_, rport)) in ids.iter().zip(&ports) {
                    if from != to {
                        links.push(((from, to), Proxy::start(rport)));
                    }
                }
            }
        }
        let mut members = Vec::new();
        for (&id, &(port, raft_port)) in ids.iter().zip(&ports) {
            let d = dir.path().join(format!("n{id}"));
            let mut args: Vec<String> = vec![
                "--port".into(),
                port.to_string(),
                "--data-dir".into(),
                d.display().to_string(),
                "--fsync".into(),
                "always".into(),
                "--raft-id".into(),
                id.to_string(),
                "--raft-listen".into(),
                format!("127.0.0.1:{raft_port}"),
                "--raft-peers".into(),
                peers.clone(),
            ];
            args.extend(keys.flags());
            for ((f, t), p) in &links {
                if *f == id {
                    args.push("--raft-route".into());
                    args.push(format!("{t}=127.0.0.1:{}", p.port));
                }
            }
            members.push(Member {
                id,
                port,
                raft_port,
                dir: d,
                args,
                child: None,
            });
        }
        for m in &mut members {
            m.spawn();
        }
        Group {
            members,
            keys,
            links,
            _dir: dir,
        }
    }

    fn member(&mut self, id: u64) -> &mut Member {
        self.members
            .iter_mut()
            .find(|m| m.id == id)
            .expect("member")
    }

    /// The member that takes writes, asked of every running member (as a Sentinel-aware
    /// client does), excluding `not`.
    fn leader(&self, not: Option<u64>, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            for m in self.members.iter().filter(|m| m.child.is_some()) {
                let Ok(mut c) = redis::Client::open(format!("redis://127.0.0.1:{}/", m.port))
                    .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(300)))
                else {
                    continue;
                };
                let addr: Option<(String, String)> = redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg("stockgate")
                    .query(&mut c)
                    .ok()
                    .flatten();
                let Some((_, p)) = addr else { continue };
                let Some(l) = self.members.iter().find(|x| x.port.to_string() == p) else {
                    continue;
                };
                if Some(l.id) == not || l.child.is_none() {
                    continue;
                }
                // The leader itself must say so and take writes.
                if let Ok(mut lc) = redis::Client::open(format!("redis://127.0.0.1:{}/", l.port))
                    .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(300)))
                {
                    let role: Vec<redis::Value> =
                        redis::cmd("ROLE").query(&mut lc).unwrap_or_default();
                    if role.first().map(common::as_str).as_deref() == Some("master") {
                        return l.id;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("no leader within {within:?}");
    }

    fn port(&self, id: u64) -> u16 {
        self.members
            .iter()
            .find(|m| m.id == id)
            .expect("member")
            .port
    }

    fn cut(&self, id: u64, cut: bool) {
        for ((f, t), p) in &self.links {
            if *f == id || *t == id {
                p.cut.store(cut, Ordering::SeqCst);
            }
        }
    }

    fn token(&self, sku: &str, user: &str) -> String {
        self.keys.keyring().mint(sku, user, now_ms() + 600_000)
    }

    /// Every running member reports the same event count, within `within`.
    fn converge(&self, within: Duration) -> i64 {
        let deadline = Instant::now() + within;
        loop {
            let lens: Vec<i64> = self
                .members
                .iter()
                .filter(|m| m.child.is_some())
                .map(|m| {
                    redis::cmd("XLEN")
                        .arg("stockgate:events")
                        .query(&mut conn(m.port))
                        .unwrap_or(-1)
                })
                .collect();
            if lens.windows(2).all(|w| w[0] == w[1]) && lens[0] >= 0 {
                return lens[0];
            }
            assert!(
                Instant::now() < deadline,
                "members did not converge: {lens:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn reserve(port: u16, g: &Group, sku: &str, user: &str, req: &str) -> Result<String, String> {
    reserve_with(port, sku, user, &g.token(sku, user), req)
}

fn sale_info(port: u16, sku: &str) -> (i64, i64, i64, i64) {
    let v: redis::Value = redis::cmd("SALE.INFO")
        .arg(sku)
        .query(&mut conn(port))
        .expect("sale.info");
    let f = |n| common::as_int(&common::field(&v, n).expect(n));
    (f("total"), f("available"), f("reserved"), f("committed"))
}

fn state_of(port: u16, token: &str) -> Option<String> {
    let v: redis::Value = redis::cmd("RESERVATION")
        .arg(token)
        .query(&mut conn(port))
        .expect("reservation");
    common::field(&v, "state").map(|s| common::as_str(&s))
}

/// Retried for a while: a leader just elected may still be catching up (`-LOADING`).
fn create_sale(port: u16, sku: &str, total: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r: redis::RedisResult<String> = redis::cmd("SALE.CREATE")
            .arg(sku)
            .arg(total)
            .arg("SHARDS")
            .arg(4)
            .query(&mut conn(port));
        match r {
            Ok(r) => return assert_eq!(r, "OK"),
            Err(e) => assert!(Instant::now() < deadline, "SALE.CREATE: {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writers reserve one unit each for distinct users against whoever leads; returns the
/// acknowledged tokens.
fn storm(
    g: &Arc<Mutex<Group>>,
    sku: &str,
    prefix: &str,
    writers: usize,
    per: usize,
) -> Vec<std::thread::JoinHandle<Vec<String>>> {
    (0..writers)
        .map(|w| {
            let (g, sku, prefix) = (g.clone(), sku.to_owned(), prefix.to_owned());
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                let mut i = 0;
                let deadline = Instant::now() + Duration::from_secs(40);
                while i < per && Instant::now() < deadline {
                    let port = {
                        let g = g.lock().expect("group");
                        let l = g.leader(None, Duration::from_secs(10));
                        g.port(l)
                    };
                    let user = format!("{prefix}-{w}-{i}");
                    let r = {
                        let g = g.lock().expect("group");
                        let tok = g.token(&sku, &user);
                        drop(g);
                        reserve_with(port, &sku, &user, &tok, &format!("req-{i}"))
                    };
                    match r {
                        Ok(t) => {
                            acked.push(t);
                            i += 1;
                        }
                        Err(e) if e == "SOLDOUT" => i += 1,
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
                acked
            })
        })
        .collect()
}

fn reserve_with(port: u16, sku: &str, user: &str, tok: &str, req: &str) -> Result<String, String> {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
        .map_err(|e| e.to_string())?;
    c.set_read_timeout(Some(Duration::from_secs(3)))
        .map_err(|e| e.to_string())?;
    let v: redis::Value = redis::cmd("RESERVE")
        .arg(sku)
        .arg(user)
        .arg(tok)
        .arg(req)
        .query(&mut c)
        .map_err(|e| e.to_string())?;
    match v {
        redis::Value::Array(items) if items.len() >= 2 => {
            let word = common::as_str(&items[0]);
            if word == "RESERVED" || word == "REPLAY" {
                Ok(common::as_str(&items[1]))
            } else {
                Err(word)
            }
        }
        redis::Value::Array(items) if !items.is_empty() => Err(common::as_str(&items[0])),
        other => Err(format!("{other:?}")),
    }
}

fn check_all_present(g: &Group, leader: u64, acked: &[String], sku: &str, total: i64) {
    let port = g.port(leader);
    let mut seen = std::collections::HashSet::new();
    for t in acked {
        assert!(seen.insert(t.clone()), "token {t} acknowledged twice");
        assert_eq!(
            state_of(port, t).as_deref(),
            Some("RESERVED"),
            "acknowledged reservation {t} missing on the leader"
        );
    }
    let (tot, avail, reserved, committed) = sale_info(port, sku);
    assert_eq!(tot, total);
    assert!(
        acked.len() as i64 <= total,
        "more units handed out than exist"
    );
    assert_eq!(
        avail + reserved + committed,
        total,
        "counters do not add up"
    );
    assert!(reserved >= acked.len() as i64);
}

#[test]
fn raft_a_killed_leader_loses_no_acknowledged_reservation_and_is_replaced_quickly() {
    let g = Group::start(false);
    let l = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(l), "KILL", 400);
    let g = Arc::new(Mutex::new(g));
    let writers = storm(&g, "KILL", "a", 4, 40);
    std::thread::sleep(Duration::from_millis(600));
    let (killed_at, old) = {
        let mut g = g.lock().expect("group");
        let l = g.leader(None, Duration::from_secs(5));
        g.member(l).kill9();
        (Instant::now(), l)
    };
    // Failover time: the kill to the first acknowledged RESERVE on the new leader. The
    // bound is loose (CI shares 2 cores among many tests); README reports the figure.
    let (new, first_ack) = loop {
        let (port, new) = {
            let g = g.lock().expect("group");
            let n = g.leader(Some(old), Duration::from_secs(10));
            (g.port(n), n)
        };
        let tok = g.lock().expect("group").token("KILL", "probe");
        if reserve_with(port, "KILL", "probe", &tok, "probe-1").is_ok() {
            break (new, killed_at.elapsed());
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(10),
            "no write accepted after the kill"
        );
    };
    eprintln!(
        "raft failover: kill -9 of node {old} -> first acknowledged RESERVE on node {new} in {} ms",
        first_ack.as_millis()
    );
    let mut acked: Vec<String> = writers
        .into_iter()
        .flat_map(|w| w.join().expect("writer"))
        .collect();
    let g = g.lock().expect("group");
    let probe = reserve_with(
        g.port(new),
        "KILL",
        "probe",
        &g.token("KILL", "probe"),
        "probe-1",
    )
    .expect("the probe replays");
    acked.push(probe);
    assert!(
        acked.len() > 40,
        "the storm made progress ({})",
        acked.len()
    );
    check_all_present(&g, new, &acked, "KILL", 400);
    assert!(
        first_ack < Duration::from_secs(5),
        "failover took {first_ack:?}"
    );
}

#[test]
fn raft_a_restarted_old_leader_cannot_acknowledge_and_follows() {
    let mut g = Group::start(false);
    let l = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(l), "BACK", 10);
    let first = reserve(g.port(l), &g, "BACK", "u1", "r1").expect("reserve");
    g.member(l).kill9();
    let n = g.leader(Some(l), Duration::from_secs(10));
    let second = reserve(g.port(n), &g, "BACK", "u2", "r1").expect("reserve on the new leader");
    // The old leader comes back on its data dir before anyone tells it anything.
    g.member(l).spawn();
    let r = reserve(g.port(l), &g, "BACK", "u3", "r1");
    assert!(
        r.is_err(),
        "the restarted old leader acknowledged a write: {r:?}"
    );
    let e = r.err().unwrap_or_default().to_ascii_lowercase();
    assert!(e.contains("readonly") || e.contains("loading"), "{e}");
    g.converge(Duration::from_secs(10));
    for id in [1, 2, 3] {
        let port = g.port(id);
        assert_eq!(
            state_of(port, &first).as_deref(),
            Some("RESERVED"),
            "node {id}"
        );
        assert_eq!(
            state_of(port, &second).as_deref(),
            Some("RESERVED"),
            "node {id}"
        );
    }
}

#[test]
fn raft_a_partitioned_leader_acknowledges_nothing_and_the_majority_goes_on() {
    let g = Group::start(true);
    let old = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(old), "CUT", 20);
    let before = reserve(g.port(old), &g, "CUT", "u0", "r0").expect("reserve");
    g.cut(old, true);
    // Every forwarding thread sees the cut within its 50 ms read timeout.
    std::thread::sleep(Duration::from_millis(200));
    // A write sent to the isolated leader, in flight across the cut, is never
    // acknowledged: not before the heal (no majority), not after (it lost its term).
    let g = Arc::new(Mutex::new(g));
    let isolated = {
        let g = g.lock().expect("group");
        let (port, tok) = (g.port(old), g.token("CUT", "cut-user"));
        std::thread::spawn(move || reserve_with(port, "CUT", "cut-user", &tok, "r1"))
    };
    let (new, after) = {
        let g = g.lock().expect("group");
        let new = g.leader(Some(old), Duration::from_secs(10));
        let after = reserve(g.port(new), &g, "CUT", "u1", "r1").expect("the majority takes writes");
        (new, after)
    };
    let r = isolated.join().expect("join");
    assert!(r.is_err(), "the isolated leader acknowledged {r:?}");
    let g = g.lock().expect("group");
    g.cut(old, false);
    g.converge(Duration::from_secs(15));
    let leader = g.leader(None, Duration::from_secs(10));
    for id in [1, 2, 3] {
        let port = g.port(id);
        assert_eq!(
            state_of(port, &before).as_deref(),
            Some("RESERVED"),
            "node {id}"
        );
        assert_eq!(
            state_of(port, &after).as_deref(),
            Some("RESERVED"),
            "node {id}"
        );
    }
    let (total, avail, reserved, committed) = sale_info(g.port(leader), "CUT");
    assert_eq!(avail + reserved + committed, total);
    // Nothing of the isolated write survived anywhere: only the two acknowledged holds.
    assert_eq!(reserved, 2, "new leader {new}, old {old}");
}

#[test]
fn raft_a_member_that_lost_its_log_refuses_to_start_and_rejoins_empty() {
    let mut g = Group::start(false);
    let l = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(l), "LOST", 10);
    let t = reserve(g.port(l), &g, "LOST", "u1", "r1").expect("reserve");
    let f = [1, 2, 3].into_iter().find(|i| *i != l).expect("a follower");
    g.converge(Duration::from_secs(10));
    g.member(f).kill9();
    std::fs::remove_file(g.member(f).dir.join("raft").join("log")).expect("rm raft/log");
    let out = Command::new(server_bin())
        .args(&g.member(f).args)
        .env("STOCKGATE_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert!(!out.status.success(), "a node without its raft log started");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("raft/log is missing") && err.contains("--rejoin-empty"),
        "{err}"
    );
    // The operator's way back: remove it, start it empty (no --raft-peers), add it again.
    let r: String = redis::cmd("RAFT.REMOVE")
        .arg(f)
        .query(&mut conn(g.port(l)))
        .expect("remove");
    assert_eq!(r, "OK");
    let m = g.member(f);
    let peers_at = m
        .args
        .iter()
        .position(|a| a == "--raft-peers")
        .expect("peers");
    m.args.drain(peers_at..peers_at + 2);
    m.args.push("--rejoin-empty".into());
    m.spawn();
    let (port, raft_port) = (m.port, m.raft_port);
    let r: String = redis::cmd("RAFT.ADD")
        .arg(f)
        .arg(format!("127.0.0.1:{port}"))
        .arg(format!("127.0.0.1:{raft_port}"))
        .query(&mut conn(g.port(l)))
        .expect("add");
    assert_eq!(r, "OK");
    g.converge(Duration::from_secs(15));
    assert_eq!(state_of(g.port(f), &t).as_deref(), Some("RESERVED"));
    let members: Vec<redis::Value> = redis::cmd("RAFT.MEMBERS")
        .query(&mut conn(g.port(l)))
        .expect("members");
    assert_eq!(members.len(), 3);
    // And the rejoined member can carry the group: the old leader dies, writes go on.
    let l2 = g.leader(None, Duration::from_secs(5));
    g.member(l2).kill9();
    let n = g.leader(Some(l2), Duration::from_secs(10));
    reserve(g.port(n), &g, "LOST", "u2", "r1").expect("reserve after losing another member");
    assert_eq!(state_of(g.port(n), &t).as_deref(), Some("RESERVED"));
}

/// redis-py's `Sentinel`, in its default settings, lists the members as its sentinels,
/// finds the leader, and after a `kill -9` of that leader finds the new one.
#[test]
fn raft_redis_py_sentinel_client_follows_a_failover_unchanged() {
    let mut g = Group::start(false);
    let l = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(l), "PY", 7);
    reserve(g.port(l), &g, "PY", "u1", "r1").expect("reserve");
    let ports = [1, 2, 3].map(|i| g.port(i).to_string()).join(",");
    let run = |ports: &str| {
        let out = Command::new("python3")
            .arg(format!(
                "{}/tests/py/raft_sentinel.py",
                env!("CARGO_MANIFEST_DIR")
            ))
            .arg(ports)
            .arg("PY")
            .output()
            .expect("python3");
        if !out.status.success() {
            // Right after a kill a member may still name the dead leader: retried below.
            return format!(
                "raft_sentinel.py failed (needs `pip install redis`): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(run(&ports), format!("leader {} stock 6", g.port(l)));
    g.member(l).kill9();
    let n = g.leader(Some(l), Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = run(&ports);
        if got == format!("leader {} stock 6", g.port(n)) {
            break;
        }
        assert!(Instant::now() < deadline, "redis-py did not follow: {got}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
