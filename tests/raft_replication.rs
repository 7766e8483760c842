//! `tests/ha_replication.rs`'s assertions that hold for a Raft group, on the group:
//!
//! - a follower converges on the leader's state (reservations, commits, releases),
//!   serves reads, refuses writes (`-READONLY`), and after a `kill -9` catches up from
//!   its own log and the leader's;
//! - a leader whose followers are both stopped (`SIGSTOP`) acknowledges nothing, and
//!   takes writes again (or another member does) once they are back.

mod common;

use std::time::{Duration, Instant};

use common::raft::*;

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
    assert_eq!(role.first().map(common::as_str).as_deref(), Some("slave"));
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
    // The first attempt waits out its 3 s read timeout; the later ones are refused at
    // once (no majority within the election timeout).
    while t.elapsed() < Duration::from_secs(5) {
        i += 1;
        if let Ok(tok) = reserve(g.port(l), &g, SKU, &format!("u{i}"), &format!("r{i}")) {
            acked.push(tok);
        }
    }
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
        "followers stopped for 5 s: {i} RESERVE attempts on the leader, 0 acknowledged; {reserved} unit(s) held after the heal"
    );
}

/// Forming a group (`--raft-peers`, every member initializing the same membership as it
/// starts) must never take a member down. Seen once in fifteen runs of
/// `raft_switchover`'s demotion test (a proxied group, `Group::start(true)`): one member
/// of the forming group died in openraft 0.9.25's
/// `debug_assert!(self.leader.is_none())` in `Engine::following_handler`
/// (engine_impl.rs:810), reached from `Engine::append_entries` <- `handle_append_entries`:
/// a member still holding leader state accepted an append-entries as a follower. In a
/// release build the assertion is compiled out and the member would go on as follower
/// with leader state left behind. The member died about 200 ms after the first member
/// of the group started, as the second one came up (before all three answered PING),
/// so the harness reported "did not answer PING". This loop of 40 formations did not
/// reproduce it on an idle machine; the one sighting was with other builds sharing the
/// two cores. Ignored until the cause is found; run with
/// `cargo test --test raft_replication -- --ignored forming`.
#[test]
#[ignore = "a member of a forming group can panic in openraft's Engine::following_handler debug assertion (1 in ~15 formations seen)"]
fn raft_forming_a_group_never_takes_a_member_down() {
    for round in 0..40 {
        let mut g = Group::start(round % 2 == 0);
        let l = g.leader(None, Duration::from_secs(10));
        create_sale(g.port(l), "FORM", 1);
        std::thread::sleep(Duration::from_millis(700));
        for m in &mut g.members {
            let exited = m.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            assert!(
                exited.is_none(),
                "round {round}: member {} exited while the group formed: {exited:?}",
                m.id
            );
        }
    }
}
