//! What replication must guarantee, on a Raft group:
//!
//! - a follower converges on the leader's state (reservations, commits, releases),
//!   serves reads, refuses writes (`-READONLY`), and after a `kill -9` catches up from
//!   its own log and the leader's;
//! - a member whose WAL lost its tail (synced once a second: the Raft log is the durable
//!   copy) gets it back from its Raft log;
//! - a leader whose followers are both stopped (`SIGSTOP`) acknowledges nothing, and
//!   takes writes again (or another member does) once they are back.

use std::time::{Duration, Instant};

use crate::common::raft::*;

fn stock(port: u16, sku: &str) -> i64 {
    redis::cmd("STOCK")
        .arg(sku)
        .query(&mut conn(port))
        .expect("STOCK")
}

fn converged(g: &Group, leader: u64, f: u64, sku: &str, tokens: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let a: Vec<_> = tokens.iter().map(|t| state_of(g.port(leader), t)).collect();
        let b: Vec<_> = tokens.iter().map(|t| state_of(g.port(f), t)).collect();
        if a == b && sale_info(g.port(leader), sku) == sale_info(g.port(f), sku) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "follower {f} did not converge on leader {leader}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn raft_a_follower_serves_reads_refuses_writes_and_catches_up_after_kill_9() {
    const SKU: &str = "FOLLOW";
    let mut g = Group::start(false);
    let l = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(l), SKU, 500);
    let mut c = conn(g.port(l));
    let mut tokens = Vec::new();
    for i in 0..60 {
        let t = reserve(g.port(l), &g, SKU, &format!("u{i}"), &format!("r{i}")).expect("reserve");
        match i % 3 {
            0 => {
                let _: redis::Value = redis::cmd("COMMIT").arg(&t).query(&mut c).expect("COMMIT");
            }
            1 => {
                let _: redis::Value = redis::cmd("RELEASE")
                    .arg(&t)
                    .query(&mut c)
                    .expect("RELEASE");
            }
            _ => {}
        }
        tokens.push(t);
    }
    let f = [1, 2, 3].into_iter().find(|i| *i != l).expect("follower");
    converged(&g, l, f, SKU, &tokens);
    let role: Vec<redis::Value> = redis::cmd("ROLE")
        .query(&mut conn(g.port(f)))
        .expect("ROLE");
    assert_eq!(
        role.first().map(crate::common::as_str).as_deref(),
        Some("slave")
    );
    let err = reserve(g.port(f), &g, SKU, "x", "rx").expect_err("a follower takes no write");
    assert!(err.to_ascii_lowercase().contains("read only"), "{err}");
    // Reads are served from the follower's committed state.
    assert_eq!(stock(g.port(f), SKU), 500 - 40);
    assert_eq!(
        state_of(g.port(f), &tokens[0]).as_deref(),
        Some("COMMITTED")
    );
    assert_eq!(state_of(g.port(f), &tokens[1]).as_deref(), Some("RELEASED"));
    assert_eq!(state_of(g.port(f), &tokens[2]).as_deref(), Some("RESERVED"));

    // kill -9 the follower, write on (the other two are a majority), restart it.
    g.member(f).kill9();
    for i in 60..90 {
        tokens.push(
            reserve(g.port(l), &g, SKU, &format!("u{i}"), &format!("r{i}")).expect("reserve"),
        );
    }
    g.member(f).spawn();
    converged(&g, l, f, SKU, &tokens);
    assert_eq!(stock(g.port(f), SKU), 500 - 70);
}

/// Cuts the member's newest WAL segment to half its length, mid-record: what a power
/// loss leaves of a WAL synced only once a second.
fn cut_wal_tail(dir: &std::path::Path) -> u64 {
    let wal = dir.join("wal");
    let newest = std::fs::read_dir(&wal)
        .expect("wal dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .max()
        .expect("a segment");
    let len = std::fs::metadata(&newest).expect("segment").len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&newest)
        .expect("open segment");
    f.set_len(len / 2 + 3).expect("cut");
    len - (len / 2 + 3)
}

#[test]
fn raft_a_member_whose_wal_lost_its_unsynced_tail_takes_it_back_from_its_raft_log() {
    const SKU: &str = "TAIL";
    let mut g = Group::start(false);
    let l = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(l), SKU, 500);
    // Every member's durable log is its Raft log: the WAL beside it syncs once a
    // second, whatever --fsync (here always) says.
    for id in [1, 2, 3] {
        let s: String = redis::cmd("INFO")
            .arg("persistence")
            .query(&mut conn(g.port(id)))
            .expect("INFO");
        assert!(s.contains("aof_fsync:everysec"), "member {id}: {s}");
    }
    let mut tokens = Vec::new();
    for i in 0..80 {
        tokens.push(
            reserve(g.port(l), &g, SKU, &format!("u{i}"), &format!("r{i}")).expect("reserve"),
        );
    }
    let f = [1, 2, 3].into_iter().find(|i| *i != l).expect("follower");
    converged(&g, l, f, SKU, &tokens);
    g.member(f).kill9();
    let lost = cut_wal_tail(&g.member(f).dir);
    assert!(lost > 0);
    g.member(f).spawn();
    converged(&g, l, f, SKU, &tokens);
    assert_eq!(stock(g.port(f), SKU), 500 - 80);
    // The leader too: a new leader takes over, the old one comes back whole.
    g.member(l).kill9();
    cut_wal_tail(&g.member(l).dir);
    let l2 = g.leader(Some(l), Duration::from_secs(10));
    tokens.push(reserve(g.port(l2), &g, SKU, "after", "r-after").expect("reserve"));
    g.member(l).spawn();
    converged(&g, l2, l, SKU, &tokens);
    assert_eq!(stock(g.port(l), SKU), 500 - 81);
}

