//! The order feed and its consumer groups on a Raft group:
//!
//! - the feed shows committed entries only: a RESERVE waiting on a leader cut from its
//!   followers is in nobody's `XREAD` while it waits, and afterwards in every member's
//!   feed if it was acknowledged, in none if it was not;
//! - after a `kill -9` of the leader, the new leader's feed has an entry for every
//!   acknowledged reservation, and every member's feed is the same, id for id;
//! - consumer-group records travel with the log: every member has the same pending list
//!   and last-delivered id, followers refuse group writes, a killed follower has the
//!   groups back from its own log, and a new leader goes on from the old one's positions
//!   (nothing delivered twice, nothing acknowledged comes back).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::raft::*;
use redis::Value;

const S: &str = "stockgate:events";

/// One command, once.
fn q_once(port: u16, args: &[&str]) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(&mut conn(port))
}

/// One command, asked again for a while if the connection ends under it: a member that
/// was deposed closes its connections when it re-executes itself (a moment after it
/// stopped leading), as a client following the group sees it.
fn q(port: u16, args: &[&str]) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match cmd.query(&mut conn(port)) {
            Err(e)
                if (e.is_io_error() || e.is_connection_dropped()) && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            r => return r,
        }
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        other => format!("{other:?}"),
    }
}

/// `(id, fields)` of each entry of an XREAD / XREADGROUP / XRANGE reply.
fn entries(v: &Value) -> Vec<(String, Vec<String>)> {
    fn walk(v: &Value, out: &mut Vec<(String, Vec<String>)>) {
        let Value::Array(items) = v else { return };
        // An entry: [id, [k, v, ...]].
        if let [id @ Value::BulkString(_), Value::Array(kv)] = &items[..] {
            if kv.iter().all(|x| matches!(x, Value::BulkString(_))) && !kv.is_empty() {
                out.push((text(id), kv.iter().map(text).collect()));
                return;
            }
        }
        for it in items {
            walk(it, out);
        }
    }
    let mut out = Vec::new();
    walk(v, &mut out);
    out
}

fn get(fields: &[String], k: &str) -> String {
    fields
        .chunks(2)
        .find(|c| c[0] == k)
        .map(|c| c.get(1).cloned().unwrap_or_default())
        .unwrap_or_default()
}

/// The whole feed of `port`: `(id, type, token)` per entry.
fn feed(port: u16) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut from = "-".to_owned();
    loop {
        let v = q(port, &["XRANGE", S, &from, "+", "COUNT", "1000"]).expect("XRANGE");
        let es = entries(&v);
        let n = es.len();
        for (id, f) in es {
            if out
                .last()
                .is_some_and(|(last, _, _): &(String, _, _)| *last == id)
            {
                continue;
            }
            from = id.clone();
            out.push((id, get(&f, "type"), get(&f, "token")));
        }
        if n < 1000 {
            return out;
        }
    }
}

fn reserved_in(feed: &[(String, String, String)]) -> HashSet<String> {
    feed.iter()
        .filter(|(_, t, _)| t == "reserved")
        .map(|(_, _, tok)| tok.clone())
        .collect()
}

