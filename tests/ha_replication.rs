//! Replication over the real binary (issue 13), without Sentinel: a replica follows its
//! primary through the log and converges; resumes after kill -9 without a full copy;
//! refuses writes; `--min-replicas-ack` holds replies and an isolated primary
//! acknowledges nothing; a promoted replica fences its old primary; a former primary
//! with a diverged tail is resynchronised from a full copy; WAIT counts replicas.

mod common;

use std::time::{Duration, Instant};

use common::ha::*;
use redis::Value;

const SKU: &str = "HA1";

fn reserve(
    c: &mut redis::Connection,
    keys: &Keys,
    user: &str,
    req: &str,
) -> redis::RedisResult<Value> {
    let adm = keys.keyring().mint(SKU, user, common::now_ms() + 600_000);
    redis::cmd("RESERVE")
        .arg(SKU)
        .arg(user)
        .arg(adm)
        .arg(req)
        .query(c)
}

fn token_of(v: &Value) -> String {
    match v {
        Value::Array(items) => match &items[1] {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            other => panic!("no token in {other:?}"),
        },
        other => panic!("not a RESERVE reply: {other:?}"),
    }
}

fn status(v: &Value) -> String {
    match v {
        Value::Array(items) => match &items[0] {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            other => format!("{other:?}"),
        },
        other => format!("{other:?}"),
    }
}

fn readonly(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::ReadOnly || e.to_string().contains("READONLY")
}

/// A primary and one attached replica started with `flags`, and sale SKU (100 units)
/// created through the returned connection to the primary.
fn primary_replica_sale(keys: &Keys, flags: &[&str]) -> (Node, Node, redis::Connection) {
    let a = Node::start(keys, flags);
    let b = Node::start_replica(keys, &a, flags);
    wait_for("replica attached", Duration::from_secs(10), || {
        a.repl_field("connected_slaves") == "1"
    });
    let mut c = a.conn();
    let _: () = redis::cmd("SALE.CREATE")
        .arg(SKU)
        .arg(100)
        .query(&mut c)
        .unwrap();
    (a, b, c)
}

fn converged(a: &Node, b: &Node, tokens: &[String]) {
    wait_for(
        "replica to reach the primary's offset",
        Duration::from_secs(15),
        || b.offset() == a.offset(),
    );
    assert_eq!(state_of(a, SKU, tokens), state_of(b, SKU, tokens));
}

#[test]
fn a_replica_follows_resumes_after_kill_9_and_refuses_writes() {
    let keys = Keys::new();
    let a = Node::start(&keys, &[]);
    let mut b = Node::start(&keys, &["--replicaof", &a.addr()]);
    let mut c = a.conn();
    let _: () = redis::cmd("SALE.CREATE")
        .arg(SKU)
        .arg(500)
        .query(&mut c)
        .unwrap();
    let mut tokens = Vec::new();
    for i in 0..60 {
        let r = reserve(&mut c, &keys, &format!("u{i}"), &format!("r{i}")).unwrap();
        assert_eq!(status(&r), "RESERVED");
        let t = token_of(&r);
        match i % 3 {
            0 => {
                let _: Value = redis::cmd("COMMIT").arg(&t).query(&mut c).unwrap();
            }
            1 => {
                let _: Value = redis::cmd("RELEASE").arg(&t).query(&mut c).unwrap();
            }
            _ => {}
        }
        tokens.push(t);
    }
    converged(&a, &b, &tokens);
    assert_eq!(b.role(), "slave");
    assert_eq!(b.info("replication")["master_link_status"], "up");
    let mut bc = b.conn();
    let err = reserve(&mut bc, &keys, "x", "rx").unwrap_err();
    assert!(readonly(&err), "a replica must refuse writes: {err}");
    // Reads are served.
    let stock: i64 = redis::cmd("STOCK").arg(SKU).query(&mut bc).unwrap();
    assert_eq!(stock, 500 - 40);

    // kill -9 the replica, write on, restart: it resumes from its log (no full copy).
    let full_before: u64 = a.info("replication")["sync_full"].parse().unwrap();
    b.kill9();
    for i in 60..90 {
        let r = reserve(&mut c, &keys, &format!("u{i}"), &format!("r{i}")).unwrap();
        tokens.push(token_of(&r));
    }
    b.restart();
    converged(&a, &b, &tokens);
    let info = a.info("replication");
    assert_eq!(
        info["sync_full"].parse::<u64>().unwrap(),
        full_before,
        "a restarted replica resumes without a full copy"
    );
    assert_eq!(info["connected_slaves"], "1");
    assert!(info["slave0"].contains(&format!("port={}", b.port)));
}

