//! A member that is down is called a few times a second, not at every heartbeat and
//! every write: the leader backs off connecting to it (10 ms doubling to 1 s, jittered),
//! logs its state once, and reaches it again within the longest pause once it is back.
//! Real processes under load, `kill -9`.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::raft::*;
use crate::common::TempDir;

const SKU: &str = "DEADPEER";
/// How long the leader is loaded while the member is down.
const LOAD: Duration = Duration::from_secs(5);
/// Writers on the leader, each on its own connection.
const WRITERS: usize = 8;

/// The lines of a member's log from byte `from` on.
fn log_since(path: &Path, from: usize) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.get(from..)
        .unwrap_or("")
        .lines()
        .map(str::to_owned)
        .collect()
}

fn log_len(path: &Path) -> usize {
    std::fs::metadata(path).map_or(0, |m| m.len() as usize)
}

/// Reserves for distinct users on `port` until `stop`; returns how many were
/// acknowledged.
fn load(g: &Group, port: u16, stop: &Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<usize>> {
    (0..WRITERS)
        .map(|w| {
            let stop = stop.clone();
            let tokens: Vec<(String, String)> = (0..20_000)
                .map(|i| {
                    let user = format!("u-{w}-{i}");
                    (g.token(SKU, &user), user)
                })
                .collect();
            std::thread::spawn(move || {
                let mut c = conn(port);
                let mut acked = 0;
                for (i, (tok, user)) in tokens.iter().enumerate() {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let r: redis::RedisResult<redis::Value> = redis::cmd("RESERVE")
                        .arg(SKU)
                        .arg(user)
                        .arg(tok)
                        .arg(format!("req-{i}"))
                        .query(&mut c);
                    match r {
                        Ok(_) => acked += 1,
                        Err(_) => c = conn(port),
                    }
                }
                acked
            })
        })
        .collect()
}

#[test]
fn a_dead_member_is_backed_off_and_reached_again_when_back() {
    // Every member logs to its own file: the attempts to connect at debug level (one
    // line each), everything else at info.
    let logs = TempDir::new("raft-dead-peer-logs");
    let mut g = Group::start_logged(
        false,
        logs.path(),
        "info,stockgate_server::raft::network=debug",
    );
    let leader = g.leader(None, Duration::from_secs(20));
    let dead = [1, 2, 3]
        .into_iter()
        .find(|i| *i != leader)
        .expect("a follower");
    let lport = g.port(leader);
    create_sale(lport, SKU, 1_000_000);
    let log = logs.path().join(format!("member-{leader}.log"));

    g.member(dead).kill9();
    let from = log_len(&log);
    let stop = Arc::new(AtomicBool::new(false));
    let writers = load(&g, lport, &stop);
    std::thread::sleep(LOAD);
    stop.store(true, Ordering::Relaxed);
    let acked: usize = writers.into_iter().map(|w| w.join().expect("writer")).sum();
    let lines = log_since(&log, from);

    let marker = format!("raft: connecting to peer {dead} ");
    let attempts = lines.iter().filter(|l| l.contains(&marker)).count();
    let others: Vec<&String> = lines.iter().filter(|l| !l.contains("DEBUG")).collect();
    eprintln!(
        "{acked} writes acknowledged in {LOAD:?}; {attempts} connection attempts to node {dead}; other log lines: {others:#?}"
    );
    assert!(acked > 100, "the leader took only {acked} writes");
    // At least the one that found it gone: else this test counts nothing.
    assert!(attempts >= 1, "no connection attempt to node {dead} logged");
    assert!(
        attempts < 50,
        "{attempts} connection attempts to a dead member in {LOAD:?}"
    );
    assert!(
        others.len() <= 6,
        "the leader's log grew by {} lines: {others:#?}",
        others.len()
    );

    // Back up: reached within the longest pause (1 s) and caught up.
    let from = log_len(&log);
    let started = Instant::now();
    g.member(dead).spawn();
    let back = format!("raft: peer {dead} at ");
    let reached = loop {
        let seen = log_since(&log, from)
            .iter()
            .any(|l| l.contains(&back) && l.contains("reachable again"));
        if seen {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "node {dead} not reached again within 5 s of its restart"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!("node {dead} reached again {reached:?} after its restart began");
    assert!(
        reached < Duration::from_millis(2500),
        "node {dead} reached again only after {reached:?}"
    );
    g.converge(Duration::from_secs(10));
    let on = |id| sale_info(g.port(id), SKU);
    assert_eq!(on(dead), on(leader), "the restarted member differs");
}
