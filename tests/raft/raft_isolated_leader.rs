//! A leader cut off from both followers (real processes, a loopback proxy on every Raft
//! link) stops acting as leader for clients once its lease runs out: it no longer names
//! itself in any discovery answer (`SENTINEL`, `ROLE`, `INFO replication`), refuses
//! writes and stock reads with `-READONLY`, and a redis-py `Sentinel` client that lists
//! it first reaches the new leader. After the heal the group converges with every
//! acknowledged hold.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::raft::*;

const SKU: &str = "ISO";
/// The cut lasts this long: well past the new leader's election.
const CUT_FOR: Duration = Duration::from_secs(8);
/// The shortest election timeout (300 ms by default) plus a discovery round, with room
/// for a loaded machine.
const DEMOTED_WITHIN: Duration = Duration::from_secs(3);
/// From the cut to the redis-py client's acknowledged RESERVE.
const CLIENT_ACK_WITHIN: Duration = Duration::from_secs(5);

/// A connection with short timeouts: the isolated member must answer at once.
fn quick(port: u16) -> Result<redis::Connection, String> {
    let c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
        .map_err(|e| format!("connect {port}: {e}"))?;
    c.set_read_timeout(Some(Duration::from_secs(1)))
        .map_err(|e| e.to_string())?;
    Ok(c)
}

/// The port a `SENTINEL` master entry names (RESP2 field list or RESP3 map).
fn entry_port(v: &redis::Value) -> Option<u16> {
    crate::common::field(v, "port").and_then(|p| crate::common::as_str(&p).parse().ok())
}

/// Whether the member on `port` acts as a follower without a leader for clients:
/// `Err` names the first answer that still makes it a master or still serves a read.
fn demoted(port: u16, token: &str) -> Result<(), String> {
    let mut c = quick(port)?;
    let named: Option<(String, String)> = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg("stockgate")
        .query(&mut c)
        .map_err(|e| format!("get-master-addr-by-name: {e}"))?;
    if named.as_ref().is_some_and(|(_, p)| *p == port.to_string()) {
        return Err(format!("get-master-addr-by-name names itself: {named:?}"));
    }
    let masters: Vec<redis::Value> = redis::cmd("SENTINEL")
        .arg("masters")
        .query(&mut c)
        .map_err(|e| format!("SENTINEL masters: {e}"))?;
    if masters.iter().any(|m| entry_port(m) == Some(port)) {
        return Err(format!("SENTINEL masters names itself: {masters:?}"));
    }
    let master: redis::RedisResult<redis::Value> = redis::cmd("SENTINEL")
        .arg("master")
        .arg("stockgate")
        .query(&mut c);
    if master.as_ref().ok().and_then(entry_port) == Some(port) {
        return Err(format!("SENTINEL master names itself: {master:?}"));
    }
    let role: Vec<redis::Value> = redis::cmd("ROLE")
        .query(&mut c)
        .map_err(|e| format!("ROLE: {e}"))?;
    if role.first().map(crate::common::as_str).as_deref() != Some("slave") {
        return Err(format!("ROLE: {role:?}"));
    }
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut c)
        .map_err(|e| format!("INFO: {e}"))?;
    if !info.lines().any(|l| l.trim() == "role:slave") {
        return Err(format!("INFO replication: {info}"));
    }
    for read in [
        vec!["RESERVATION", token],
        vec!["SALE.INFO", SKU],
        vec!["STOCK", SKU],
    ] {
        let r: redis::RedisResult<redis::Value> = redis::cmd(read[0]).arg(&read[1..]).query(&mut c);
        match r {
            Err(e) if e.code() == Some("READONLY") => {}
            other => return Err(format!("{} answered {other:?}", read[0])),
        }
    }
    Ok(())
}

