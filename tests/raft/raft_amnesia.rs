//! Members that lost their disks: a member started again with its usual command line on
//! an empty data dir takes no part in votes or commits until the group re-admits it
//! (`RAFT.READMIT`), so two such members never elect a leader that lacks the sale's
//! acknowledged holds. Real processes, `kill -9`, real wiped data dirs.

use std::io::Read as _;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::nemesis::{info_text, wait_voting, wipe_and_restart};
use crate::common::raft::*;
use crate::common::{copy_dir, server_bin};
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use openraft::Vote;
use stockgate_server::raft::network::{self, Envelope, Rpc, RpcReply};

const SKU: &str = "AMNESIA";
const TOTAL: i64 = 100;

/// `RAFT.MEMBERS` on `port`: id, role, admitted incarnation.
fn members(port: u16) -> Vec<(u64, String, String)> {
    let rows: Vec<Vec<redis::Value>> = redis::cmd("RAFT.MEMBERS")
        .query(&mut conn(port))
        .expect("RAFT.MEMBERS");
    rows.iter()
        .map(|r| {
            let id = crate::common::as_int(&r[0]) as u64;
            (
                id,
                crate::common::as_str(&r[3]),
                crate::common::as_str(&r[4]),
            )
        })
        .collect()
}

/// The member on `port` must not be a voter: by its own account and by the group's
/// membership (the incarnation the group admitted is not the one it runs on).
fn assert_not_a_voter(g: &Group, id: u64, leader_port: Option<u16>) {
    let port = g.port(id);
    assert_eq!(
        info_text(port, "raft_voting").as_deref(),
        Some("0"),
        "member {id} on a wiped disk counts itself a voter"
    );
    let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut conn(port)).expect("ROLE");
    assert_eq!(
        crate::common::as_str(&role[0]),
        "slave",
        "member {id} leads"
    );
    if let Some(lp) = leader_port {
        let mine = info_text(port, "raft_incarnation").expect("incarnation");
        let admitted = members(lp)
            .into_iter()
            .find(|(i, _, _)| *i == id)
            .map(|(_, _, inc)| inc);
        assert_ne!(
            admitted.as_deref(),
            Some(mine.as_str()),
            "the group admitted member {id}'s new storage without RAFT.READMIT"
        );
    }
}

