//! A Raft group of three real `stockgate` processes on loopback: a write is acknowledged
//! only once a majority has it, so no `kill -9`, restart, partition or lost log loses an
//! acknowledged reservation. Faults by real means: SIGKILL, a restart on the same data
//! dir, a loopback proxy per directed link that can cut it, a deleted `raft/log`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::process::{Command, Stdio};

use crate::common::raft::*;
use crate::common::server_bin;

#[test]
fn raft_a_killed_leader_loses_no_acknowledged_reservation_and_is_replaced_quickly() {
    let g = Group::start(false);
    let l = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(l), "KILL", 400);
    // The group has one history id, begun by its first leader, on every member.
    let history = history_of(g.port(l));
    assert_eq!(history.len(), 32, "{history:?}");
    converge_wal(&g, Duration::from_secs(10));
    for p in g.ports() {
        assert_eq!(history_of(p), history);
    }
    // INFO's replication section has its header, as Redis's (exporters split on it).
    let rep: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut conn(g.port(l)))
        .expect("info");
    assert!(rep.starts_with("# Replication\r\nrole:master"), "{rep}");
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
    // bound is loose (CI shares 2 cores among many tests); docs/replication.md reports the figure.
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
    // A new leader continues the history; it does not begin another.
    assert_eq!(history_of(g.port(new)), history);
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
        for (what, tok) in [("before", &before), ("after", &after)] {
            let got = held_on(&g, id, tok);
            assert_eq!(
                got.as_deref(),
                Some("RESERVED"),
                "node {id}, the hold acknowledged {what} the cut (old leader {old}, new {new}); {}",
                group_facts(&g, "CUT", &[&before, &after])
            );
        }
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
    g.rejoin_empty(f, l);
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

/// The state of `tok` on member `id`, read again for a few seconds while it is missing: a
/// member the heal deposed re-executes itself and catches up, and a read on a connection
/// that accepts stale answers may meet it before it has. A hold that stays missing is lost.
fn held_on(g: &Group, id: u64, tok: &str) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = state_of(g.port(id), tok);
        if got.is_some() || Instant::now() > deadline {
            return got;
        }
        eprintln!("node {id}: {tok} not there yet; reading again");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What each member says of the sale and the holds, for a failure's message.
fn group_facts(g: &Group, sku: &str, toks: &[&str]) -> String {
    let mut out = String::new();
    for id in [1, 2, 3] {
        let port = g.port(id);
        let mut c = conn(port);
        let role: redis::RedisResult<redis::Value> = redis::cmd("ROLE").query(&mut c);
        let xlen: redis::RedisResult<i64> =
            redis::cmd("XLEN").arg("stockgate:events").query(&mut c);
        let states: Vec<_> = toks.iter().map(|t| state_of(port, t)).collect();
        out.push_str(&format!(
            "\n  node {id}: role {role:?}, xlen {xlen:?}, sale {:?}, holds {states:?}",
            sale_info(port, sku)
        ));
    }
    out
}