#[test]
fn with_min_replicas_ack_an_isolated_primary_acknowledges_nothing() {
    let keys = Keys::new();
    let a = Node::start(
        &keys,
        &["--min-replicas-ack", "1", "--repl-timeout-ms", "800"],
    );
    let mut c = a.conn();
    // No replica attached: writes are refused before anything changes.
    let err = redis::cmd("SALE.CREATE")
        .arg(SKU)
        .arg(100)
        .query::<Value>(&mut c)
        .unwrap_err();
    assert!(err.to_string().contains("NOREPLICAS"), "{err}");
    let b = Node::start(&keys, &["--replicaof", &a.addr()]);
    wait_for("replica attached", Duration::from_secs(10), || {
        a.info("replication")["connected_slaves"] == "1"
    });
    let _: () = redis::cmd("SALE.CREATE")
        .arg(SKU)
        .arg(100)
        .query(&mut c)
        .unwrap();
    let r = reserve(&mut c, &keys, "u1", "r1").unwrap();
    assert_eq!(status(&r), "RESERVED");
    // Every acknowledged record is on the replica at the moment of the reply.
    assert!(
        b.offset() >= a.offset(),
        "acknowledged before the replica had it"
    );

    // Isolate the primary: its only replica stops (SIGSTOP).
    b.signal(libc::SIGSTOP);
    let t = Instant::now();
    let mut acked = Vec::new();
    for i in 2..6 {
        let mut c = a.conn();
        match reserve(&mut c, &keys, &format!("u{i}"), &format!("r{i}")) {
            Ok(v) if !v.to_string_lossy().contains("NOREPLICAS") => acked.push(v),
            _ => {}
        }
    }
    assert!(
        acked.is_empty(),
        "an isolated primary acknowledged {acked:?} ({:?} after the stop)",
        t.elapsed()
    );
    let info = a.info("replication");
    assert_eq!(
        info["connected_slaves"], "0",
        "the silent replica is detached"
    );
    // Back: the replica reattaches, catches up, and writes are acknowledged again.
    b.signal(libc::SIGCONT);
    wait_for("replica reattached", Duration::from_secs(10), || {
        a.info("replication")["connected_slaves"] == "1"
    });
    let r = reserve(&mut c, &keys, "u9", "r9").unwrap();
    assert_eq!(status(&r), "RESERVED");
    // WAIT: one replica has everything.
    let n: i64 = redis::cmd("WAIT").arg(1).arg(2000).query(&mut c).unwrap();
    assert_eq!(n, 1);
    let n: i64 = redis::cmd("WAIT").arg(2).arg(200).query(&mut c).unwrap();
    assert_eq!(
        n, 1,
        "WAIT answers the count it has when the timeout passes"
    );
}

trait Lossy {
    fn to_string_lossy(&self) -> String;
}

impl Lossy for Value {
    fn to_string_lossy(&self) -> String {
        format!("{self:?}")
    }
}

