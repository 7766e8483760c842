//! The leader's disk fills up while clients write: the member stops leading and naming
//! itself at once (its process exits with the storage status for its supervisor to
//! restart), another member leads and takes writes, no acknowledged hold is lost, and
//! once space is back the member, restarted as systemd would, converges with the others.
//! Real processes, each member's data dir on its own small tmpfs.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::nemesis::{
    fill, onto_tmpfs, quick_conn, reap, role_is_master, Tmpfs, EXIT_STORAGE,
};
use crate::common::raft::*;
use crate::common::TempDir;

const SKU: &str = "FULLDISK";
const TOTAL: i64 = 1_000_000;
const WRITERS: usize = 6;

/// Moves member `id`'s data dir onto its own 32 MiB tmpfs ([`onto_tmpfs`]). The test needs
/// it: a failure is the test's failure, with the reason (CI runs as root, where tmpfs
/// mounts work).
fn onto_own_tmpfs(g: &mut Group, id: u64) -> Tmpfs {
    onto_tmpfs(g, id, "32m").unwrap_or_else(|e| {
        panic!("{e}; this test needs to mount a small file system (run as root)")
    })
}

/// Writers reserving for distinct users against whoever leads; each returns the
/// tokens it got acknowledged.
fn writers(
    g: &Group,
    tag: &str,
    stop: &Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<Vec<String>>> {
    let ports = g.ports();
    (0..WRITERS)
        .map(|w| {
            let (stop, ports) = (stop.clone(), ports.clone());
            let tokens: Vec<(String, String)> = (0..20_000)
                .map(|i| {
                    let user = format!("{tag}-{w}-{i}");
                    (g.token(SKU, &user), user)
                })
                .collect();
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                let mut at = 0;
                while !stop.load(Ordering::Relaxed) && at < tokens.len() {
                    let Some(port) = discover(&ports, Duration::from_secs(1)) else {
                        continue;
                    };
                    let (tok, user) = &tokens[at];
                    match reserve_with(port, SKU, user, tok, &format!("req-{at}")) {
                        Ok(t) => {
                            acked.push(t);
                            at += 1;
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
                acked
            })
        })
        .collect()
}

/// Whether the member on `port` names itself the master (`ROLE`, or Sentinel discovery
/// asked of it). A member that does not answer does not.
fn names_itself(port: u16) -> bool {
    let Some(mut c) = quick_conn(port) else {
        return false;
    };
    let master = role_is_master(&mut c);
    let named: Option<(String, String)> = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg("stockgate")
        .query(&mut c)
        .ok()
        .flatten();
    master || named.is_some_and(|(_, p)| p == port.to_string())
}

/// Waits until member `id` stopped naming itself the leader (or its process ended);
/// returns its exit status, if it ended.
fn wait_stepped_down(g: &mut Group, id: u64, within: Duration) -> Option<i32> {
    let port = g.port(id);
    let deadline = Instant::now() + within;
    loop {
        if let Some(code) = reap(g, id) {
            return Some(code);
        }
        if !names_itself(port) {
            return None;
        }
        assert!(
            Instant::now() < deadline,
            "node {id} still names itself the master {within:?} after its disk filled up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The disk of member `victim` fills up under load (writers `tag`), stays full a few
/// seconds, then space returns: the member must stop naming itself the leader at once
/// (or exit, with the storage status, and be restarted as its supervisor would), another
/// member must take writes meanwhile, and afterwards all three must agree. Returns the
/// holds acknowledged.
fn disk_fills(g: &mut Group, logs: &Path, victim: u64, tag: &str) -> Vec<String> {
    let stop = Arc::new(AtomicBool::new(false));
    let ws = writers(g, tag, &stop);
    std::thread::sleep(Duration::from_secs(1));
    let dir = g.member(victim).dir.clone();
    let filler = fill(&dir);
    let full_at = Instant::now();
    let mut exited = wait_stepped_down(g, victim, Duration::from_secs(5));
    eprintln!(
        "node {victim} not leading {:?} after its disk filled (exit status {exited:?})",
        full_at.elapsed()
    );
    let next = g.leader(Some(victim), Duration::from_secs(10));
    let probe = reserve(g.port(next), g, SKU, &format!("probe-{tag}"), "req-probe");
    assert!(probe.is_ok(), "the leader {next} refused: {probe:?}");
    // The disk stays full a while, under load.
    std::thread::sleep(Duration::from_secs(3));
    exited = exited.or_else(|| reap(g, victim));
    if exited.is_none() {
        assert!(
            !names_itself(g.port(victim)),
            "node {victim} names itself the master again on a full disk"
        );
    }
    std::fs::remove_file(&filler).expect("free the space");
    exited = exited.or_else(|| reap(g, victim));
    eprintln!("node {victim}: exit status {exited:?} when space returned");
    if let Some(code) = exited {
        assert_eq!(code, EXIT_STORAGE, "node {victim} exited with {code}");
        // As its supervisor would.
        g.member(victim).spawn();
        let log =
            std::fs::read_to_string(logs.join(format!("member-{victim}.log"))).unwrap_or_default();
        let line = log.lines().find(|l| l.contains("storage error on"));
        assert!(
            line.is_some_and(|l| l.contains(&*dir.to_string_lossy())),
            "no log line names the error and the path: {line:?}"
        );
    }
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let mut acked: Vec<String> = ws
        .into_iter()
        .flat_map(|w| w.join().expect("writer"))
        .collect();
    acked.extend(probe);
    g.converge(Duration::from_secs(20));
    let infos: Vec<_> = [1, 2, 3]
        .iter()
        .map(|i| sale_info(g.port(*i), SKU))
        .collect();
    assert!(
        infos.windows(2).all(|w| w[0] == w[1]),
        "members differ after node {victim}'s disk came back: {infos:?}"
    );
    acked
}

#[test]
fn a_full_disk_stops_the_member_and_it_comes_back_when_space_returns() {
    let logs = TempDir::new("raft-full-disk-logs");
    let mut g = Group::start_logged(false, logs.path(), "info,openraft=warn");
    g.leader(None, Duration::from_secs(20));
    let mut mounts = Vec::new();
    for id in [1, 2, 3] {
        mounts.push(onto_own_tmpfs(&mut g, id));
        g.leader(None, Duration::from_secs(20));
    }
    let leader = g.leader(None, Duration::from_secs(20));
    create_sale(g.port(leader), SKU, TOTAL as u64);

    let mut acked = disk_fills(&mut g, logs.path(), leader, "lead");
    let now = g.leader(None, Duration::from_secs(10));
    let follower = [1, 2, 3]
        .into_iter()
        .find(|i| *i != now)
        .expect("a follower");
    acked.extend(disk_fills(&mut g, logs.path(), follower, "follow"));
    eprintln!("{} holds acknowledged", acked.len());
    let now = g.leader(None, Duration::from_secs(10));
    check_all_present(&g, now, &acked, SKU, TOTAL);
    drop(mounts);
}