#[test]
fn raft_the_feed_shows_only_committed_entries() {
    let g = Group::start(true);
    let l = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(l), "FEED", 100);
    let first = reserve(g.port(l), &g, "FEED", "u1", "r1").expect("reserve");
    // Each member's feed follows its applied log a moment later: equal lengths alone
    // may still be the sale's creation only.
    let deadline = Instant::now() + Duration::from_secs(10);
    for id in [1, 2, 3] {
        loop {
            let seen = reserved_in(&feed(g.port(id)));
            if seen == HashSet::from([first.clone()]) {
                break;
            }
            assert!(
                seen.is_empty() && Instant::now() < deadline,
                "member {id}'s feed: {seen:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    g.cut(l, true);
    std::thread::sleep(Duration::from_millis(60));
    let waiting = {
        let (port, tok) = (g.port(l), g.token("FEED", "u2"));
        std::thread::spawn(move || reserve_with(port, "FEED", "u2", &tok, "r2"))
    };
    // While it waits, the leader's feed (when it answers at all: without a majority it
    // refuses reads) and the followers' show only the first reservation.
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(800) {
        for id in [1, 2, 3] {
            if let Ok(v) = q_once(g.port(id), &["XRANGE", S, "-", "+"]) {
                let toks: HashSet<String> = entries(&v)
                    .into_iter()
                    .filter(|(_, f)| get(f, "type") == "reserved")
                    .map(|(_, f)| get(&f, "token"))
                    .collect();
                assert_eq!(
                    toks,
                    HashSet::from([first.clone()]),
                    "node {id} showed an uncommitted entry"
                );
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    g.cut(l, false);
    let second = waiting.join().expect("join");
    g.converge(Duration::from_secs(20));
    let want: HashSet<String> = match &second {
        Ok(t) => HashSet::from([first.clone(), t.clone()]),
        Err(_) => HashSet::from([first.clone()]),
    };
    let feeds: Vec<_> = [1, 2, 3].iter().map(|id| feed(g.port(*id))).collect();
    for (i, f) in feeds.iter().enumerate() {
        assert_eq!(
            reserved_in(f),
            want,
            "node {}: the waiting RESERVE answered {second:?}",
            i + 1
        );
        assert_eq!(f, &feeds[0], "node {}'s feed differs from node 1's", i + 1);
    }
}

#[test]
fn raft_the_new_leaders_feed_has_every_acknowledged_reservation() {
    let g = Group::start(false);
    let l = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(l), "FKILL", 10_000);
    let g = Arc::new(Mutex::new(g));
    let writers = storm(&g, "FKILL", "f", 3, 60);
    std::thread::sleep(Duration::from_millis(800));
    let old = {
        let mut g = g.lock().expect("group");
        let l = g.leader(None, Duration::from_secs(5));
        g.member(l).kill9();
        l
    };
    let acked: Vec<String> = writers
        .into_iter()
        .flat_map(|w| w.join().expect("writer"))
        .collect();
    let mut g = g.lock().expect("group");
    let new = g.leader(Some(old), Duration::from_secs(10));
    let on_new = reserved_in(&feed(g.port(new)));
    let missing: Vec<&String> = acked.iter().filter(|t| !on_new.contains(*t)).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged reservations have no feed entry on the new leader, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    // The killed member back: every feed the same, id for id (a position means the
    // same on every member).
    g.member(old).spawn();
    g.converge(Duration::from_secs(20));
    let feeds: Vec<_> = [1, 2, 3].iter().map(|id| feed(g.port(*id))).collect();
    for (i, f) in feeds.iter().enumerate() {
        assert_eq!(f, &feeds[0], "node {}'s feed differs from node 1's", i + 1);
    }
    println!(
        "feed after a leader kill: {} acknowledged reservations, {} entries on every member",
        acked.len(),
        feeds[0].len()
    );
}

/// Pending list (without idle times) and XINFO GROUPS (without times) of a member.
fn group_state(port: u16, stream: &str) -> (Value, String) {
    let pending = q(port, &["XPENDING", stream, "g", "-", "+", "1000"]).expect("XPENDING");
    let pending = match pending {
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .map(|it| match it {
                    Value::Array(mut f) if f.len() > 2 => {
                        f.remove(2);
                        Value::Array(f)
                    }
                    v => v,
                })
                .collect(),
        ),
        v => v,
    };
    let groups = format!(
        "{:?}",
        q(port, &["XINFO", "GROUPS", stream]).expect("XINFO GROUPS")
    );
    (pending, groups)
}

fn same_groups(g: &Group, stream: &str, members: &[u64]) -> (Value, String) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let states: Vec<_> = members
            .iter()
            .map(|id| group_state(g.port(*id), stream))
            .collect();
        if states.windows(2).all(|w| w[0] == w[1]) {
            return states[0].clone();
        }
        assert!(
            Instant::now() < deadline,
            "members' groups differ: {states:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn read_group(port: u16, stream: &str, consumer: &str, count: usize) -> Vec<String> {
    let v = q(
        port,
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            consumer,
            "COUNT",
            &count.to_string(),
            "STREAMS",
            stream,
            ">",
        ],
    )
    .expect("XREADGROUP");
    entries(&v).into_iter().map(|(id, _)| id).collect()
}

#[test]
fn raft_consumer_groups_replicate_and_survive_kills_of_a_follower_and_the_leader() {
    const SKU: &str = "GRP";
    let stream = "{GRP}:events";
    let mut g = Group::start(false);
    let l = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(l), SKU, 500);
    q(g.port(l), &["XGROUP", "CREATE", stream, "g", "0"]).expect("XGROUP CREATE");
    let reserve_n = |g: &Group, port: u16, from: usize, n: usize| {
        for i in from..from + n {
            reserve(port, g, SKU, &format!("u{i}"), &format!("r{i}")).expect("reserve");
        }
    };
    reserve_n(&g, g.port(l), 0, 10);
    let c1 = read_group(g.port(l), stream, "c1", 4);
    let c2 = read_group(g.port(l), stream, "c2", 3);
    assert_eq!((c1.len(), c2.len()), (4, 3));
    assert_eq!(
        q(g.port(l), &["XACK", stream, "g", &c1[0]]).expect("XACK"),
        Value::Int(1)
    );
    let want = same_groups(&g, stream, &[1, 2, 3]);
    assert!(want.1.contains("int(6)"), "six pending: {want:?}");

    // Group writes are refused on a follower; its reads are served (above).
    let f = [1, 2, 3].into_iter().find(|i| *i != l).expect("follower");
    for args in [
        &["XGROUP", "CREATE", stream, "other", "0"][..],
        &["XREADGROUP", "GROUP", "g", "c1", "STREAMS", stream, ">"][..],
        &["XACK", stream, "g", &c1[1]][..],
    ] {
        let e = q(g.port(f), args).expect_err("a follower takes no group write");
        assert!(
            e.kind() == redis::ErrorKind::ReadOnly || e.to_string().contains("READONLY"),
            "{args:?}: {e}"
        );
    }

    // kill -9 a follower, go on, restart it: its groups come back from its own log.
    g.member(f).kill9();
    reserve_n(&g, g.port(l), 10, 3);
    assert_eq!(
        q(g.port(l), &["XACK", stream, "g", &c1[1], &c2[0]]).expect("XACK"),
        Value::Int(2)
    );
    g.member(f).spawn();
    let before_kill = same_groups(&g, stream, &[1, 2, 3]);

    // kill -9 the leader: the new leader goes on from its positions.
    g.member(l).kill9();
    let n = g.leader(Some(l), Duration::from_secs(10));
    assert_eq!(
        group_state(g.port(n), stream),
        before_kill,
        "the new leader has the old one's group state"
    );
    let next = read_group(g.port(n), stream, "c3", 100);
    let delivered: HashSet<&String> = c1.iter().chain(&c2).collect();
    assert!(
        next.iter().all(|id| !delivered.contains(id)),
        "an entry delivered before the failover was delivered again: {next:?}"
    );
    // Exactly the stream's entries not delivered before.
    let all = entries(&q(g.port(n), &["XRANGE", stream, "-", "+"]).expect("XRANGE"));
    let undelivered: Vec<String> = all
        .into_iter()
        .map(|(id, _)| id)
        .filter(|id| !delivered.contains(id))
        .collect();
    assert_eq!(next, undelivered);
    assert_eq!(
        undelivered.len(),
        7,
        "14 entries (the sale's and 13 reservations), 7 delivered"
    );
    assert_eq!(
        q(g.port(n), &["XACK", stream, "g", &c1[0]]).expect("XACK"),
        Value::Int(0),
        "an acknowledged entry is pending again after the failover"
    );
    g.member(l).spawn();
    same_groups(&g, stream, &[1, 2, 3]);
}