#[test]
fn a_promoted_replica_fences_its_old_primary_and_the_group_converges() {
    let keys = Keys::new();
    let ack = ["--min-replicas-ack", "1", "--repl-timeout-ms", "1000"];
    let a = Node::start(&keys, &ack);
    let b = Node::start_replica(&keys, &a, &ack);
    let cnode = Node::start_replica(&keys, &a, &ack);
    wait_for("two replicas attached", Duration::from_secs(10), || {
        a.info("replication")["connected_slaves"] == "2"
    });
    let mut c = a.conn();
    let _: () = redis::cmd("SALE.CREATE")
        .arg(SKU)
        .arg(100)
        .query(&mut c)
        .unwrap();
    let mut tokens = Vec::new();
    for i in 0..20 {
        tokens.push(token_of(
            &reserve(&mut c, &keys, &format!("u{i}"), &format!("r{i}")).unwrap(),
        ));
    }
    // Promote b while a is alive (what an unasked failover does).
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut b.conn())
        .unwrap();
    wait_for("the old primary fenced", Duration::from_secs(5), || {
        a.info("replication")["stockgate_deposed"] == "1"
    });
    let err = reserve(&mut c, &keys, "late", "late").unwrap_err();
    assert!(readonly(&err), "a fenced primary must refuse writes: {err}");
    // Its feed too: a reader there would wait forever on a log that no longer grows;
    // -READONLY sends a Sentinel-aware reader to the new primary.
    let err = redis::cmd("XREAD")
        .arg("STREAMS")
        .arg("stockgate:events")
        .arg("0-0")
        .query::<Value>(&mut c)
        .unwrap_err();
    assert!(
        readonly(&err),
        "a fenced primary must refuse feed reads: {err}"
    );
    // Still fenced after a kill -9 and restart, though c still follows it.
    let mut a = a;
    a.kill9();
    a.restart();
    wait_for("c back on the restarted a", Duration::from_secs(10), || {
        a.info("replication")["connected_slaves"] == "1"
    });
    assert_eq!(a.info("replication")["stockgate_deposed"], "1");
    let err = reserve(&mut a.conn(), &keys, "late", "late").unwrap_err();
    assert!(
        readonly(&err),
        "a restarted fenced primary must refuse writes: {err}"
    );
    // Without a replica, the new primary (--min-replicas-ack 1) neither writes nor reports.
    let mut bc = b.conn();
    let err = redis::cmd("STOCK")
        .arg(SKU)
        .query::<i64>(&mut bc)
        .unwrap_err();
    assert!(err.to_string().contains("NOREPLICAS"), "{err}");
    // c and then a follow b; both continue from their logs (no divergence here).
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(b.port)
        .query(&mut cnode.conn())
        .unwrap();
    wait_for("c attached to b", Duration::from_secs(10), || {
        b.info("replication")["connected_slaves"] == "1"
    });
    // b has every reservation a acknowledged.
    for t in &tokens {
        let v: Value = redis::cmd("RESERVATION").arg(t).query(&mut bc).unwrap();
        assert!(
            format!("{v:?}").contains("RESERVED"),
            "{t} missing on the promoted node: {v:?}"
        );
    }
    let r = reserve(&mut bc, &keys, "after", "after").unwrap();
    assert_eq!(status(&r), "RESERVED");
    tokens.push(token_of(&r));
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(b.port)
        .query(&mut a.conn())
        .unwrap();
    converged(&b, &cnode, &tokens);
    converged(&b, &a, &tokens);
    assert_eq!(
        b.info("replication")["sync_full"],
        "0",
        "no full copy was needed"
    );
}

