//! The waiting room (`ROOM.*`, docs/protocol.md section 4a) in a Raft group: every room
//! change is a logged record the followers apply, so a `kill -9` of the leader keeps every
//! place. 40 buyers queue for a 5-unit sale, the first are admitted and one reserves with
//! its admission token; after the leader is killed the new leader accepts every ticket,
//! keeps the waiting buyers in their order (nobody lost), keeps the admissions and the
//! hold, answers a repeated join with the same ticket, and honours an admission given
//! before the kill; the old leader, restarted, catches up to the same room. Followers
//! refuse the room's writes as they refuse `RESERVE` (`-READONLY`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use redis::Value;

use crate::common::raft::*;
use crate::common::{as_int, as_str, field};

const USERS: usize = 40;
const UNITS: u64 = 5;

fn user(i: usize) -> String {
    format!("buyer-{i:02}")
}

fn items(v: &Value) -> Vec<Value> {
    match v {
        Value::Array(items) => items.clone(),
        other => panic!("not an array: {other:?}"),
    }
}

/// A refusal a client following the group asks again (of whoever leads then): a leader
/// without its lease, a member that is not (or no longer) the leader, one recovering, a
/// connection lost to a kill or a member's re-execution.
fn transient(e: &redis::RedisError) -> bool {
    let s = e.to_string();
    s.contains("leads no majority")
        || s.contains("not the Raft leader")
        || s.contains("handing its leadership over")
        || e.code() == Some("LOADING")
        || e.is_io_error()
        || e.is_connection_dropped()
        || e.is_timeout()
}

/// `args` on whichever member leads (never `not`), asked again while the refusal is
/// transient, up to 20 s. Only idempotent commands go through here: ROOM.JOIN answers a
/// held place again, ROOM.STATUS a place's state, RESERVE with the same request id its
/// first hold, ROOM.OPEN with the same settings `+OK`.
fn on_leader(g: &Group, not: Option<u64>, args: &[&str]) -> redis::RedisResult<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let port = g.port(g.leader(not, Duration::from_secs(20)));
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        let r = match c.query::<Value>(&mut strict_conn(port)) {
            Ok(Value::ServerError(e)) => Err(redis::RedisError::from(e)),
            r => r,
        };
        match r {
            Err(e) if transient(&e) && Instant::now() < deadline => {
                eprintln!("{} on {port}: {e}; asking the leader again", args[0]);
                std::thread::sleep(Duration::from_millis(50));
            }
            r => return r,
        }
    }
}