/// `python3` with redis-py: the one on the PATH, else the test virtualenv's.
fn python() -> Command {
    let local = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/py/newest/bin/python3");
    let has_redis = Command::new("python3")
        .args(["-c", "import redis"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_redis && local.exists() {
        return Command::new(local);
    }
    Command::new("python3")
}

/// redis-py's `Sentinel` over `ports` (in that order), reserving for `user`.
fn sentinel_client(g: &Group, ports: &[u16], user: &str) -> Child {
    let list = ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/raft_isolated_leader.py");
    python()
        .arg(script)
        .arg(list)
        .arg("stockgate")
        .arg(SKU)
        .arg(user)
        .arg(g.token(SKU, user))
        .arg(format!("req-{user}"))
        .arg(CUT_FOR.as_secs().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 tests/py/raft_isolated_leader.py")
}

/// The client's `ACK <token> <port> <ms>` line, or its failure in words.
fn client_ack(mut child: Child) -> Result<(String, u16, u64), String> {
    let out = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    let _ = BufReader::new(out).read_line(&mut line);
    let status = child.wait().map_err(|e| e.to_string())?;
    let mut words = line.split_whitespace();
    match (words.next(), words.next(), words.next(), words.next()) {
        (Some("ACK"), Some(t), Some(p), Some(ms)) => Ok((
            t.to_owned(),
            p.parse().map_err(|_| line.clone())?,
            ms.parse().map_err(|_| line.clone())?,
        )),
        _ => Err(format!("redis-py client: {status}, printed {line:?}")),
    }
}

#[test]
fn raft_an_isolated_leader_stops_naming_itself_and_clients_find_the_new_one() {
    let g = Group::start(true);
    let old = g.leader(None, Duration::from_secs(10));
    let old_port = g.port(old);
    create_sale(old_port, SKU, 50);
    let mut acked = vec![reserve(old_port, &g, SKU, "before", "r0").expect("reserve")];
    converge_wal(&g, Duration::from_secs(10));
    let others: Vec<u64> = [1, 2, 3].into_iter().filter(|i| *i != old).collect();
    // The old leader first in the client's list, as it was first in every client's.
    let mut order = vec![old_port];
    order.extend(others.iter().map(|i| g.port(*i)));

    g.cut(old, true);
    let cut_at = Instant::now();
    let client = sentinel_client(&g, &order, "via-sentinel");

    // Discovery and reads on the old leader, within the election timeout and a round.
    let mut last = Err(String::new());
    while cut_at.elapsed() < DEMOTED_WITHIN {
        last = demoted(old_port, &acked[0]);
        if last.is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Err(e) = last {
        panic!("the isolated leader {old} still acts as leader after {DEMOTED_WITHIN:?}: {e}");
    }
    eprintln!(
        "isolated leader stopped acting as leader {:?} after the cut",
        cut_at.elapsed()
    );

    let (token, at, ms) = client_ack(client).expect("redis-py Sentinel client");
    let took = cut_at.elapsed();
    eprintln!(
        "redis-py acknowledged on port {at} {ms} ms after its start ({took:?} after the cut)"
    );
    assert!(
        took < CLIENT_ACK_WITHIN,
        "redis-py acknowledged only after {took:?}"
    );
    assert_ne!(at, old_port, "acknowledged by the isolated leader");
    acked.push(token);

    let new = g.leader(Some(old), Duration::from_secs(10));
    assert!(others.contains(&new));
    acked.push(reserve(g.port(new), &g, SKU, "after", "r1").expect("the majority takes writes"));
    // Still a follower without a leader for clients, for as long as the cut lasts.
    std::thread::sleep(CUT_FOR.saturating_sub(cut_at.elapsed()));
    demoted(old_port, &acked[0]).expect("the isolated leader, late in the cut");

    g.cut(old, false);
    g.converge(Duration::from_secs(20));
    let leader = g.leader(None, Duration::from_secs(10));
    check_all_present(&g, leader, &acked, SKU, 50);
    for p in g.ports() {
        for t in &acked {
            assert_eq!(state_of(p, t).as_deref(), Some("RESERVED"), "port {p}, {t}");
        }
    }
    // The old leader names the group's leader again.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let named: Option<(String, String)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg("stockgate")
            .query(&mut conn(old_port))
            .unwrap_or(None);
        if named.is_some_and(|(_, p)| p == g.port(leader).to_string()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the old leader does not name {leader}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A leader that can send but not hear: its appends reach the followers, their answers
/// are lost, and their calls to it are cut. Were it to go on sending heartbeats, the
/// followers would never stand while it serves nobody; it stops once no majority has
/// answered it for the longest election timeout, and the others elect a leader that
/// takes writes.
#[test]
fn raft_a_leader_that_cannot_hear_its_followers_gives_way() {
    let g = Group::start(true);
    let old = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(old), SKU, 50);
    let mut acked = vec![reserve(g.port(old), &g, SKU, "before", "r0").expect("reserve")];
    converge_wal(&g, Duration::from_secs(10));

    g.deafen(old, true);
    let deaf_at = Instant::now();
    let new = g.leader(Some(old), Duration::from_secs(10));
    let elected = deaf_at.elapsed();
    acked.push(reserve(g.port(new), &g, SKU, "during", "r1").expect("the others take writes"));
    eprintln!(
        "a new leader took a write {:?} after the old one went deaf (elected after {elected:?})",
        deaf_at.elapsed()
    );
    demoted(g.port(old), &acked[0]).expect("the deaf leader acts as a follower");

    g.deafen(old, false);
    g.converge(Duration::from_secs(20));
    let leader = g.leader(None, Duration::from_secs(10));
    check_all_present(&g, leader, &acked, SKU, 50);
}

/// Reads of stock state: a follower refuses them on a connection that did not send
/// `READONLY` (a client that takes it for the master must never read stale state), and
/// answers from its own state once the connection did, until `READWRITE`.
#[test]
fn raft_a_follower_answers_stock_reads_only_to_connections_that_accept_stale_ones() {
    let g = Group::start(false);
    let l = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(l), SKU, 50);
    let token = reserve(g.port(l), &g, SKU, "u", "r0").expect("reserve");
    converge_wal(&g, Duration::from_secs(10));
    let f = [1, 2, 3].into_iter().find(|i| *i != l).expect("a follower");
    let mut c = strict_conn(g.port(f));
    let reads: [Vec<&str>; 3] = [
        vec!["RESERVATION", &token],
        vec!["SALE.INFO", SKU],
        vec!["STOCK", SKU],
    ];
    let refused = |c: &mut redis::Connection| {
        for r in &reads {
            let got: redis::RedisResult<redis::Value> = redis::cmd(r[0]).arg(&r[1..]).query(c);
            match got {
                Err(e) if e.code() == Some("READONLY") && e.to_string().contains("follower") => {}
                other => panic!("{} on a follower answered {other:?}", r[0]),
            }
        }
    };
    refused(&mut c);
    let ok: String = redis::cmd("READONLY").query(&mut c).expect("READONLY");
    assert_eq!(ok, "OK");
    for r in &reads {
        let got: redis::RedisResult<redis::Value> = redis::cmd(r[0]).arg(&r[1..]).query(&mut c);
        got.unwrap_or_else(|e| panic!("{} after READONLY: {e}", r[0]));
    }
    let ok: String = redis::cmd("READWRITE").query(&mut c).expect("READWRITE");
    assert_eq!(ok, "OK");
    refused(&mut c);
    // The leader answers a plain connection.
    let mut c = strict_conn(g.port(l));
    let v: redis::Value = redis::cmd("RESERVATION")
        .arg(&token)
        .query(&mut c)
        .expect("leader read");
    assert_eq!(
        crate::common::field(&v, "state")
            .map(|s| crate::common::as_str(&s))
            .as_deref(),
        Some("RESERVED")
    );
}

/// A leader paused past an election and resumed: a connection its clients opened to it
/// as the master never reads state older than what the new leader acknowledged; each
/// read answers the newest state or `-READONLY`.
#[test]
fn raft_a_resumed_leader_never_answers_a_stale_read() {
    let mut g = Group::start(false);
    for round in 0..3 {
        let old = g.leader(None, Duration::from_secs(10));
        let sku = format!("{SKU}{round}");
        create_sale(g.port(old), &sku, 50);
        let token = reserve(g.port(old), &g, &sku, "u", "r0").expect("reserve");
        converge_wal(&g, Duration::from_secs(10));
        let mut on_old = strict_conn(g.port(old));
        g.member(old).pause(true);
        let new = g.leader(Some(old), Duration::from_secs(10));
        let v: redis::Value = redis::cmd("RELEASE")
            .arg(&token)
            .query(&mut strict_conn(g.port(new)))
            .expect("release on the new leader");
        drop(v);
        g.member(old).pause(false);
        // Read at once, then for a while: never RESERVED, never nil.
        let until = Instant::now() + Duration::from_millis(1500);
        while Instant::now() < until {
            let r: redis::RedisResult<redis::Value> =
                redis::cmd("RESERVATION").arg(&token).query(&mut on_old);
            match r {
                Ok(v) => {
                    let state =
                        crate::common::field(&v, "state").map(|s| crate::common::as_str(&s));
                    assert_eq!(
                        state.as_deref(),
                        Some("RELEASED"),
                        "round {round}: stale read {v:?}"
                    );
                }
                Err(e) if e.code() == Some("READONLY") || e.code() == Some("LOADING") => {}
                // The deposed leader re-executes itself: the connection ends.
                Err(e) if e.is_io_error() || e.is_connection_dropped() => break,
                Err(e) => panic!("round {round}: {e}"),
            }
        }
        g.converge(Duration::from_secs(20));
    }
}

/// A follower cut off from both others for a while, then back: alone, it has no
/// majority in reach and does not stand, so it comes back at the group's term and the
/// leader keeps leading (no election, no pause in writes).
#[test]
fn raft_a_member_back_from_a_partition_does_not_depose_the_leader() {
    let g = Group::start(true);
    let l = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(l), SKU, 50);
    let acked = vec![reserve(g.port(l), &g, SKU, "before", "r0").expect("reserve")];
    converge_wal(&g, Duration::from_secs(10));
    let f = [1, 2, 3].into_iter().find(|i| *i != l).expect("a follower");
    let term = info_field(g.port(l), "raft_term");
    g.cut(f, true);
    // Ten election timeouts and more: a member that stood each time would be far ahead.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        info_field(g.port(f), "raft_term"),
        term,
        "the cut-off member stood"
    );
    g.cut(f, false);
    converge_wal(&g, Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(2));
    leader_kept(&g, l, term, acked);
}

/// A follower taken out of the group (`RAFT.REMOVE`) and left running hears nothing from
/// the leader, which still answers its `Hello`s; it must not stand meanwhile, or the
/// term it raises deposes the leader the moment `RAFT.ADD` has the log sent to it again.
#[test]
fn raft_a_member_taken_out_and_added_back_leaves_the_leader_in_place() {
    let mut g = Group::start(false);
    let l = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(l), SKU, 50);
    let acked = vec![reserve(g.port(l), &g, SKU, "before", "r0").expect("reserve")];
    converge_wal(&g, Duration::from_secs(10));
    let f = [1, 2, 3].into_iter().find(|i| *i != l).expect("a follower");
    let term = info_field(g.port(l), "raft_term");
    let r: String = redis::cmd("RAFT.REMOVE")
        .arg(f)
        .query(&mut conn(g.port(l)))
        .expect("remove");
    assert_eq!(r, "OK");
    // Several election timeouts: a member that stood would be terms ahead.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        info_field(g.port(f), "raft_term"),
        term,
        "the member taken out stood for election"
    );
    let (port, raft_port) = {
        let m = g.member(f);
        (m.port, m.raft_port)
    };
    let r: String = redis::cmd("RAFT.ADD")
        .arg(f)
        .arg(format!("127.0.0.1:{port}"))
        .arg(format!("127.0.0.1:{raft_port}"))
        .query(&mut conn(g.port(l)))
        .expect("add");
    assert_eq!(r, "OK");
    converge_wal(&g, Duration::from_secs(10));
    leader_kept(&g, l, term, acked);
}

/// `l` still leads in `term` (no election was held), takes a write, and every member
/// holds `acked` and it.
fn leader_kept(g: &Group, l: u64, term: u64, mut acked: Vec<String>) {
    assert_eq!(
        g.leader(None, Duration::from_secs(5)),
        l,
        "the leader changed"
    );
    assert_eq!(
        info_field(g.port(l), "raft_term"),
        term,
        "an election was held"
    );
    acked.push(reserve(g.port(l), g, SKU, "after", "r1").expect("reserve after"));
    check_all_present(g, l, &acked, SKU, 50);
}
