//! Consumer groups with replication: a replica applies its primary's group records as
//! they arrive (same pending list, same last-delivered id), refuses group writes, never
//! logs a checkpoint of its own (its log stays the primary's, LSN for LSN, across its own
//! and the primary's snapshots), and has the groups back after a kill -9.

mod common;

use std::time::Duration;

use common::ha::*;
use redis::Value;

const SKU: &str = "HAG";
const S: &str = "{HAG}:events";

fn q(c: &mut redis::Connection, args: &[&str]) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(c)
}

fn reserve_n(c: &mut redis::Connection, keys: &Keys, from: usize, n: usize) {
    for i in from..from + n {
        let u = format!("u{i}");
        let adm = keys.keyring().mint(SKU, &u, common::now_ms() + 600_000);
        q(c, &["RESERVE", SKU, &u, &adm, &format!("r{i}")]).unwrap();
    }
}

/// What a node says of the group: pending list and XINFO GROUPS without the times.
fn group_state(n: &Node) -> (Value, String) {
    let mut c = n.conn();
    let pending = q(&mut c, &["XPENDING", S, "g", "-", "+", "100"]).unwrap();
    // Idle times differ between nodes and moments: keep id, consumer, deliveries.
    let pending = match pending {
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .map(|it| match it {
                    Value::Array(mut f) => {
                        f.remove(2);
                        Value::Array(f)
                    }
                    v => v,
                })
                .collect(),
        ),
        v => v,
    };
    let groups = format!("{:?}", q(&mut c, &["XINFO", "GROUPS", S]).unwrap());
    (pending, groups)
}

fn converge(a: &Node, b: &Node) {
    wait_for(
        "replica to reach the primary's offset",
        Duration::from_secs(15),
        || b.offset() == a.offset(),
    );
}

#[test]
fn groups_replicate_and_a_replica_never_logs_its_own() {
    let keys = Keys::new();
    // The group lags behind on purpose: retention keeps what it still has to read.
    let a = Node::start(&keys, &["--feed-retention", "64MiB"]);
    let mut b = Node::start(
        &keys,
        &["--feed-retention", "64MiB", "--replicaof", &a.addr()],
    );
    let mut c = a.conn();
    q(&mut c, &["SALE.CREATE", SKU, "500"]).unwrap();
    q(&mut c, &["XGROUP", "CREATE", S, "g", "0"]).unwrap();
    reserve_n(&mut c, &keys, 0, 10);
    q(
        &mut c,
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            "c1",
            "COUNT",
            "4",
            "STREAMS",
            S,
            ">",
        ],
    )
    .unwrap();
    q(
        &mut c,
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            "c2",
            "COUNT",
            "3",
            "STREAMS",
            S,
            ">",
        ],
    )
    .unwrap();
    // LSN 2 is the group's own record: the first reservation is 3.
    assert_eq!(q(&mut c, &["XACK", S, "g", "3-0"]).unwrap(), Value::Int(1));
    converge(&a, &b);
    let want = group_state(&a);
    assert!(
        want.1.contains("\"pending\", int(6)") || want.1.contains("int(6)"),
        "{want:?}"
    );
    assert_eq!(
        group_state(&b),
        want,
        "the replica applies the group records live"
    );

    // Group writes are refused on the replica; reads are served.
    let mut bc = b.conn();
    for args in [
        &["XGROUP", "CREATE", S, "other", "0"][..],
        &["XREADGROUP", "GROUP", "g", "c1", "STREAMS", S, ">"][..],
        &["XACK", S, "g", "3-0"][..],
    ] {
        let e = q(&mut bc, args).unwrap_err();
        assert!(
            e.kind() == redis::ErrorKind::ReadOnly || e.to_string().contains("READONLY"),
            "{args:?}: {e}"
        );
    }

    // Snapshots on both sides: the replica must not log a checkpoint (its log would
    // diverge from the primary's), the primary's checkpoint replicates.
    q(&mut bc, &["SAVE"]).unwrap();
    q(&mut c, &["SAVE"]).unwrap();
    reserve_n(&mut c, &keys, 10, 5);
    q(
        &mut c,
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            "c1",
            "COUNT",
            "2",
            "STREAMS",
            S,
            ">",
        ],
    )
    .unwrap();
    converge(&a, &b);
    assert_eq!(b.info("replication")["master_link_status"], "up");
    let want = group_state(&a);
    assert_eq!(group_state(&b), want);
    q(&mut bc, &["SAVE"]).unwrap();

    // kill -9 the replica: its groups come back from its own log.
    b.kill9();
    reserve_n(&mut c, &keys, 15, 3);
    assert_eq!(
        q(&mut c, &["XACK", S, "g", "4-0", "5-0"]).unwrap(),
        Value::Int(2)
    );
    b.restart();
    converge(&a, &b);
    assert_eq!(b.info("replication")["master_link_status"], "up");
    assert_eq!(
        group_state(&b),
        group_state(&a),
        "after the replica's restart"
    );
}