#[test]
fn raft_a_leader_whose_followers_are_stopped_acknowledges_nothing() {
    const SKU: &str = "STOPPED";
    let g = Group::start(false);
    let l = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(l), SKU, 100);
    let followers: Vec<u64> = [1, 2, 3].into_iter().filter(|i| *i != l).collect();
    let pid = |id: u64| {
        g.members
            .iter()
            .find(|m| m.id == id)
            .and_then(|m| m.child.as_ref())
            .map(|c| c.id() as i32)
            .expect("a running member")
    };
    for f in &followers {
        unsafe {
            libc::kill(pid(*f), libc::SIGSTOP);
        }
    }
    let mut acked = Vec::new();
    let t = Instant::now();
    let mut i = 0;
    // The first attempt waits on a commit that cannot come: the leader gives way once no
    // majority answered for the election timeout (600 ms) and fails it with -READONLY,
    // well before the client's own 3 s read timeout; the later ones are refused at once.
    let mut first = None;
    while t.elapsed() < Duration::from_secs(5) {
        i += 1;
        let sent = Instant::now();
        match reserve(g.port(l), &g, SKU, &format!("u{i}"), &format!("r{i}")) {
            Ok(tok) => acked.push(tok),
            Err(e) if first.is_none() => first = Some((e, sent.elapsed())),
            Err(_) => {}
        }
    }
    let (why, took) = first.expect("a first attempt");
    assert!(
        why.contains("read only") && took < Duration::from_millis(2500),
        "the write waiting on the leader that lost its majority: {why:?} after {took:?}"
    );
    for f in &followers {
        unsafe {
            libc::kill(pid(*f), libc::SIGCONT);
        }
    }
    assert!(
        acked.is_empty(),
        "an isolated leader acknowledged {acked:?}"
    );
    // Back: a leader (the same or another) takes writes. An attempt that timed out
    // while the followers were stopped may still commit after they resume (the client
    // was never told either way), so only the counters are checked.
    let deadline = Instant::now() + Duration::from_secs(20);
    let back = loop {
        let n = g.leader(None, Duration::from_secs(15));
        if let Ok(t) = reserve(g.port(n), &g, SKU, "back", "back") {
            break (n, t);
        }
        assert!(Instant::now() < deadline, "no write taken after SIGCONT");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        state_of(g.port(back.0), &back.1).as_deref(),
        Some("RESERVED")
    );
    g.converge(Duration::from_secs(20));
    let (total, avail, reserved, committed) = sale_info(g.port(back.0), SKU);
    assert_eq!(avail + reserved + committed, total);
    println!(
        "followers stopped for 5 s: {i} RESERVE attempts on the leader, 0 acknowledged, the first failed with -READONLY after {took:?}; {reserved} unit(s) held after the heal"
    );
}

/// A member whose route to a peer loops back to itself must not die of it: a leader
/// that received its own append-entries would stop its Raft core (openraft 0.9.25's
/// `Engine::following_handler` asserts it has no leader state) and live on applying
/// nothing. Members drop requests that name themselves (`raft::network::serve_peer`).
/// Here node 1 reaches "node 2" at its own Raft address and is made to lead; it must
/// still apply what the group commits.
#[test]
fn raft_a_route_that_loops_back_to_the_member_does_not_stop_its_raft_core() {
    let mut g = Group::start(false);
    let l = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(l), "LOOP", 1);
    let m = g.member(1);
    m.kill9();
    let own = m.raft_port;
    m.args.push("--raft-route".into());
    m.args.push(format!("2=127.0.0.1:{own}"));
    m.spawn();
    // Node 1 leads: ask it to stand (or hand over to it) until it does.
    let deadline = Instant::now() + Duration::from_secs(20);
    while g.leader(None, Duration::from_secs(10)) != 1 && Instant::now() < deadline {
        let _ = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg("stockgate")
            .query::<String>(&mut conn(g.port(1)));
        std::thread::sleep(Duration::from_millis(1000));
        let exited = g
            .member(1)
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten());
        assert!(exited.is_none(), "node 1 died: {exited:?}");
    }
    // Its Raft core must still run: it applies what the group commits next.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut i = 0;
    loop {
        i += 1;
        let n = g.leader(None, Duration::from_secs(10));
        if let Ok(t) = reserve(g.port(n), &g, "LOOP", &format!("u{i}"), &format!("r{i}")) {
            let applied = Instant::now() + Duration::from_secs(5);
            while Instant::now() < applied {
                if state_of(g.port(1), &t).as_deref() == Some("RESERVED") {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        assert!(
            Instant::now() < deadline,
            "node 1 no longer applies the group's entries (its Raft core stopped: see its log for openraft's panic)"
        );
    }
}