#[test]
fn a_former_primary_with_a_diverged_tail_takes_a_full_copy() {
    let keys = Keys::new();
    let mut a = Node::start(&keys, &[]);
    let b = Node::start(&keys, &["--replicaof", &a.addr()]);
    let mut c = a.conn();
    let _: () = redis::cmd("SALE.CREATE")
        .arg(SKU)
        .arg(100)
        .query(&mut c)
        .unwrap();
    let mut tokens = Vec::new();
    for i in 0..10 {
        tokens.push(token_of(
            &reserve(&mut c, &keys, &format!("u{i}"), &format!("r{i}")).unwrap(),
        ));
    }
    converged(&a, &b, &tokens);
    a.kill9();
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut b.conn())
        .unwrap();
    let mut bc = b.conn();
    for i in 10..15 {
        tokens.push(token_of(
            &reserve(&mut bc, &keys, &format!("u{i}"), &format!("r{i}")).unwrap(),
        ));
    }
    // a comes back as the primary it was (no replicas, --min-replicas-ack 0) and takes a
    // write b never sees: its history now diverges from b's.
    a.restart();
    let mut c = a.conn();
    let lost = token_of(&reserve(&mut c, &keys, "stray", "stray").unwrap());
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(b.port)
        .query(&mut c)
        .unwrap();
    // It discards its own tail, installs b's copy (restarting itself on the same port).
    wait_for("a in sync with b", Duration::from_secs(20), || {
        a.try_conn().is_ok_and(|mut c| {
            redis::cmd("INFO")
                .arg("replication")
                .query::<String>(&mut c)
                .is_ok_and(|i| i.contains("master_link_status:up"))
        }) && a.offset() == b.offset()
    });
    assert_eq!(state_of(&a, SKU, &tokens), state_of(&b, SKU, &tokens));
    let v: Value = redis::cmd("RESERVATION")
        .arg(&lost)
        .query(&mut a.conn())
        .unwrap();
    assert_eq!(
        v,
        Value::Nil,
        "the diverged, never-replicated write is gone"
    );
    assert_eq!(b.info("replication")["sync_full"], "1");
}

#[test]
fn replication_and_sentinel_users_can_do_exactly_their_part() {
    let keys = Keys::new();
    let users = common::TempDir::new("users");
    let file = users.path().join("users");
    std::fs::write(
        &file,
        "adm admin pw-admin\nrepl replication pw-repl\nsent sentinel pw-sent\nbuyer checkout pw-buyer\n",
    )
    .unwrap();
    let f = file.display().to_string();
    let a = Node::start(&keys, &["--users-file", &f]);
    let b = Node::start(
        &keys,
        &[
            "--users-file",
            &f,
            "--replicaof",
            &a.addr(),
            "--primary-user",
            "repl",
            "--primary-password",
            "pw-repl",
        ],
    );
    let login = |n: &Node, u: &str, p: &str| {
        let mut c = n.conn();
        let _: () = redis::cmd("AUTH").arg(u).arg(p).query(&mut c).unwrap();
        c
    };
    let mut admin = login(&a, "adm", "pw-admin");
    let _: () = redis::cmd("SALE.CREATE")
        .arg(SKU)
        .arg(10)
        .query(&mut admin)
        .unwrap();
    wait_for(
        "the replica authenticated and caught up",
        Duration::from_secs(10),
        || {
            let mut c = login(&b, "adm", "pw-admin");
            redis::cmd("STOCK")
                .arg(SKU)
                .query::<i64>(&mut c)
                .is_ok_and(|n| n == 10)
        },
    );
    // The replication user may sync, not sell.
    let mut r = login(&a, "repl", "pw-repl");
    let e = redis::cmd("SALE.CREATE")
        .arg("X")
        .arg(1)
        .query::<()>(&mut r)
        .unwrap_err();
    assert!(e.to_string().contains("NOPERM"), "{e}");
    // The sentinel user may do what Sentinel does, nothing else.
    let mut s = login(&b, "sent", "pw-sent");
    let info: String = redis::cmd("INFO").arg("replication").query(&mut s).unwrap();
    assert!(info.contains("role:slave"));
    let _: Value = redis::cmd("ROLE").query(&mut s).unwrap();
    let n: i64 = redis::cmd("PUBLISH")
        .arg("__sentinel__:hello")
        .arg("hi")
        .query(&mut s)
        .unwrap();
    assert_eq!(n, 0);
    let e = reserve(&mut s, &keys, "u", "r").unwrap_err();
    assert!(e.to_string().contains("NOPERM"), "{e}");
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut s)
        .unwrap();
    let _: () = redis::cmd("CONFIG").arg("REWRITE").query(&mut s).unwrap();
    let info: String = redis::cmd("INFO").arg("replication").query(&mut s).unwrap();
    assert!(info.contains("role:master"), "{info}");
}