/// Replies from member `id` that the member on `port` did not count (`INFO replication`).
fn refused_by(port: u16, id: u64) -> u64 {
    let line = info_text(port, &format!("raft_peer_{id}")).expect("raft_peer line");
    line.split(',')
        .find_map(|kv| kv.strip_prefix("refused="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no refused= in {line}"))
}

/// Whether `token` is RESERVED on `port`; `None` when the member refuses the read for
/// want of a majority (it no longer acts as the leader).
fn reserved_on_a_leader(port: u16, token: &str) -> Option<bool> {
    let r: redis::RedisResult<redis::Value> =
        redis::cmd("RESERVATION").arg(token).query(&mut conn(port));
    match r {
        Ok(v) => Some(
            crate::common::field(&v, "state")
                .map(|s| crate::common::as_str(&s))
                .as_deref()
                == Some("RESERVED"),
        ),
        Err(e) if e.to_string().contains("leads no majority") => None,
        Err(e) => panic!("RESERVATION on {port}: {e}"),
    }
}

/// For `within`: any member that says it leads must be `allowed` and hold every hold.
/// A member named master a moment ago may since have lost its lease (the survivor does,
/// with the others down): it then refuses reads, which is not leading.
fn no_leader_without_the_holds(g: &Group, allowed: u64, acked: &[String], within: Duration) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        for m in g.members.iter().filter(|m| m.child.is_some()) {
            let role: Vec<redis::Value> = redis::cmd("ROLE")
                .query(&mut conn(m.port))
                .unwrap_or_default();
            if role.first().map(crate::common::as_str).as_deref() == Some("master") {
                assert_eq!(m.id, allowed, "member {} leads without the holds", m.id);
                for t in acked {
                    match reserved_on_a_leader(m.port, t) {
                        Some(held) => assert!(held, "{t} missing on leader {}", m.id),
                        None => break,
                    }
                }
            }
            if m.id != allowed {
                assert_eq!(info_text(m.port, "raft_voting").as_deref(), Some("0"));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn readmit(leader_port: u16, id: u64) {
    let mut c = conn(leader_port);
    c.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let r: String = redis::cmd("RAFT.READMIT")
        .arg(id)
        .query(&mut c)
        .expect("RAFT.READMIT");
    assert_eq!(r, "OK");
}

#[test]
fn raft_members_started_on_wiped_disks_never_elect_a_leader_without_the_holds() {
    let mut g = Group::start(false);
    let l = g.leader(None, Duration::from_secs(15));
    create_sale(g.port(l), SKU, TOTAL as u64);
    let mut acked: Vec<String> = (0..40)
        .map(|i| reserve(g.port(l), &g, SKU, &format!("u{i}"), "r1").expect("reserve"))
        .collect();
    check_all_present(&g, l, &acked, SKU, TOTAL);
    g.converge(Duration::from_secs(15));
    // C (member 1, which formed the group) survives; A and B lose their disks.
    let (a, b, c) = (2u64, 3u64, 1u64);

    wipe_and_restart(&mut g, a);
    std::thread::sleep(Duration::from_secs(2));
    let l = g.leader(Some(a), Duration::from_secs(15));
    assert_not_a_voter(&g, a, Some(g.port(l)));
    // The leader calls A no more often than its back-off allows (doubling to 1 s), rather
    // than again at once after every reply it cannot count.
    // The group goes on without it: commits need B and C.
    let before = refused_by(g.port(l), a);
    for i in 40..45 {
        acked.push(reserve(g.port(l), &g, SKU, &format!("u{i}"), "r1").expect("reserve"));
    }
    std::thread::sleep(Duration::from_secs(3));
    let during = refused_by(g.port(l), a) - before;
    eprintln!("the leader called the wiped member {during} times in 3 s");
    assert!(
        during <= 20,
        "the leader called the wiped member {during} times in 3 s"
    );
    check_all_present(&g, l, &acked, SKU, TOTAL);

    // B's disk is kept aside: it comes back later as a member that was only down.
    g.member(b).kill9();
    let kept = g.member(b).dir.with_extension("kept");
    copy_dir(&g.member(b).dir.clone(), &kept);
    wipe_and_restart(&mut g, b);
    no_leader_without_the_holds(&g, c, &acked, Duration::from_secs(6));
    assert_not_a_voter(&g, b, None);
    assert_not_a_voter(&g, a, None);

    g.member(b).kill9();
    let dir = g.member(b).dir.clone();
    std::fs::remove_dir_all(&dir).expect("wipe");
    std::fs::rename(&kept, &dir).expect("restore B's disk");
    g.member(b).spawn();
    let l = g.leader(Some(a), Duration::from_secs(20));
    check_all_present(&g, l, &acked, SKU, TOTAL);

    // The documented way back for A.
    readmit(g.port(l), a);
    wait_voting(&g, a, "1", Duration::from_secs(20)).expect("member A votes again");
    g.converge(Duration::from_secs(20));
    for t in &acked {
        assert_eq!(
            state_of(g.port(a), t).as_deref(),
            Some("RESERVED"),
            "{t} on A"
        );
    }
    let rows = members(g.port(l));
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert!(
        rows.iter().all(|(_, role, _)| role != "learner"),
        "{rows:?}"
    );
    let a_inc = info_text(g.port(a), "raft_incarnation");
    assert!(rows
        .iter()
        .any(|(i, _, inc)| *i == a && Some(inc) == a_inc.as_ref()));

    // Healthy: the leader dies, A helps elect the next one, which holds everything.
    g.member(l).kill9();
    let n = g.leader(Some(l), Duration::from_secs(15));
    acked.push(reserve(g.port(n), &g, SKU, "after", "r1").expect("reserve after"));
    check_all_present(&g, n, &acked, SKU, TOTAL);
    assert!(g.exited().is_empty(), "{:?}", g.exited());
}

#[test]
fn raft_the_bootstrap_member_on_a_wiped_disk_refuses_to_form_a_second_group() {
    let mut g = Group::start(false);
    let l = g.leader(None, Duration::from_secs(15));
    create_sale(g.port(l), SKU, TOTAL as u64);
    let t = reserve(g.port(l), &g, SKU, "u1", "r1").expect("reserve");
    g.converge(Duration::from_secs(15));
    // Member 1 formed the group: its usual command line carries --raft-bootstrap.
    g.member(1).kill9();
    let dir = g.member(1).dir.clone();
    std::fs::remove_dir_all(&dir).expect("wipe");
    let mut child = Command::new(server_bin())
        .args(&g.member(1).args)
        .env("STOCKGATE_LOG", "warn,openraft=error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("a wiped bootstrap member kept running");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read");
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("lost its state") && err.contains("RAFT.READMIT"),
        "{err}"
    );
    // The documented way back: without --raft-bootstrap, then RAFT.READMIT.
    std::fs::remove_dir_all(&dir).expect("wipe again");
    let m = g.member(1);
    m.args.retain(|a| a != "--raft-bootstrap");
    m.spawn();
    let l = g.leader(Some(1), Duration::from_secs(15));
    assert_not_a_voter(&g, 1, Some(g.port(l)));
    readmit(g.port(l), 1);
    wait_voting(&g, 1, "1", Duration::from_secs(20)).expect("member 1 votes again");
    g.converge(Duration::from_secs(20));
    assert_eq!(state_of(g.port(1), &t).as_deref(), Some("RESERVED"));
}

/// One request on a member's Raft port, as any process that can reach it could send it.
fn ask(raft_port: u16, env: &Envelope<Rpc>) -> RpcReply {
    use std::io::Write as _;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", raft_port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let body = network::encode(env).expect("encode");
    s.write_all(&(body.len() as u32).to_le_bytes())
        .expect("write");
    s.write_all(&body).expect("write");
    let mut len = [0u8; 4];
    s.read_exact(&mut len).expect("reply length");
    let mut reply = vec![0; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut reply).expect("reply");
    network::decode_reply(&reply).expect("decode").reply
}

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s, 16).expect("hex")
}

/// The peers' own checks, with the sender's bypassed: vote requests and appends forged
/// for a member's node id under another storage incarnation, or from another group, are
/// refused before they reach Raft; the same request with the admitted identity is not.
#[test]
fn raft_forged_votes_and_appends_from_an_unadmitted_storage_are_refused() {
    let g = Group::start(false);
    let l = g.leader(None, Duration::from_secs(15));
    create_sale(g.port(l), SKU, TOTAL as u64);
    let held = reserve(g.port(l), &g, SKU, "u1", "r1").expect("reserve");
    let t = [1u64, 2, 3]
        .into_iter()
        .find(|i| *i != l)
        .expect("a follower");
    let rows = members(g.port(l));
    let inc = |id: u64| hex(&rows.iter().find(|r| r.0 == id).expect("member").2);
    let group = hex(&info_text(g.port(t), "raft_group_id").expect("group id"));
    let raft_port = g.members.iter().find(|m| m.id == t).expect("t").raft_port;
    // Forged as the leader's node id: the one a target follows.
    let env = |group: u64, from_incarnation: u64, rpc: Rpc| Envelope {
        group,
        from: l,
        from_incarnation,
        to_incarnation: inc(t),
        rpc,
    };
    let vote = |term| Rpc::Vote(VoteRequest::new(Vote::new(term, l), None));
    let append = Rpc::Append(AppendEntriesRequest {
        vote: Vote::new_committed(1000, l),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    });
    let wiped = inc(l) ^ 0x5a5a;
    for (what, e) in [
        ("a vote from a wiped storage", env(group, wiped, vote(1000))),
        (
            "a vote from another group",
            env(group ^ 1, inc(l), vote(1000)),
        ),
        ("an append from a wiped storage", env(group, wiped, append)),
    ] {
        match ask(raft_port, &e) {
            RpcReply::Refused(why) => eprintln!("{what}: refused: {why}"),
            other => panic!("{what} reached Raft: {other:?}"),
        }
    }
    // The admitted identity reaches Raft (a stale term: refused by Raft itself).
    match ask(raft_port, &env(group, inc(l), vote(0))) {
        RpcReply::Vote(_) => {}
        other => panic!("the admitted identity was refused: {other:?}"),
    }
    let term: u64 = info_text(g.port(t), "raft_term")
        .and_then(|v| v.parse().ok())
        .expect("term");
    assert!(term < 1000, "a forged request moved the term to {term}");
    let l2 = g.leader(None, Duration::from_secs(10));
    assert_eq!(state_of(g.port(l2), &held).as_deref(), Some("RESERVED"));
}

/// A forwarder to a member's Raft port that lets every request through but appends and
/// snapshots while `shut`: the connection that carries one is dropped (the member then
/// learns nothing of the log), while `Hello`, votes and the rest still pass. A network
/// that fails one connection and not another does the same.
struct AppendGate {
    port: u16,
    shut: Arc<AtomicBool>,
}

impl AppendGate {
    fn start(target: u16) -> AppendGate {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind gate");
        let port = l.local_addr().expect("addr").port();
        let shut = Arc::new(AtomicBool::new(true));
        let s = shut.clone();
        std::thread::spawn(move || {
            for inbound in l.incoming().flatten() {
                let Ok(outbound) = std::net::TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let (back_from, back_to) = (
                    outbound.try_clone().expect("clone"),
                    inbound.try_clone().expect("clone"),
                );
                std::thread::spawn(move || {
                    let (mut from, mut to) = (back_from, back_to);
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = to.shutdown(std::net::Shutdown::Both);
                });
                let s = s.clone();
                std::thread::spawn(move || forward_requests(inbound, outbound, &s));
            }
        });
        AppendGate { port, shut }
    }
}

/// Forwards request frames from `from` to `to`, ending the connection at the first
/// append or snapshot while `shut`.
fn forward_requests(mut from: std::net::TcpStream, mut to: std::net::TcpStream, shut: &AtomicBool) {
    use std::io::Write as _;
    let end = |a: &std::net::TcpStream, b: &std::net::TcpStream| {
        let _ = a.shutdown(std::net::Shutdown::Both);
        let _ = b.shutdown(std::net::Shutdown::Both);
    };
    loop {
        let mut len = [0u8; 4];
        if from.read_exact(&mut len).is_err() {
            return end(&from, &to);
        }
        let mut body = vec![0; u32::from_le_bytes(len) as usize];
        if from.read_exact(&mut body).is_err() {
            return end(&from, &to);
        }
        let log = matches!(
            network::decode_request(&body).map(|e| e.rpc),
            Ok(Rpc::Append(_) | Rpc::Snapshot(_))
        );
        if log && shut.load(Ordering::SeqCst) {
            return end(&from, &to);
        }
        if to
            .write_all(&len)
            .and_then(|_| to.write_all(&body))
            .is_err()
        {
            return end(&from, &to);
        }
    }
}

/// The leader takes itself out (`RAFT.REMOVE`; its own log ends with the membership
/// without it) and the next one adds it back (`RAFT.ADD`, the same storage), but it never
/// receives the entries adding it back, while the other follower's log makes it a voter
/// again. Then that leader loses its disk. The follower needs this member's vote, and the
/// member, whose storage kept its state, grants it by the candidate's membership: a
/// leader is elected, re-admits the wiped member, and holds every acknowledged hold.
#[test]
fn raft_a_member_added_back_and_behind_votes() {
    let mut g = Group::start(false);
    let x = g.leader(None, Duration::from_secs(15));
    create_sale(g.port(x), SKU, TOTAL as u64);
    let mut acked: Vec<String> = (0..10)
        .map(|i| reserve(g.port(x), &g, SKU, &format!("u{i}"), "r1").expect("reserve"))
        .collect();
    g.converge(Duration::from_secs(15));
    let r: String = redis::cmd("RAFT.REMOVE")
        .arg(x)
        .query(&mut conn(g.port(x)))
        .expect("RAFT.REMOVE");
    assert_eq!(r, "OK");
    wait_voting(&g, x, "0", Duration::from_secs(10)).expect("the member taken out stops voting");
    let l = g.leader(Some(x), Duration::from_secs(15));

    // Added back through a gate that lets its Hello through and none of the log.
    let gate = AppendGate::start(g.member(x).raft_port);
    let r: String = redis::cmd("RAFT.ADD")
        .arg(x)
        .arg(format!("127.0.0.1:{}", g.port(x)))
        .arg(format!("127.0.0.1:{}", gate.port))
        .query(&mut conn(g.port(l)))
        .expect("RAFT.ADD");
    assert_eq!(r, "OK");
    let row = members(g.port(l)).into_iter().find(|r| r.0 == x);
    assert_eq!(
        row.map(|r| r.1).as_deref(),
        Some("voter"),
        "RAFT.ADD made no voter"
    );
    for i in 10..15 {
        acked.push(reserve(g.port(l), &g, SKU, &format!("u{i}"), "r1").expect("reserve"));
    }
    assert_eq!(
        info_text(g.port(x), "raft_voting").as_deref(),
        Some("0"),
        "the member added back received the log through the gate"
    );

    // The leader loses its disk; the member added back may now take the log.
    wipe_and_restart(&mut g, l);
    gate.shut.store(false, Ordering::SeqCst);
    let n = g.leader(Some(l), Duration::from_secs(15));
    check_all_present(&g, n, &acked, SKU, TOTAL);
    readmit(g.port(n), l);
    wait_voting(&g, l, "1", Duration::from_secs(20)).expect("the wiped member votes again");
    g.converge(Duration::from_secs(20));
    assert!(g.exited().is_empty(), "{:?}", g.exited());
}