fn ok(g: &Group, not: Option<u64>, args: &[&str]) -> Value {
    on_leader(g, not, args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// `[ticket, position]` of a ROOM.JOIN on the leader.
fn join(g: &Group, not: Option<u64>, sku: &str, u: &str) -> (String, i64) {
    let v = items(&ok(g, not, &["ROOM.JOIN", sku, u]));
    assert_eq!(
        v.len(),
        3,
        "ROOM.JOIN answers [ticket, position, eta_ms]: {v:?}"
    );
    (as_str(&v[0]), as_int(&v[1]))
}

/// Every buyer's status on the leader: the word and, while waiting, the position, when
/// admitted the admission's end (`until_ms`); and the admission tokens by buyer. Any
/// refusal (NOTQUEUED, BADTICKET, ...) fails the test: nobody here ever left.
fn places(
    g: &Group,
    not: Option<u64>,
    sku: &str,
    tickets: &[String],
) -> (Vec<(String, i64)>, HashMap<usize, String>) {
    let mut out = Vec::new();
    let mut admissions = HashMap::new();
    for (i, t) in tickets.iter().enumerate() {
        let s = items(&ok(g, not, &["ROOM.STATUS", sku, &user(i), t]));
        let word = as_str(&s[0]);
        let value = match word.as_str() {
            "WAITING" => as_int(&s[1]),
            "ADMITTED" => {
                admissions.insert(i, as_str(&s[1]));
                as_int(&s[2])
            }
            "RESERVED" => 0,
            other => panic!("{} ({t}) is {other}: {s:?}", user(i)),
        };
        out.push((word, value));
    }
    (out, admissions)
}

fn room_info(port: u16, sku: &str, name: &str) -> i64 {
    let v = read(port, redis::cmd("ROOM.INFO").arg(sku));
    as_int(&field(&v, name).unwrap_or_else(|| panic!("ROOM.INFO has no {name}: {v:?}")))
}

/// A RESERVE with an admission token on the leader; the hold's token.
fn reserve_admitted(g: &Group, not: Option<u64>, sku: &str, i: usize, admission: &str) -> String {
    let req = format!("req-{i}");
    let v = items(&ok(g, not, &["RESERVE", sku, &user(i), admission, &req]));
    let word = as_str(&v[0]);
    assert!(word == "RESERVED" || word == "REPLAY", "{v:?}");
    as_str(&v[1])
}

/// The room after the kill against the room before: the same words for those admitted
/// or reserved; the waiting buyers, in the order they had, either still waiting at
/// positions 1, 2, ... in that order or (a prefix of them) admitted since.
fn check_kept(before: &[(String, i64)], after: &[(String, i64)]) {
    let mut waiting: Vec<usize> = (0..USERS).filter(|&i| before[i].0 == "WAITING").collect();
    waiting.sort_by_key(|&i| before[i].1);
    for i in (0..USERS).filter(|&i| before[i].0 != "WAITING") {
        assert_eq!(after[i].0, before[i].0, "{} after the kill", user(i));
        if before[i].0 == "ADMITTED" {
            assert_eq!(
                after[i].1,
                before[i].1,
                "{}'s admission ends as before",
                user(i)
            );
        }
    }
    let admitted_since = waiting
        .iter()
        .take_while(|&&i| after[i].0 == "ADMITTED")
        .count();
    for (k, &i) in waiting.iter().enumerate().skip(admitted_since) {
        let want = ("WAITING", (k - admitted_since + 1) as i64);
        assert_eq!(
            (after[i].0.as_str(), after[i].1),
            want,
            "{}: order kept",
            user(i)
        );
    }
}

/// 40 buyers join on the leader (twice each: the same ticket); returns the tickets.
fn join_all(g: &Group, sku: &str) -> Vec<String> {
    let mut tickets = Vec::new();
    let mut last_waiting = 0;
    for i in 0..USERS {
        let (t, pos) = join(g, None, sku, &user(i));
        assert!(t.starts_with("t1|") && t.contains(&user(i)), "{t}");
        assert_eq!(
            join(g, None, sku, &user(i)),
            (t.clone(), pos),
            "a repeated join"
        );
        if pos > 0 {
            assert!(
                pos > last_waiting,
                "{} at {pos} after {last_waiting}",
                user(i)
            );
            last_waiting = pos;
        }
        tickets.push(t);
    }
    tickets
}

#[test]
fn raft_a_waiting_room_survives_a_leader_kill_with_every_place_kept() {
    let started = Instant::now();
    let sku = "ROOM-RAFT";
    let mut g = Group::start(false);
    let old = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(old), sku, UNITS);
    let open = ["ROOM.OPEN", sku, "RATE", "1000", "ADMIT-TTL", "600000"];
    assert_eq!(ok(&g, None, &open), Value::Okay);
    let tickets = join_all(&g, sku);
    // One admitted buyer per unit (OVERADMIT 1000), from the head of the line.
    let lport = g.port(old);
    let t = Instant::now();
    while room_info(lport, sku, "admitted") < UNITS as i64 {
        assert!(t.elapsed() < Duration::from_secs(10), "nobody admitted");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (first, minted) = places(&g, None, sku, &tickets);
    let admitted: Vec<usize> = (0..USERS).filter(|i| minted.contains_key(i)).collect();
    assert_eq!(
        admitted,
        (0..UNITS as usize).collect::<Vec<_>>(),
        "{first:?}"
    );
    // The first admitted buyer reserves with its admission token.
    let hold = reserve_admitted(&g, None, sku, 0, &minted[&0]);
    let (before, _) = places(&g, None, sku, &tickets);
    assert_eq!(before[0].0, "RESERVED", "the admission was used");
    let waiting = room_info(lport, sku, "waiting");
    assert_eq!(waiting, (USERS - UNITS as usize) as i64);

    g.member(old).kill9();
    let new = g.leader(Some(old), Duration::from_secs(20));
    let nport = g.port(new);
    eprintln!(
        "leader {old} killed; {new} leads after {:?}",
        started.elapsed()
    );
    let (after, _) = places(&g, Some(old), sku, &tickets);
    check_kept(&before, &after);
    assert_eq!(
        state_of(nport, &hold).as_deref(),
        Some("RESERVED"),
        "the hold"
    );
    assert_eq!(sale_info(nport, sku), (UNITS as i64, 4, 1, 0));
    assert_eq!(room_info(nport, sku, "waiting"), waiting);
    // A join again answers the same ticket, and queues nobody twice.
    for i in (0..USERS).filter(|&i| after[i].0 != "RESERVED") {
        let (t, _) = join(&g, Some(old), sku, &user(i));
        assert_eq!(t, tickets[i], "{}'s ticket after the failover", user(i));
    }
    assert_eq!(room_info(nport, sku, "waiting"), waiting);
    // An admission token the old leader minted is honoured by the new one.
    reserve_admitted(&g, Some(old), sku, 1, &minted[&1]);
    assert_eq!(sale_info(nport, sku), (UNITS as i64, 3, 2, 0));

    restart_and_compare(&mut g, old, new, sku);
    eprintln!("raft_room: kill test done in {:?}", started.elapsed());
}

/// The old leader, restarted, catches up: its room (read after READONLY) is the leader's.
fn restart_and_compare(g: &mut Group, old: u64, new: u64, sku: &str) {
    g.member(old).spawn();
    g.converge(Duration::from_secs(30));
    let (oport, nport) = (g.port(old), g.port(new));
    let leader_info = read(nport, redis::cmd("ROOM.INFO").arg(sku));
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mine = read(oport, redis::cmd("ROOM.INFO").arg(sku));
        if mine == leader_info {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "ROOM.INFO on the restarted member {mine:?} != the leader's {leader_info:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for name in ["waiting", "admitted"] {
        assert_eq!(
            room_info(oport, sku, name),
            room_info(nport, sku, name),
            "{name}"
        );
    }
    assert_eq!(room_info(nport, sku, "admitted"), 3);
}

/// The error `args` gets on `c`: its code and its text.
fn refusal(c: &mut redis::Connection, args: &[&str]) -> (String, String) {
    let mut k = redis::cmd(args[0]);
    for a in &args[1..] {
        k.arg(*a);
    }
    match k.query::<Value>(c) {
        Err(e) => (e.code().unwrap_or("?").to_owned(), e.to_string()),
        Ok(Value::ServerError(e)) => (e.code().to_owned(), format!("{e:?}")),
        Ok(v) => panic!("{args:?} accepted on a follower: {v:?}"),
    }
}

#[test]
fn raft_a_follower_refuses_room_writes() {
    let sku = "ROOM-FOLLOWER";
    let g = Group::start(false);
    let l = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(l), sku, UNITS);
    let open = ["ROOM.OPEN", sku, "RATE", "1000"];
    assert_eq!(ok(&g, None, &open), Value::Okay);
    let (ticket, _) = join(&g, None, sku, "on-leader");
    let l = g.leader(None, Duration::from_secs(10));
    let f = g
        .members
        .iter()
        .map(|m| m.id)
        .find(|&id| id != l)
        .expect("a follower");
    let fport = g.port(f);
    converge_wal(&g, Duration::from_secs(15));

    let mut c = strict_conn(fport);
    let tok = g.token(sku, "buyer");
    let (code, text) = refusal(&mut c, &["RESERVE", sku, "buyer", &tok, "req-1"]);
    assert_eq!(code, "READONLY", "RESERVE on a follower: {text}");
    let writes: [&[&str]; 4] = [
        &["ROOM.JOIN", sku, "buyer"],
        &["ROOM.STATUS", sku, "on-leader", &ticket],
        &["ROOM.LEAVE", sku, "on-leader"],
        &["ROOM.OPEN", sku, "RATE", "1000"],
    ];
    for w in writes {
        assert_eq!(refusal(&mut c, w), (code.clone(), text.clone()), "{w:?}");
    }
    // READONLY lets a follower serve reads, never writes: the join is still refused,
    // and the follower's room shows the one buyer the leader queued, nobody else.
    let mut c = conn(fport);
    let (jcode, jtext) = refusal(&mut c, &["ROOM.JOIN", sku, "buyer"]);
    assert_eq!(jcode, "READONLY", "ROOM.JOIN after READONLY: {jtext}");
    assert_eq!(room_info(fport, sku, "waiting"), 0);
    assert_eq!(room_info(fport, sku, "admitted"), 1);
    assert_eq!(
        room_info(g.port(l), sku, "waiting"),
        0,
        "the refused join queued nobody"
    );
    assert_eq!(room_info(g.port(l), sku, "admitted"), 1);
    let s = items(&ok(&g, None, &["ROOM.STATUS", sku, "on-leader", &ticket]));
    assert_eq!(
        as_str(&s[0]),
        "ADMITTED",
        "the refused leave left the place: {s:?}"
    );
}