#[test]
fn client_kill_ends_the_chosen_connections_and_needs_admin_or_sentinel() {
    let keys = Keys::new();
    let a = Node::start(&keys, &[]);
    let mut victim = a.conn();
    let mut killer = a.conn();
    let n: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query(&mut killer)
        .unwrap();
    assert!(n >= 1, "killed {n}");
    assert!(
        redis::cmd("PING").query::<String>(&mut victim).is_err(),
        "the victim is gone"
    );
    let pong: String = redis::cmd("PING").query(&mut killer).unwrap();
    assert_eq!(pong, "PONG", "SKIPME yes by default");
}

#[test]
fn a_fence_is_lifted_when_the_promotion_did_not_hold() {
    // Sentinel may abort a failover after promoting a replica (it did not see the
    // promotion in time) and then make that replica follow the old primary again. The old
    // primary, fenced by the promotion, must then take writes again.
    let keys = Keys::new();
    let ack = ["--min-replicas-ack", "1", "--repl-timeout-ms", "1000"];
    let (a, b, mut c) = primary_replica_sale(&keys, &ack);
    let before = token_of(&reserve(&mut c, &keys, "u1", "r1").unwrap());
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut b.conn())
        .unwrap();
    wait_for("a fenced", Duration::from_secs(5), || {
        a.repl_field("stockgate_deposed") == "1"
    });
    // The failover is abandoned: b follows a again.
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(a.port)
        .query(&mut b.conn())
        .unwrap();
    wait_for("the fence lifted", Duration::from_secs(20), || {
        a.repl_field("stockgate_deposed") == "0" && a.repl_field("connected_slaves") == "1"
    });
    let after = token_of(&reserve(&mut a.conn(), &keys, "u2", "r2").unwrap());
    converged(&a, &b, &[before, after]);
}

#[test]
fn a_primary_whose_replicas_are_all_stopped_acknowledges_nothing() {
    // The partition case without real networks: both replicas SIGSTOPped.
    let keys = Keys::new();
    let ack = ["--min-replicas-ack", "1", "--repl-timeout-ms", "800"];
    let a = Node::start(&keys, &ack);
    let replicas = [
        Node::start_replica(&keys, &a, &ack),
        Node::start_replica(&keys, &a, &ack),
    ];
    wait_for("two replicas attached", Duration::from_secs(10), || {
        a.repl_field("connected_slaves") == "2"
    });
    let mut c = a.conn();
    let _: () = redis::cmd("SALE.CREATE")
        .arg(SKU)
        .arg(100)
        .query(&mut c)
        .unwrap();
    for r in &replicas {
        r.signal(libc::SIGSTOP);
    }
    let mut acked = Vec::new();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(4) {
        let i = acked.len() + t.elapsed().as_millis() as usize;
        let mut c = a.conn();
        if let Ok(v) = reserve(&mut c, &keys, &format!("u{i}"), &format!("r{i}")) {
            acked.push(v);
        }
    }
    assert!(
        acked.is_empty(),
        "an isolated primary acknowledged {acked:?}"
    );
    assert_eq!(a.repl_field("connected_slaves"), "0");
    for r in &replicas {
        r.signal(libc::SIGCONT);
    }
    wait_for("replicas back", Duration::from_secs(10), || {
        a.repl_field("connected_slaves") == "2"
    });
    let r = reserve(&mut a.conn(), &keys, "back", "back").unwrap();
    assert_eq!(status(&r), "RESERVED");
}

