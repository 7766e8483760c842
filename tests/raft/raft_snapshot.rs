//! Snapshots of a Raft group: members compact their Raft log and WAL every
//! `--snapshot-records` records; a member that lost everything rejoins empty and, the
//! entries it needs being purged on the leader, receives the leader's snapshot, restarts
//! on it and catches up; consumer groups hold snapshots back so none of their entries is
//! trimmed. Real processes, real files.

use std::time::{Duration, Instant};

use crate::common::raft::{
    conn, converge_wal, create_sale, info_field, reserve, sale_info, state_of, Group,
};

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Restarts every member with `extra` flags (the group keeps its data dirs).
fn restart_all_with(g: &mut Group, extra: &[&str]) {
    for id in [1, 2, 3] {
        let m = g.member(id);
        m.kill9();
        m.args.extend(extra.iter().map(|s| s.to_string()));
    }
    for id in [1, 2, 3] {
        g.member(id).spawn();
    }
}

fn snapshot_files(g: &mut Group, id: u64) -> usize {
    let wal = g.member(id).dir.join("wal");
    std::fs::read_dir(wal)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("snapshot-"))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn raft_snapshots_compact_the_log_and_an_empty_member_installs_one() {
    let mut g = Group::start(false);
    restart_all_with(&mut g, &["--snapshot-records", "40"]);
    let l = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(l), "SNAP", 1000);
    let mut acked = Vec::new();
    for i in 0..240 {
        acked.push(reserve(g.port(l), &g, "SNAP", &format!("u{i}"), "r").expect("reserve"));
    }
    g.converge(Duration::from_secs(10));
    for id in [1, 2, 3] {
        let port = g.port(id);
        wait_for(
            "a snapshot on every member",
            Duration::from_secs(15),
            || info_field(port, "raft_snapshot_lsn") >= 160,
        );
        // The Raft log was compacted: far fewer entries than were written.
        assert!(
            info_field(port, "raft_log_entries") < 200,
            "member {id} kept its whole log"
        );
        assert!(snapshot_files(&mut g, id) >= 1, "no WAL snapshot on {id}");
    }

    // A follower restarted on its snapshot.
    let f = [1, 2, 3].into_iter().find(|i| *i != l).expect("a follower");
    g.member(f).kill9();
    g.member(f).spawn();
    g.converge(Duration::from_secs(10));
    assert_eq!(state_of(g.port(f), &acked[0]).as_deref(), Some("RESERVED"));

    // A follower that lost its whole data dir rejoins empty: the leader no longer has
    // the first entries, so it sends its snapshot.
    let f = [1, 2, 3]
        .into_iter()
        .find(|i| *i != l && *i != f)
        .expect("the other follower");
    g.member(f).kill9();
    let dir = g.member(f).dir.clone();
    std::fs::remove_dir_all(&dir).expect("wipe");
    g.rejoin_empty(f, l);
    converge_wal(&g, Duration::from_secs(20));
    assert!(
        info_field(g.port(f), "raft_snapshot_lsn") > 0,
        "the rejoined member did not install a snapshot"
    );
    for t in &acked {
        assert_eq!(state_of(g.port(f), t).as_deref(), Some("RESERVED"), "{t}");
    }
    assert_eq!(sale_info(g.port(f), "SNAP"), sale_info(g.port(l), "SNAP"));

    // And it carries the group: the leader dies, nothing acknowledged is lost.
    g.member(l).kill9();
    let n = g.leader(Some(l), Duration::from_secs(10));
    let t = reserve(g.port(n), &g, "SNAP", "after", "r").expect("reserve after");
    acked.push(t);
    for t in &acked {
        assert_eq!(state_of(g.port(n), t).as_deref(), Some("RESERVED"), "{t}");
    }
    let (total, avail, reserved, committed) = sale_info(g.port(n), "SNAP");
    assert_eq!((total, reserved), (1000, acked.len() as i64));
    assert_eq!(avail + reserved + committed, total);
}

/// A consumer group that has read nothing holds every snapshot back (its entries stay
/// readable on every member); once it has read and acknowledged, snapshots go on.
#[test]
fn raft_a_consumer_group_holds_snapshots_back() {
    let mut g = Group::start(false);
    restart_all_with(&mut g, &["--snapshot-records", "30"]);
    let l = g.leader(None, Duration::from_secs(10));
    create_sale(g.port(l), "HOLD", 1000);
    let r: String = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg("stockgate:events")
        .arg("orders")
        .arg("0")
        .query(&mut conn(g.port(l)))
        .expect("xgroup create");
    assert_eq!(r, "OK");
    for i in 0..120 {
        reserve(g.port(l), &g, "HOLD", &format!("u{i}"), "r").expect("reserve");
    }
    g.converge(Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(1000));
    for id in [1, 2, 3] {
        assert_eq!(
            info_field(g.port(id), "raft_snapshot_lsn"),
            0,
            "member {id} snapshotted past the group's position"
        );
    }
    // The group reads and acknowledges everything: the hold moves.
    let mut c = conn(g.port(l));
    let v: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("orders")
        .arg("c1")
        .arg("COUNT")
        .arg(1000)
        .arg("STREAMS")
        .arg("stockgate:events")
        .arg(">")
        .query(&mut c)
        .expect("xreadgroup");
    let ids = entry_ids(&v);
    assert!(ids.len() >= 121, "the group got {} entries", ids.len());
    let mut ack = redis::cmd("XACK");
    ack.arg("stockgate:events").arg("orders");
    for id in &ids {
        ack.arg(id);
    }
    let n: i64 = ack.query(&mut c).expect("xack");
    assert_eq!(n as usize, ids.len());
    for i in 0..40 {
        reserve(g.port(l), &g, "HOLD", &format!("v{i}"), "r").expect("reserve");
    }
    for id in [1, 2, 3] {
        let port = g.port(id);
        wait_for(
            "snapshots once the group moved",
            Duration::from_secs(15),
            || info_field(port, "raft_snapshot_lsn") > 0,
        );
    }
}

fn entry_ids(v: &redis::Value) -> Vec<String> {
    // RESP2: [[stream, [[id, fields], ...]]]
    let mut out = Vec::new();
    if let redis::Value::Array(streams) = v {
        for s in streams {
            if let redis::Value::Array(pair) = s {
                if let Some(redis::Value::Array(entries)) = pair.get(1) {
                    for e in entries {
                        if let redis::Value::Array(kv) = e {
                            if let Some(id) = kv.first() {
                                out.push(crate::common::as_str(id));
                            }
                        }
                    }
                }
            }
        }
    }
    out
}