/// Tokens of the `reserved` entries of an XREAD reply (RESP2: [[stream, [[id, [k, v, ...]], ...]]]).
fn reserved_tokens(v: &Value) -> Vec<String> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        other => format!("{other:?}"),
    };
    let mut out = Vec::new();
    let Value::Array(streams) = v else {
        return out;
    };
    for s in streams {
        let Value::Array(pair) = s else { continue };
        let Some(Value::Array(entries)) = pair.get(1) else {
            continue;
        };
        for e in entries {
            let Value::Array(idkv) = e else { continue };
            let Some(Value::Array(kv)) = idkv.get(1) else {
                continue;
            };
            let fields: Vec<String> = kv.iter().map(text).collect();
            let get = |k: &str| {
                fields
                    .chunks(2)
                    .find(|c| c[0] == k)
                    .map(|c| c[1].clone())
                    .unwrap_or_default()
            };
            if get("type") == "reserved" {
                out.push(get("token"));
            }
        }
    }
    out
}

fn xread(c: &mut redis::Connection, block_ms: Option<u64>) -> Value {
    let mut cmd = redis::cmd("XREAD");
    cmd.arg("COUNT").arg(1000);
    if let Some(ms) = block_ms {
        cmd.arg("BLOCK").arg(ms);
    }
    cmd.arg("STREAMS").arg("stockgate:events").arg("0-0");
    cmd.query(c).unwrap()
}

#[test]
fn the_feed_shows_only_what_the_replicas_acknowledged() {
    // Issue 12: "an entry is readable only once its record is durable (and, with
    // replication, acknowledged as the replies are)". A consumer that saw a record the
    // replicas do not have would write an order the next primary never heard of, and
    // its position would run ahead of the new primary's log.
    let keys = Keys::new();
    let ack = ["--min-replicas-ack", "1", "--repl-timeout-ms", "8000"];
    let (a, b, mut c) = primary_replica_sale(&keys, &ack);
    let first = token_of(&reserve(&mut c, &keys, "u1", "r1").unwrap());
    assert_eq!(reserved_tokens(&xread(&mut c, None)), vec![first.clone()]);

    let durable_before: u64 = a.info("feed")["feed_durable_lsn"].parse().unwrap();
    b.signal(libc::SIGSTOP);
    let adm = keys.keyring().mint(SKU, "u2", common::now_ms() + 600_000);
    let addr = a.addr();
    let pending = std::thread::spawn(move || {
        let mut c = redis::Client::open(format!("redis://{addr}/"))
            .unwrap()
            .get_connection()
            .unwrap();
        redis::cmd("RESERVE")
            .arg(SKU)
            .arg("u2")
            .arg(adm)
            .arg("r2")
            .query::<Value>(&mut c)
            .map(|v| token_of(&v))
    });
    // The second reservation is durable on the primary, not on its replica: not readable.
    wait_for(
        "the record durable locally",
        Duration::from_secs(10),
        || a.info("feed")["feed_durable_lsn"].parse::<u64>().unwrap() > durable_before,
    );
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(1000) {
        assert_eq!(
            reserved_tokens(&xread(&mut c, None)),
            vec![first.clone()],
            "the feed showed a record its replica does not have"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The replica comes back and acknowledges: a blocked reader after the first entry
    // wakes with the second.
    let (addr, after) = (a.addr(), a.info("feed")["feed_readable_lsn"].clone());
    let reader = std::thread::spawn(move || {
        let mut c = redis::Client::open(format!("redis://{addr}/"))
            .unwrap()
            .get_connection()
            .unwrap();
        let v: Value = redis::cmd("XREAD")
            .arg("BLOCK")
            .arg(10_000)
            .arg("STREAMS")
            .arg("stockgate:events")
            .arg(format!("{after}-0"))
            .query(&mut c)
            .unwrap();
        reserved_tokens(&v)
    });
    std::thread::sleep(Duration::from_millis(200));
    b.signal(libc::SIGCONT);
    let second = pending
        .join()
        .unwrap()
        .expect("acknowledged once the replica is back");
    let woke = reader.join().unwrap();
    assert_eq!(woke, vec![second.clone()]);
    assert_eq!(reserved_tokens(&xread(&mut c, None)), vec![first, second]);
}
